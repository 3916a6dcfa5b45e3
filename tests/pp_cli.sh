#!/usr/bin/env bash
# Pipeline parallelism through the CLI, on a shard dataset:
#  1. checkpoints reshard across pipeline layouts: a pp=2 (1F1B) run dies in step 4, its
#     step-3 checkpoint resumes on pp=2 (same layout), pp=1 (one rank), FSDP only
#     (dp_shard=2) and pp=4: steps 4-6 match an uninterrupted one-rank run within 1e-5, and
#     the data loader continues where it was (every sample trained on once:
#     debug.sample_log); the Hugging Face export of the pp=2 checkpoint equals the
#     one-rank run's within 1e-5;
#  2. traces: one Chrome trace per rank of the pipeline actions;
#  3. bad input exits 2 naming the key: an unknown schedule, layers that do not split, a
#     micro-batch count Interleaved1F1B cannot use, a micro-batch size that does not divide
#     the batch, a CSV with an unmatched send; ZB-H1 with async TP says why not (Hyena under PP: tests/hyena_cli.sh);
#     ZeroBubbleH1 and async TP on pp=2 x tp=2 equal the one-rank run, and pp=2 with bf16
#     parameters the one-rank bf16 run;
#  4. validation under PP (the forward-only pipeline schedule): pp=2 Interleaved1F1B and
#     pp=2 x tp=2 ZB-H1 log the one-rank run's validation losses within 1e-5, and train
#     bitwise as without validation (every step's loss and grad norm, the step-6 checkpoint);
#  5. `ctitan plan` with pp: 405B on 512 GPUs within 15% of TorchTitan's tokens/s per GPU for
#     1F1B and Interleaved1F1B (assumptions in the command), bubble and in-flight memory.
#   tests/pp_cli.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
LAUNCH="$ROOT/scripts/launch"
PY=/usr/bin/python3
token_shards "$tmp/data" 5 0.8 7 1 train_000000=30000 # tests/lib.sh
COMMON=(--training.dataset=mine --training.dataset_path="$tmp/data" --model.vocab_size=509
        --training.seq_len=32 --training.global_batch_size=4 --training.local_batch_size=1
        --training.steps=6 --lr_scheduler.warmup_steps=2 --metrics.peak_tflops=0.1
        --checkpoint.interval=3)
