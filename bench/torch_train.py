#!/usr/bin/python3
"""PyTorch side of the training benchmark: Llama 3 training steps on CPU, one JSON line out.

  /usr/bin/python3 bench/torch_train.py --flavor debugmodel|125M --seq-len T --batch B \
      --steps N --warmup-steps K --threads 2 --peak-tflops P [--dtype float32]

Builds the model of tests/reference/llama_model.py (random init, N(0, 0.02) matrices), trains
N steps on random tokens with AdamW (lr 8e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on
matrices) and global-norm clipping at 1.0, and times every step after the first K. A step is
forward + loss + backward + clip + optimizer step + zero_grad, ending with loss.item().

Output fields: tps = B*T / median timed step time (one preempted step on a shared VM
moves a mean by tens of percent); tflops = flops_per_token * tps / 1e12 with
flops_per_token = 6 * (N_params - N_embedding) + 12 * n_layers * dim * T (TorchTitan's
estimate, only the input embedding table excluded); mfu = tflops / P * 100 (percent);
peak_rss_bytes = ru_maxrss * 1024; final_loss = the last step's loss.
"""

import argparse
import ctypes
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "reference"))
import llama_model as lm  # noqa: E402

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>


def keep_freed_memory():
    """Stop glibc from handing large freed blocks back to the kernel.

    By default blocks above the mmap threshold (dynamic, at most 32 MiB), such as each layer's
    (B*H, T, T) attention scores, are mmap'ed on allocation and unmapped on free, and free
    space at the top of the heap is trimmed, so every step page-faults its activations in
    again: seconds of system time per step, and 10x slower softmax and bmm calls. With both
    thresholds at 1 GiB the heap reaches its steady size after about two steps (use
    --warmup-steps 2 for steady-state numbers). This is the in-process equivalent of the usual
    PyTorch CPU advice to LD_PRELOAD jemalloc or tcmalloc.
    """
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flavor", choices=sorted(lm.FLAVORS), required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True, help="total steps, warm-up included")
    ap.add_argument("--warmup-steps", type=int, default=1, help="untimed leading steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peak-tflops", type=float, required=True,
                    help="peak TFLOP/s of the cores used, the MFU denominator")
    ap.add_argument("--dtype", choices=["float32"], default="float32")
    ap.add_argument("--autocast", choices=["none", "bfloat16"], default="none",
                    help="bfloat16: torch.autocast('cpu', bfloat16) around each step "
                         "(matmuls in bf16 through oneDNN; fp32 master weights)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not 0 <= args.warmup_steps < args.steps:
        ap.error("need 0 <= --warmup-steps < --steps (at least one timed step)")
    if args.peak_tflops <= 0:
        ap.error("--peak-tflops must be > 0")

    keep_freed_memory()
    lm.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    gen = torch.Generator().manual_seed(args.seed)
    margs = lm.FLAVORS[args.flavor]
    model = lm.Transformer(margs).to(getattr(torch, args.dtype))
    lm.init_weights(model, std=0.02, generator=gen)
    optimizer = lm.build_optimizer(model, lr=8e-4, beta1=0.9, beta2=0.95, eps=1e-8,
                                   weight_decay=0.1, foreach=True)

    # Synthetic data: fresh random sequences each step; targets are inputs shifted by one.
    data = torch.randint(0, margs.vocab_size, (args.steps, args.batch, args.seq_len + 1),
                         generator=gen)

    times = []
    loss = None
    for step in range(args.steps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast != "none"):
            loss = lm.train_step(model, optimizer, None, data[step, :, :-1],
                                 data[step, :, 1:], max_norm=1.0).item()
        if step >= args.warmup_steps:
            times.append(time.perf_counter() - t0)

    step_s = sorted(times)[len(times) // 2]  # median (upper for an even count)
    tps = args.batch * args.seq_len / step_s
    tflops = lm.flops_per_token(model, args.seq_len) * tps / 1e12
    print(json.dumps({
        "impl": "pytorch" if args.autocast == "none" else "pt-bf16",
        "flavor": args.flavor,
        "seq_len": args.seq_len,
        "batch": args.batch,
        "threads": args.threads,
        "tps": tps,
        "step_s": step_s,
        "tflops": tflops,
        "mfu": tflops / args.peak_tflops * 100.0,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "final_loss": loss,
    }))


if __name__ == "__main__":
    main()
