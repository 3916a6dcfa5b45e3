#!/usr/bin/python3
"""Checks `ctitan export` of a deepseek_v3 (MoE) checkpoint: a Hugging Face DeepSeek-V3-style
forward written here from transformers' modeling_deepseek_v3.py equations (HF tensor names,
config.json keys, rotate_half RoPE; DeepseekV3TopkRouter's noaux_tc top-k of score +
e_score_correction_bias with n_group = topk_group = 1; the routed experts by name,
mlp.experts.<e>.{gate,up,down}_proj; shared_experts added), with GQA self_attn.{q,k,v,o}_proj
in place of MLA (ctitan's model has no MLA), run on the exported weights, must give the logits
of the independent MoE reference (moe_ref.py: ctitan's names and grouped expert tensors,
interleaved RoPE) run on the checkpoint's own tensors and balancing bias (model_state.bin).
float64 throughout. transformers itself is not installed here (no DeepseekV3 to load).

  /usr/bin/python3 tests/reference/moe_hf_check.py EXPORT_DIR CHECKPOINT_STEP_DIR
Exit 0 if the logits agree within 1e-9 relative, 1 otherwise, 2 on bad input.
"""

import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_check  # noqa: E402
import moe_ref  # noqa: E402
import safetensors_io as st  # noqa: E402


def hf_forward(w, cfg, tokens):
    C, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, L, eps = cfg.get("head_dim", C // H), cfg["num_hidden_layers"], cfg["rms_norm_eps"]
    E, K = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    assert cfg["topk_method"] == "noaux_tc" and cfg["n_group"] == cfg["topk_group"] == 1
    T = tokens.shape[1]

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g

    def mlp(x, p):
        return (F.silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ \
            w[p + "down_proj.weight"].T

    inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    emb = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    emb = torch.cat((emb, emb), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    h = w["model.embed_tokens.weight"][tokens]
    B = h.shape[0]
    for i in range(L):
        p = f"model.layers.{i}."
        x = rms(h, w[p + "input_layernorm.weight"])
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(B, T, H, D).transpose(1, 2)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(B, T, KV, D).transpose(1, 2)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(B, T, KV, D).transpose(1, 2)
        q, k = q * cos + hf_check.rotate_half(q) * sin, k * cos + hf_check.rotate_half(k) * sin
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + mask, dim=-1) @ v
        h = h + a.transpose(1, 2).reshape(B, T, H * D) @ w[p + "self_attn.o_proj.weight"].T
        x = rms(h, w[p + "post_attention_layernorm.weight"])
        if i < cfg["first_k_dense_replace"]:
            h = h + mlp(x, p + "mlp.")
            continue
        xf = x.reshape(B * T, C)
        logits = xf @ w[p + "mlp.gate.weight"].T
        scores = logits.sigmoid() if cfg["scoring_func"] == "sigmoid" else logits.softmax(-1)
        idx = torch.topk(scores + w[p + "mlp.gate.e_score_correction_bias"], K, dim=-1)[1]
        g = scores.gather(1, idx)
        if cfg["norm_topk_prob"]:
            g = g / (g.sum(-1, keepdim=True) + 1e-20)
        g = g * cfg["routed_scaling_factor"]
        out = torch.zeros_like(xf)
        for e in range(E):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            if tok.numel():
                y = mlp(xf[tok], f"{p}mlp.experts.{e}.") * g[tok, slot].unsqueeze(1)
                out = out.index_add(0, tok, y)
        if cfg["n_shared_experts"] > 0:
            out = out + mlp(xf, p + "mlp.shared_experts.")
        h = h + out.view(B, T, C)
    return rms(h, w["model.norm.weight"]) @ w["lm_head.weight"].T


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    export_dir, step_dir = sys.argv[1:]
    try:
        hf, _ = st.read(os.path.join(export_dir, "model.safetensors"))
        cfg = json.load(open(os.path.join(export_dir, "config.json")))
        man, ck = hf_check.checkpoint_tensors(step_dir)
        bias = np.fromfile(os.path.join(step_dir, "model_state.bin"), dtype=np.float64)
    except (OSError, ValueError, KeyError) as e:
        print(f"moe_hf_check: {e}", file=sys.stderr)
        return 2
    hfw = {k: torch.from_numpy(v).double() for k, v in hf.items()}
    c = dict(man["model"])
    ref = moe_ref.MoELM(c).double()
    ref.load_state_dict(ck, strict=True)
    ref.bias = torch.from_numpy(bias.copy()).view(ref.bias.shape)
    torch.manual_seed(0)
    tokens = torch.randint(0, c["vocab_size"], (2, 24))
    with torch.no_grad():
        want = ref(tokens)[0]
        got = hf_forward(hfw, cfg, tokens)
    err = ((got - want).norm() / want.norm()).item()
    print(f"moe_hf_check: {len(hfw)} tensors; HF DeepSeek-V3-style forward on the export vs "
          f"the reference on the checkpoint: logits rel err {err:.3e} (bias absmax "
          f"{np.abs(bias).max():.3g})")
    return 0 if err < 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