train() { # N DUMP_FOLDER args...
  local n=$1 dir=$2
  shift 2
  "$LAUNCH" "$n" "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" \
    --job.dump_folder="$dir" "$@" >> "$dir.log" 2>&1
}
losses() { $PY -c "
import json,sys
last={}
for l in open(sys.argv[1]):
    r=json.loads(l); last[r['step']]=r['loss']
print('\n'.join(repr(last[s]) for s in (4,5,6)))" "$1"; }
close() { $PY -c "
import sys
a=[float(x) for x in open(sys.argv[1])]; b=[float(x) for x in open(sys.argv[2])]
sys.exit(0 if len(a)==len(b)==3 and all(abs(x-y)<=1e-5*abs(y) for x,y in zip(a,b)) else 1)" "$1" "$2"; }
# every sample of steps 1-6 exactly once, over all ranks' logs (a pipeline's ranks log the
# same samples)
once() { $PY -c "
import glob,sys
seen={}
for f in glob.glob(sys.argv[1]+'.rank-*'):
    for l in open(f):
        s,x=map(int,l.split()); seen.setdefault(s,set()).add(x)
ok=sorted(seen)==[1,2,3,4,5,6] and all(len(v)==4 for v in seen.values())
ok=ok and len(set().union(*seen.values()))==24
sys.exit(0 if ok else 1)" "$1"; }

# 1. reshard
train 1 "$tmp/ref" --checkpoint.enable=true
losses "$tmp/ref/metrics.jsonl" > "$tmp/ref.l"
train 2 "$tmp/p2" --parallelism.pipeline_parallel_degree=2 --checkpoint.enable=true \
  --debug.fail_rank=1 --debug.fail_step=4 --debug.sample_log="$tmp/samples_p2"
[ -f "$tmp/p2/checkpoint/step-00000003/manifest.json" ]; check "pp=2 checkpoint of step 3 exists after the crash" $?
grep -q '"pp":[[:space:]]*2,' "$tmp/p2/checkpoint/step-00000003/manifest.json"; check "its manifest records pp=2" $?
for layout in "2 pp2" "1 pp1" "2 fsdp2" "4 pp4"; do
  set -- $layout
  n=$1 name=$2 d="$tmp/r_$2"
  mkdir -p "$d"; cp -r "$tmp/p2/checkpoint" "$d/"
  cp "$tmp/samples_p2.rank-0" "$tmp/samples_$name.rank-0"
  extra=()
  case $name in
    pp2) extra=(--parallelism.pipeline_parallel_degree=2) ;;
    pp4) extra=(--parallelism.pipeline_parallel_degree=4) ;;
  esac
  train "$n" "$d" --checkpoint.enable=true "${extra[@]}" --debug.sample_log="$tmp/samples_$name"
  rc=$?
  [ $rc -eq 0 ] && grep -q "loaded step 3" "$d.log"; check "pp=2 checkpoint resumes as $name" $?
  losses "$d/metrics.jsonl" > "$d.l" 2>/dev/null
  close "$d.l" "$tmp/ref.l"; check "$name: steps 4-6 match the uninterrupted one-rank run within 1e-5" $?
  # the samples of steps 1-3 (pp=2) + 4-6 (this layout, all its ranks) cover the data order
  once "$tmp/samples_$name"; check "$name: the data loader resumes (24 samples, each once)" $?
done

# Hugging Face export of the pp=2 checkpoint equals the one-rank run's (within 1e-5: the
# gradient norm for clipping is summed per stage, so the last bits may differ)
"$CTITAN" export "$tmp/p2/checkpoint/step-00000003" "$tmp/hf_p2" > /dev/null 2>&1 &&
  "$CTITAN" export "$tmp/ref/checkpoint/step-00000003" "$tmp/hf_ref" > /dev/null 2>&1 &&
  $PY - "$tmp/hf_p2/model.safetensors" "$tmp/hf_ref/model.safetensors" <<'PY'
import json, struct, sys
import numpy as np
def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                             dtype=np.float32) for k, v in h.items() if k != "__metadata__"}
a, b = load(sys.argv[1]), load(sys.argv[2])
ok = a.keys() == b.keys() and len(a) > 0
worst = max(float(np.linalg.norm(a[k] - b[k]) / max(np.linalg.norm(b[k]), 1e-30)) for k in a)
print(f"export: {len(a)} tensors, worst relative difference {worst:.2e}")
sys.exit(0 if ok and worst <= 1e-5 else 1)
PY
check "export of the pp=2 checkpoint equals the one-rank run's within 1e-5" $?

# 2. traces
train 2 "$tmp/tr" --parallelism.pipeline_parallel_degree=2 --training.steps=2 \
  --profiling.enable_profiling=true --profiling.profile_freq=2 \
  --parallelism.pipeline_parallel_schedule=GPipe
ok=0
for r in 0 1; do
  f="$tmp/tr/profile_trace/iteration_2/rank${r}_trace.json"
  $PY -c "
import json,sys
t=json.load(open(sys.argv[1]))['traceEvents']
import re
names=[e['name'] for e in t if e.get('ph')=='X']
f=[n for n in names if re.fullmatch(r'\dF\d+',n)]; b=[n for n in names if re.fullmatch(r'\dB\d+',n)]
# the stage transfers are schedule nodes: rank 0 sends activations and receives gradients,
# rank 1 the reverse, each transfer posted (p2p, its bytes) and completed by a WAIT node
r=int(sys.argv[2]); out,inn=('SEND_F','RECV_B') if r==0 else ('SEND_B','RECV_F')
x=[e for e in t if e.get('ph')=='X' and e['cat']=='p2p' and e['args'].get('bytes',0)>0]
sends=[e for e in x if re.fullmatch(r'\d'+out+r'\d+',e['name'])]
recvs=[e for e in x if re.fullmatch(r'\d'+inn+r'\d+',e['name'])]
waits=[n for n in names if re.fullmatch(r'WAIT \d('+out+'|'+inn+r')\d+',n)]
sys.exit(0 if len(f)==4 and len(b)==4 and len(sends)==4 and len(recvs)==4 and len(waits)==8 else 1)" "$f" $r || ok=1
done
check "GPipe traces: rank 0 and 1 each record 4 forwards, 4 backwards and their 8 transfers as nodes (posted, then waited)" $ok

