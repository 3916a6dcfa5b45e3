#!/usr/bin/env bash
# Hyena through the CLI (`[model] name = "hyena"`):
#  - one rank: trains on synthetic data and the loss falls;
#  - FSDP on 2 ranks: the same global batch gives the 1-rank losses and grad norms within 1e-5;
#  - 2 pipeline stages (1F1B) with full activation checkpointing equal 1 rank too;
#  - tensor parallelism (TP 2, FSDP 2 x TP 2, PP 2 x TP 2): losses, grad norms and every
#    parameter after 6 steps (exported from the checkpoint every rank wrote its pieces of)
#    equal 1 rank's within 1e-5; checkpoints resume across tp = 1 and tp = 2;
#  - a checkpoint saved on 2 ranks resumes on 1 (the manifest names the family), and the
#    resumed steps equal the uninterrupted run's;
#  - a Llama run refuses a Hyena checkpoint (naming the family); bad hyena keys are usage
#    errors (exit 2);
#  - export writes safari's state dict (names, shapes, buffers checked from safari's module
#    tree and formulas); training from it is bitwise training from the checkpoint; a
#    trained positional embedding is refused on load.
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
  --checkpoint.enable=true > "$tmp/a.log" 2>&1
check "1 rank trains (exit 0)" $?
grep -q "model hyena hyena-debug" "$tmp/a.log"; check "log names the hyena model" $?
metric "$tmp/a/metrics.jsonl" 1 6 > "$tmp/a.l"
/usr/bin/python3 -c "
import sys
l=[float(x.split()[0]) for x in open(sys.argv[1])]; sys.exit(0 if len(l) == 6 and l[-1] < l[0] - 0.05 else 1)" "$tmp/a.l"
ok=$?  # before the message expands: $(...) resets $?
check "loss falls over 6 steps ($(head -1 "$tmp/a.l" | cut -d' ' -f1) -> $(tail -1 "$tmp/a.l" | cut -d' ' -f1))" $ok

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

# 3c. tensor parallelism: each rank holds D/tp channels of every in_proj stream (and of the
# short filter, the long convolutions and the filters' last layer), fc1's rows, out_proj's and
# fc2's columns; the row-parallel outputs, the column-parallel input gradients and the implicit
# filter MLP's gradients are all-reduced over tp. Every rank writes its pieces of the step-6
# checkpoint; `ctitan export` gathers them into safari's tensors, compared with 1 rank's.
"$CTITAN" export "$tmp/a/checkpoint" "$tmp/a.exp" > "$tmp/a.exp.log" 2>&1
check "export of the 1-rank checkpoint (exit $?)" $?
# (per tensor in the L2 norm, as tests/compose.py: an element whose gradient is at the fp32
# summation-order noise may take an Adam step of +-lr the other way, ~5e-5 of a tensor's
# largest element, which the norm of the whole tensor averages out)
params_close() { # A B: every tensor of two exports within 1e-5 (relative, in the L2 norm)
  /usr/bin/python3 - "$1/model.safetensors" "$2/model.safetensors" <<'PY'
import json, struct, sys
import numpy as np
def load(p):
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n]); hdr.pop("__metadata__", None)
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                             np.float32).astype(np.float64) for k, v in hdr.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
worst = max((np.linalg.norm(a[k] - b[k]) / max(np.linalg.norm(b[k]), 1e-6), k) for k in b)
print(f"  {len(b)} tensors, worst {worst[1]}: {worst[0]:.1e} of its norm")
sys.exit(0 if a.keys() == b.keys() and worst[0] <= 1e-5 else 1)
PY
}
for lay in "tp2 2 --parallelism.tensor_parallel_degree=2" \
           "fsdp2xtp2 4 --parallelism.tensor_parallel_degree=2 --parallelism.data_parallel_shard_degree=2" \
           "pp2xtp2 4 --parallelism.tensor_parallel_degree=2 --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule=1F1B"; do
  read -r name n args <<< "$lay"
  # shellcheck disable=SC2086
  "$LAUNCH" "$n" "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" $args \
    --job.dump_folder="$tmp/$name" --checkpoint.enable=true > "$tmp/$name.log" 2>&1
  check "$name ($n ranks) trains (exit $?)" $?
  metric "$tmp/$name/metrics.jsonl" 1 6 > "$tmp/$name.l"
  close "$tmp/$name.l" "$tmp/a.l"; check "$name losses and grad_norms equal 1-rank ones within 1e-5" $?
  "$CTITAN" export "$tmp/$name/checkpoint" "$tmp/$name.exp" > "$tmp/$name.exp.log" 2>&1 &&
    params_close "$tmp/$name.exp" "$tmp/a.exp"
  check "$name parameters after 6 steps (every rank's pieces) equal 1-rank ones within 1e-5" $?
