#!/usr/bin/env bash
# The mixture of experts through the CLI (`[model] name = "deepseek_v3"`, configs/moe-debug.toml):
#  - one rank trains on synthetic data, the loss falls, every record has the expert load
#    (moe_load_max_mean >= 1, per layer) and the console line shows it;
#  - FSDP on 2 ranks: the same global batch gives the 1-rank losses, grad norms and loads
#    (the tokens per expert are summed over the ranks before the bias update);
#  - expert parallelism: ep=2 on 2 ranks, ep=2 inside dp_shard=4 and ep=4 on 4 ranks give the
#    1-rank losses, grad norms, loads and bias (6 steps, 1e-5); refusals (exit 2, the reason
#    named): a family without experts, ep not dividing dp_shard, ep not dividing the experts,
#    ep with tp / cp;
#  - the cost model in a run: ep=2 with comm.buckets = "auto", a memory budget and profiling
#    prices the all-to-alls and gives the 1-rank losses;
#  - checkpoints reshard between ep layouts, with the balancing bias on (a coefficient that
#    moves the routing within 3 steps; the checkpoint holds the bias in model_state.bin): a
#    step-3 checkpoint saved at ep=2 holds the experts in the global layout and resumes on 1
#    rank, one saved on 1 rank resumes at ep=2, both within 1e-5 of the uninterrupted runs;
#  - activation checkpointing: ep=2 on 2 ranks with mode full (the recompute re-runs the
#    dispatch and combine, counts no token twice) and one rank with selective give the 1-rank
#    losses, grad norms, loads and bias, and their own layout's without checkpointing bitwise;
#  - pipeline stages: pp=2 with GPipe, 1F1B, Interleaved1F1B (4 stages of one block:
#    pipeline_parallel_first/last_stage_less_layers 0) and ZB-H1, and pp=2 x dp_shard=2 with
#    ep=2 (4 ranks; 1F1B and Interleaved1F1B) give the 1-rank losses, grad norms, loads
#    (every layer's, from both stages) and bias within 1e-5, and after 6 steps its parameters
#    (every tensor, 1e-5 of its norm) and balancing bias (model_state.bin, 1e-12); checkpoints
#    with the bias on reshard between pp layouts: a pp=2 step-3 checkpoint resumes on 1 rank,
#    a 1-rank one at pp=2 x ep=2, both within 1e-5 of the uninterrupted runs;
#  - ctitan plot draws balance.png;
#  - refusals with exit 2: TP, a llama3 flavor; ctitan plan runs for the
#    family (its cost model), refuses ep not dividing dp_shard and ep for a family
#    without experts.
#   tests/moe_cli.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
LAUNCH="$ROOT/scripts/launch"
COMMON=(--training.dataset=synthetic --model.tokenizer_path= --model.vocab_size=509
        --training.steps=6 --training.seq_len=32 --training.global_batch_size=8
        --training.local_batch_size=2 --lr_scheduler.warmup_steps=2 --optimizer.lr=3e-3
        --metrics.log_freq=1 --metrics.peak_tflops=0.1 --model.moe_load_balance_coeff=0.01)
CFG="$ROOT/configs/moe-debug.toml"
# 1. one rank
"$CTITAN" train "$CFG" "${COMMON[@]}" --job.dump_folder="$tmp/a" > "$tmp/a.log" 2>&1
check "1 rank trains (exit 0)" $?
grep -q "model deepseek_v3 deepseek_v3-debug" "$tmp/a.log"; check "log names the MoE model" $?
grep -q "moe_load_max_mean: [0-9]" "$tmp/a.log"; check "console line shows the expert load" $?
metric "$tmp/a/metrics.jsonl" 1 6 loss grad_norm moe_load_max_mean "moe_load_max_mean/layer.1" \
  moe_bias_absmax > "$tmp/a.l"
