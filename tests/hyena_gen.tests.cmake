ct_add_test(hyena_gen TIMEOUT 300)
ct_add_script_test(hyena_generate tests/hyena_generate.sh)