# 3. bad input: exit 2 and the key named
bad() { # NAME PATTERN N args...
  local name=$1 pat=$2 n=$3
  shift 3
  "$LAUNCH" "$n" "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" \
    --job.dump_folder="$tmp/bad" "$@" > "$tmp/bad.log" 2>&1
  local rc=$?
  [ $rc -eq 2 ] && grep -q -- "$pat" "$tmp/bad.log"
  check "$name: exit 2 naming '$pat' (got $rc)" $?
}
bad "unknown schedule" "pipeline_parallel_schedule: unknown schedule 'LoopedDFS'" 2 \
  --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule=LoopedDFS
bad "layers that do not split" "pipeline_parallel_layers_per_stage" 2 \
  --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_layers_per_stage=3
bad "interleaved micro-batches" "pipeline_parallel_microbatch_size: Interleaved1F1B" 2 \
  --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule=Interleaved1F1B \
  --training.global_batch_size=3 --training.local_batch_size=3
bad "micro-batch size" "pipeline_parallel_microbatch_size: 3 does not divide" 2 \
  --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_microbatch_size=3
printf '0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1B0,1SEND_B0\n' > "$tmp/bad.csv"
bad "CSV with an unmatched send" "pipeline_parallel_schedule_csv.*unmatched send" 2 \
  --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule_csv="$tmp/bad.csv" \
  --training.global_batch_size=1
# ZB-H1 under TP: the split backward keeps TP's gathered activations for its W half
train 4 "$tmp/zbtp" --parallelism.pipeline_parallel_degree=2 \
  --parallelism.pipeline_parallel_schedule=ZeroBubbleH1 --parallelism.tensor_parallel_degree=2 &&
  losses "$tmp/zbtp/metrics.jsonl" > "$tmp/zbtp.l" && close "$tmp/zbtp.l" "$tmp/ref.l"
check "pp=2 x tp=2 ZeroBubbleH1: steps 4-6 equal the one-rank run within 1e-5" $?
# bf16 parameters under PP: the gathered stage weights rounded to bf16 values, as one rank's
train 1 "$tmp/refb" --training.mixed_precision_param=bfloat16 &&
  train 2 "$tmp/ppb" --parallelism.pipeline_parallel_degree=2 \
    --training.mixed_precision_param=bfloat16 &&
  losses "$tmp/refb/metrics.jsonl" > "$tmp/refb.l" && losses "$tmp/ppb/metrics.jsonl" > "$tmp/ppb.l" &&
  close "$tmp/ppb.l" "$tmp/refb.l"
check "pp=2 with bf16 parameters: steps 4-6 equal the one-rank bf16 run within 1e-5" $?
# async TP under PP: the stage models' TP collectives as ring steps
train 4 "$tmp/atp" --parallelism.pipeline_parallel_degree=2 --parallelism.tensor_parallel_degree=2 \
  --parallelism.enable_async_tensor_parallel=true &&
  losses "$tmp/atp/metrics.jsonl" > "$tmp/atp.l" && close "$tmp/atp.l" "$tmp/ref.l"
check "pp=2 x tp=2 with async TP: steps 4-6 equal the one-rank run within 1e-5" $?
bad "ZB-H1 with async TP" "ZeroBubbleH1 (split backward, I/W) with enable_async_tensor_parallel = true: not supported" 4 \
  --parallelism.pipeline_parallel_degree=2 --parallelism.tensor_parallel_degree=2 \
  --parallelism.enable_async_tensor_parallel=true --parallelism.pipeline_parallel_schedule=ZeroBubbleH1

# 4. validation under PP
token_shards "$tmp/dval" 5 0.8 7 1 train_000000=30000 val_000000=4000
VAL=(--training.dataset_path="$tmp/dval" --validation.enable=true --validation.freq=3
     --validation.steps=2 --checkpoint.enable=true --checkpoint.interval=6)
