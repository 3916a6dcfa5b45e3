#!/usr/bin/env bash
# A rank that dies mid-step takes the whole job down: every other rank exits, the launcher
# exits non-zero within 60 s and names the failed rank. Also: bad usage exits 2.
#   tests/cli_faults.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
pass=0
check() { # name, condition-result
  if [ "$2" -eq 0 ]; then pass=$((pass + 1)); echo "[ ok ] $1"; else fail=$((fail + 1)); echo "[FAIL] $1"; fi
}

for victim in 1 0; do
  start=$(date +%s)
  timeout 120 "$ROOT/scripts/launch" 3 "$CTITAN" train "$ROOT/configs/debug.toml" \
    --training.steps=20 --training.seq_len=64 --metrics.peak_tflops=0.1 \
    --job.dump_folder="$tmp/run$victim" --debug.fail_rank=$victim --debug.fail_step=3 \
    > "$tmp/out$victim" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  echo "  rank $victim killed: exit $rc after ${took}s; launcher said:"
  grep -iE "rank|signal|killed" "$tmp/out$victim" | head -5 | sed 's/^/    /'
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]; check "job exits non-zero when rank $victim dies" $?
  [ "$took" -le 60 ]; check "job ends within 60 s when rank $victim dies" $?
  grep -qE "process rank $victim .*(exited|signal)" "$tmp/out$victim"; check "launcher names the failed rank $victim" $?
  ! grep -q "step:    20" "$tmp/out$victim"; check "no step completes after the failure" $?
done

# Bad usage exits 2, runtime failures 1.
"$CTITAN" > /dev/null 2>&1; [ $? -eq 2 ]; check "no command: exit 2" $?
"$CTITAN" frobnicate > /dev/null 2>&1; [ $? -eq 2 ]; check "unknown command: exit 2" $?
"$CTITAN" train "$tmp/missing.toml" > /dev/null 2>&1; [ $? -eq 2 ]; check "missing config: exit 2" $?
"$CTITAN" train "$ROOT/configs/debug.toml" --training.stepz=3 2> "$tmp/err" > /dev/null
[ $? -eq 2 ] && grep -q "training.stepz" "$tmp/err"; check "unknown key named, exit 2" $?
"$CTITAN" train "$ROOT/configs/debug.toml" --parallelism.tensor_parallel_degree=2 2> "$tmp/err" > /dev/null
[ $? -eq 2 ] && grep -q "not yet supported" "$tmp/err"; check "tensor parallel: not yet supported, exit 2" $?
mkdir -p "$tmp/data"
printf 'CTTOKENS\001\000\000\000\002\000\000\000\377\000\000\000\000\000\000\000' > "$tmp/data/train_000000.bin"
"$CTITAN" train "$ROOT/configs/debug.toml" --training.dataset=mine --training.dataset_path="$tmp/data" \
  --metrics.peak_tflops=0.1 2> "$tmp/err" > /dev/null
rc=$?
[ $rc -eq 1 ] && grep -q "train_000000.bin" "$tmp/err"; check "token shard that lies about its size: named, exit 1 (got $rc)" $?
"$CTITAN" train "$ROOT/configs/debug.toml" --training.dataset=mine 2> "$tmp/err" > /dev/null
[ $? -eq 2 ] && grep -q "dataset_path" "$tmp/err"; check "a dataset without dataset_path: exit 2" $?
"$CTITAN" train "$ROOT/configs/debug.toml" --job.print_config=true > "$tmp/p.toml" 2>&1
"$CTITAN" train "$tmp/p.toml" --job.print_config=true > "$tmp/p2.toml" 2>&1
cmp -s "$tmp/p.toml" "$tmp/p2.toml"; check "printed config reads back identically" $?

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
