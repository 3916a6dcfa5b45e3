#!/usr/bin/python3
"""Check ctitan's Hyena forward, backward and training steps against a float64 PyTorch run.

Usage: /usr/bin/python3 tests/reference/hyena_ref.py DIR [--threads N] [--tol-logits X] ...

Written from the equations (safari's src/models/sequence/hyena.py and long_conv_lm.py), not
from ctitan's code. Exchange files as tests/reference/llama_ref.py:
DIR/inputs.safetensors: every parameter (F32, ctitan's names), tokens and targets I32
  (S, B, T), __metadata__["config"] = JSON with dim, n_layers, vocab_size, order,
  filter_order, emb_dim, ffn_hidden, l_max, norm_eps and the training settings (lr, beta1,
  beta2, eps, weight_decay, max_norm, warmup_steps, steps, decay_type, decay_ratio,
  min_lr_factor).
DIR/outputs.safetensors: logits F32 (B, T, V), loss F64 (1,), grad.<name> F32, losses F64
  (S,), final.<name> F32.

The model, per block (x the residual stream, D = dim, N = order):
  u = LayerNorm1(x); p = in_proj(u) (D -> (N+1)D); pc = depthwise causal Conv1d(p, 3 taps)
  x_0..x_{N-1}, v = split(pc, D)
  h = window * MLP(z): z = [t/(l_max-1), cos(f w_t), -sin(f w_t)] (real/imag of
      exp(-i f w_t)), f = linspace(1e-4, B-1, B), w_t = 2 pi t / l_max, B = (emb_dim-1)/2;
      MLP = Linear-Sin-Linear-Sin-Linear-Sin-Linear(no bias), one shared Sin(freq);
      window = exp(-t/(l_max-1) * |linspace(ln(1e-2)/1.5, ln(1e-2)/0.3, (N-1)D)|)
  k = rearrange(h, 'l (o d) -> o d l'); bias = rearrange(filter_fn.bias, '(o d) -> o d')
  for o, x_i in enumerate(reversed(x[1:])): v = v * x_i; v = fftconv(v, k[o]) + bias[o] v
  x = x + out_proj(v * x_0);  x = x + fc2(gelu_tanh(fc1(LayerNorm2(x))))
then logits = LayerNorm_f(x) E^T with the embedding E (tied).
AdamW with weight decay on 2-D parameters except the implicit filter's (safari: wd 0 there).
Exit status: 0 all within tolerance, 1 some outside (listed), 2 bad or missing files.
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_model as lm  # noqa: E402  (cross-entropy, LR schedule, train step)
import llama_ref  # noqa: E402  (comparison and reporting)
import safetensors_io  # noqa: E402

CONFIG_KEYS = {
    "dim": int, "n_layers": int, "vocab_size": int, "order": int, "filter_order": int,
    "emb_dim": int, "ffn_hidden": int, "l_max": int, "norm_eps": float,
    "lr": float, "beta1": float, "beta2": float, "eps": float, "weight_decay": float,
    "max_norm": float, "warmup_steps": int, "steps": int, "decay_type": str,
    "decay_ratio": float, "min_lr_factor": float,
}


class Sin(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.freq = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return torch.sin(self.freq * x)


class ShortFilter(nn.Module):
    """Depthwise causal Conv1d: PyTorch's padding K-1, truncated to the input length."""

    def __init__(self, channels, taps=3):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(channels, taps))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x):  # (B, C, T)
        T = x.shape[-1]
        y = F.conv1d(x, self.weight.unsqueeze(1), self.bias, padding=self.weight.shape[1] - 1,
                     groups=x.shape[1])
        return y[..., :T]


