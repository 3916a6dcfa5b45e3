# The matmul engine layer (kernels/mm_engine): unit test, and the model and FSDP equivalence
# tests with each engine forced in turn (CT_MATMUL_ENGINE) and in bf16 compute.
ct_add_test(mm_engine)
foreach(eng onednn openblas)
  add_test(NAME llama_${eng} COMMAND $<TARGET_FILE:test_llama> --all)
  add_test(NAME fsdp_${eng}_np2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
           $<TARGET_FILE:test_fsdp>)
  set_tests_properties(llama_${eng} fsdp_${eng}_np2 PROPERTIES TIMEOUT 600
                       ENVIRONMENT "${CT_TEST_ENV};CT_MATMUL_ENGINE=${eng}")
endforeach()
ct_add_script_test(engine_cli tests/engine_cli.sh)
