#!/usr/bin/env bash
# Hyena through the CLI (`[model] name = "hyena"`):
#  - one rank: trains on synthetic data and the loss falls;
#  - FSDP on 2 ranks: the same global batch gives the 1-rank losses and grad norms within 1e-5;
#  - 2 pipeline stages (1F1B) with full activation checkpointing equal 1 rank too;
#  - a checkpoint saved on 2 ranks resumes on 1 (the manifest names the family), and the
#    resumed steps equal the uninterrupted run's;
#  - a Llama run refuses a Hyena checkpoint (naming the family), and export refuses Hyena
#    with "not supported (the family has no ...)" (exit 2); bad hyena keys are usage errors (exit 2).
#   tests/hyena_cli.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
LAUNCH="$ROOT/scripts/launch"
COMMON=(--model.name=hyena --model.flavor=hyena-debug --model.vocab_size=509
        --training.steps=6 --training.seq_len=32 --training.global_batch_size=8
        --training.local_batch_size=2 --lr_scheduler.warmup_steps=2 --optimizer.lr=3e-3
        --metrics.peak_tflops=0.1 --checkpoint.interval=3)
# 1. one rank
"$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --job.dump_folder="$tmp/a" \
  > "$tmp/a.log" 2>&1
check "1 rank trains (exit 0)" $?
grep -q "model hyena hyena-debug" "$tmp/a.log"; check "log names the hyena model" $?
metric "$tmp/a/metrics.jsonl" 1 6 > "$tmp/a.l"
/usr/bin/python3 -c "
import sys
l=[float(x.split()[0]) for x in open(sys.argv[1])]; sys.exit(0 if len(l) == 6 and l[-1] < l[0] - 0.05 else 1)" "$tmp/a.l"
check "loss falls over 6 steps ($(head -1 "$tmp/a.l" | cut -d' ' -f1) -> $(tail -1 "$tmp/a.l" | cut -d' ' -f1))" $?

# 2. FSDP on 2 ranks, with checkpoints
"$LAUNCH" 2 "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" \
  --job.dump_folder="$tmp/b" --checkpoint.enable=true > "$tmp/b.log" 2>&1
check "2 ranks (FSDP) train (exit 0)" $?
metric "$tmp/b/metrics.jsonl" 1 6 > "$tmp/b.l"
close "$tmp/b.l" "$tmp/a.l"; check "FSDP losses and grad_norms equal 1-rank ones within 1e-5" $?
grep -q '"name":[[:space:]]*"hyena"' "$tmp/b/checkpoint/step-00000006/manifest.json"
check "manifest names the family" $?

# 3. resume the 2-rank checkpoint of step 3 on 1 rank
rm -rf "$tmp/b/checkpoint/step-00000006"
echo 3 > "$tmp/b/checkpoint/latest"
run "$tmp/c.log" "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --job.dump_folder="$tmp/b" \
  --checkpoint.enable=true && grep -q "loaded step 3" "$tmp/c.log"
check "1 rank resumes the 2-rank checkpoint (exit 0)" $?
metric "$tmp/b/metrics.jsonl" 4 6 > "$tmp/c.l"
metric "$tmp/a/metrics.jsonl" 4 6 > "$tmp/a4.l"
close "$tmp/c.l" "$tmp/a4.l"; check "resumed steps 4-6 (loss, grad_norm) equal the uninterrupted run's" $?

# 3b. pipeline parallelism (the tied head: the embedding travels to the last stage and its
# gradient back), with full activation checkpointing: 1-rank losses and grad norms
"$LAUNCH" 2 "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" \
  --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule=1F1B \
  --activation_checkpoint.mode=full --job.dump_folder="$tmp/p" > "$tmp/p.log" 2>&1
check "2 pipeline stages (1F1B, full AC) train (exit 0)" $?
metric "$tmp/p/metrics.jsonl" 1 6 > "$tmp/p.l"
close "$tmp/p.l" "$tmp/a.l"; check "PP losses and grad_norms equal 1-rank ones within 1e-5" $?

# 4. refusals
"$CTITAN" train "$ROOT/configs/debug.toml" --training.steps=1 --training.seq_len=32 \
  --training.local_batch_size=2 --model.vocab_size=509 --metrics.peak_tflops=0.1 \
  --job.dump_folder="$tmp/b" --checkpoint.enable=true > "$tmp/d.log" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "holds a hyena model, not llama3" "$tmp/d.log"
check "a llama run refuses the hyena checkpoint (exit $rc)" $?
"$CTITAN" export "$tmp/b/checkpoint" "$tmp/exp" > "$tmp/e.log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "not supported (the family has no Hugging" "$tmp/e.log"; check "export: not supported, saying why, exit 2" $?
for bad in --model.hyena_emb_dim=4 --model.hyena_order=1 --model.flavor=debugmodel \
           --model.hyena_l_max=16; do
  "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" "$bad" \
    --job.dump_folder="$tmp/f" > "$tmp/f.log" 2>&1
  rc=$?
  [ $rc -eq 2 ]; check "$bad is a usage error (exit $rc: $(grep -m1 error "$tmp/f.log"))" $?
done
finish