class HyenaFilter(nn.Module):
    def __init__(self, channels, emb_dim, order):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(channels))
        act = Sin(order)
        self.implicit_filter = nn.Sequential(
            nn.Linear(emb_dim, order), act, nn.Linear(order, order), act,
            nn.Linear(order, order), act, nn.Linear(order, channels, bias=False))

    def filter(self, L, l_max):
        E = self.implicit_filter[0].in_features
        bands = (E - 1) // 2
        t = torch.linspace(0, 1, l_max, dtype=torch.float64)[:L, None]
        t_rescaled = torch.linspace(0, l_max - 1, l_max, dtype=torch.float64)[:L, None]
        w = 2 * math.pi * t_rescaled / l_max
        f = torch.linspace(1e-4, bands - 1, bands, dtype=torch.float64)[None]
        zc = torch.exp(-1j * f * w)
        z = torch.cat([t, zc.real, zc.imag], dim=-1)
        C = self.bias.shape[0]
        deltas = torch.linspace(math.log(1e-2) / 1.5, math.log(1e-2) / 0.3, C,
                                dtype=torch.float64)[None]
        dt = self.bias.dtype  # float64 in the reference; float32 in the self-test's run
        return self.implicit_filter(z.to(dt)) * torch.exp(-t * deltas.abs()).to(dt)  # (L, C)


def fftconv(u, k, bias):
    """u (B, D, L), k (D, L), bias (D): causal convolution + skip, by zero-padded FFT."""
    L = u.shape[-1]
    n = 2 * L
    y = torch.fft.irfft(torch.fft.rfft(u, n=n) * torch.fft.rfft(k, n=n), n=n)[..., :L]
    return y + u * bias[:, None]


class HyenaOperator(nn.Module):
    def __init__(self, d, order, filter_order, emb_dim, l_max):
        super().__init__()
        self.d, self.order, self.l_max = d, order, l_max
        self.in_proj = nn.Linear(d, (order + 1) * d)
        self.short_filter = ShortFilter((order + 1) * d)
        self.filter_fn = HyenaFilter((order - 1) * d, emb_dim, filter_order)
        self.out_proj = nn.Linear(d, d)

    def forward(self, u):  # (B, L, D)
        L = u.shape[1]
        uc = self.short_filter(self.in_proj(u).transpose(1, 2))
        *x, v = uc.split(self.d, dim=1)
        h = self.filter_fn.filter(L, self.l_max)  # (L, (N-1)D), column o*D + c
        k = h.T.reshape(self.order - 1, self.d, L)  # 'l (o d) -> o d l'
        bias = self.filter_fn.bias.reshape(self.order - 1, self.d)
        for o, x_i in enumerate(reversed(x[1:])):
            v = v * x_i
            v = fftconv(v, k[o], bias[o])
        return self.out_proj((v * x[0]).transpose(1, 2))


class FeedForward(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["dim"]
        self.mixer_norm = nn.LayerNorm(d, eps=cfg["norm_eps"])
        self.mixer = HyenaOperator(d, cfg["order"], cfg["filter_order"], cfg["emb_dim"],
                                   cfg["l_max"])
        self.ffn_norm = nn.LayerNorm(d, eps=cfg["norm_eps"])
        self.feed_forward = FeedForward(d, cfg["ffn_hidden"])

    def forward(self, x):
        x = x + self.mixer(self.mixer_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class HyenaLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg["vocab_size"], cfg["dim"])
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg["n_layers"]))
        self.norm = nn.LayerNorm(cfg["dim"], eps=cfg["norm_eps"])

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x) @ self.tok_embeddings.weight.T  # tied head