/usr/bin/python3 -c "
import sys
r=[[float(v) for v in x.split()] for x in open(sys.argv[1])]
ok = len(r) == 6 and r[-1][0] < r[0][0] - 0.05 and all(x[2] >= 1 and x[3] >= 1 for x in r)
sys.exit(0 if ok and r[-1][4] > 0 else 1)" "$tmp/a.l"
ok=$? # before the message's command substitutions, which set $?
check "loss falls, loads >= 1 per layer, the bias moves ($(head -1 "$tmp/a.l" | cut -d' ' -f1) -> $(tail -1 "$tmp/a.l" | cut -d' ' -f1))" $ok
# the load over the last steps (moe_load_max_mean_w100): one step's at step 1, then a sum of
# counts, so between 1 and the per-step worst of the steps it holds
/usr/bin/python3 -c "
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
w = [x['moe_load_max_mean_w100'] for x in r]
ok = len(r) == 6 and abs(w[0] - r[0]['moe_load_max_mean']) < 1e-12
ok = ok and all(1 <= w[i] <= max(x['moe_load_max_mean'] for x in r[:i + 1]) + 1e-12
                for i in range(6))
sys.exit(0 if ok else 1)" "$tmp/a/metrics.jsonl"
check "the load over the window: step 1's at step 1, then between 1 and the steps' worst" $?

# 2. FSDP on 2 ranks
"$LAUNCH" 2 "$CTITAN" train "$CFG" "${COMMON[@]}" --job.dump_folder="$tmp/b" > "$tmp/b.log" 2>&1
check "2 ranks (FSDP) train (exit 0)" $?
metric "$tmp/b/metrics.jsonl" 1 6 loss grad_norm moe_load_max_mean "moe_load_max_mean/layer.1" \
  moe_bias_absmax > "$tmp/b.l"
close "$tmp/b.l" "$tmp/a.l"; check "FSDP losses, grad norms, loads and bias equal 1 rank's within 1e-5" $?

# 2b. expert parallelism through the CLI
for ep in "2 2" "4 2" "4 4"; do
  set -- $ep
  "$LAUNCH" "$1" "$CTITAN" train "$CFG" "${COMMON[@]}" --parallelism.expert_parallel_degree="$2" \
    --job.dump_folder="$tmp/e$1" > "$tmp/e$1.log" 2>&1
  check "$1 ranks, expert_parallel_degree $2 train (exit $?)" $?
  grep -q "expert parallelism: $2 ranks share" "$tmp/e$1.log"; check "log states the ep layout" $?
  # the rows each ep rank's experts took: every step's (token, slot) rows of all 3 MoE layers
  # (global batch 8 x seq 32 x top-2 x 3 = 1,536), split over the ep ranks
  /usr/bin/python3 -c "
import json, sys
ep = int(sys.argv[2])
r = [json.loads(l) for l in open(sys.argv[1])]
rows = [[x['moe_ep_rows/rank.%d' % k] for k in range(ep)] for x in r]
ok = len(r) == 6 and all(sum(v) == 1536 and min(v) > 0 for v in rows)
ok = ok and all(abs(x['moe_ep_rows_max_mean'] - max(v) / (sum(v) / ep)) < 1e-12
                for x, v in zip(r, rows))
sys.exit(0 if ok else 1)" "$tmp/e$1/metrics.jsonl" "$2"
  check "rows per ep rank: 1,536 a step over $2 ranks, and their max/mean" $?
  metric "$tmp/e$1/metrics.jsonl" 1 6 loss grad_norm moe_load_max_mean \
    "moe_load_max_mean/layer.1" moe_bias_absmax > "$tmp/e$1.l"
  close "$tmp/e$1.l" "$tmp/a.l"; check "ep $2 on $1 ranks: losses, grad norms, loads and bias equal 1 rank's within 1e-5" $?
done
# the cost model in a run (model/moe/moe_cost.c): ep 2 with automatic buckets, a memory
# budget and profiling; the plan does not change the numbers
"$LAUNCH" 2 "$CTITAN" train "$CFG" "${COMMON[@]}" --parallelism.expert_parallel_degree=2 \
  --comm.buckets=auto --comm.memory_budget_gb=1 --profiling.enable_profiling=true \
  --profiling.profile_freq=3 --job.dump_folder="$tmp/eauto" > "$tmp/eauto.log" 2>&1 &&
  grep -q "cost model: expert-parallel all-to-alls .* (30 of them" "$tmp/eauto.log" &&
  grep -q "cost model vs this step" "$tmp/eauto.log"
