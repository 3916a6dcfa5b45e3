#!/usr/bin/env bash
# Hugging Face interop of the mixture of experts (deepseek_v3, src/model/moe/moe_hf.c):
#  - `ctitan export` of a checkpoint saved at ep=2 on 2 ranks (balancing bias on, moved by 3
#    steps): the key set and every shape equal DeepSeek-V3's names derived here from the
#    debug preset's dimensions (not from ctitan's code), config.json's DeepSeek-V3 keys, and
#    every value equals the checkpoint's (experts one tensor each, in order, from the grouped
#    w1/w3/w2 rows; q/k rows permuted for rotate_half; e_score_correction_bias = float32 of
#    model_state.bin); the log says why no MLA names are written;
#  - an HF DeepSeek-V3-style forward on the export gives the logits of the independent
#    reference on the checkpoint (tests/reference/moe_hf_check.py; transformers is not
#    installed, so not transformers itself);
#  - with 2 shared experts and 2 dense layers: the shared experts as one SwiGLU of hidden
#    2 x moe_intermediate_size, the dense layers' mlp names;
#  - round trip: export -> checkpoint.initial_load_in_hf -> one step at lr 0 without bias
#    updates -> export again is the first export, bitwise (the bias carried: the imported
#    run's model_state.bin is the float32-rounded original);
#  - training from the export equals training from the checkpoint (losses and grad norms of 3
#    steps within 1e-6; the bias on), also from an index of two shards;
#  - refusals naming the cause: a config.json of another model, a missing expert tensor.
#   tests/moe_hf.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
PY=/usr/bin/python3
CFG="$ROOT/configs/moe-debug.toml"
COMMON=(--training.dataset=synthetic --model.tokenizer_path= --model.vocab_size=509
        --training.seq_len=32 --training.global_batch_size=8 --training.local_batch_size=2
        --lr_scheduler.warmup_steps=2 --optimizer.lr=3e-3 --metrics.log_freq=1
        --metrics.peak_tflops=0.1 --model.moe_load_balance_coeff=0.01 --checkpoint.enable=true)
train() { # N DIR ARGS...
  local n=$1 d=$2
  shift 2
  "$ROOT/scripts/launch" "$n" "$CTITAN" train "$CFG" "${COMMON[@]}" --job.dump_folder="$d" "$@" \
    > "$d.log" 2>&1
}
# KEYS EXPORT_DIR CHECKPOINT_STEP_DIR DENSE SHARED: the export's names and shapes against
# DeepSeek-V3's, from the debug preset (dim 256, 4 layers, 8 heads, 4 kv heads, dense ffn 768,
# 8 experts of hidden 128, top-2; vocab 509 here), config.json's keys, and every value against
# the checkpoint's tensors (ctitan's names: experts.w1, w3 (E*Fm, C), w2 (E*C, Fm), expert e's
# rows e*Fm.. / e*C..; interleaved RoPE pairs)
keys() {
  $PY - "$@" <<'PY'
import json, os, sys
import numpy as np
sys.path.insert(0, os.environ["ROOT"] + "/tests/reference")
import hf_check, safetensors_io as st
out, step, dense, shared = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
C, L, H, KV, D, F, E, Fm, K, V = 256, 4, 8, 4, 32, 768, 8, 128, 2, 509
want = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C], "lm_head.weight": [V, C]}
for l in range(L):
    p = f"model.layers.{l}."
    want.update({p + "input_layernorm.weight": [C], p + "post_attention_layernorm.weight": [C],
                 p + "self_attn.q_proj.weight": [H * D, C], p + "self_attn.k_proj.weight": [KV * D, C],
                 p + "self_attn.v_proj.weight": [KV * D, C], p + "self_attn.o_proj.weight": [C, H * D]})
    if l < dense:
        want.update({p + "mlp.gate_proj.weight": [F, C], p + "mlp.up_proj.weight": [F, C],
                     p + "mlp.down_proj.weight": [C, F]})
        continue
    want[p + "mlp.gate.weight"] = [E, C]
    want[p + "mlp.gate.e_score_correction_bias"] = [E]
    for e in range(E):
        q = f"{p}mlp.experts.{e}."
        want.update({q + "gate_proj.weight": [Fm, C], q + "up_proj.weight": [Fm, C],
                     q + "down_proj.weight": [C, Fm]})
    if shared:
        Fs = Fm * shared
        want.update({p + "mlp.shared_experts.gate_proj.weight": [Fs, C],
                     p + "mlp.shared_experts.up_proj.weight": [Fs, C],
                     p + "mlp.shared_experts.down_proj.weight": [C, Fs]})
hf, _ = st.read(out + "/model.safetensors")
got = {k: list(v.shape) for k, v in hf.items()}
bad = [f"{k}: {got.get(k)} want {want.get(k)}" for k in sorted(set(want) | set(got))
       if got.get(k) != want.get(k)]