done
# across layouts: tp = 2's step 3 on 1 rank, 1 rank's step 3 on tp = 2
for from in "tp2 1" "a 2"; do
  read -r src n <<< "$from"
  rm -rf "$tmp/r-$src" && mkdir -p "$tmp/r-$src" && cp -r "$tmp/$src/checkpoint" "$tmp/r-$src/" &&
    rm -rf "$tmp/r-$src/checkpoint/step-00000006" && echo 3 > "$tmp/r-$src/checkpoint/latest"
  run "$tmp/r-$src.log" "$LAUNCH" "$n" "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" \
    --parallelism.tensor_parallel_degree="$n" --job.dump_folder="$tmp/r-$src" \
    --checkpoint.enable=true && grep -q "loaded step 3" "$tmp/r-$src.log"
  check "tp = $n resumes the step-3 checkpoint of $src (exit 0)" $?
  metric "$tmp/r-$src/metrics.jsonl" 4 6 > "$tmp/r-$src.l"
  close "$tmp/r-$src.l" "$tmp/a4.l"; check "its steps 4-6 equal the uninterrupted 1-rank run's" $?
done

# 4. refusals
"$CTITAN" train "$ROOT/configs/debug.toml" --training.steps=1 --training.seq_len=32 \
  --training.local_batch_size=2 --model.vocab_size=509 --metrics.peak_tflops=0.1 \
  --job.dump_folder="$tmp/b" --checkpoint.enable=true > "$tmp/d.log" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "holds a hyena model, not llama3" "$tmp/d.log"
check "a llama run refuses the hyena checkpoint (exit $rc)" $?

