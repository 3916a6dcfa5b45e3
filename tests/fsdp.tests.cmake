ct_add_test(fsdp RANKS 2)
ct_add_test(fsdp RANKS 3)
ct_add_test(fsdp RANKS 4)
add_test(NAME fsdp_hsdp_np4 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4
         $<TARGET_FILE:test_fsdp> --replicate 2)
add_test(NAME fsdp_bf16_np2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
         $<TARGET_FILE:test_fsdp> --bf16-check)
set_tests_properties(fsdp_hsdp_np4 fsdp_bf16_np2 PROPERTIES TIMEOUT 300 ENVIRONMENT "${CT_TEST_ENV}")
# Tensor parallelism (sequence + loss parallel) alone and as 2D with FSDP / HSDP, against
# 1 rank; bf16 all-gather TP x FSDP against bf16 FSDP.
ct_add_test(tp RANKS 2 ARGS --tp 2)
ct_add_test(tp RANKS 4 ARGS --tp 4)
add_test(NAME tp_fsdp_np4 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4
         $<TARGET_FILE:test_tp> --tp 2)
add_test(NAME tp_hsdp_np4 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4
         $<TARGET_FILE:test_tp> --tp 2 --replicate 2)
add_test(NAME tp_bf16_np4 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4
         $<TARGET_FILE:test_tp> --tp 2 --bf16)
add_test(NAME tp_ac_full_np4 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4
         $<TARGET_FILE:test_tp> --tp 2 --ac-full)
add_test(NAME tp_ac_ffn_np4 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4
         $<TARGET_FILE:test_tp> --tp 2 --ac-ffn)
add_test(NAME tp_ac_selective_np4 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4
         $<TARGET_FILE:test_tp> --tp 2 --ac-selective)
# async TP (ring steps) against plain TP: tp=2 x dp_shard=2, and tp=4 with ffn checkpointing
# (the async backward's recompute path)
add_test(NAME tp_async_np4 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4
         $<TARGET_FILE:test_tp> --tp 2 --async)
add_test(NAME tp4_async_np4 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4
         $<TARGET_FILE:test_tp> --tp 4 --async --ac-ffn)
set_tests_properties(tp_fsdp_np4 tp_hsdp_np4 tp_bf16_np4 tp_ac_full_np4 tp_ac_ffn_np4
                     tp_ac_selective_np4 tp_async_np4 tp4_async_np4 PROPERTIES TIMEOUT 300 ENVIRONMENT "${CT_TEST_ENV}")
ct_add_script_test(tp_cli tests/tp_cli.sh)
# The 3D data x tensor layout (dp_replicate 2 x dp_shard 2 x tp 2) needs 8 ranks; the suite's
# one 8-rank test is pp_np8 (pp x dp_shard x tp and pp x dp_replicate x dp_shard), so this
# one is run by hand:
#   mpiexec -n 8 build/test_tp --tp 2 --replicate 2
