ct_add_script_test(plan tests/plan.sh)
ct_add_script_test(trace tests/trace.sh)
