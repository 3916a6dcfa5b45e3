#!/usr/bin/env bash
# The mixture of experts through the CLI (`[model] name = "deepseek_v3"`, configs/moe-debug.toml):
#  - one rank trains on synthetic data, the loss falls, every record has the expert load
#    (moe_load_max_mean >= 1, per layer) and the console line shows it;
#  - FSDP on 2 ranks: the same global batch gives the 1-rank losses, grad norms and loads
#    (the tokens per expert are summed over the ranks before the bias update);
#  - ctitan plot draws balance.png;
#  - refusals with exit 2: TP, PP, activation checkpointing, float8, checkpoints while the
#    balancing bias is on, ctitan plan (no cost model), a llama3 flavor.
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
check "loss falls, loads >= 1 per layer, the bias moves ($(head -1 "$tmp/a.l" | cut -d' ' -f1) -> $(tail -1 "$tmp/a.l" | cut -d' ' -f1))" $?

# 2. FSDP on 2 ranks
"$LAUNCH" 2 "$CTITAN" train "$CFG" "${COMMON[@]}" --job.dump_folder="$tmp/b" > "$tmp/b.log" 2>&1
check "2 ranks (FSDP) train (exit 0)" $?
metric "$tmp/b/metrics.jsonl" 1 6 loss grad_norm moe_load_max_mean "moe_load_max_mean/layer.1" \
  moe_bias_absmax > "$tmp/b.l"
close "$tmp/b.l" "$tmp/a.l"; check "FSDP losses, grad norms, loads and bias equal 1 rank's within 1e-5" $?

# 3. the balance plot
"$CTITAN" plot "$tmp/a" --out "$tmp/plots" > "$tmp/plot.log" 2>&1 &&
  head -c 4 "$tmp/plots/balance.png" | grep -q PNG
check "ctitan plot draws balance.png" $?

# 4. refusals
for bad in --activation_checkpoint.mode=full --checkpoint.enable=true \
           --model.converters=float8 --model.flavor=debugmodel --model.moe_top_k=9; do
  "$CTITAN" train "$CFG" "${COMMON[@]}" "$bad" --job.dump_folder="$tmp/f" > "$tmp/f.log" 2>&1
  rc=$?
  [ $rc -eq 2 ]; check "$bad refused (exit $rc: $(grep -m1 error "$tmp/f.log" | cut -c1-110))" $?
done
for bad in --parallelism.tensor_parallel_degree=2 --parallelism.pipeline_parallel_degree=2; do
  "$LAUNCH" 2 "$CTITAN" train "$CFG" "${COMMON[@]}" "$bad" --job.dump_folder="$tmp/f" \
    > "$tmp/f.log" 2>&1
  rc=$?
  [ $rc -eq 2 ] && grep -q "not supported\|not yet supported" "$tmp/f.log"
  check "$bad refused (exit $rc)" $?
done
"$CTITAN" plan "$CFG" --model.flavor=deepseek_v3-16B --world-size 8 --metrics.peak_tflops=989 \
  --comm.bandwidth_gbps=400 > "$tmp/p.log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "no cost model" "$tmp/p.log"; check "plan: no cost model yet, exit $rc" $?
finish