check "ep 2 with comm.buckets = auto, a memory budget and profiling (the all-to-alls priced)" $?
metric "$tmp/eauto/metrics.jsonl" 1 6 loss grad_norm moe_load_max_mean \
  "moe_load_max_mean/layer.1" moe_bias_absmax > "$tmp/eauto.l"
close "$tmp/eauto.l" "$tmp/a.l"; check "ep 2, automatic buckets: the 1-rank losses within 1e-5" $?
refuse() { # N REASON_REGEX ARGS...: exit 2 and the reason in the log
  local n=$1 why=$2
  shift 2
  "$LAUNCH" "$n" "$CTITAN" train "$CFG" "${COMMON[@]}" "$@" --job.dump_folder="$tmp/f" \
    > "$tmp/f.log" 2>&1
  local rc=$?
  [ $rc -eq 2 ] && grep -q "$why" "$tmp/f.log"
  local ok=$?
  check "$* refused on $n ranks (exit $rc: $(grep -m1 -o 'expert_parallel_degree.*' "$tmp/f.log" | cut -c1-100))" $ok
}
"$LAUNCH" 2 "$CTITAN" train "$ROOT/configs/debug.toml" --training.dataset=synthetic \
  --model.tokenizer_path= --parallelism.expert_parallel_degree=2 --job.dump_folder="$tmp/f" \
  > "$tmp/f.log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "is not supported with model.name = \"llama3\": the family has no routed" "$tmp/f.log"
ok=$?
check "ep with llama3 refused (exit $rc: $(grep -m1 -o 'expert_parallel_degree.*' "$tmp/f.log" | cut -c1-100))" $ok
refuse 2 "does not divide data_parallel_shard_degree" --parallelism.expert_parallel_degree=3
refuse 2 "does not divide model.moe_n_routed_experts" --parallelism.expert_parallel_degree=2 \
  --model.moe_n_routed_experts=9
refuse 4 "not supported with parallelism.tensor_parallel_degree" \
  --parallelism.expert_parallel_degree=2 --parallelism.tensor_parallel_degree=2
refuse 4 "not supported with parallelism.context_parallel_degree" \
  --parallelism.expert_parallel_degree=2 --parallelism.context_parallel_degree=2

# 2b'. activation checkpointing: the same run, recomputed
for ac in "2 2 full" "1 1 selective"; do
  set -- $ac
  "$LAUNCH" "$1" "$CTITAN" train "$CFG" "${COMMON[@]}" --parallelism.expert_parallel_degree="$2" \
    --activation_checkpoint.mode="$3" --job.dump_folder="$tmp/ac$3" > "$tmp/ac$3.log" 2>&1
  check "$1 ranks, ep $2, activation_checkpoint.mode=$3 train (exit $?)" $?
  metric "$tmp/ac$3/metrics.jsonl" 1 6 loss grad_norm moe_load_max_mean \
    "moe_load_max_mean/layer.1" moe_bias_absmax > "$tmp/ac$3.l"
  close "$tmp/ac$3.l" "$tmp/a.l"; check "ep $2 on $1 ranks, mode $3: losses, grad norms, loads and bias equal 1 rank's (mode none) within 1e-5" $?
done
cmp -s "$tmp/acfull.l" "$tmp/e2.l"
check "ep 2 on 2 ranks: mode full's losses, grad norms, loads and bias are mode none's, bitwise" $?
cmp -s "$tmp/acselective.l" "$tmp/a.l"
check "1 rank: mode selective's losses, grad norms, loads and bias are mode none's, bitwise" $?

