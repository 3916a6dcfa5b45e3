ct_add_test(kernels)
# fp8 formats, scales and the float8 linear recipes; once per instruction set of the casts
# (each must equal the reference written in the test, bit for bit).
ct_add_test(fp8)
foreach(isa x86-64 avx2)
  add_test(NAME fp8_${isa} COMMAND $<TARGET_FILE:test_fp8>)
  set_tests_properties(fp8_${isa} PROPERTIES TIMEOUT 120
                       ENVIRONMENT "${CT_TEST_ENV};CT_FP8_ISA=${isa}")
endforeach()
