# tests/lib.sh: shared by the shell tests. Source it after `set -u`; it provides
#   $tmp      a scratch folder, removed at exit (kept, and reused, when KEEP_TMP names one)
#   check NAME STATUS   count a result: STATUS 0 passes
#   finish    print "N passed, N failed" (CTest-readable) and return the verdict
tmp=${KEEP_TMP:-$(mktemp -d)}
[ -n "${KEEP_TMP:-}" ] || trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
check() {
  if [ "$2" -eq 0 ]; then
    pass=$((pass + 1))
    echo "[ ok ] $1"
  else
    fail=$((fail + 1))
    echo "[FAIL] $1"
  fi
}
finish() {
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
}