# 2c. checkpoints reshard between ep layouts, the balancing bias on (and held)
CK=(--model.moe_load_balance_coeff=0.02 --checkpoint.enable=true --checkpoint.interval=3)
"$LAUNCH" 2 "$CTITAN" train "$CFG" "${COMMON[@]}" "${CK[@]}" \
  --parallelism.expert_parallel_degree=2 --job.dump_folder="$tmp/c2" > "$tmp/c2.log" 2>&1
check "ep=2 run with checkpoints (exit $?)" $?
"$CTITAN" train "$CFG" "${COMMON[@]}" "${CK[@]}" --job.dump_folder="$tmp/c1" > "$tmp/c1.log" 2>&1
check "1-rank run with checkpoints (exit $?)" $?
/usr/bin/python3 -c "
import json, sys
m = json.load(open(sys.argv[1]))
t = m['tensors']['layers.1.moe.experts.w1']
rows = sorted(tuple(p['rows']) for p in t['pieces'])
assert t['shape'][0] == 8 * 128 and rows == [(0, 512), (512, 1024)], (t['shape'], rows)" \
  "$tmp/c2/checkpoint/step-00000003/manifest.json"
check "ep=2 checkpoint: the experts in the global layout (8 x 128 rows of w1, one piece per ep rank)" $?
metric "$tmp/c2/metrics.jsonl" 4 6 > "$tmp/c2.l"
metric "$tmp/c1/metrics.jsonl" 4 6 > "$tmp/c1.l"
for r in "c2 1 1" "c1 2 2"; do
  set -- $r
  d="$tmp/r$1"
  mkdir -p "$d/checkpoint" && cp -r "$tmp/$1/checkpoint/step-00000003" "$d/checkpoint/"
  "$LAUNCH" "$2" "$CTITAN" train "$CFG" "${COMMON[@]}" "${CK[@]}" --checkpoint.interval=100 \
    --parallelism.expert_parallel_degree="$3" --job.dump_folder="$d" > "$d.log" 2>&1 &&
    grep -q "loaded step 3 " "$d.log"
  check "checkpoint of $1 resumed on $2 ranks at ep=$3 (exit 0, loaded step 3)" $?
  metric "$d/metrics.jsonl" 4 6 > "$d.l"
  close "$d.l" "$tmp/$1.l"; check "resumed steps 4-6 within 1e-5 of the uninterrupted run" $?
done

# a corrupted model_state.bin (the bias) is refused, naming it
d="$tmp/rbad"
mkdir -p "$d/checkpoint" && cp -r "$tmp/c1/checkpoint/step-00000003" "$d/checkpoint/" &&
  printf '\x01' | dd of="$d/checkpoint/step-00000003/model_state.bin" bs=1 seek=3 conv=notrunc 2>/dev/null
"$CTITAN" train "$CFG" "${COMMON[@]}" "${CK[@]}" --checkpoint.interval=100 \
  --job.dump_folder="$d" > "$d.log" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "model_state.bin' is missing or does not match" "$d.log"
check "a corrupted model_state.bin is refused, naming it (exit $rc)" $?

# 2d. pipeline stages (each stage its own layers' bias and counts; the bias whole on every
# rank), alone and with expert parallelism inside dp_shard, against one rank
PP=(--parallelism.pipeline_parallel_degree=2)
ONE=(--parallelism.pipeline_parallel_first_stage_less_layers=0
     --parallelism.pipeline_parallel_last_stage_less_layers=0)
