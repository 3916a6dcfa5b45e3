# The composition matrix (tests/compose.py): a seeded pairwise sample of layouts x precisions x
# activation checkpointing x families x modes, each equal to one rank; every refusal rule once.
# `tests/compose.py --ctitan build/ctitan --full` runs every working combination (not in CI).
add_test(NAME compose COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/compose.py
         --ctitan $<TARGET_FILE:ctitan>)
set_tests_properties(compose PROPERTIES TIMEOUT 900 ENVIRONMENT "${CT_TEST_ENV}")
# README's "Composition matrix" section is generated from the same table
add_test(NAME compose_docs COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/compose.py
         --check-readme)
