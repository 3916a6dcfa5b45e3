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
# bf16 compute: N ranks (bf16 all-gather + bf16 matmuls) = 1 rank in bf16 within 1e-5, the
# 1-rank gradient summed in the N-rank order (tests/test_fsdp.c says why; powers of two).
foreach(n 2 4)
  add_test(NAME fsdp_bf16_compute_np${n} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n}
           $<TARGET_FILE:test_fsdp> --bf16-compute)
  set_tests_properties(fsdp_bf16_compute_np${n} PROPERTIES TIMEOUT 300 ENVIRONMENT "${CT_TEST_ENV}")
endforeach()
# The model in bf16 against the float64 PyTorch reference, tolerances from bf16 rounding
# (derived in tests/test_llama.c, main).
add_test(NAME llama_bf16_reference COMMAND $<TARGET_FILE:test_llama> --bf16)
set_tests_properties(llama_bf16_reference PROPERTIES TIMEOUT 600 ENVIRONMENT "${CT_TEST_ENV}")
# fp8 all-gather (float8 linears, tensorwise): N ranks against 1 rank on the same quantised
# weights, and the exact bytes on the wire (tests/test_fsdp.c, --fp8-all-gather).
foreach(n 2 4)
  add_test(NAME fsdp_fp8_all_gather_np${n} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n}
           $<TARGET_FILE:test_fsdp> --fp8-all-gather)
  set_tests_properties(fsdp_fp8_all_gather_np${n} PROPERTIES TIMEOUT 300 ENVIRONMENT "${CT_TEST_ENV}")
endforeach()
add_test(NAME fsdp_fp8_all_gather_bf16_np2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
         $<TARGET_FILE:test_fsdp> --fp8-all-gather --bf16-compute)
set_tests_properties(fsdp_fp8_all_gather_bf16_np2 PROPERTIES TIMEOUT 300 ENVIRONMENT "${CT_TEST_ENV}")
ct_add_script_test(float8_cli tests/float8_cli.sh)