cfg = json.load(open(out + "/config.json"))
wcfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": C,
        "intermediate_size": F, "moe_intermediate_size": Fm, "num_hidden_layers": L,
        "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": D, "n_routed_experts": E,
        "n_shared_experts": shared, "num_experts_per_tok": K, "first_k_dense_replace": dense,
        "routed_scaling_factor": 1, "scoring_func": "softmax", "topk_method": "noaux_tc",
        "norm_topk_prob": False, "vocab_size": V, "rope_theta": 10000, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "n_group": 1, "topk_group": 1}
bad += [f"config.json {k} = {cfg.get(k)!r}, want {v!r}" for k, v in wcfg.items() if cfg.get(k) != v]
_, ck = hf_check.checkpoint_tensors(step)
ck = {k: v.numpy().astype(np.float32) for k, v in ck.items()}
bias = np.fromfile(step + "/model_state.bin", dtype=np.float64).reshape(L - dense, E)
def rope_hf(w, heads):  # interleaved pairs (2i, 2i+1) -> halves (i, D/2 + i), per head
    return w.reshape(heads, D // 2, 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)
expect = {"model.embed_tokens.weight": ck["tok_embeddings.weight"],
          "model.norm.weight": ck["norm.weight"], "lm_head.weight": ck["output.weight"]}
for l in range(L):
    p, c = f"model.layers.{l}.", f"layers.{l}."
    expect.update({p + "input_layernorm.weight": ck[c + "attention_norm.weight"],
                   p + "post_attention_layernorm.weight": ck[c + "ffn_norm.weight"],
                   p + "self_attn.q_proj.weight": rope_hf(ck[c + "attention.wq.weight"], H),
                   p + "self_attn.k_proj.weight": rope_hf(ck[c + "attention.wk.weight"], KV),
                   p + "self_attn.v_proj.weight": ck[c + "attention.wv.weight"],
                   p + "self_attn.o_proj.weight": ck[c + "attention.wo.weight"]})
    if l < dense:
        for hfn, ct in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
            expect[f"{p}mlp.{hfn}.weight"] = ck[f"{c}feed_forward.{ct}.weight"]
        continue
    expect[p + "mlp.gate.weight"] = ck[c + "moe.router.gate.weight"]
    expect[p + "mlp.gate.e_score_correction_bias"] = bias[l - dense].astype(np.float32)
    for e in range(E):
        q = f"{p}mlp.experts.{e}."
        expect[q + "gate_proj.weight"] = ck[c + "moe.experts.w1"][e * Fm:(e + 1) * Fm]
        expect[q + "up_proj.weight"] = ck[c + "moe.experts.w3"][e * Fm:(e + 1) * Fm]
        expect[q + "down_proj.weight"] = ck[c + "moe.experts.w2"][e * C:(e + 1) * C]
    for hfn, ct in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
        if shared:
            expect[f"{p}mlp.shared_experts.{hfn}.weight"] = ck[f"{c}moe.shared_experts.{ct}.weight"]
diff = [k for k in expect if k in hf and not np.array_equal(hf[k], expect[k])]
bad += [f"{k}: values differ from the checkpoint's" for k in diff]
print(f"  {len(got)} tensors (want {len(want)}); {len(expect) - len(diff)} of {len(expect)} "
      f"equal the checkpoint's; bias absmax {np.abs(bias).max():.3g}")
for b in bad[:8]:
    print("  ", b, file=sys.stderr)
sys.exit(1 if bad or not np.abs(bias).max() > 0 else 0)
PY
}
export ROOT

# 1. a checkpoint saved at ep 2 on 2 ranks, exported on one process
train 2 "$tmp/a" --training.steps=3 --parallelism.expert_parallel_degree=2
check "ep 2 on 2 ranks trains 3 steps with a checkpoint (exit $?)" $?
"$CTITAN" export "$tmp/a/checkpoint" "$tmp/hf" > "$tmp/export.log" 2>&1
check "export (exit $?)" $?
grep -q "not MLA: no q_a_proj / kv_a_proj_with_mqa" "$tmp/export.log"
check "the export's log says why no MLA names are written" $?
STEP="$tmp/a/checkpoint/step-00000003"
keys "$tmp/hf" "$STEP" 1 1
check "DeepSeek-V3's key set, shapes and config.json; every value the checkpoint's (experts in order, the bias)" $?
$PY "$ROOT/tests/reference/moe_hf_check.py" "$tmp/hf" "$STEP"
check "HF DeepSeek-V3-style forward on the export = the reference on the checkpoint" $?

# 2. 2 shared experts (concatenated along the hidden dim), 2 dense layers
train 1 "$tmp/s" --training.steps=1 --model.moe_n_shared_experts=2 --model.moe_n_dense_layers=2 &&
  "$CTITAN" export "$tmp/s/checkpoint" "$tmp/hfs" > "$tmp/exports.log" 2>&1 &&
  keys "$tmp/hfs" "$tmp/s/checkpoint/step-00000001" 2 2 &&
  $PY "$ROOT/tests/reference/moe_hf_check.py" "$tmp/hfs" "$tmp/s/checkpoint/step-00000001"
