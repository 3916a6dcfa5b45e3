ct_add_test(config)
