ct_add_test(llama)
add_test(NAME llama_reference COMMAND $<TARGET_FILE:test_llama> --reference)
set_tests_properties(llama_reference PROPERTIES TIMEOUT 600 ENVIRONMENT "${CT_TEST_ENV}")