EP2=(--parallelism.data_parallel_shard_degree=2 --parallelism.expert_parallel_degree=2)
CK6=(--checkpoint.enable=true --checkpoint.interval=3 --checkpoint.async_mode=disabled)
"$CTITAN" train "$CFG" "${COMMON[@]}" "${CK6[@]}" --job.dump_folder="$tmp/pa" > "$tmp/pa.log" 2>&1
check "1-rank run with checkpoints at steps 3 and 6 (exit $?)" $?
# params_close A B: every tensor of checkpoint A within 1e-5 of B's (L2, relative to B's
# norm) and their balancing bias (model_state.bin) within 1e-12
params_close() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, os, struct, sys
import numpy as np
def load(ck):
    man = json.load(open(os.path.join(ck, "manifest.json")))
    out, files = {}, {}
    for name, t in man["tensors"].items():
        if name.endswith(".exp_avg") or name.endswith(".exp_avg_sq"):
            continue
        a = np.zeros(t["shape"], dtype=np.float32)
        for p in t["pieces"]:
            if p["file"] not in files:
                raw = open(os.path.join(ck, p["file"]), "rb").read()
                n = struct.unpack("<Q", raw[:8])[0]
                files[p["file"]] = (json.loads(raw[8:8 + n]), raw, 8 + n)
            head, raw, base = files[p["file"]]
            lo, hi = head[name]["data_offsets"]
            v = np.frombuffer(raw[base + lo:base + hi], dtype=np.float32).reshape(head[name]["shape"])
            r0, r1 = p["rows"]
            a[r0:r1] = v
        out[name] = a
    bias = np.fromfile(os.path.join(ck, "model_state.bin"), dtype=np.float64)
    return out, bias
(a, ba), (b, bb) = load(sys.argv[1]), load(sys.argv[2])
worst = max(float(np.linalg.norm(a[k] - b[k]) / max(np.linalg.norm(b[k]), 1e-30)) for k in b)
bd = float(np.abs(ba - bb).max()) if ba.shape == bb.shape else 1.0
ok = set(a) == set(b) and worst <= 1e-5 and bd <= 1e-12 and np.abs(bb).max() > 0
print(f"{worst:.2e} (bias {bd:.1e})")
sys.exit(0 if ok else 1)
PY
}
metric "$tmp/pa/metrics.jsonl" 1 6 loss grad_norm moe_load_max_mean "moe_load_max_mean/layer.1" \
  "moe_load_max_mean/layer.3" moe_bias_absmax > "$tmp/pa.l"
for run in "2 GPipe" "2 1F1B" "2 Interleaved1F1B one" "2 ZBH1" "4 1F1B ep" \
           "4 Interleaved1F1B one ep"; do
  set -- $run
  n=$1 sch=$2
  extra=()
  case "$run" in *one*) extra+=("${ONE[@]}") ;; esac
  case "$run" in *ep) extra+=("${EP2[@]}") ;; esac
  d="$tmp/pp$n$sch"
  "$LAUNCH" "$n" "$CTITAN" train "$CFG" "${COMMON[@]}" "${CK6[@]}" "${PP[@]}" \
    --parallelism.pipeline_parallel_schedule="$sch" "${extra[@]}" --job.dump_folder="$d" \
    > "$d.log" 2>&1
  check "$n ranks, pp=2 $sch ${extra[*]} train (exit $?)" $?
  metric "$d/metrics.jsonl" 1 6 loss grad_norm moe_load_max_mean "moe_load_max_mean/layer.1" \
    "moe_load_max_mean/layer.3" moe_bias_absmax > "$d.l"
  close "$d.l" "$tmp/pa.l"; check "pp=2 $sch on $n ranks: losses, grad norms, loads (both stages' layers) and bias equal 1 rank's within 1e-5" $?
  why=$(params_close "$d/checkpoint/step-00000006" "$tmp/pa/checkpoint/step-00000006")
  check "pp=2 $sch on $n ranks: step-6 parameters and bias equal 1 rank's (worst tensor $why)" $?
done
# resume across pp layouts with the bias on (coefficient 0.02, as tests/compose.py)
CKB=(--model.moe_load_balance_coeff=0.02 "${CK6[@]}")
"$LAUNCH" 2 "$CTITAN" train "$CFG" "${COMMON[@]}" "${CKB[@]}" "${PP[@]}" \
  --parallelism.pipeline_parallel_schedule=1F1B --job.dump_folder="$tmp/cp2" > "$tmp/cp2.log" 2>&1
