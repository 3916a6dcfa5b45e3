# The comm layer: chunked collectives (count-only beyond 2^31), the stream's labels, the comm
# thread's OpenMP team and signal mask, concurrent counters. OMP_NUM_THREADS=3 so that a team
# on the comm thread would show up as extra threads.
ct_add_test(comm RANKS 2)
ct_add_test(comm RANKS 4)
# The flight recorder's ring: wraparound, sequence numbers equal across ranks, stream states,
# transfers, the debug injection, dumps (also while two threads record: make tsan).
ct_add_test(flight RANKS 3)
if(CMAKE_BUILD_TYPE STREQUAL "Tsan")
  # (make tsan) libgomp is not instrumented: one OpenMP thread, so only our threads are checked
  set_tests_properties(comm_np2 comm_np4 flight_np3 PROPERTIES ENVIRONMENT
                       "${CT_TEST_ENV};OMP_NUM_THREADS=1;TSAN_OPTIONS=halt_on_error=1:exitcode=66:suppressions=${CMAKE_SOURCE_DIR}/tests/tsan.supp")
else()
  set_tests_properties(comm_np2 comm_np4 PROPERTIES ENVIRONMENT "${CT_TEST_ENV};OMP_NUM_THREADS=3")
endif()
# The watchdog: a rank that hangs or is stopped ends the job, named, within the timeout + 10 s.
ct_add_script_test(watchdog tests/watchdog.sh)
# The flight recorder: dumps on SIGUSR1 and from every running rank before the watchdog ends a
# hung job; ctitan trace-comm names a stopped rank and a mismatched collective.
ct_add_script_test(flight tests/flight.sh)
# Checkpoint saves fsync the root folder after renaming the step folder and `latest`.
ct_add_test(ckpt_durable)
# Multi-host over TCP in network namespaces (root only; skipped elsewhere).
ct_add_script_test(multihost tests/multihost.sh)
set_tests_properties(multihost PROPERTIES SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
# ctitan launch: bad input, the restart limit, a job ended as a whole, nothing left behind.
ct_add_script_test(launch tests/launch.sh)
