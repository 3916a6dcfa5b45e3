#!/usr/bin/python3
"""Check ctitan's mixture-of-experts (deepseek_v3) model against a float64 PyTorch run.

Usage: /usr/bin/python3 tests/reference/moe_ref.py DIR [--threads N] [--tol-loss X] ...

Written from the equations (DeepSeek-V3, arXiv 2412.19437 sec. 2.1.2 and 2.2; TorchTitan's
models/moe/moe.py and components/optimizer.py as of 2025-12), not from ctitan's code: the
experts run as a per-expert loop over a token mask with index_add (no sorting), top-k is
torch.topk. Attention, RMSNorm, the dense SwiGLU, RoPE, the LR schedule and AdamW are the
Llama reference's (llama_model.py).

DIR/inputs.safetensors: every parameter (F32, ctitan's names), tokens and targets I32
  (S, B, T), __metadata__["config"] = JSON (model shape, router settings, training settings).
DIR/outputs.safetensors: loss F64 (1,) and grad.<name> F32 of one forward/backward on batch 0
  before training; losses, grad_norms F64 (S,) of S training steps; bias F64 (MoE layers x E)
  and final.<name> F32 after them.

The MoE FFN on xn (N, C), E routed experts, top-k K:
  s = softmax(xn G^T) or sigmoid(xn G^T)                     (N, E)
  idx = topk(s + bias, K)       (the bias only selects: no gradient through it)
  g = s[idx], / (sum g + 1e-20) if route_norm, * route_scale
  out = shared(xn) + sum_k g_k * expert_{idx_k}(xn),  expert_e(x) = w2_e(silu(w1_e x) * w3_e x)
Sequence-wise auxiliary loss per MoE layer (alpha > 0), per sequence of T tokens:
  f_e = E / (K T) * #{(t, k): idx[t, k] = e},  P_e = mean_t s_te / sum_j s_tj,  L = sum_e f_e P_e
The step's loss = (sum of token cross-entropies + sum_layers alpha T sum_seq L) / valid tokens.
After each optimizer step, per MoE layer with c = the step's tokens per expert:
  delta = coeff * sign(mean(c) - c);  bias += delta - mean(delta)
Exit status: 0 all within tolerance, 1 some outside (listed), 2 bad or missing files.
"""

import argparse
import json
import os
import sys
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_model as lm  # noqa: E402
import safetensors_io  # noqa: E402

CONFIG_KEYS = {
    "dim": int, "n_layers": int, "n_heads": int, "n_kv_heads": int, "vocab_size": int,
    "inter_dim": int, "moe_inter_dim": int, "n_dense_layers": int, "n_routed_experts": int,
    "n_shared_experts": int, "top_k": int, "score_func": str, "route_norm": int,
    "route_scale": float, "load_balance_coeff": float, "aux_loss_alpha": float,
    "norm_eps": float, "rope_theta": float,
    "lr": float, "beta1": float, "beta2": float, "eps": float, "weight_decay": float,
    "max_norm": float, "warmup_steps": int, "steps": int, "decay_type": str,
    "decay_ratio": float, "min_lr_factor": float,
}


class BadInput(Exception):
    pass


