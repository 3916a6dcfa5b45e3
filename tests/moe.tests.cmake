# The mixture-of-experts family (deepseek_v3): finite differences, routing, the bias update,
# determinism; the independent PyTorch float64 reference (tests/reference/moe_ref.py); FSDP on
# 2 and 3 ranks against one rank (tests/test_fsdp.c --moe), and with expert parallelism.
ct_add_test(moe)
add_test(NAME moe_reference COMMAND $<TARGET_FILE:test_moe> --reference)
set_tests_properties(moe_reference PROPERTIES TIMEOUT 300 ENVIRONMENT "${CT_TEST_ENV}")
add_test(NAME fsdp_moe_np2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
         $<TARGET_FILE:test_fsdp> --moe)
add_test(NAME fsdp_moe_np3 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 3
         $<TARGET_FILE:test_fsdp> --moe)
# expert parallelism: ep 2 = dp_shard 2 (the experts unsharded by FSDP), ep 2 inside dp_shard 4
# (experts sharded over efsdp 2), each against one rank (tests/test_fsdp.c --ep)
add_test(NAME fsdp_moe_ep2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
         $<TARGET_FILE:test_fsdp> --moe --ep 2)
add_test(NAME fsdp_moe_ep2_np4 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4
         $<TARGET_FILE:test_fsdp> --moe --ep 2)
# full activation checkpointing at ep 2 (the recompute re-runs the dispatch and combine) and
# selective under FSDP, against one rank without
add_test(NAME fsdp_moe_ep2_acfull COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
         $<TARGET_FILE:test_fsdp> --moe --ep 2 --ac full)
add_test(NAME fsdp_moe_np2_acsel COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
         $<TARGET_FILE:test_fsdp> --moe --ac selective)
set_tests_properties(fsdp_moe_np2 fsdp_moe_np3 fsdp_moe_ep2 fsdp_moe_ep2_np4
                     fsdp_moe_ep2_acfull fsdp_moe_np2_acsel PROPERTIES
                     TIMEOUT 300 ENVIRONMENT "${CT_TEST_ENV}")
ct_add_script_test(moe_cli tests/moe_cli.sh)
# Hugging Face export / import with DeepSeek-V3's names (src/model/moe/moe_hf.c)
ct_add_script_test(moe_hf tests/moe_hf.sh)
# pipeline stages (tests/test_pp.c --moe): pp 2 with every schedule on 2 ranks; pp 2 x
# dp_shard 2, and with ep 2 inside dp_shard (1F1B, Interleaved1F1B) on 4; each against one rank
# (losses, grad norms, validation, parameters, the balancing bias)
add_test(NAME pp_moe_np2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
         $<TARGET_FILE:test_pp> --moe)
add_test(NAME pp_moe_np4 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4
         $<TARGET_FILE:test_pp> --moe)
set_tests_properties(pp_moe_np2 pp_moe_np4 PROPERTIES TIMEOUT 300 ENVIRONMENT "${CT_TEST_ENV}")