check "pp=2 run with checkpoints, bias coefficient 0.02 (exit $?)" $?
metric "$tmp/cp2/metrics.jsonl" 4 6 loss grad_norm moe_bias_absmax > "$tmp/cp2.l"
metric "$tmp/c1/metrics.jsonl" 4 6 loss grad_norm moe_bias_absmax > "$tmp/c1b.l"
close "$tmp/cp2.l" "$tmp/c1b.l"; check "pp=2 with coefficient 0.02: steps 4-6 equal 1 rank's" $?
for r in "cp2 1 --" "c1 4 ep"; do
  set -- $r
  d="$tmp/rp$1"
  lay=()
  [ "$3" = ep ] && lay=("${PP[@]}" "${EP2[@]}")
  mkdir -p "$d/checkpoint" && cp -r "$tmp/$1/checkpoint/step-00000003" "$d/checkpoint/"
  "$LAUNCH" "$2" "$CTITAN" train "$CFG" "${COMMON[@]}" "${CKB[@]}" --checkpoint.interval=100 \
    "${lay[@]}" --job.dump_folder="$d" > "$d.log" 2>&1 && grep -q "loaded step 3 " "$d.log"
  check "checkpoint of $1 resumed on $2 ranks ${lay[*]} (exit 0, loaded step 3)" $?
  metric "$d/metrics.jsonl" 4 6 loss grad_norm moe_bias_absmax > "$d.l"
  close "$d.l" "$tmp/c1b.l"; check "resumed steps 4-6 (losses, grad norms, bias) within 1e-5 of the uninterrupted run" $?
done

# 3. the balance plot
"$CTITAN" plot "$tmp/a" --out "$tmp/plots" > "$tmp/plot.log" 2>&1 &&
  head -c 4 "$tmp/plots/balance.png" | grep -q PNG
check "ctitan plot draws balance.png" $?

# 4. refusals
for bad in --model.flavor=debugmodel --model.moe_top_k=9; do
  "$CTITAN" train "$CFG" "${COMMON[@]}" "$bad" --job.dump_folder="$tmp/f" > "$tmp/f.log" 2>&1
  rc=$?
  [ $rc -eq 2 ]
  ok=$?
  check "$bad refused (exit $rc: $(grep -m1 error "$tmp/f.log" | cut -c1-110))" $ok
done
for bad in --parallelism.tensor_parallel_degree=2; do
  "$LAUNCH" 2 "$CTITAN" train "$CFG" "${COMMON[@]}" "$bad" --job.dump_folder="$tmp/f" \
    > "$tmp/f.log" 2>&1
  rc=$?
  [ $rc -eq 2 ] && grep -q "not supported\|not yet supported" "$tmp/f.log"
  check "$bad refused (exit $rc)" $?
done
"$CTITAN" plan "$CFG" --model.flavor=deepseek_v3-16B --world-size 8 --metrics.peak_tflops=989 \
  --comm.bandwidth_gbps=400 > "$tmp/p.log" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "predicted step time  *[0-9.]* s" "$tmp/p.log"
check "plan: deepseek_v3-16B on 8 ranks (the family's cost model), exit $rc" $?
"$CTITAN" plan "$CFG" --world-size 4 --metrics.peak_tflops=989 --comm.bandwidth_gbps=400 \
  --model.converters=float8 > "$tmp/p.log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "model.converters = float8 with model.name = \"deepseek_v3\": not modelled" \
  "$tmp/p.log"
check "plan: float8 for the MoE family refused with its reason (training runs it), exit $rc" $?
"$CTITAN" plan "$CFG" --world-size 4 --metrics.peak_tflops=989 --comm.bandwidth_gbps=400 \
  --parallelism.expert_parallel_degree=3 > "$tmp/p.log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "expert_parallel_degree = 3 does not divide" "$tmp/p.log"
check "plan: ep not dividing dp_shard refused, exit $rc" $?
"$CTITAN" plan "$ROOT/configs/debug.toml" --world-size 4 --metrics.peak_tflops=989 \
  --comm.bandwidth_gbps=400 --parallelism.expert_parallel_degree=2 > "$tmp/p.log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "expert_parallel_degree = 2 is not supported" "$tmp/p.log"
check "plan: expert parallelism of a family without experts refused, exit $rc" $?
finish