class Router(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate = nn.Linear(c["dim"], c["n_routed_experts"], bias=False)


class Experts(nn.Module):
    """E SwiGLU experts, stored as ctitan's 2-D tensors: w1, w3 (E*Fm, C), w2 (E*C, Fm)."""

    def __init__(self, c):
        super().__init__()
        E, C, Fm = c["n_routed_experts"], c["dim"], c["moe_inter_dim"]
        self.E, self.C, self.Fm = E, C, Fm
        self.w1 = nn.Parameter(torch.zeros(E * Fm, C))
        self.w2 = nn.Parameter(torch.zeros(E * C, Fm))
        self.w3 = nn.Parameter(torch.zeros(E * Fm, C))

    def expert(self, e, x):
        Fm, C = self.Fm, self.C
        w1 = self.w1[e * Fm:(e + 1) * Fm]
        w3 = self.w3[e * Fm:(e + 1) * Fm]
        w2 = self.w2[e * C:(e + 1) * C]
        return (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.router = Router(c)
        self.experts = Experts(c)
        ns = c["n_shared_experts"]
        self.shared_experts = lm.FeedForward(c["dim"], c["moe_inter_dim"] * ns) if ns else None

    def forward(self, x, bias):
        c = self.c
        B, T, C = x.shape
        E, K = c["n_routed_experts"], c["top_k"]
        xf = x.reshape(B * T, C)
        logits = self.router.gate(xf)
        s = torch.softmax(logits, dim=-1) if c["score_func"] == "softmax" else torch.sigmoid(logits)
        _, idx = torch.topk(s.detach() + bias, K, dim=-1)
        g = s.gather(1, idx)
        if c["route_norm"]:
            g = g / (g.sum(dim=-1, keepdim=True) + 1e-20)
        g = g * c["route_scale"]
        out = torch.zeros_like(xf)
        for e in range(E):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            y = self.experts.expert(e, xf[tok]) * g[tok, slot].unsqueeze(1)
            out = out.index_add(0, tok, y)
        if self.shared_experts is not None:
            out = out + self.shared_experts(xf)
        counts = torch.bincount(idx.flatten(), minlength=E).to(torch.float64)
        aux = torch.zeros((), dtype=x.dtype)
        if c["aux_loss_alpha"] > 0:
            sn = s / s.sum(dim=-1, keepdim=True)
            for b in range(B):
                f = torch.bincount(idx[b * T:(b + 1) * T].flatten(), minlength=E).to(x.dtype)
                f = f * E / (K * T)
                P = sn[b * T:(b + 1) * T].mean(dim=0)
                aux = aux + (f * P).sum()
            aux = aux * c["aux_loss_alpha"] * T
        return out.view(B, T, C), counts, aux


class Block(nn.Module):
    def __init__(self, c, args, dense):
        super().__init__()
        self.attention_norm = lm.RMSNorm(c["dim"], c["norm_eps"])
        self.attention = lm.Attention(args)
        self.ffn_norm = lm.RMSNorm(c["dim"], c["norm_eps"])
        if dense:
            self.feed_forward = lm.FeedForward(c["dim"], c["inter_dim"])
        else:
            self.moe = MoE(c)
        self.dense = dense

    def forward(self, h, cos, sin, mask, bias):
        h = h + self.attention(self.attention_norm(h), cos, sin, mask)
        if self.dense:
            return h + self.feed_forward(self.ffn_norm(h)), None, None
        y, counts, aux = self.moe(self.ffn_norm(h), bias)
        return h + y, counts, aux


class MoELM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        args = SimpleNamespace(dim=c["dim"], n_heads=c["n_heads"], n_kv_heads=c["n_kv_heads"],
                               rope_theta=c["rope_theta"], rope_scaling=False)
        self.tok_embeddings = nn.Embedding(c["vocab_size"], c["dim"])
        self.layers = nn.ModuleList(Block(c, args, l < c["n_dense_layers"])
                                    for l in range(c["n_layers"]))
        self.norm = lm.RMSNorm(c["dim"], c["norm_eps"])
        self.output = nn.Linear(c["dim"], c["vocab_size"], bias=False)
        self.rope_freqs = lm.rope_frequencies(args)
        n_moe = c["n_layers"] - c["n_dense_layers"]
        self.bias = torch.zeros(n_moe, c["n_routed_experts"], dtype=torch.float64)

    def forward(self, tokens):
        """(logits, per-layer token counts, total auxiliary loss sum)"""
        h = self.tok_embeddings(tokens)
        T = tokens.shape[1]
        t = torch.arange(T, dtype=torch.float64)
        ang = torch.outer(t, self.rope_freqs)
        cos, sin = ang.cos(), ang.sin()
        mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
        counts, aux = [], torch.zeros((), dtype=torch.float64)
        j = 0
        for layer in self.layers:
            h, cnt, a = layer(h, cos, sin, mask, None if layer.dense else self.bias[j])
            if cnt is not None:
                counts.append(cnt)
                aux = aux + a
                j += 1
        return self.output(self.norm(h)), counts, aux

    def loss(self, tokens, targets):
        logits, counts, aux = self(tokens)
        ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100,
                             reduction="sum")
        valid = max(int((targets != -100).sum()), 1)
        return (ce + aux) / valid, counts

    def update_bias(self, counts):
        coeff = self.c["load_balance_coeff"]
        if coeff <= 0:
            return
        for j, cnt in enumerate(counts):
            delta = coeff * torch.sign(cnt.mean() - cnt)
            self.bias[j] += delta - delta.mean()


def load_inputs(path):
    tensors, meta = safetensors_io.read(path)
    if "config" not in meta:
        raise BadInput(f"{path}: __metadata__ lacks 'config'")
    raw = json.loads(meta["config"])
    cfg = {}
    for key, typ in CONFIG_KEYS.items():
        if key not in raw:
            raise BadInput(f"config lacks {key!r}")
        cfg[key] = typ(raw[key])
    model = MoELM(cfg).double()
    names = dict(model.named_parameters())
    for name, p in names.items():
        arr = tensors.get(name)
        if arr is None or arr.dtype != np.float32 or tuple(arr.shape) != tuple(p.shape):
            raise BadInput(f"{path}: parameter {name} missing or not float32 {list(p.shape)}")
        with torch.no_grad():
            p.copy_(torch.from_numpy(arr.astype(np.float64)))
    unknown = set(tensors) - set(names) - {"tokens", "targets"}
    if unknown:
        raise BadInput(f"{path}: tensors the reference does not know: {sorted(unknown)}")
    tokens = torch.from_numpy(tensors["tokens"].astype(np.int64))
    targets = torch.from_numpy(tensors["targets"].astype(np.int64))
    return cfg, model, tokens, targets


def reference_outputs(cfg, model, tokens, targets):
    out = {}
    loss, _ = model.loss(tokens[0], targets[0])
    loss.backward()
    out["loss"] = np.array([loss.item()])
    for name, p in model.named_parameters():
        out["grad." + name] = p.grad.numpy().copy()
    model.zero_grad(set_to_none=True)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"])
    sched = lm.build_lr_scheduler(opt, cfg["warmup_steps"], cfg["steps"], cfg["decay_type"],
                                  cfg["decay_ratio"], cfg["min_lr_factor"])
    losses, norms = [], []
    for s in range(cfg["steps"]):
        loss, counts = model.loss(tokens[s], targets[s])
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["max_norm"])))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        model.update_bias(counts)
        losses.append(loss.item())
    out["losses"] = np.array(losses)
    out["grad_norms"] = np.array(norms)
    out["bias"] = model.bias.flatten().numpy().copy()
    for name, p in model.named_parameters():
        out["final." + name] = p.detach().numpy().copy()
    return out


