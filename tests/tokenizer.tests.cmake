ct_add_test(tokenizer TIMEOUT 120)
# Parity with tiktoken (cl100k_base) and Llama 3 (llama3-tokenizer-js's vocabulary) from npm;
# prints SKIPPED and passes only when the npm registry cannot be reached.
ct_add_script_test(tokenizer_parity tests/tokenizer_parity.sh)
