ct_add_test(fsdp RANKS 2)
ct_add_test(fsdp RANKS 3)
ct_add_test(fsdp RANKS 4)
add_test(NAME fsdp_hsdp_np4 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4
         $<TARGET_FILE:test_fsdp> --replicate 2)
add_test(NAME fsdp_bf16_np2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
         $<TARGET_FILE:test_fsdp> --bf16-check)
set_tests_properties(fsdp_hsdp_np4 fsdp_bf16_np2 PROPERTIES TIMEOUT 300 ENVIRONMENT "${CT_TEST_ENV}")
