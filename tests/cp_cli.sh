#!/usr/bin/env bash
# Context parallelism through `ctitan train`: cp=2 (head-tail, K/V all-gathered) on synthetic
# data and on a shard folder (the loader's sequences cut by the same token order, validation
# too), cp=2 as a ring on the comm stream's thread, cp=4 without load balancing,
# cp=2 x async tp=2 and pp=2 x cp=2 (1F1B; interleaved and ZB-H1 with the ring) train
# like 1 rank (losses and grad norms within 1e-5 relative, from metrics.jsonl), also with
# automatic buckets and a profiled step (the cost model prices the K/V transfers); `ctitan
# plan` with cp counts the K/V bytes per step; bad CP settings exit 2 naming the key and the
# numbers.
#   tests/cp_cli.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
L="$ROOT/scripts/launch"
common=(train "$ROOT/configs/debug.toml" --training.steps=3 --training.seq_len=64
        --training.local_batch_size=2 --metrics.peak_tflops=0.1 --model.vocab_size=2047)

run "$tmp/one.log" "$CTITAN" "${common[@]}" --job.dump_folder="$tmp/one"
check "1 rank trains" $?
metric "$tmp/one/metrics.jsonl" 1 3 > "$tmp/one.l"
cp_run() { # name, ranks, args...
  local name=$1 n=$2
  shift 2
  run "$tmp/$name.log" "$L" "$n" "$CTITAN" "${common[@]}" --job.dump_folder="$tmp/$name" "$@"
  check "$name trains" $?
  metric "$tmp/$name/metrics.jsonl" 1 3 > "$tmp/$name.l" && close "$tmp/$name.l" "$tmp/one.l"
  check "$name: losses and grad norms equal 1 rank's within 1e-5" $?
}
cp_run cp2 2 --parallelism.context_parallel_degree=2
grep -q "context parallelism: 2 ranks per sequence, 32 of its 64 tokens" "$tmp/cp2.log"
check "cp=2 says how the sequence is split" $?
metric "$tmp/one/metrics.jsonl" 1 3 tokens_seen > "$tmp/one.t"
metric "$tmp/cp2/metrics.jsonl" 1 3 tokens_seen > "$tmp/cp2.t" && same "$tmp/cp2.t" "$tmp/one.t"
check "cp=2 counts the tokens seen as 1 rank does" $?
# the cost model prices the K/V transfers: automatic buckets and a profiled step (predicted vs
# measured, per node kind)
cp_run cp2_auto_profiled 2 --parallelism.context_parallel_degree=2 --comm.buckets=auto \
  --profiling.enable_profiling=true --profiling.profile_freq=2
grep -q "cost model: context-parallel K/V transfers" "$tmp/cp2_auto_profiled.log" &&
  grep -q "cost model vs this step" "$tmp/cp2_auto_profiled.log"
check "cp=2 with automatic buckets and profiling: the K/V transfers priced, the step compared" $?
# the K/V transfers are schedule nodes: the profiled step's trace has them (category cp), and
# the profile compares them as a row of their own
/usr/bin/python3 - "$tmp/cp2_auto_profiled/profile_trace/iteration_2/rank0_trace.json" <<'PY'
import collections, json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
n = collections.Counter(e["name"].split()[0] for e in ev if e.get("cat") == "cp")
# 6 blocks, 1 micro-batch: CP-AG in forward and backward, CP-RS in backward
sys.exit(0 if n["CP-AG"] == 12 and n["CP-RS"] == 6 else f"cp trace events: {dict(n)}")
PY
[ $? -eq 0 ] && grep -q "^  CP K/V transfers  *18 " "$tmp/cp2_auto_profiled.log"
check "cp=2 trace: 12 CP-AG and 6 CP-RS nodes (category cp), and their profile row of 18" $?
cp_run cp2_ring_thread 2 --parallelism.context_parallel_degree=2 \
  --parallelism.context_parallel_rotate_method=alltoall --comm.progress=thread
cp_run cp4_none 4 --parallelism.context_parallel_degree=4 \
  --parallelism.context_parallel_load_balancer=none
cp_run cp2_tp2_async 4 --parallelism.context_parallel_degree=2 \
  --parallelism.tensor_parallel_degree=2 --parallelism.enable_async_tensor_parallel=true
cp_run pp2_cp2 4 --parallelism.context_parallel_degree=2 --parallelism.pipeline_parallel_degree=2 \
  --profiling.enable_profiling=true --profiling.profile_freq=2
grep -q "cost model vs this step (pipeline): predicted" "$tmp/pp2_cp2.log"
check "pp=2 x cp=2 profiled: the pipeline cost model compares the step" $?
cp_run pp2_cp2_ring_interleaved 4 --parallelism.context_parallel_degree=2 \
  --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule=Interleaved1F1B \
  --parallelism.context_parallel_rotate_method=alltoall
cp_run pp2_cp2_ring_zbh1 4 --parallelism.context_parallel_degree=2 \
  --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule=ZeroBubbleH1 \
  --parallelism.context_parallel_rotate_method=alltoall --comm.progress=thread

