ct_add_test(hyena_gen TIMEOUT 300)
