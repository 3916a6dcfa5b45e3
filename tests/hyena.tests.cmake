ct_add_test(hyena)
