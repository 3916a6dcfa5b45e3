#!/usr/bin/python3
"""Self-test of the Llama 3 reference, without the C side.

  /usr/bin/python3 tests/reference/selftest.py [--keep DIR]

1. Unit checks written independently of llama_model's code paths: safetensors round trip and
   rejection of corrupt files, RoPE against complex multiplication, Llama 3.1 frequency scaling
   regimes, the LR schedule against hand-computed values, attention against a per-query loop,
   the debugmodel parameter count.
2. End to end through llama_ref.py (run as a subprocess, so exit codes are real): write a random
   inputs.safetensors, produce outputs.safetensors with
     a. the float64 reference itself          -> must exit 0,
     b. a float32 run of the same model        -> must exit 0 (the tolerances are reachable
                                                   by a float32 implementation),
     c. (b) with one gradient entry perturbed  -> must exit 1,
     d. outputs.safetensors missing            -> must exit 2.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_model as lm  # noqa: E402
import llama_ref  # noqa: E402
import safetensors_io  # noqa: E402

CONFIG = {
    "dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 64,
    "vocab_size": 61, "norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": True,
    "lr": 5e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1,
    "max_norm": 5.0, "warmup_steps": 2, "steps": 6, "decay_type": "cosine",
    "decay_ratio": 0.5, "min_lr_factor": 0.1,
}
BATCH, SEQ = 2, 16


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok   {what}")


def test_safetensors(tmp):
    path = os.path.join(tmp, "rt.safetensors")
    rng = np.random.default_rng(1)
    tensors = {"a": rng.standard_normal((3, 5)).astype(np.float32),
               "b": rng.standard_normal(7),
               "c": np.arange(-4, 8, dtype=np.int32).reshape(2, 2, 3),
               "d": np.array([2**40, -1], dtype=np.int64),
               "e": np.zeros((0, 4), dtype=np.float32)}
    safetensors_io.write(path, tensors, {"config": '{"x": 1}'})
    back, meta = safetensors_io.read(path)
    check(meta == {"config": '{"x": 1}'} and back.keys() == tensors.keys() and
          all(back[k].dtype == v.dtype and np.array_equal(back[k], v)
              for k, v in tensors.items()), "safetensors round trip")
    with open(path, "rb") as f:
        blob = f.read()
    for label, bad in (("truncated data", blob[:-1]), ("short header", blob[:5]),
                       ("header longer than file", b"\xff" * 8 + blob[8:])):
        with open(path, "wb") as f:
            f.write(bad)
        try:
            safetensors_io.read(path)
            check(False, f"safetensors rejects {label}")
        except safetensors_io.SafetensorsError:
            check(True, f"safetensors rejects {label}")


def rope_args(head_dim, theta, scaling):
    return lm.ModelArgs(dim=head_dim, n_layers=1, n_heads=1, n_kv_heads=1, ffn_hidden=1,
                        vocab_size=1, rope_theta=theta, rope_scaling=scaling)


def test_rope():
    B, T, N, D = 2, 9, 3, 8
    x = torch.randn(B, T, N, D, dtype=torch.float64)
    freqs = lm.rope_frequencies(rope_args(D, 10000.0, False))
    check(torch.allclose(freqs, torch.tensor([10000.0 ** (-2 * i / D) for i in range(D // 2)],
                                             dtype=torch.float64)), "rope freq_i = theta^(-2i/D)")
    angles = torch.outer(torch.arange(T, dtype=torch.float64), freqs)
    # Meta's formulation: view interleaved pairs as complex numbers, multiply by e^(j angle).
    z = torch.view_as_complex(x.reshape(B, T, N, D // 2, 2).contiguous())
    want = torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)[None, :, None, :])
    got = lm.apply_rope(x, angles.cos(), angles.sin())
    check(torch.allclose(got, want.reshape(B, T, N, D), atol=1e-14), "rope = complex rotation")

    base = lm.rope_frequencies(rope_args(64, 500000.0, False))
    scaled = lm.rope_frequencies(rope_args(64, 500000.0, True))
    wavelen = 2 * math.pi / base
    high, low = wavelen < 2048, wavelen > 8192
    mid = ~(high | low)
    check(high.any() and low.any() and mid.any(), "rope scaling test covers all three regimes")
    check(torch.equal(scaled[high], base[high]) and
          torch.allclose(scaled[low], base[low] / 8, rtol=1e-15) and
          bool(((scaled[mid] < base[mid]) & (scaled[mid] > base[mid] / 8)).all()),
          "rope scaling: keep / divide by 8 / interpolate")
    # D = 4 gives freqs (1, theta^(-1/2)); pick theta so the second has wavelen 4096, where
    # smooth = (8192 / 4096 - 1) / (4 - 1) = 1/3.
    f = 2 * math.pi / 4096
    got = lm.rope_frequencies(rope_args(4, f ** -2, True)).tolist()
    want = [1.0, (1 - 1 / 3) * f / 8 + (1 / 3) * f]
    check(np.allclose(got, want, rtol=1e-12, atol=0), "rope scaling smooth value at wavelen 4096")


def test_lr_schedule():
    f = lm.wsd_lr_factor
    # warmup 2, decay round(6 * 0.5) = 3, stable 1, cosine, min 0.1
    got = [f(s, 2, 6, "cosine", 0.5, 0.1) for s in range(6)]
    cos_f = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)) for p in (1 / 3, 2 / 3, 1.0)]
    check(np.allclose(got, [0.5, 1.0, 1.0] + cos_f, rtol=0, atol=1e-15),
          f"lr cosine schedule {np.round(got, 4).tolist()}")
    got = [f(s, 3, 5, "linear", -1, 0.0) for s in range(5)]
    check(np.allclose(got, [1 / 3, 2 / 3, 1.0, 0.5, 0.0]), "lr linear, decay = total - warmup")
    got = [f(s, 0, 4, "sqrt", 1.0, 0.0) for s in range(4)]
    check(np.allclose(got, [1 - math.sqrt(p) for p in (0.25, 0.5, 0.75, 1.0)]),
          "lr sqrt, no warmup")
    got = [f(s, 10, 4, "linear", -1, 0.0) for s in range(4)]
    check(np.allclose(got, [0.25, 0.5, 0.75, 1.0]), "lr warmup clipped to total steps")
    got = [f(s, 2, 5, "linear", 0.5, 0.0) for s in range(5)]  # round(2.5) = 2 (ties to even)
    check(np.allclose(got, [0.5, 1.0, 1.0, 0.5, 0.0]), "lr decay steps use ties-to-even")
    got = [f(s, 3, 4, "linear", 0.75, 0.0) for s in range(4)]  # 3 + 3 > 4: decay -> 1
    check(np.allclose(got, [1 / 3, 2 / 3, 1.0, 0.0]), "lr decay clipped to total - warmup")


def test_attention():
    args = lm.ModelArgs(dim=24, n_layers=1, n_heads=6, n_kv_heads=2, ffn_hidden=16,
                        vocab_size=5, rope_theta=100.0)
    model = lm.Transformer(args).double()
    attn = model.layers[0].attention
    B, T, D = 2, 7, 4
    x = torch.randn(B, T, 24, dtype=torch.float64)
    cos, sin, mask = model.position_tables(T, torch.float64, x.device)
    got = attn(x, cos, sin, mask)
    q = lm.apply_rope((x @ attn.wq.weight.T).view(B, T, 6, D), cos, sin)
    k = lm.apply_rope((x @ attn.wk.weight.T).view(B, T, 2, D), cos, sin)
    v = (x @ attn.wv.weight.T).view(B, T, 2, D)
    out = torch.zeros(B, T, 6, D, dtype=torch.float64)
    for b in range(B):
        for h in range(6):
            g = h // 3
            for t in range(T):
                s = torch.stack([q[b, t, h] @ k[b, u, g] for u in range(t + 1)]) / math.sqrt(D)
                w = torch.exp(s - s.max())
                out[b, t, h] = (w / w.sum()) @ v[b, : t + 1, g]
    want = out.reshape(B, T, 24) @ attn.wo.weight.T
    check(torch.allclose(got, want, atol=1e-13), "attention = per-query causal GQA loop")


def test_param_count():
    model = lm.Transformer(lm.FLAVORS["debugmodel"])
    check(lm.num_params(model) == 6_163_712, "debugmodel has 6,163,712 parameters")
    check(lm.FLAVORS["125M"].ffn_hidden == 2048, "125M FFN hidden = 2048")


def write_inputs(path, seed=0):
    rng = np.random.default_rng(seed)
    model = lm.Transformer(llama_ref.model_args(CONFIG))
    tensors = {}
    for name, p in model.named_parameters():
        if p.dim() == 2:
            tensors[name] = rng.normal(0.0, 0.2, p.shape).astype(np.float32)
        else:  # norm weights around 1, not exactly 1, so their gradients matter
            tensors[name] = (1.0 + rng.normal(0.0, 0.1, p.shape)).astype(np.float32)
    shape = (CONFIG["steps"], BATCH, SEQ)
    tensors["tokens"] = rng.integers(0, CONFIG["vocab_size"], shape, dtype=np.int32)
    targets = rng.integers(0, CONFIG["vocab_size"], shape, dtype=np.int32)
    targets[rng.random(shape) < 0.15] = lm.IGNORE_INDEX
    tensors["targets"] = targets
    safetensors_io.write(path, tensors, {"config": json.dumps(CONFIG)})


def write_outputs(path, out):
    """Store reference outputs in the C side's dtypes (F32, with F64 losses)."""
    safetensors_io.write(path, {k: v.astype(np.float64 if k in ("loss", "losses")
                                            else np.float32) for k, v in out.items()})


