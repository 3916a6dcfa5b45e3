# Benchmark programs (C); bench/run.sh runs them next to the Python baselines.
add_executable(flash_inference bench/flash_inference.c)
target_link_libraries(flash_inference PRIVATE ctcore)
set_target_properties(flash_inference PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench
                      BUILD_RPATH /usr/lib/x86_64-linux-gnu/openblas-openmp)
add_executable(bench_comm bench/bench_comm.c)
target_link_libraries(bench_comm PRIVATE ctcore)
set_target_properties(bench_comm PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench
                      BUILD_RPATH /usr/lib/x86_64-linux-gnu/openblas-openmp)
add_executable(bench_matmul bench/bench_matmul.c)
target_link_libraries(bench_matmul PRIVATE ctcore)
set_target_properties(bench_matmul PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench
                      BUILD_RPATH /usr/lib/x86_64-linux-gnu/openblas-openmp)
add_executable(bench_float8 bench/bench_float8.c)
target_link_libraries(bench_float8 PRIVATE ctcore)
set_target_properties(bench_float8 PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench
                      BUILD_RPATH /usr/lib/x86_64-linux-gnu/openblas-openmp)
add_executable(bench_cp_balance bench/bench_cp_balance.c)
target_link_libraries(bench_cp_balance PRIVATE ctcore)
set_target_properties(bench_cp_balance PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench
                      BUILD_RPATH /usr/lib/x86_64-linux-gnu/openblas-openmp)
