#!/usr/bin/env bash
# `ctitan plan`: predicted step time, memory and exposed communication for presets on many
# ranks, in seconds, without MPI; sane numbers; bad arguments exit 2.
#   tests/plan.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
H100="--metrics.peak_tflops=989 --comm.bandwidth_gbps=400 --comm.latency_us=30"
start=$(date +%s)
"$CTITAN" plan "$ROOT/configs/8b.toml" --world-size 128 > "$tmp/8b.txt" 2> "$tmp/8b.err"
check "8B on 128 ranks (H100 figures from configs/8b.toml)" $?
/usr/bin/python3 - "$tmp/8b.txt" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
step = float(re.search(r"predicted step time\s+([\d.]+) s", t).group(1))
tps = float(re.search(r"throughput\s+(\d+) tokens/s per rank", t).group(1))
mem = float(re.search(r"memory per rank\s+([\d.]+) GiB", t).group(1))
exp = float(re.search(r"exposed communication\s+([\d.]+) s", t).group(1))
# 8B, 8192 tokens per rank: a step of O(1) s, a few thousand tokens/s per H100, tens of GiB
ok = 0.2 < step < 10 and 1000 < tps < 20000 and 5 < mem < 80 and 0 <= exp < step
ok = ok and "RECOMPUTE u1" in t and "AG b1 (recomputed)" in t and "buckets (34)" in t
print(f"step {step} s, {tps} tokens/s/rank, {mem} GiB, exposed {exp} s")
sys.exit(0 if ok else 1)
PY
check "8B: step time, tokens/s, memory and exposed comm are sane; selective AC in the schedule" $?
grep -q "plans compared" "$tmp/8b.txt" && grep -q "^  #1 .*per_block" "$tmp/8b.txt" && grep -q "lower bound" "$tmp/8b.txt"
check "8B: the plans the automatic search compared are printed" $?
"$CTITAN" plan "$ROOT/configs/8b.toml" --world-size 128 > "$tmp/8b2.txt" 2>&1 && cmp -s "$tmp/8b.txt" "$tmp/8b2.txt"
check "8B: the plan depends only on its inputs (two runs print the same)" $?
"$CTITAN" plan "$ROOT/configs/8b.toml" --world-size 128 --comm.buckets=auto --comm.memory_budget_gb=10 > /dev/null 2> "$tmp/err"
[ $? -eq 2 ] && grep -q "memory_budget_gb.*no plan fits.*smallest predicted peak is 2[0-9.]* GiB" "$tmp/err"
check "a memory budget no plan fits: exit 2 with the smallest predicted peak" $?
for c in 70b 405b; do
  "$CTITAN" plan "$ROOT/configs/$c.toml" --world-size 512 $H100 --comm.buckets=auto \
    --activation_checkpoint.mode=full --training.mixed_precision_param=bfloat16 \
    > "$tmp/$c.txt" 2>&1 && grep -q "predicted step time" "$tmp/$c.txt"
  check "$c on 512 ranks with auto bucketing" $?
done
"$CTITAN" plan "$ROOT/configs/8b.toml" --world-size 64 --comm.buckets="embed+0,1+2" > /dev/null 2> "$tmp/err"
[ $? -eq 2 ] && grep -q "comm.buckets" "$tmp/err"; check "bad bucket plan: named, exit 2" $?
[ $(( $(date +%s) - start )) -le 10 ]; check "plans take seconds" $?
"$CTITAN" plan "$ROOT/configs/8b.toml" > /dev/null 2>&1; [ $? -eq 2 ]; check "no --world-size: exit 2" $?
"$CTITAN" plan --world-size 8 > /dev/null 2>&1; [ $? -eq 2 ]; check "no config: exit 2" $?
"$CTITAN" plan "$ROOT/configs/8b.toml" --world-size x > /dev/null 2>&1; [ $? -eq 2 ]; check "bad --world-size: exit 2" $?
"$CTITAN" plan "$ROOT/configs/8b.toml" --world-size 100 --parallelism.data_parallel_replicate_degree=3 > /dev/null 2>&1
[ $? -eq 2 ]; check "world not replicate x shard: exit 2" $?
"$CTITAN" plan "$ROOT/configs/debug.toml" --world-size 8 > /dev/null 2> "$tmp/err"
[ $? -eq 2 ] && grep -q "peak_tflops" "$tmp/err"; check "no target figures: named, exit 2" $?
"$CTITAN" plan "$ROOT/configs/8b.toml" --world-size 8 --comm.nope=1 > /dev/null 2>&1; [ $? -eq 2 ]; check "unknown key: exit 2" $?
"$CTITAN" plan --help | grep -q "world-size"; check "--help" $?
finish
