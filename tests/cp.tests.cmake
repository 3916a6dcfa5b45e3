# Context parallelism against 1 rank (losses, grad norms, gathered parameters after 5 steps):
# cp=2 and cp=4 with head-tail load balancing and without, cp=2 x dp_shard=2 (FSDP over
# dp_shard x cp), cp=2 x dp_replicate=2, cp=2 x tp=2, under the checkpointing modes; the ring (alltoall)
# against allgather within 1e-6 (point-to-point and on the comm stream's thread).
function(ct_add_cp_test name ranks)
  add_test(NAME ${name} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks}
           $<TARGET_FILE:test_cp> ${ARGN})
  set_tests_properties(${name} PROPERTIES TIMEOUT 300 ENVIRONMENT "${CT_TEST_ENV}")
endfunction()
ct_add_test(cp RANKS 2 ARGS --cp 2 --ring)
ct_add_cp_test(cp4_np4 4 --cp 4 --ring --stream)
ct_add_cp_test(cp4_none_np4 4 --cp 4 --none --ring)
ct_add_cp_test(cp_fsdp_np4 4 --cp 2 --ring)
ct_add_cp_test(cp_hsdp_np4 4 --cp 2 --replicate 2)
ct_add_cp_test(cp_ac_full_np2 2 --cp 2 --ac-full --ring)
ct_add_cp_test(cp_ac_selective_np4 4 --cp 2 --ac-selective)
ct_add_cp_test(cp_ac_ffn_np2 2 --cp 2 --ac-ffn)
# cp x tp: the attention core of each TP rank's heads under CP
ct_add_cp_test(cp_tp_np4 4 --cp 2 --tp 2 --ring)
ct_add_cp_test(cp_tp_ac_full_np4 4 --cp 2 --tp 2 --none --ac-full)
ct_add_script_test(cp_cli tests/cp_cli.sh)
