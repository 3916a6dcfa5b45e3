ct_add_test(attention)
