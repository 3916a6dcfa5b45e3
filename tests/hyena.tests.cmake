ct_add_test(hyena_kernels)
ct_add_test(hyena)
add_test(NAME hyena_reference COMMAND $<TARGET_FILE:test_hyena> --reference)
set_tests_properties(hyena_reference PROPERTIES TIMEOUT 600 ENVIRONMENT "${CT_TEST_ENV}")
add_test(NAME fsdp_hyena_np2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
         $<TARGET_FILE:test_fsdp> --hyena)
add_test(NAME fsdp_hyena_np3 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 3
         $<TARGET_FILE:test_fsdp> --hyena)
set_tests_properties(fsdp_hyena_np2 fsdp_hyena_np3 PROPERTIES TIMEOUT 300 ENVIRONMENT "${CT_TEST_ENV}")
ct_add_script_test(hyena_cli tests/hyena_cli.sh)
# The Hyena reference's own must-fail self-test (a perturbed gradient and perturbed losses exit 1).
add_test(NAME hyena_reference_selftest COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/reference/hyena_selftest.py)
set_tests_properties(hyena_reference_selftest PROPERTIES TIMEOUT 300)
