#!/usr/bin/env bash
# Checkpoints across tensor-parallel layouts, on a shard dataset (the data loader's position
# travels with the checkpoint) with an odd vocabulary (509: the last TP piece of the embedding
# and output is zero-padded, and the padding is never saved):
#  1. a tp=2 x dp_shard=2 run crashes in step 4 and resumes from its step-3 checkpoint on 4
#     ranks as dp_shard=4, on 4 as tp=4, and on 1 rank;
#  2. the reverse: step-3 checkpoints saved as dp_shard=4, tp=4 and 1 rank resume as
#     tp=2 x dp_shard=2;
#     each resumed run's steps 4-6 (loss, grad_norm) within 1e-5 of the uninterrupted
#     tp=2 x dp_shard=2 run, and every sample of the data order trained exactly once
#     (debug.sample_log);
#     a manifest whose column pieces overlap is named and refused;
#  3. `ctitan export` of the tp=2 x dp_shard=2 checkpoint gives, through an HF-style forward,
#     the reference model's logits on the checkpoint's own pieces (assembled in Python from
#     the manifest's row and column ranges).
#   tests/checkpoint_tp.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
LAUNCH="$ROOT/scripts/launch"
PY=/usr/bin/python3
SEED=${SEED:-$RANDOM}
echo "seed $SEED"
token_shards "$tmp/data" "$SEED" 0 0 0 train_000000=30000 # uniform tokens (tests/lib.sh)
# global batch 4 of local 1: 1 rank, dp 2 and dp 4 all divide it
COMMON=(--training.dataset=mine --training.dataset_path="$tmp/data" --model.vocab_size=509
        --training.seq_len=32 --training.global_batch_size=4 --training.local_batch_size=1
        --lr_scheduler.warmup_steps=2 --metrics.peak_tflops=0.1 --checkpoint.enable=true
        --debug.seed="$SEED" --training.steps=6)
train() { # N TP DUMP_FOLDER args...: its exit status; the log's tail on a failure
  local n=$1 tp=$2 dir=$3
  shift 3
  run "$dir.log" "$LAUNCH" "$n" "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" \
    --parallelism.tensor_parallel_degree="$tp" --job.dump_folder="$dir" \
    --debug.sample_log="$dir.samples" "$@"
}
resume() { # NAME SAVED_RUN N TP: resume a copy of SAVED_RUN's step-3 checkpoint
  local name=$1 src=$2 n=$3 tp=$4 d="$tmp/$1"
  mkdir -p "$d/checkpoint" && cp -r "$src/checkpoint/step-00000003" "$d/checkpoint/"
  train "$n" "$tp" "$d" --checkpoint.interval=100 && grep -q "loaded step 3 " "$d.log"
  check "$name: resumed from step 3 (exit 0)" $?
  metric "$d/metrics.jsonl" 4 6 > "$d.l"
  close "$d.l" "$tmp/f.l"; check "$name: steps 4-6 loss and grad_norm within 1e-5 of the uninterrupted run" $?
  samples_once "$tmp/f.samples" "$src.samples" "$d.samples" 3 6 24; check "$name: every sample of steps 1-6 trained exactly once" $?
}

train 4 2 "$tmp/f" --checkpoint.interval=100
check "uninterrupted tp=2 x dp_shard=2 run" $?
metric "$tmp/f/metrics.jsonl" 4 6 > "$tmp/f.l"
# 1. saved as tp=2 x dp_shard=2 (a crash in step 4), resumed on other layouts
train 4 2 "$tmp/s" --checkpoint.interval=3 --debug.fail_rank=1 --debug.fail_step=4 2> /dev/null
$PY -c "
import json, sys
m = json.load(open(sys.argv[1]))
wo = m['tensors']['layers.0.attention.wo.weight']['pieces']
out = m['tensors']['output.weight']['pieces']
assert m['mesh']['tp'] == 2 and len(wo) == 4 and all('cols' in p for p in wo), wo
assert max(p['rows'][1] for p in out) == 509, out" "$tmp/s/checkpoint/step-00000003/manifest.json"
check "tp=2 x dp_shard=2 checkpoint of step 3: column pieces for wo, the vocabulary unpadded" $?
resume "tp2x2 -> dp_shard=4" "$tmp/s" 4 1
resume "tp2x2 -> tp=4" "$tmp/s" 4 4
resume "tp2x2 -> 1 rank" "$tmp/s" 1 1
# 2. the reverse
for layout in "dp4 4 1" "tp4 4 4" "one 1 1"; do
  set -- $layout
  train "$2" "$3" "$tmp/s_$1" --checkpoint.interval=3 --debug.fail_rank=0 --debug.fail_step=4 2> /dev/null
  [ -f "$tmp/s_$1/checkpoint/step-00000003/manifest.json" ]; check "$1: checkpoint of step 3 (then a crash)" $?
  resume "$1 -> tp2x2" "$tmp/s_$1" 4 2
done
# a column piece moved onto its neighbour's columns: named, not loaded
mkdir -p "$tmp/bad/checkpoint" && cp -r "$tmp/s/checkpoint/step-00000003" "$tmp/bad/checkpoint/"
$PY -c "
import json, sys
p = sys.argv[1]; m = json.load(open(p))
wo = m['tensors']['layers.1.feed_forward.w2.weight']['pieces']
c = [q for q in wo if q['rows'] == wo[0]['rows']]
c[1]['cols'] = c[0]['cols']
json.dump(m, open(p, 'w'), indent=1)" "$tmp/bad/checkpoint/step-00000003/manifest.json"
"$LAUNCH" 1 "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --job.dump_folder="$tmp/bad" \
  > "$tmp/bad.log" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "pieces of tensor 'layers.1.feed_forward.w2.weight' do not cover its 256 x 768 elements exactly once" "$tmp/bad.log"
check "overlapping column pieces: named, not loaded (exit $rc)" $?
# 3. Hugging Face export from the tensor-parallel checkpoint
"$CTITAN" export "$tmp/s/checkpoint" "$tmp/hf" > "$tmp/export.log" 2>&1
check "export of the tp=2 x dp_shard=2 checkpoint" $?
$PY "$ROOT/tests/reference/hf_check.py" "$tmp/hf" "$tmp/s/checkpoint/step-00000003"
check "HF-style forward on the export equals the reference on the checkpoint's pieces" $?
finish
