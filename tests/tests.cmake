# Test registry: each tests/test_<name>.c is a plain executable; add it here.
# Environment for every test: MPI as root and oversubscribed (CI runs as root on 2 cores),
# one OpenMP thread per rank for MPI tests, deterministic OpenBLAS kernel choice.
# (the OpenMPI part from scripts/ompi.env, shared with scripts/launch and the benchmarks)
file(STRINGS ${CMAKE_SOURCE_DIR}/scripts/ompi.env CT_OMPI_ENV REGEX "^[A-Za-z_]+=")
set(CT_TEST_ENV
  ${CT_OMPI_ENV}
  ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:abort_on_error=1
  LSAN_OPTIONS=suppressions=${CMAKE_SOURCE_DIR}/tests/lsan.supp:print_suppressions=0
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  CT_SOURCE_DIR=${CMAKE_SOURCE_DIR} CT_BUILD_DIR=${CMAKE_BINARY_DIR}
  # one matmul engine, not auto's timing-dependent choice, so separate processes (resume
  # tests) compute bitwise alike; tests/engine.tests.cmake forces each engine in turn
  CT_MATMUL_ENGINE=onednn)

function(ct_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT;RANKS" "ARGS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(NOT TARGET test_${name})
    add_executable(test_${name} tests/test_${name}.c tests/testutil.c)
    target_link_libraries(test_${name} PRIVATE ctcore)
    target_include_directories(test_${name} PRIVATE ${CMAKE_SOURCE_DIR}/tests)
    set_target_properties(test_${name} PROPERTIES BUILD_RPATH /usr/lib/x86_64-linux-gnu/openblas-openmp)
  endif()
  if(T_RANKS)
    set(tname ${name}_np${T_RANKS})
    add_test(NAME ${tname} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${T_RANKS}
             $<TARGET_FILE:test_${name}> ${T_ARGS})
  else()
    set(tname ${name})
    add_test(NAME ${tname} COMMAND $<TARGET_FILE:test_${name}> ${T_ARGS})
  endif()
  set_tests_properties(${tname} PROPERTIES TIMEOUT ${T_TIMEOUT} ENVIRONMENT "${CT_TEST_ENV}")
endfunction()

# Shell/Python-driven tests of the ctitan binary.
function(ct_add_script_test name script)
  add_test(NAME ${name} COMMAND bash ${CMAKE_SOURCE_DIR}/${script} $<TARGET_FILE:ctitan>)
  set_tests_properties(${name} PROPERTIES TIMEOUT 600 ENVIRONMENT "${CT_TEST_ENV}")
endfunction()

file(GLOB CT_TEST_LISTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/*.tests.cmake)
foreach(f ${CT_TEST_LISTS})
  include(${f})
endforeach()
