ct_add_script_test(cli_faults tests/cli_faults.sh)
ct_add_script_test(checkpoint tests/checkpoint.sh)
ct_add_script_test(data_train tests/data_train.sh)
ct_add_script_test(export tests/export.sh)
