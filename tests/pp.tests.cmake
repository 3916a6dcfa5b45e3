ct_add_test(pp_schedule TIMEOUT 60)