same_train() { $PY - "$1" "$2" <<'PY'
import json, os, sys
def run(d):
    m = {}
    for l in open(os.path.join(d, "metrics.jsonl")):
        r = json.loads(l); m.setdefault(r["step"], {}).update(r)
    ck = os.path.join(d, "checkpoint", "step-00000006")
    files = b"".join(open(os.path.join(ck, f), "rb").read()
                     for f in sorted(os.listdir(ck)) if f.endswith(".safetensors"))
    return [(m[s]["loss"], m[s]["grad_norm"]) for s in range(1, 7)], files
a, b = run(sys.argv[1]), run(sys.argv[2])
sys.exit(0 if a[0] == b[0] and a[1] == b[1] and a[1] else 1)
PY
}
close_val() { $PY - "$1" "$2" <<'PY'
import json, sys
def val(p):
    return {r["step"]: r["validation_loss"] for r in map(json.loads, open(p))
            if "validation_loss" in r}
a, b = val(sys.argv[1]), val(sys.argv[2])
print("validation", a, "one rank", b)
sys.exit(0 if sorted(a) == sorted(b) == [3, 6] and
         all(abs(a[s] - b[s]) <= 1e-5 * abs(b[s]) for s in a) else 1)
PY
}
train 1 "$tmp/v1" "${VAL[@]}"
for layout in "2 pp2i --parallelism.pipeline_parallel_schedule=Interleaved1F1B" \
              "4 pp2tp2zb --parallelism.pipeline_parallel_schedule=ZeroBubbleH1 --parallelism.tensor_parallel_degree=2"; do
  set -- $layout
  n=$1 name=$2
  shift 2
  train "$n" "$tmp/v_$name" "${VAL[@]}" --parallelism.pipeline_parallel_degree=2 "$@" &&
    close_val "$tmp/v_$name/metrics.jsonl" "$tmp/v1/metrics.jsonl"
  check "$name with validation: the validation losses of steps 3 and 6 equal one rank's within 1e-5" $?
  train "$n" "$tmp/n_$name" "${VAL[@]}" --validation.enable=false \
    --parallelism.pipeline_parallel_degree=2 "$@" && same_train "$tmp/v_$name" "$tmp/n_$name"
  check "$name: training with validation is bitwise the run without it (losses, norms, checkpoint)" $?
done

# 5. plan: Llama 3.1 405B on 512 H100s (FSDP 8 x TP 8 x PP 8, full AC, 8 sequences of 8192 per
# data-parallel rank in micro-batches of 1, compute at 0.64 of the bf16 peak) within 15% of
# TorchTitan's 100 (1F1B) and 128 (Interleaved1F1B) tokens/s per GPU
P405=(--world-size 512 --metrics.peak_tflops=989 --comm.bandwidth_gbps=400 --comm.latency_us=30
      --parallelism.pipeline_parallel_degree=8 --parallelism.tensor_parallel_degree=8
      --parallelism.data_parallel_shard_degree=8 --training.local_batch_size=8
      --activation_checkpoint.mode=full --training.mixed_precision_param=bfloat16
      --plan.compute_efficiency=0.64)
for want in "1F1B 100" "Interleaved1F1B 128"; do
  set -- $want
  "$CTITAN" plan "$ROOT/configs/405b.toml" "${P405[@]}" --parallelism.pipeline_parallel_schedule=$1 \
    > "$tmp/plan_$1.txt" 2>&1
  got=$(sed -n 's/^throughput *\([0-9]*\) tokens.*/\1/p' "$tmp/plan_$1.txt")
  $PY -c "import sys; g=float(sys.argv[1] or 0); sys.exit(0 if abs(g-$2)<=0.15*$2 else 1)" "$got"
  check "plan 405B/512 $1: $got tokens/s per GPU, TorchTitan $2 (within 15%)" $?
done
grep -q "in-flight activations    8 micro-batches on rank 0" "$tmp/plan_1F1B.txt" && \
  grep -q "bubble fraction" "$tmp/plan_1F1B.txt"; check "plan prints bubble and in-flight memory (1F1B: p on rank 0)" $?
"$CTITAN" plan "$ROOT/configs/405b.toml" "${P405[@]}" --parallelism.pipeline_parallel_schedule=Nope \
  > "$tmp/plan_bad.txt" 2>&1
[ $? -eq 2 ] && grep -q "pipeline_parallel_schedule: unknown schedule 'Nope'" "$tmp/plan_bad.txt"
check "plan with an unknown schedule: exit 2, named" $?
finish
