#!/usr/bin/env bash
# Checkpoint acceptance through the CLI, on a shard dataset:
#  1. exact resume: 20 steps uninterrupted vs 10 + crash + resume + 10 on the same 2 ranks,
#     with synchronous and with async saves: bitwise-identical losses and final state (the
#     step-20 checkpoint files have the same checksums);
#  2. reshard: a 4-rank (dp_shard 4) checkpoint resumed on 2, on 3, and on 4 ranks as 2x2
#     HSDP: losses and grad norms within 1e-5 of the uninterrupted 4-rank run, and every sample of the data
#     order trained on exactly once (debug.sample_log);
#  3. exclude_from_loading: optimizer, lr_scheduler, dataloader, train_state each do what they
#     say;
#  4. Hugging Face round trip: export, then initial_load_in_hf (also from an index of shards)
#     trains bitwise like initial_load_path on the checkpoint itself; a mismatched config.json
#     or a missing tensor is named.
#   tests/checkpoint_resume.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
LAUNCH="$ROOT/scripts/launch"
PY=/usr/bin/python3
token_shards "$tmp/data" 11 0.8 7 1 train_000000=40000 train_000001=25000 # tests/lib.sh
# global batch 12 of local 1: any of 1, 2, 3, 4 ranks divides it
COMMON=(--training.dataset=mine --training.dataset_path="$tmp/data" --model.vocab_size=509
        --training.seq_len=32 --training.global_batch_size=12 --training.local_batch_size=1
        --lr_scheduler.warmup_steps=3 --metrics.peak_tflops=0.1 --checkpoint.enable=true)
