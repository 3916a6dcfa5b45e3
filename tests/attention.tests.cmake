ct_add_test(attention)
ct_add_test(attention_pos TIMEOUT 120)
# bf16 attention (AVX512-BF16): skipped (77) on CPUs without it
ct_add_test(attention_bf16 TIMEOUT 120)
set_tests_properties(attention_bf16 PROPERTIES SKIP_RETURN_CODE 77)