# 5. export: safari's state dict (long_conv_lm's ConvLMHeadModel with the hyena layer), and back
"$CTITAN" export "$tmp/b/checkpoint" "$tmp/exp" > "$tmp/e.log" 2>&1
check "export of the Hyena checkpoint (exit $?)" $?
/usr/bin/python3 - "$tmp/exp" <<'PY'
# the names and shapes safari's modules give (written from its module tree, not from ctitan),
# the fixed buffers from safari's formulas, and the tied and shared tensors
import json, math, struct, sys
import numpy as np
d = sys.argv[1]; cfg = json.load(open(f"{d}/config.json")); ly = cfg["layer"]
raw = open(f"{d}/model.safetensors", "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n]); hdr.pop("__metadata__", None); data = raw[8 + n:]
def get(k):
    b, e = hdr[k]["data_offsets"]; return np.frombuffer(data[b:e], np.float32).reshape(hdr[k]["shape"])
D, L, H, V = cfg["d_model"], cfg["n_layer"], cfg["d_inner"], cfg["vocab_size"]
N, F, E, T = ly["order"], ly["filter_order"], ly["emb_dim"], ly["l_max"]
P, C = (N + 1) * D, (N - 1) * D
want = {"backbone.embeddings.word_embeddings.weight": [V, D], "backbone.ln_f.weight": [D],
        "backbone.ln_f.bias": [D], "lm_head.weight": [V, D]}
for l in range(L):
    b = f"backbone.layers.{l}."; m = b + "mixer."; f = m + "filter_fn."
    want.update({b + "norm1.weight": [D], b + "norm1.bias": [D], b + "norm2.weight": [D],
                 b + "norm2.bias": [D], b + "mlp.fc1.weight": [H, D], b + "mlp.fc1.bias": [H],
                 b + "mlp.fc2.weight": [D, H], b + "mlp.fc2.bias": [D],
                 m + "in_proj.weight": [P, D], m + "in_proj.bias": [P], m + "out_proj.weight": [D, D],
                 m + "out_proj.bias": [D], m + "short_filter.weight": [P, 1, 3],
                 m + "short_filter.bias": [P], f + "bias": [C], f + "pos_emb.z": [1, T, E],
                 f + "pos_emb.t": [1, T, 1], f + "modulation.deltas": [1, 1, C],
                 f + "implicit_filter.0.weight": [F, E], f + "implicit_filter.0.bias": [F],
                 f + "implicit_filter.2.weight": [F, F], f + "implicit_filter.2.bias": [F],
                 f + "implicit_filter.4.weight": [F, F], f + "implicit_filter.4.bias": [F],
                 f + "implicit_filter.6.weight": [C, F]})
    for k in (1, 3, 5):
        want[f + f"implicit_filter.{k}.freq"] = [1, F]
got = {k: v["shape"] for k, v in hdr.items()}
if got != want:
    print("names/shapes differ:", [k for k in set(got) | set(want) if got.get(k) != want.get(k)][:6])
    sys.exit(1)
t = np.linspace(0, 1, T)[:, None]; w = 2 * math.pi * np.arange(T)[:, None] / T
bands = (E - 1) // 2; fr = np.linspace(1e-4, bands - 1, bands)[None]
z = np.concatenate([t, np.cos(-fr * w), np.sin(-fr * w)], axis=1)
deltas = np.linspace(math.log(1e-2) / 1.5, math.log(1e-2) / 0.3, C)
for l in range(L):
    f = f"backbone.layers.{l}.mixer.filter_fn."
    ok = (np.abs(get(f + "pos_emb.z")[0] - z).max() < 1e-6 and np.abs(get(f + "pos_emb.t")[0] - t).max() < 1e-6
          and np.abs(get(f + "modulation.deltas")[0, 0] - deltas).max() < 1e-6
          and all((get(f + "implicit_filter.1.freq") == get(f + f"implicit_filter.{k}.freq")).all() for k in (3, 5)))
    if not ok: print("layer", l, "buffers differ from safari's formulas"); sys.exit(1)
if not (get("lm_head.weight") == get("backbone.embeddings.word_embeddings.weight")).all():
    print("lm_head is not the embedding"); sys.exit(1)
PY
check "export: safari's names and shapes, its buffers' values, lm_head tied, one Sin frequency" $?
"$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --training.steps=2 --job.dump_folder="$tmp/i1" \
  --checkpoint.initial_load_path="$tmp/b/checkpoint/step-00000006" > "$tmp/i1.log" 2>&1 &&
"$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --training.steps=2 --job.dump_folder="$tmp/i2" \
  --checkpoint.initial_load_path="$tmp/exp" --checkpoint.initial_load_in_hf=true > "$tmp/i2.log" 2>&1 &&
metric "$tmp/i1/metrics.jsonl" 1 2 > "$tmp/i1.l" && metric "$tmp/i2/metrics.jsonl" 1 2 > "$tmp/i2.l" &&
same "$tmp/i1.l" "$tmp/i2.l"
check "round trip: training from the export is bitwise training from the checkpoint" $?
cp -r "$tmp/exp" "$tmp/exp2"
/usr/bin/python3 - "$tmp/exp2/model.safetensors" <<'PY'
import json, struct, sys
raw = bytearray(open(sys.argv[1], "rb").read()); n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n]); b, e = hdr["backbone.layers.0.mixer.filter_fn.pos_emb.z"]["data_offsets"]
raw[8 + n + b + 4:8 + n + b + 8] = struct.pack("<f", 0.5)  # a trained z
open(sys.argv[1], "wb").write(raw)
PY
"$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" --training.steps=1 --job.dump_folder="$tmp/i3" \
  --checkpoint.initial_load_path="$tmp/exp2" --checkpoint.initial_load_in_hf=true > "$tmp/i3.log" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "pos_emb.z' differs from the fixed features" "$tmp/i3.log"
check "a trained positional embedding is refused, naming it (exit $rc)" $?
for bad in --model.hyena_emb_dim=4 --model.hyena_order=1 --model.flavor=debugmodel \
           --model.hyena_l_max=16; do
  "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" "$bad" \
    --job.dump_folder="$tmp/f" > "$tmp/f.log" 2>&1
  rc=$?
  [ $rc -eq 2 ]; ok=$?; check "$bad is a usage error (exit $rc: $(grep -m1 error "$tmp/f.log"))" $ok
done
finish