def build_optimizer(model, cfg):
    decay = [p for n, p in model.named_parameters()
             if p.dim() == 2 and "implicit_filter" not in n]
    no_decay = [p for n, p in model.named_parameters()
                if not (p.dim() == 2 and "implicit_filter" not in n)]
    groups = [{"params": decay, "weight_decay": cfg["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]),
                             eps=cfg["eps"])


def load_inputs(path):
    tensors, meta = safetensors_io.read(path)
    if "config" not in meta:
        raise llama_ref.BadInput(f"{path}: __metadata__ lacks 'config'")
    raw = json.loads(meta["config"])
    cfg = {}
    for key, typ in CONFIG_KEYS.items():
        if key not in raw:
            raise llama_ref.BadInput(f"config lacks {key!r}")
        cfg[key] = typ(raw[key])
    model = HyenaLM(cfg).double()
    state = {}
    for name, p in model.named_parameters():
        arr = tensors.get(name)
        if arr is None or arr.dtype != np.float32 or tuple(arr.shape) != tuple(p.shape):
            raise llama_ref.BadInput(f"{path}: parameter {name} missing or not float32 "
                                     f"{list(p.shape)}")
        state[name] = torch.from_numpy(arr.astype(np.float64))
    missing = set(tensors) - set(state) - {"tokens", "targets"}
    if missing:
        raise llama_ref.BadInput(f"{path}: tensors the reference does not know: {missing}")
    with torch.no_grad():  # (not load_state_dict: the shared Sin appears 3 times there)
        for name, p in model.named_parameters():
            p.copy_(state[name])
    tokens = torch.from_numpy(tensors["tokens"].astype(np.int64))
    targets = torch.from_numpy(tensors["targets"].astype(np.int64))
    return cfg, model, tokens, targets


def reference_outputs(cfg, model, tokens, targets):
    out = {}
    logits = model(tokens[0])
    loss = lm.cross_entropy_loss(logits, targets[0])
    loss.backward()
    out["logits"] = logits.detach().numpy()
    out["loss"] = np.array([loss.item()])
    for name, p in model.named_parameters():
        out["grad." + name] = p.grad.numpy().copy()
    model.zero_grad(set_to_none=True)
    optimizer = build_optimizer(model, cfg)
    scheduler = lm.build_lr_scheduler(optimizer, cfg["warmup_steps"], cfg["steps"],
                                      cfg["decay_type"], cfg["decay_ratio"],
                                      cfg["min_lr_factor"])
    losses = [lm.train_step(model, optimizer, scheduler, tokens[s], targets[s],
                            cfg["max_norm"]).item()
              for s in range(cfg["steps"])]
    out["losses"] = np.array(losses)
    for name, p in model.named_parameters():
        out["final." + name] = p.detach().numpy().copy()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tol-logits", dest="logits", type=float, default=1e-5)
    ap.add_argument("--tol-loss", dest="loss", type=float, default=1e-5)
    ap.add_argument("--tol-grad", dest="grad", type=float, default=1e-4)
    ap.add_argument("--tol-losses", dest="losses", type=float, default=1e-5)
    ap.add_argument("--tol-final", dest="final", type=float, default=1e-4)
    tols = ap.parse_args(argv)
    lm.set_num_threads(tols.threads)
    out_path = os.path.join(tols.dir, "outputs.safetensors")
    try:
        cfg, model, tokens, targets = load_inputs(os.path.join(tols.dir, "inputs.safetensors"))
        c_out, _ = safetensors_io.read(out_path)
        ref = reference_outputs(cfg, model, tokens, targets)
        llama_ref.check_outputs(out_path, c_out, ref)
    except (llama_ref.BadInput, safetensors_io.SafetensorsError, KeyError, ValueError) as e:
        print(f"hyena_ref: {e}", file=sys.stderr)
        return 2
    rows, failures = llama_ref.check(c_out, ref, tols)
    width = max(len(r[0]) for r in rows)
    print(f"{'tensor':<{width}}  {'rel err':>10}  {'max abs':>10}  {'tol':>7}")
    for name, rel, maxabs, tol in rows:
        flag = "" if rel < tol else "  FAIL"
        print(f"{name:<{width}}  {rel:10.3e}  {maxabs:10.3e}  {tol:7.0e}{flag}")
    worst = {}
    for name, rel, _, _ in rows:
        kind = name.split(".")[0].split("[")[0]
        worst[kind] = max(worst.get(kind, 0.0), rel)
    print("hyena_ref: worst rel err by kind: "
          + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    if failures:
        print(f"hyena_ref: {len(failures)} of {len(rows)} outside tolerance: "
              + ", ".join(failures), file=sys.stderr)
        return 1
    print(f"hyena_ref: all {len(rows)} tensors within tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
