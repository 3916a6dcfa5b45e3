ct_add_test(llama)
add_test(NAME llama_reference COMMAND $<TARGET_FILE:test_llama> --reference)
set_tests_properties(llama_reference PROPERTIES TIMEOUT 600 ENVIRONMENT "${CT_TEST_ENV}")
add_test(NAME reference_selftest COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/reference/selftest.py)
set_tests_properties(reference_selftest PROPERTIES TIMEOUT 300)
# a third family defined only in the test, through the family table, on the one engine
ct_add_test(family RANKS 1)
ct_add_test(family RANKS 2)