def compare(c, ref):
    if not np.all(np.isfinite(c)):
        return float("inf"), float("inf")
    diff = c.astype(np.float64) - ref
    n = np.linalg.norm(ref)
    rel = np.linalg.norm(diff) / n if n > 0 else np.linalg.norm(diff)
    return float(rel), float(np.max(np.abs(diff))) if diff.size else 0.0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tol-loss", dest="loss", type=float, default=1e-5)
    ap.add_argument("--tol-grad", dest="grad", type=float, default=1e-4)
    ap.add_argument("--tol-losses", dest="losses", type=float, default=1e-5)
    ap.add_argument("--tol-norms", dest="norms", type=float, default=1e-4)
    ap.add_argument("--tol-bias", dest="bias", type=float, default=1e-9)
    ap.add_argument("--tol-final", dest="final", type=float, default=1e-4)
    tols = ap.parse_args(argv)
    lm.set_num_threads(tols.threads)
    out_path = os.path.join(tols.dir, "outputs.safetensors")
    try:
        cfg, model, tokens, targets = load_inputs(os.path.join(tols.dir, "inputs.safetensors"))
        c_out, _ = safetensors_io.read(out_path)
        ref = reference_outputs(cfg, model, tokens, targets)
        for key, r in ref.items():
            if key not in c_out or c_out[key].shape != r.shape:
                raise BadInput(f"{out_path}: {key} missing or not {list(r.shape)}")
    except (BadInput, safetensors_io.SafetensorsError, KeyError, ValueError) as e:
        print(f"moe_ref: {e}", file=sys.stderr)
        return 2
    rows, failures = [], []

    def add(name, tol):
        rel, maxabs = compare(c_out[name], ref[name])
        rows.append((name, rel, maxabs, tol))
        if not rel < tol:
            failures.append(name)

    add("loss", tols.loss)
    for k in ref:
        if k.startswith("grad."):
            add(k, tols.grad)
    add("losses", tols.losses)
    add("grad_norms", tols.norms)
    add("bias", tols.bias)
    for k in ref:
        if k.startswith("final."):
            add(k, tols.final)
    width = max(len(r[0]) for r in rows)
    for name, rel, maxabs, tol in rows:
        if name in ("loss", "losses", "grad_norms", "bias") or not rel < tol:
            flag = "" if rel < tol else "  FAIL"
            print(f"{name:<{width}}  {rel:10.3e}  {maxabs:10.3e}  {tol:7.0e}{flag}")
    print("moe_ref: losses " + " ".join(f"{x:.6f}" for x in ref["losses"])
          + ", grad_norms " + " ".join(f"{x:.6f}" for x in ref["grad_norms"])
          + f", |bias| {np.abs(ref['bias']).sum():.4f}")
    worst = {}
    for name, rel, _, _ in rows:
        kind = name.split(".")[0]
        worst[kind] = max(worst.get(kind, 0.0), rel)
    print("moe_ref: worst rel err by kind: " + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    if failures:
        print(f"moe_ref: {len(failures)} of {len(rows)} outside tolerance: " + ", ".join(failures),
              file=sys.stderr)
        return 1
    print(f"moe_ref: all {len(rows)} within tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