# a shard folder: the loader reads whole sequences, each rank keeps its tokens of them
token_shards "$tmp/data" 7 0.8 5 3 train_000000=20000 val_000000=3000 # tests/lib.sh
data=(--training.dataset=mine --training.dataset_path="$tmp/data" --model.vocab_size=509
      --validation.enable=true --validation.freq=3 --validation.steps=2)
run "$tmp/d1.log" "$CTITAN" "${common[@]}" "${data[@]}" --job.dump_folder="$tmp/d1" \
  --debug.sample_log="$tmp/d1.samples"
check "1 rank trains on a shard folder" $?
run "$tmp/d2.log" "$L" 2 "$CTITAN" "${common[@]}" "${data[@]}" --job.dump_folder="$tmp/d2" \
  --parallelism.context_parallel_degree=2 --debug.sample_log="$tmp/d2.samples"
check "cp=2 trains on a shard folder" $?
[ ! -e "$tmp/d2.samples.rank-1" ] && same "$tmp/d2.samples.rank-0" "$tmp/d1.samples.rank-0"
check "cp=2 trains on the same samples, logged once per cp group" $?
{ metric "$tmp/d1/metrics.jsonl" 1 3 && metric "$tmp/d1/metrics.jsonl" 3 3 validation_loss; } > "$tmp/d1.l"
{ metric "$tmp/d2/metrics.jsonl" 1 3 && metric "$tmp/d2/metrics.jsonl" 3 3 validation_loss; } > "$tmp/d2.l"
close "$tmp/d2.l" "$tmp/d1.l"
check "cp=2 on a shard folder: losses, grad norms and validation loss equal 1 rank's" $?

# checkpoints across cp layouts: a cp=2 run that crashes in step 4 resumes from its step-3
# checkpoint on 1 rank, and a 1-rank step-3 checkpoint resumes as cp=2 x dp_shard=2 (local
# batch 1 per data-parallel rank: the same global batch); steps 4-6 equal the uninterrupted
# 1-rank run's within 1e-5
ck=(--training.steps=6 --checkpoint.enable=true --checkpoint.interval=3)
run "$tmp/f.log" "$CTITAN" "${common[@]}" "${ck[@]}" --job.dump_folder="$tmp/f"
check "uninterrupted 1-rank run with checkpoints" $?
metric "$tmp/f/metrics.jsonl" 4 6 > "$tmp/f.l"
"$L" 2 "$CTITAN" "${common[@]}" "${ck[@]}" --job.dump_folder="$tmp/s" \
  --parallelism.context_parallel_degree=2 --debug.fail_rank=1 --debug.fail_step=4 > "$tmp/s.log" 2>&1
[ -f "$tmp/s/checkpoint/step-00000003/manifest.json" ]; check "cp=2 saved step 3 before its crash" $?
resume_cp() { # name, saved run, ranks, args...
  local name=$1 src=$2 n=$3 d="$tmp/$1"
  shift 3
  mkdir -p "$d/checkpoint" && cp -r "$src/checkpoint/step-00000003" "$d/checkpoint/"
  run "$d.log" "$L" "$n" "$CTITAN" "${common[@]}" "${ck[@]}" --job.dump_folder="$d" \
    --checkpoint.interval=100 "$@" && grep -q "loaded step 3 " "$d.log"
  check "$name: resumed from step 3" $?
  metric "$d/metrics.jsonl" 4 6 > "$d.l" && close "$d.l" "$tmp/f.l"
  check "$name: steps 4-6 equal the uninterrupted run's within 1e-5" $?
}
resume_cp "cp=2 checkpoint on 1 rank" "$tmp/s" 1
resume_cp "1-rank checkpoint as cp=2 x dp_shard=2" "$tmp/f" 4 \
  --parallelism.context_parallel_degree=2 --training.local_batch_size=1

# the cp group in the flight recorder: a rank that replaces the cp group's third collective
# (a K/V all-gather) by a barrier is named by trace-comm
timeout 60 "$L" 2 "$CTITAN" "${common[@]}" --parallelism.context_parallel_degree=2 \
  --comm.timeout_seconds=5 --job.dump_folder="$tmp/skip" --debug.skip_collective_rank=1 \
  --debug.skip_collective_group=cp --debug.skip_collective_seq=3 > "$tmp/skip.log" 2>&1
"$CTITAN" trace-comm "$tmp/skip" 2>&1 |
  grep -q "^diagnosis: group cp seq 3: op mismatch: rank 0: all-gather .* vs rank 1: barrier"
check "a desynchronised cp rank: trace-comm names group cp and the K/V all-gather" $?

bad() { # name, ranks, expected message, args...
  local name=$1 n=$2 msg=$3
  shift 3
  "$L" "$n" "$CTITAN" "${common[@]}" --job.dump_folder="$tmp/bad" "$@" > "$tmp/err" 2>&1
  local rc=$?
  [ $rc -eq 2 ] && grep -q -- "$msg" "$tmp/err"
  local ok=$?  # before the message expands: $(...) resets $?
  check "$name: exit 2 naming it (got $rc: $(grep -m1 -i error "$tmp/err" | cut -c1-160))" $ok
}
bad "seq_len not divisible by 2 x cp" 2 \
  "training.seq_len = 62 is not divisible by 2 x cp = 4 (parallelism.context_parallel_degree = 2" \
  --parallelism.context_parallel_degree=2 --training.seq_len=62
