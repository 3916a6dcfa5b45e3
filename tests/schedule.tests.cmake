ct_add_test(schedule RANKS 2 TIMEOUT 300)
ct_add_test(schedule RANKS 4 TIMEOUT 300)
ct_add_test(sched_auto TIMEOUT 120)
