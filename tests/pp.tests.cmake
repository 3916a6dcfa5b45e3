ct_add_test(pp_schedule TIMEOUT 60)
ct_add_test(pp RANKS 2 TIMEOUT 120)
ct_add_test(pp RANKS 4 TIMEOUT 180)
ct_add_script_test(pp_cli tests/pp_cli.sh)
