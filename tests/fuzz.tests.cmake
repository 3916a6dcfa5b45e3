# libFuzzer harnesses (config parser, token shards + loader, tokenizer loaders, checkpoint
# manifest + safetensors readers), briefly.
add_test(NAME fuzz_smoke COMMAND bash ${CMAKE_SOURCE_DIR}/tests/fuzz/smoke.sh ${CMAKE_BINARY_DIR} 3)
# exit 77 (CTest: skipped) only without clang's libFuzzer runtime (a test-only package)
set_tests_properties(fuzz_smoke PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
