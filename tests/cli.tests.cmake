ct_add_script_test(cli_faults tests/cli_faults.sh)