def run_checker(directory, expect, what):
    proc = subprocess.run([sys.executable, os.path.join(HERE, "llama_ref.py"), directory],
                          capture_output=True, text=True)
    if proc.returncode != expect:
        print(proc.stdout + proc.stderr)
    check(proc.returncode == expect, f"llama_ref exits {expect} on {what}")
    return proc.stdout


def test_end_to_end(tmp):
    inputs = os.path.join(tmp, "inputs.safetensors")
    outputs = os.path.join(tmp, "outputs.safetensors")
    write_inputs(inputs)
    cfg, model, tokens, targets = llama_ref.load_inputs(inputs)

    write_outputs(outputs, llama_ref.reference_outputs(cfg, model, tokens, targets))
    run_checker(tmp, 0, "the float64 reference's own outputs")

    _, model, _, _ = llama_ref.load_inputs(inputs)
    out32 = llama_ref.reference_outputs(cfg, model.float(), tokens, targets)
    write_outputs(outputs, out32)
    table = run_checker(tmp, 0, "a float32 run")
    print("\n".join("     " + line for line in table.splitlines()))

    name = "grad.layers.1.feed_forward.w2.weight"
    g = out32[name]
    g.flat[np.argmax(np.abs(g))] *= 1.01
    write_outputs(outputs, out32)
    run_checker(tmp, 1, f"{name} perturbed by 1% in one entry")

    os.remove(outputs)
    run_checker(tmp, 2, "a missing outputs.safetensors")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", metavar="DIR", help="write the exchange files here and keep them")
    args = ap.parse_args()
    torch.manual_seed(0)
    lm.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or tmp
        os.makedirs(work, exist_ok=True)
        test_safetensors(tmp)
        test_rope()
        test_lr_schedule()
        test_attention()
        test_param_count()
        test_end_to_end(work)
    print("selftest: all checks passed")


if __name__ == "__main__":
    main()
