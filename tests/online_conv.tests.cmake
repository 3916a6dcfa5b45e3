ct_add_test(online_conv TIMEOUT 300)
