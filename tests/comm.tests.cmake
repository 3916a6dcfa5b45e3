# The comm layer: chunked collectives (count-only beyond 2^31), the stream's labels, the comm
# thread's OpenMP team and signal mask, concurrent counters. OMP_NUM_THREADS=3 so that a team
# on the comm thread would show up as extra threads.
ct_add_test(comm RANKS 2)
ct_add_test(comm RANKS 4)
set_tests_properties(comm_np2 comm_np4 PROPERTIES ENVIRONMENT "${CT_TEST_ENV};OMP_NUM_THREADS=3")
# The watchdog: a rank that hangs or is stopped ends the job, named, within the timeout + 10 s.
ct_add_script_test(watchdog tests/watchdog.sh)
# Checkpoint saves fsync the root folder after renaming the step folder and `latest`.
ct_add_test(ckpt_durable)
