ct_add_test(kernels)