bad "seq_len not divisible by cp" 4 "training.seq_len = 66 is not divisible by cp = 4" \
  --parallelism.context_parallel_degree=4 --parallelism.context_parallel_load_balancer=none \
  --training.seq_len=66
bad "cp not dividing the world" 3 "context_parallel_degree = 2 does not divide the world of 3" \
  --parallelism.context_parallel_degree=2
bad "cp x shard not the world" 4 "but the world has 4 (parallelism.context_parallel_degree = 2)" \
  --parallelism.context_parallel_degree=2 --parallelism.data_parallel_shard_degree=3
bad "cp x tp x shard not the world" 4 \
  "data_parallel_shard_degree 2 x context_parallel_degree 2 x tensor_parallel_degree 2 does not match the world of 4" \
  --parallelism.context_parallel_degree=2 --parallelism.tensor_parallel_degree=2 \
  --parallelism.data_parallel_shard_degree=2
bad "cp with hyena" 2 'not supported for model.name = "hyena"' \
  --parallelism.context_parallel_degree=2 --model.name=hyena --model.flavor=hyena-debug
bad "an unknown load balancer" 1 "context_parallel_load_balancer" \
  --parallelism.context_parallel_load_balancer=ptrr
bad "an unknown rotate method" 1 "context_parallel_rotate_method" \
  --parallelism.context_parallel_rotate_method=ring
# the plan's K/V bytes per step and rank: debugmodel (6 layers, 16 x 16 K/V columns), batch 8 x
# 256 tokens, fp32: K or V of the whole sequence 2 MiB, a rank sends (cp-1)/cp of it; allgather
# gathers K and V in forward and backward and reduce-scatters dK, dV (3 x 6 x 2 x 2 MiB / 2 =
# 36 MiB), a full recompute gathers again (48 MiB); the ring sends (cp-1) K/V shards in forward,
# (cp-1) K/V + cp dK/dV in backward (8 MiB a block: 48 MiB)
plan_cp() { # want, args...
  local want=$1
  shift
  "$CTITAN" plan "$ROOT/configs/debug.toml" --world-size 2 --comm.bandwidth_gbps=400 \
    --metrics.peak_tflops=989 --parallelism.context_parallel_degree=2 "$@" > "$tmp/plan" 2>&1
  [ $? -eq 0 ] && grep -q "context parallelism .*: $want MiB sent per step and rank" "$tmp/plan"
}
plan_cp 36.0
check "ctitan plan with cp=2 (allgather): 36 MiB of K/V per step and rank" $?
plan_cp 48.0 --activation_checkpoint.mode=full
check "ctitan plan with cp=2 and full checkpointing: 48 MiB (the recompute gathers again)" $?
plan_cp 48.0 --parallelism.context_parallel_rotate_method=alltoall
check "ctitan plan with cp=2 as a ring: 48 MiB" $?
grep -q "mesh: 2 ranks = 1 replicas x 1 shards (FSDP, reshard default) x 2 context-parallel" \
  "$tmp/plan"
check "ctitan plan with cp=2: FSDP's mesh names the cp ranks" $?
# pp=2 x cp=2, one sequence per micro-batch: a stage's 3 blocks gather K and V in forward
# (3 x 2 x 128 KiB over a 1 Gbit/s cp link: 6.3 ms) and gather and reduce-scatter in backward
"$CTITAN" plan "$ROOT/configs/debug.toml" --world-size 4 --comm.bandwidth_gbps=400 \
  --metrics.peak_tflops=989 --parallelism.pipeline_parallel_degree=2 \
  --parallelism.context_parallel_degree=2 --parallelism.tp_bandwidth_gbps=1 \
  --training.local_batch_size=1 > "$tmp/plan" 2>&1 &&
  grep -q "per stage and micro-batch: forward 6.3 ms, backward 12.6 ms" "$tmp/plan"
check "ctitan plan with pp=2 x cp=2: the stages' K/V transfers in their forward and backward" $?
plan_bad() { # what, message, args...
  local what=$1 msg=$2
  shift 2
  "$CTITAN" plan "$ROOT/configs/debug.toml" --world-size 2 --comm.bandwidth_gbps=400 \
    --metrics.peak_tflops=989 --parallelism.context_parallel_degree=2 "$@" > "$tmp/plan" 2>&1
  [ $? -eq 2 ] && grep -q "$msg" "$tmp/plan"
  check "ctitan plan with $what: exit 2 naming it" $?
}
plan_bad "cp=2 and a sequence of 250" "training.seq_len = 250 is not divisible by 4" \
  --training.seq_len=250
plan_bad "cp and hyena" 'context_parallel_degree = 2: not supported for model.name = "hyena"' \
  --model.name=hyena --model.flavor=hyena-debug
finish
