#!/usr/bin/python3
"""Check ctitan's Llama 3 forward, backward and training steps against a float64 PyTorch run.

Usage: /usr/bin/python3 tests/reference/llama_ref.py DIR [--threads N] [--tol-logits X] ...

DIR/inputs.safetensors (written by the C test):
  every parameter (F32, TorchTitan names), tokens I32 (S, B, T), targets I32 (S, B, T) with
  -100 = ignored; __metadata__["config"] = JSON with dim, n_layers, n_heads, n_kv_heads,
  ffn_hidden, vocab_size, norm_eps, rope_theta, rope_scaling, lr, beta1, beta2, eps,
  weight_decay, max_norm, warmup_steps, steps (= S), decay_type, decay_ratio, min_lr_factor,
  and optionally rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_ctx
  (default 8, 1, 4, 8192).
DIR/outputs.safetensors (the C results):
  logits F32 (B, T, V) and loss F64 (1,) of batch 0 at the initial weights; grad.<name> F32,
  the gradient of that loss (before clipping); losses F64 (S,), the loss of each training step
  before its update; final.<name> F32, every parameter after S steps.

The reference casts the F32 inputs to float64 and recomputes everything in float64, so its
own rounding error is negligible next to the tolerances. Error of each tensor:
relative = ||c - ref||_2 / ||ref||_2 (the absolute norm when ||ref|| = 0), and max |c - ref|.
Exit status: 0 all within tolerance, 1 some outside (listed), 2 bad or missing files.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_model as lm  # noqa: E402
import safetensors_io  # noqa: E402

CONFIG_KEYS = {
    "dim": int, "n_layers": int, "n_heads": int, "n_kv_heads": int, "ffn_hidden": int,
    "vocab_size": int, "norm_eps": float, "rope_theta": float, "rope_scaling": bool,
    "lr": float, "beta1": float, "beta2": float, "eps": float, "weight_decay": float,
    "max_norm": float, "warmup_steps": int, "steps": int, "decay_type": str,
    "decay_ratio": float, "min_lr_factor": float,
}
# Optional: the Llama 3.1 RoPE scaling constants; absent keys keep ModelArgs' defaults.
OPTIONAL_KEYS = {
    "rope_factor": float, "rope_low_freq_factor": float, "rope_high_freq_factor": float,
    "rope_original_ctx": int,
}


class BadInput(Exception):
    """The exchange files are missing or inconsistent (exit status 2)."""


def parse_config(text):
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInput(f"config metadata is not JSON: {e}") from e
    if not isinstance(raw, dict):
        raise BadInput("config metadata is not a JSON object")
    cfg = {}
    for key, typ in (*CONFIG_KEYS.items(), *OPTIONAL_KEYS.items()):
        if key not in raw:
            if key in OPTIONAL_KEYS:
                continue
            raise BadInput(f"config lacks {key!r}")
        val = raw[key]
        ok = (isinstance(val, str) if typ is str else
              isinstance(val, (bool, int)) if typ is bool else
              isinstance(val, int) and not isinstance(val, bool) if typ is int else
              isinstance(val, (int, float)) and not isinstance(val, bool))
        if not ok:
            raise BadInput(f"config {key!r} = {val!r} is not a {typ.__name__}")
        cfg[key] = typ(val)
    if cfg["dim"] % cfg["n_heads"] or cfg["n_heads"] % cfg["n_kv_heads"] or \
            (cfg["dim"] // cfg["n_heads"]) % 2:
        raise BadInput("config needs dim % n_heads == 0, n_heads % n_kv_heads == 0, even head dim")
    if cfg["decay_type"] not in ("linear", "sqrt", "cosine"):
        raise BadInput(f"config decay_type {cfg['decay_type']!r} is not linear|sqrt|cosine")
    return cfg


def model_args(cfg):
    fields = set(lm.ModelArgs.__dataclass_fields__)
    return lm.ModelArgs(**{k: v for k, v in cfg.items() if k in fields})


def load_inputs(path):
    """Return (cfg, model in float64 with the initial weights, tokens, targets)."""
    tensors, meta = safetensors_io.read(path)
    if "config" not in meta:
        raise BadInput(f"{path}: __metadata__ lacks 'config'")
    cfg = parse_config(meta["config"])
    model = lm.Transformer(model_args(cfg)).double()
    state = {}
    for name, p in model.named_parameters():
        if name not in tensors:
            raise BadInput(f"{path}: missing parameter {name}")
        arr = tensors[name]
        if arr.dtype != np.float32 or tuple(arr.shape) != tuple(p.shape):
            raise BadInput(f"{path}: {name} is {arr.dtype} {list(arr.shape)}, "
                           f"expected float32 {list(p.shape)}")
        state[name] = torch.from_numpy(arr.astype(np.float64))
    model.load_state_dict(state)

    batches = []
    for key in ("tokens", "targets"):
        arr = tensors.get(key)
        if arr is None or arr.dtype != np.int32 or arr.ndim != 3 or arr.shape[0] != cfg["steps"]:
            raise BadInput(f"{path}: {key} must be I32 (steps={cfg['steps']}, B, T), got "
                           f"{None if arr is None else (arr.dtype, list(arr.shape))}")
        batches.append(torch.from_numpy(arr.astype(np.int64)))
    tokens, targets = batches
    if tokens.shape != targets.shape:
        raise BadInput(f"{path}: tokens {list(tokens.shape)} and targets "
                       f"{list(targets.shape)} differ in shape")
    V = cfg["vocab_size"]
    if tokens.min() < 0 or tokens.max() >= V:
        raise BadInput(f"{path}: tokens outside [0, {V})")
    valid = targets[targets != lm.IGNORE_INDEX]
    if valid.numel() and (valid.min() < 0 or valid.max() >= V):
        raise BadInput(f"{path}: targets outside [0, {V}) other than {lm.IGNORE_INDEX}")
    return cfg, model, tokens, targets


def reference_outputs(cfg, model, tokens, targets):
    """Everything outputs.safetensors should hold, as numpy arrays in the model's dtype.

    Trains `model` in place.
    """
    out = {}
    logits = model(tokens[0])
    loss = lm.cross_entropy_loss(logits, targets[0])
    loss.backward()
    out["logits"] = logits.detach().numpy()
    out["loss"] = np.array([loss.item()])
    for name, p in model.named_parameters():
        out["grad." + name] = p.grad.numpy().copy()
    model.zero_grad(set_to_none=True)

    optimizer = lm.build_optimizer(model, cfg["lr"], cfg["beta1"], cfg["beta2"], cfg["eps"],
                                   cfg["weight_decay"])
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


def compare(c, ref):
    """(relative L2 error, max abs difference); NaN/Inf in c give an infinite error."""
    if not np.all(np.isfinite(c)):
        return float("inf"), float("inf")
    diff = c.astype(np.float64) - ref
    ref_norm = np.linalg.norm(ref)
    err = np.linalg.norm(diff)
    rel = err / ref_norm if ref_norm > 0 else err
    return float(rel), float(np.max(np.abs(diff))) if diff.size else 0.0


def check(c_out, ref, tols):
    """Return (rows, failures); rows are (name, rel, maxabs, tol)."""
    rows, failures = [], []

    def add(name, c, r, tol):
        rel, maxabs = compare(c, r)
        rows.append((name, rel, maxabs, tol))
        if not rel < tol:  # NaN-safe
            failures.append(name)

    add("logits", c_out["logits"], ref["logits"], tols.logits)
    add("loss", c_out["loss"], ref["loss"], tols.loss)
    grads = [k for k in ref if k.startswith("grad.")]
    finals = [k for k in ref if k.startswith("final.")]
    for k in grads:
        add(k, c_out[k], ref[k], tols.grad)
    for s in range(ref["losses"].shape[0]):
        add(f"losses[{s}]", c_out["losses"][s:s + 1], ref["losses"][s:s + 1], tols.losses)
    for k in finals:
        add(k, c_out[k], ref[k], tols.final)
    return rows, failures


def check_outputs(path, tensors, ref):
    """The C outputs must hold every reference tensor, F32 except the F64 loss and losses."""
    want_dtype = {"loss": np.float64, "losses": np.float64}
    for key, r in ref.items():
        arr = tensors.get(key)
        dt = want_dtype.get(key, np.float32)
        if arr is None:
            raise BadInput(f"{path}: missing {key}")
        if arr.dtype != dt or arr.shape != r.shape:
            raise BadInput(f"{path}: {key} is {arr.dtype} {list(arr.shape)}, expected "
                           f"{np.dtype(dt)} {list(r.shape)}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="directory with inputs.safetensors and outputs.safetensors")
    ap.add_argument("--threads", type=int, default=1, help="torch and BLAS threads (default 1)")
    ap.add_argument("--tol-logits", dest="logits", type=float, default=1e-5)
    ap.add_argument("--tol-loss", dest="loss", type=float, default=1e-5)
    ap.add_argument("--tol-grad", dest="grad", type=float, default=1e-4)
    ap.add_argument("--tol-losses", dest="losses", type=float, default=1e-5,
                    help="per training step loss")
    ap.add_argument("--tol-final", dest="final", type=float, default=1e-4,
                    help="parameters after all steps")
    tols = ap.parse_args(argv)
    lm.set_num_threads(tols.threads)

    out_path = os.path.join(tols.dir, "outputs.safetensors")
    try:
        cfg, model, tokens, targets = load_inputs(os.path.join(tols.dir, "inputs.safetensors"))
        c_out, _ = safetensors_io.read(out_path)  # before the (slow) reference run
        ref = reference_outputs(cfg, model, tokens, targets)
        check_outputs(out_path, c_out, ref)
    except (BadInput, safetensors_io.SafetensorsError) as e:
        print(f"llama_ref: {e}", file=sys.stderr)
        return 2

    rows, failures = check(c_out, ref, tols)
    width = max(len(r[0]) for r in rows)
    print(f"{'tensor':<{width}}  {'rel err':>10}  {'max abs':>10}  {'tol':>7}")
    for name, rel, maxabs, tol in rows:
        flag = "" if rel < tol else "  FAIL"
        print(f"{name:<{width}}  {rel:10.3e}  {maxabs:10.3e}  {tol:7.0e}{flag}")
    if failures:
        print(f"llama_ref: {len(failures)} of {len(rows)} outside tolerance: "
              + ", ".join(failures), file=sys.stderr)
        return 1
    print(f"llama_ref: all {len(rows)} tensors within tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
