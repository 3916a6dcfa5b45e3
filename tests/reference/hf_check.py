#!/usr/bin/python3
"""Checks `ctitan export` against a checkpoint: a Hugging Face-style Llama forward (rotate_half
RoPE, HF tensor names, config.json), written here from the HF modeling equations, run on the
exported weights must give the logits of the Meta/TorchTitan-style reference model
(llama_model.py, interleaved RoPE) run on the checkpoint's own tensors. float64 throughout.

  /usr/bin/python3 tests/reference/hf_check.py EXPORT_DIR CHECKPOINT_STEP_DIR
Exit 0 if the logits agree within 1e-9 relative, 1 otherwise, 2 on bad input.
"""

import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_model as lm  # noqa: E402
import safetensors_io as st  # noqa: E402


def hf_rope_inv_freq(cfg, head_dim):
    inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    rs = cfg.get("rope_scaling")
    if not rs:
        return inv
    # transformers' _compute_llama3_parameters
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    low_wl, high_wl = old / low, old / high
    out = []
    for f in inv.tolist():
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(f)
        elif wl > low_wl:
            out.append(f / factor)
        else:
            s = (old / wl - low) / (high - low)
            out.append((1 - s) * f / factor + s * f)
    return torch.tensor(out, dtype=torch.float64)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_forward(w, cfg, tokens):
    C, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, L, eps = cfg.get("head_dim", C // H), cfg["num_hidden_layers"], cfg["rms_norm_eps"]
    T = tokens.shape[1]

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g

    inv = hf_rope_inv_freq(cfg, D)
    emb = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    emb = torch.cat((emb, emb), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    h = w["model.embed_tokens.weight"][tokens]
    for i in range(L):
        p = f"model.layers.{i}."
        x = rms(h, w[p + "input_layernorm.weight"])
        B = x.shape[0]
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(B, T, H, D).transpose(1, 2)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(B, T, KV, D).transpose(1, 2)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(B, T, KV, D).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + mask, dim=-1) @ v
        h = h + a.transpose(1, 2).reshape(B, T, H * D) @ w[p + "self_attn.o_proj.weight"].T
        x = rms(h, w[p + "post_attention_layernorm.weight"])
        g = torch.nn.functional.silu(x @ w[p + "mlp.gate_proj.weight"].T)
        h = h + (g * (x @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return rms(h, w["model.norm.weight"]) @ w["lm_head.weight"].T


def checkpoint_tensors(step_dir):
    """Full tensors from a ctitan checkpoint folder: each tensor's rows (and, for a
    tensor-parallel column piece, columns) from the files the manifest lists; every element
    covered exactly once."""
    man = json.load(open(os.path.join(step_dir, "manifest.json")))
    files = {}
    out = {}
    for name, meta in man["tensors"].items():
        full = np.zeros(meta["shape"], dtype=np.float32)
        seen = np.zeros(meta["shape"], dtype=bool)
        for piece in meta["pieces"]:
            if piece["file"] not in files:
                files[piece["file"]], _ = st.read(os.path.join(step_dir, piece["file"]))
            a, b = piece["rows"]
            c, d = piece.get("cols", [0, full.shape[1] if full.ndim == 2 else 1])
            part = files[piece["file"]][name]
            if full.ndim == 2:
                assert not seen[a:b, c:d].any(), f"{name}: pieces overlap"
                full[a:b, c:d] = part
                seen[a:b, c:d] = True
            else:
                assert not seen[a:b].any(), f"{name}: pieces overlap"
                full[a:b] = part
                seen[a:b] = True
        assert seen.all(), f"{name}: pieces leave elements out"
        out[name] = torch.from_numpy(full).double()
    return man, out


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    export_dir, step_dir = sys.argv[1:]
    try:
        hf, _ = st.read(os.path.join(export_dir, "model.safetensors"))
        cfg = json.load(open(os.path.join(export_dir, "config.json")))
        man, ck = checkpoint_tensors(step_dir)
    except (OSError, ValueError, KeyError) as e:
        print(f"hf_check: {e}", file=sys.stderr)
        return 2
    hfw = {k: torch.from_numpy(v).double() for k, v in hf.items()}
    m = man["model"]
    args = lm.ModelArgs(dim=m["dim"], n_layers=m["n_layers"], n_heads=m["n_heads"],
                        n_kv_heads=m["n_kv_heads"], ffn_hidden=m["ffn_hidden"],
                        vocab_size=m["vocab_size"], norm_eps=m["norm_eps"],
                        rope_theta=m["rope_theta"], rope_scaling=m["rope_scaling"])
    ref = lm.Transformer(args).double()
    ref.load_state_dict(ck, strict=True)
    torch.manual_seed(0)
    tokens = torch.randint(0, args.vocab_size, (2, 24))
    with torch.no_grad():
        want = ref(tokens)
        got = hf_forward(hfw, cfg, tokens)
    err = ((got - want).norm() / want.norm()).item()
    print(f"hf_check: {len(hfw)} tensors; HF-style forward on the export vs reference on the "
          f"checkpoint: logits rel err {err:.3e}")
    return 0 if err < 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
