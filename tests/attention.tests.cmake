ct_add_test(attention)
ct_add_test(attention_pos TIMEOUT 120)