check "2 shared experts, 2 dense layers: names, shapes, values and logits" $?

# 3. round trip: import, one step at lr 0 (no warmup, all decay, min 0) without bias updates,
# export again
train 1 "$tmp/r" --training.steps=1 --lr_scheduler.warmup_steps=0 --lr_scheduler.decay_ratio=1 \
  --lr_scheduler.min_lr_factor=0 --model.moe_load_balance_coeff=0 \
  --checkpoint.initial_load_path="$tmp/hf" --checkpoint.initial_load_in_hf=true &&
  grep -q "loaded Hugging Face weights" "$tmp/r.log" &&
  "$CTITAN" export "$tmp/r/checkpoint" "$tmp/hf2" > "$tmp/export2.log" 2>&1
check "import the export, one step at lr 0, export again (exit $?)" $?
same "$tmp/hf/model.safetensors" "$tmp/hf2/model.safetensors" && same "$tmp/hf/config.json" "$tmp/hf2/config.json"
check "export -> initial_load_in_hf -> export: model.safetensors and config.json bitwise" $?
$PY - "$STEP/model_state.bin" "$tmp/r/checkpoint/step-00000001/model_state.bin" <<'PY'
import sys
import numpy as np
a, b = (np.fromfile(p, dtype=np.float64) for p in sys.argv[1:])
ok = a.size == b.size == 3 * 8 and np.abs(a).max() > 0
ok = ok and np.array_equal(a.astype(np.float32).astype(np.float64), b)
print(f"  bias: {a.size} values, absmax {np.abs(a).max():.3g}, max |imported - saved| {np.abs(a - b).max():.2e}")
sys.exit(0 if ok else 1)
PY
check "the balancing bias carried through the import (float32 of the saved one, exactly)" $?

# 4. training from the export = training from the checkpoint (bias updates on)
train 1 "$tmp/k" --training.steps=3 --checkpoint.initial_load_path="$STEP"
check "3 steps from the checkpoint (exit $?)" $?
train 1 "$tmp/h" --training.steps=3 --checkpoint.initial_load_path="$tmp/hf" \
  --checkpoint.initial_load_in_hf=true
check "3 steps from the HF export (exit $?)" $?
metric "$tmp/k/metrics.jsonl" 1 3 loss grad_norm moe_bias_absmax > "$tmp/k.l"
metric "$tmp/h/metrics.jsonl" 1 3 loss grad_norm moe_bias_absmax > "$tmp/h.l"
close "$tmp/h.l" "$tmp/k.l" 1e-6
ok=$? # before the message's command substitutions, which set $?
check "from the export: the checkpoint's losses, grad norms and bias within 1e-6 ($(head -1 "$tmp/h.l" | cut -d' ' -f1) -> $(tail -1 "$tmp/h.l" | cut -d' ' -f1))" $ok
# the same export as an index of two shards
$PY - "$tmp/hf" "$tmp/hfi" <<'PY'
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
train 1 "$tmp/hi" --training.steps=3 --checkpoint.initial_load_path="$tmp/hfi" \
  --checkpoint.initial_load_in_hf=true &&
  metric "$tmp/hi/metrics.jsonl" 1 3 loss grad_norm moe_bias_absmax > "$tmp/hi.l" &&
  same "$tmp/hi.l" "$tmp/h.l"
check "from an index of two shards: the single file's run, bitwise" $?

# 5. refusals
sed -i 's/"n_routed_experts":\s*[0-9]*/"n_routed_experts": 4/' "$tmp/hfi/config.json"
train 1 "$tmp/x1" --training.steps=1 --checkpoint.initial_load_path="$tmp/hfi" \
  --checkpoint.initial_load_in_hf=true
rc=$?
[ $rc -ne 0 ] && grep -q "n_routed_experts is 4, this model has 8" "$tmp/x1.log"
check "config.json of another model: named (exit $rc)" $?
$PY - "$tmp/hf" <<'PY'
import json, struct, sys
p = sys.argv[1] + "/model.safetensors"; raw = open(p, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]; hdr = json.loads(raw[8:8+n])
k = "model.layers.2.mlp.experts.5.up_proj.weight"
hdr[k + "_renamed"] = hdr.pop(k)
hj = json.dumps(hdr).encode(); open(p, "wb").write(struct.pack("<Q", len(hj)) + hj + raw[8+n:])
PY
train 1 "$tmp/x2" --training.steps=1 --checkpoint.initial_load_path="$tmp/hf" \
  --checkpoint.initial_load_in_hf=true
rc=$?
[ $rc -ne 0 ] && grep -q "has no tensor 'model.layers.2.mlp.experts.5.up_proj.weight'" "$tmp/x2.log"
check "a missing expert tensor: named (exit $rc)" $?
finish