train() { # N DUMP_FOLDER args...: its exit status; the log's tail on a failure
  local n=$1 dir=$2
  shift 2
  run "$dir.log" "$LAUNCH" "$n" "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" \
    --job.dump_folder="$dir" "$@"
}
fails() { "$@" 2>/dev/null; } # a run expected to fail: no tail printed
checksums() { $PY -c "
import json,sys
m=json.load(open(sys.argv[1]))
print(sorted((k,v['xxh3_64']) for k,v in m['files'].items() if k.startswith('rank-')))" "$1"; }
# 1. exact resume, sync and async
train 2 "$tmp/u" --training.steps=20 --checkpoint.interval=10
check "uninterrupted 20-step run" $?
metric "$tmp/u/metrics.jsonl" 11 20 > "$tmp/u.l"
for mode in disabled async; do
  fails train 2 "$tmp/r_$mode" --training.steps=20 --checkpoint.interval=10 \
    --checkpoint.async_mode=$mode --debug.fail_rank=1 --debug.fail_step=11
  train 2 "$tmp/r_$mode" --training.steps=20 --checkpoint.interval=10 --checkpoint.async_mode=$mode &&
    grep -q "loaded step 10 " "$tmp/r_$mode.log"; check "$mode: crash in step 11, resumed from step 10 (exit 0)" $?
  metric "$tmp/r_$mode/metrics.jsonl" 11 20 > "$tmp/r_$mode.l"
  same "$tmp/u.l" "$tmp/r_$mode.l"; check "$mode: steps 11-20 (loss, grad_norm) bitwise equal the uninterrupted run" $?
  [ "$(checksums "$tmp/u/checkpoint/step-00000020/manifest.json")" = \
    "$(checksums "$tmp/r_$mode/checkpoint/step-00000020/manifest.json")" ]
  check "$mode: final parameters and moments bitwise equal (step-20 file checksums)" $?
done

# 2. reshard from 4 ranks
train 4 "$tmp/f" --training.steps=8 --checkpoint.interval=100 --debug.sample_log="$tmp/f.samples"
check "uninterrupted 4-rank run" $?
metric "$tmp/f/metrics.jsonl" 5 8 > "$tmp/f.l"
fails train 4 "$tmp/s" --training.steps=8 --checkpoint.interval=4 --debug.fail_rank=2 --debug.fail_step=5 \
  --debug.sample_log="$tmp/s.samples"
[ -f "$tmp/s/checkpoint/step-00000004/manifest.json" ]; check "4-rank checkpoint of step 4" $?
for layout in "2 1" "3 1" "4 2"; do
  set -- $layout
  n=$1 rep=$2 d="$tmp/g${n}x$rep"
  mkdir -p "$d" && cp -r "$tmp/s/checkpoint" "$d/"
  train "$n" "$d" --training.steps=8 --checkpoint.interval=100 \
    --parallelism.data_parallel_replicate_degree=$rep --debug.sample_log="$d.samples" &&
    grep -q "loaded step 4 " "$d.log"; check "4-rank checkpoint loads on $n ranks ($rep replicas) (exit 0)" $?
  metric "$d/metrics.jsonl" 5 8 > "$d.l"
  close "$d.l" "$tmp/f.l"; check "$n ranks ($rep replicas): steps 5-8 loss and grad_norm within 1e-5 of the 4-rank run" $?
  # replicas train on different samples: every sample once, each step the same set
  samples_once "$tmp/f.samples" "$tmp/s.samples" "$d.samples" 4 8 96
  check "$n ranks ($rep replicas): every sample of steps 1-8 seen exactly once, as uninterrupted" $?
done

# 3. exclude_from_loading, from the 2-rank step-10 checkpoint
# (2 more steps each: 12 in all; "none" is the plain resume they are compared with)
for part in none optimizer lr_scheduler dataloader train_state; do
  d="$tmp/x_$part"
  mkdir -p "$d/checkpoint" && cp -r "$tmp/u/checkpoint/step-00000010" "$d/checkpoint/"
  ex=$part
  [ "$part" = none ] && ex=""
  train 2 "$d" --training.steps=12 --checkpoint.interval=100 --checkpoint.load_step=10 \
    --checkpoint.exclude_from_loading=$ex --debug.sample_log="$d.samples"
  check "exclude_from_loading=$ex: resumed run (exit 0)" $?
done
a=$(metric "$tmp/x_optimizer/metrics.jsonl" 11 12 loss)
b=$(metric "$tmp/x_none/metrics.jsonl" 11 12 loss)
[ -n "$a" ] && [ "$(echo "$a" | head -1)" = "$(echo "$b" | head -1)" ] && [ "$(echo "$a" | tail -1)" != "$(echo "$b" | tail -1)" ]
check "optimizer excluded: same weights (step 11 loss equal), fresh moments (step 12 differs)" $?
a=$(metric "$tmp/x_lr_scheduler/metrics.jsonl" 11 11 lr); [ -n "$a" ] && [ "$a" = "$(metric "$tmp/u/metrics.jsonl" 1 1 lr)" ]
check "lr_scheduler excluded: step 11 runs at the schedule's first learning rate" $?
$PY - "$tmp/x_dataloader.samples" "$tmp/f.samples" <<'PY'
import glob, sys
def step(prefix, s):
    return sorted(int(l.split()[1]) for f in glob.glob(prefix + ".rank-*") for l in open(f) if int(l.split()[0]) == s)
sys.exit(0 if step(sys.argv[1], 11) == step(sys.argv[2], 1) else 1)
PY
check "dataloader excluded: step 11 trains on the first batch of the data order" $?
grep -q "starting at step 0" "$tmp/x_train_state.log" && [ "$(head -1 "$tmp/x_train_state/metrics.jsonl" | $PY -c 'import json,sys;print(json.load(sys.stdin)["step"])')" = 1 ]
check "train_state excluded: training restarts at step 1" $?
fails train 1 "$tmp/x_bad" --training.steps=20 --checkpoint.exclude_from_loading=optimizer,weights
[ $? -eq 2 ] && grep -q "unknown part 'weights'" "$tmp/x_bad.log"; check "unknown exclude_from_loading part named, exit 2" $?

# 4. Hugging Face export -> import
"$CTITAN" export "$tmp/u/checkpoint" "$tmp/hf" > "$tmp/export.log" 2>&1
check "export step 20" $?
train 2 "$tmp/i_ckpt" --training.steps=3 --checkpoint.initial_load_path="$tmp/u/checkpoint/step-00000020"
check "training from the step-20 checkpoint (exit 0)" $?
train 2 "$tmp/i_hf" --training.steps=3 --checkpoint.initial_load_path="$tmp/hf" --checkpoint.initial_load_in_hf=true
check "training from the HF export (exit 0)" $?
metric "$tmp/i_ckpt/metrics.jsonl" 1 3 > "$tmp/i_ckpt.l"; metric "$tmp/i_hf/metrics.jsonl" 1 3 > "$tmp/i_hf.l"
grep -q "loaded Hugging Face weights" "$tmp/i_hf.log" && same "$tmp/i_ckpt.l" "$tmp/i_hf.l" \
  && [ "$(checksums "$tmp/i_ckpt/checkpoint/step-00000003/manifest.json")" = "$(checksums "$tmp/i_hf/checkpoint/step-00000003/manifest.json")" ]
check "HF round trip: training from the export is bitwise training from the checkpoint" $?
# the same weights as an index of two shards (the layout of large HF models), in bf16-free f32
$PY - "$tmp/hf" "$tmp/hf2" <<'PY'
import json, os, struct, sys
src, dst = sys.argv[1], sys.argv[2]; os.makedirs(dst)
raw = open(f"{src}/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]; hdr = json.loads(raw[8:8+n]); data = raw[8+n:]
names = [k for k in hdr if k != "__metadata__"]
wmap = {}
for part, chunk in enumerate((names[::2], names[1::2])):
    fn = f"model-{part+1:05d}-of-00002.safetensors"; h = {}; blob = b""
    for k in chunk:
        b, e = hdr[k]["data_offsets"]; h[k] = dict(hdr[k], data_offsets=[len(blob), len(blob)+e-b]); blob += data[b:e]; wmap[k] = fn
    hj = json.dumps(h).encode()
    open(f"{dst}/{fn}", "wb").write(struct.pack("<Q", len(hj)) + hj + blob)
json.dump({"metadata": {}, "weight_map": wmap}, open(f"{dst}/model.safetensors.index.json", "w"))
open(f"{dst}/config.json", "w").write(open(f"{src}/config.json").read())
PY
train 2 "$tmp/i_hf2" --training.steps=3 --checkpoint.initial_load_path="$tmp/hf2" --checkpoint.initial_load_in_hf=true &&
  metric "$tmp/i_hf2/metrics.jsonl" 1 3 > "$tmp/i_hf2.l" && same "$tmp/i_ckpt.l" "$tmp/i_hf2.l"
check "HF import from an index of shards equals the single file" $?
sed -i 's/"num_hidden_layers":\s*[0-9]*/"num_hidden_layers": 3/' "$tmp/hf2/config.json"
fails train 1 "$tmp/i_bad" --training.steps=1 --checkpoint.initial_load_path="$tmp/hf2" --checkpoint.initial_load_in_hf=true
rc=$?
[ $rc -ne 0 ] && grep -q "num_hidden_layers is 3, this model has 6" "$tmp/i_bad.log"; check "HF config.json of another model named (exit $rc)" $?
$PY - "$tmp/hf" <<'PY'
import json, struct, sys
p = sys.argv[1] + "/model.safetensors"; raw = open(p, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]; hdr = json.loads(raw[8:8+n])
hdr["model.layers.1.mlp.up_proj.weight_renamed"] = hdr.pop("model.layers.1.mlp.up_proj.weight")
hj = json.dumps(hdr).encode(); open(p, "wb").write(struct.pack("<Q", len(hj)) + hj + raw[8+n:])
PY
fails train 1 "$tmp/i_bad2" --training.steps=1 --checkpoint.initial_load_path="$tmp/hf" --checkpoint.initial_load_in_hf=true
rc=$?
[ $rc -ne 0 ] && grep -q "has no tensor 'model.layers.1.mlp.up_proj.weight'" "$tmp/i_bad2.log"; check "HF file lacking a tensor: named (exit $rc)" $?
finish
