ct_add_test(tokenizer TIMEOUT 120)
# Parity with tiktoken (cl100k_base) and Llama 3 (llama3-tokenizer-js's vocabulary) from npm;
# exit 77 (CTest: skipped, not passed) only when the npm registry cannot be reached.
ct_add_script_test(tokenizer_parity tests/tokenizer_parity.sh)
set_tests_properties(tokenizer_parity PROPERTIES SKIP_RETURN_CODE 77)
