#!/usr/bin/python3
"""Self-test of the Hyena reference (tests/reference/hyena_ref.py), without the C side.

  /usr/bin/python3 tests/reference/hyena_selftest.py [--keep DIR]

1. Unit checks written independently of hyena_ref's code paths: the FFT long convolution
   against a direct causal sum, the short depthwise filter against a per-tap loop, the implicit
   filter's window (decays along t, one rate per channel), and the tied head.
2. End to end through hyena_ref.py (run as a subprocess, so exit codes are real): write a random
   inputs.safetensors, produce outputs.safetensors with
     a. the float64 reference itself          -> must exit 0,
     b. a float32 run of the same model        -> must exit 0 (the tolerances are reachable
                                                   by a float32 implementation),
     c. (b) with one gradient entry perturbed  -> must exit 1,
     d. (b) with the losses off by 1e-3        -> must exit 1,
     e. outputs.safetensors missing            -> must exit 2.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hyena_ref  # noqa: E402
import llama_model as lm  # noqa: E402
import safetensors_io  # noqa: E402

CONFIG = {
    "dim": 8, "n_layers": 2, "vocab_size": 37, "order": 3, "filter_order": 8, "emb_dim": 5,
    "ffn_hidden": 16, "l_max": 16, "norm_eps": 1e-5,
    "lr": 5e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1,
    "max_norm": 5.0, "warmup_steps": 2, "steps": 4, "decay_type": "cosine",
    "decay_ratio": 0.5, "min_lr_factor": 0.1,
}
BATCH, SEQ = 2, 13  # SEQ < l_max: the filter is cut to the sequence


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok   {what}")


def test_fftconv():
    g = torch.Generator().manual_seed(3)
    B, D, L = 2, 3, 11
    u = torch.randn(B, D, L, generator=g, dtype=torch.float64)
    k = torch.randn(D, L, generator=g, dtype=torch.float64)
    bias = torch.randn(D, generator=g, dtype=torch.float64)
    want = torch.zeros(B, D, L, dtype=torch.float64)
    for t in range(L):
        for s in range(t + 1):
            want[..., t] += u[..., s] * k[:, t - s]
    want += u * bias[:, None]
    check(torch.allclose(hyena_ref.fftconv(u, k, bias), want, atol=1e-12),
          "fftconv = direct causal sum + bias skip")


def test_short_filter():
    g = torch.Generator().manual_seed(4)
    f = hyena_ref.ShortFilter(4).double()
    with torch.no_grad():
        f.weight.copy_(torch.randn(4, 3, generator=g, dtype=torch.float64))
        f.bias.copy_(torch.randn(4, generator=g, dtype=torch.float64))
    x = torch.randn(2, 4, 9, generator=g, dtype=torch.float64)
    want = torch.zeros_like(x) + f.bias[None, :, None]
    for t in range(9):
        for j in range(3):  # tap j sees x[t - (2 - j)]
            if t - (2 - j) >= 0:
                want[..., t] += f.weight[:, j] * x[..., t - (2 - j)]
    check(torch.allclose(f(x), want, atol=1e-12), "short filter = causal 3-tap loop")


def test_filter_window():
    torch.manual_seed(5)
    hf = hyena_ref.HyenaFilter(6, 5, 8).double()
    # an MLP that outputs 1 everywhere leaves the window alone: the third Linear outputs pi/2
    # whatever its input, sin(pi/2) = 1 (frequencies 1), and the last one averages 8 ones
    with torch.no_grad():
        hf.implicit_filter[4].weight.zero_()
        hf.implicit_filter[4].bias.fill_(np.pi / 2)
        hf.implicit_filter[6].weight.fill_(1.0 / 8)
    h = hf.filter(12, 16).detach()  # (L, C)
    check(torch.allclose(h[0], torch.ones(6, dtype=torch.float64)), "window is 1 at t = 0")
    check(bool((h[1:] < h[:-1]).all()), "window decays along t in every channel")
    check(bool((h[-1][1:] < h[-1][:-1]).all()), "later channels decay faster")


def test_tied_head():
    torch.manual_seed(6)
    m = hyena_ref.HyenaLM(CONFIG).double()
    names = [n for n, _ in m.named_parameters()]
    check("output.weight" not in names and "tok_embeddings.weight" in names,
          "the head is the embedding (tied), no separate output weight")


def write_inputs(path, seed=0):
    rng = np.random.default_rng(seed)
    model = hyena_ref.HyenaLM(CONFIG)
    tensors = {}
    for name, p in model.named_parameters():
        if p.dim() == 2:
            tensors[name] = rng.normal(0.0, 0.3, p.shape).astype(np.float32)
        else:  # biases, norm weights and the Sin frequencies around 1: their gradients matter
            base = 1.0 if ("norm" in name and "weight" in name) or "freq" in name else 0.0
            tensors[name] = (base + rng.normal(0.0, 0.1, p.shape)).astype(np.float32)
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
    proc = subprocess.run([sys.executable, os.path.join(HERE, "hyena_ref.py"), directory],
                          capture_output=True, text=True)
    if proc.returncode != expect:
        print(proc.stdout + proc.stderr)
    check(proc.returncode == expect, f"hyena_ref exits {expect} on {what}")
    return proc.stdout


def test_end_to_end(tmp):
    inputs = os.path.join(tmp, "inputs.safetensors")
    outputs = os.path.join(tmp, "outputs.safetensors")
    write_inputs(inputs)
    cfg, model, tokens, targets = hyena_ref.load_inputs(inputs)

    write_outputs(outputs, hyena_ref.reference_outputs(cfg, model, tokens, targets))
    run_checker(tmp, 0, "the float64 reference's own outputs")

    _, model, _, _ = hyena_ref.load_inputs(inputs)
    out32 = hyena_ref.reference_outputs(cfg, model.float(), tokens.clone(), targets.clone())
    write_outputs(outputs, out32)
    table = run_checker(tmp, 0, "a float32 run")
    print("\n".join("     " + line for line in table.splitlines()))

    name = "grad.layers.1.mixer.filter_fn.implicit_filter.0.weight"
    g = out32[name].copy()
    out32[name].flat[np.argmax(np.abs(g))] *= 1.01
    write_outputs(outputs, out32)
    run_checker(tmp, 1, f"{name} perturbed by 1% in one entry")
    out32[name] = g

    out32["losses"] = out32["losses"] * (1 + 1e-3)
    write_outputs(outputs, out32)
    run_checker(tmp, 1, "training losses off by 1e-3 relative")

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
        test_fftconv()
        test_short_filter()
        test_filter_window()
        test_tied_head()
        test_end_to_end(work)
    print("hyena_selftest: all checks passed")


if __name__ == "__main__":
    main()
