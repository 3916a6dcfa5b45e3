#!/usr/bin/python3
"""PyTorch data-parallel baseline: Llama 3 training on R local CPU ranks (gloo), one JSON line out.

  /usr/bin/python3 bench/torch_dp.py --ranks R --mode zero|ddp --flavor debugmodel|125M \
      --seq-len T --global-batch G --steps N --warmup-steps K --threads-per-rank t \
      --peak-tflops P [--timeout-min 30]

The baseline that ctitan's FSDP benchmark compares against. The parent spawns R ranks
(torch.multiprocessing, spawn); each joins a gloo process group over loopback TCP
(127.0.0.1, a free port), runs with t intra-op threads and trains the model of
tests/reference/llama_model.py exactly as bench/torch_train.py does (same init N(0, 0.02) from
the same seed on every rank, AdamW lr 8e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on
matrices only, global-norm clipping at 1.0), on its own G/R random sequences per step:

  ddp   DistributedDataParallel (gradients all-reduced in buckets, overlapped with backward,
        kept as views of the buckets) + a full AdamW replica on every rank.
  zero  the same DDP + torch.distributed.optim.ZeroRedundancyOptimizer wrapping AdamW: each
        rank keeps AdamW state for, and updates, only its shard of the parameters, then the
        owners broadcast the updated parameters (ZeRO-1). torch 1.13's ZeRO takes the two
        parameter groups as long as overlap_with_ddp=False (overlap mode only supports one
        group), so the optimizer is the same as in ddp mode.

A step is barrier, then (timed) forward + loss + backward (DDP all-reduce) + clip + optimizer
step + zero_grad, ending with loss.item(). Steps after the first K are timed on every rank;
the step time is the max over ranks of each step, averaged over the timed steps.

Output fields (printed by the parent once every rank exited cleanly): tps_total = G*T / step
time; tps_per_rank = tps_total / R; tflops_per_rank = flops_per_token * tps_per_rank / 1e12
with torch_train.py's flops_per_token (6 * (N_params - N_embedding) + 12 * n_layers * dim * T);
mfu = tflops_per_rank / P * 100 (percent, P = peak TFLOP/s of one rank's cores);
peak_rss_bytes_per_rank = max over ranks of ru_maxrss * 1024; final_loss = the last step's
loss averaged over ranks (the global-batch loss, as every rank has G/R sequences of T tokens).
Exits non-zero with a message if a rank fails or the run exceeds --timeout-min.
"""

import argparse
import datetime
import json
import os
import resource
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.multiprocessing.spawn import ProcessException
from torch.nn.parallel import DistributedDataParallel as DDP

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "tests", "reference"))
sys.path.insert(0, _HERE)
import llama_model as lm  # noqa: E402
from torch_train import keep_freed_memory  # noqa: E402

LR, BETA1, BETA2, EPS, WEIGHT_DECAY, MAX_NORM = 8e-4, 0.9, 0.95, 1e-8, 0.1, 1.0


def free_port():
    """A TCP port on 127.0.0.1 that is free right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_optimizer(model, mode):
    # Same two groups and hyperparameters as lm.build_optimizer (weight decay on 2-D tensors).
    adamw = lm.build_optimizer(model, lr=LR, beta1=BETA1, beta2=BETA2, eps=EPS,
                               weight_decay=WEIGHT_DECAY, foreach=True)
    if mode == "ddp":
        return adamw
    # ZeRO-1. The groups are partitioned greedily by size (largest tensors first) across ranks;
    # each rank's local AdamW gets the same two groups restricted to its shard. After the
    # local step the owners broadcast their parameters (one broadcast per rank with
    # parameters_as_bucket_view=True, which packs each rank's shard into one flat tensor).
    return ZeroRedundancyOptimizer(
        [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in adamw.param_groups],
        optimizer_class=torch.optim.AdamW, parameters_as_bucket_view=True,
        lr=LR, betas=(BETA1, BETA2), eps=EPS, foreach=True)


def worker(rank, args, port, results):
    keep_freed_memory()
    torch.set_num_threads(args.threads_per_rank)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.ranks,
                            timeout=datetime.timedelta(minutes=args.timeout_min))
    try:
        margs = lm.FLAVORS[args.flavor]
        # Same seed on every rank: identical initial weights (DDP also broadcasts rank 0's).
        model = lm.Transformer(margs)
        lm.init_weights(model, std=0.02, generator=torch.Generator().manual_seed(args.seed))
        ddp_model = DDP(model, gradient_as_bucket_view=True)
        optimizer = build_optimizer(model, args.mode)

        # Per-rank synthetic data: each rank its own random sequences; targets = inputs >> 1.
        local_batch = args.global_batch // args.ranks
        gen = torch.Generator().manual_seed(args.seed + 1 + rank)
        data = torch.randint(0, margs.vocab_size,
                             (args.steps, local_batch, args.seq_len + 1), generator=gen)

        times = []
        loss = None
        for step in range(args.steps):
            dist.barrier()
            t0 = time.perf_counter()
            loss = lm.train_step(ddp_model, optimizer, None, data[step, :, :-1],
                                 data[step, :, 1:], max_norm=MAX_NORM).item()
            if step >= args.warmup_steps:
                times.append(time.perf_counter() - t0)

        final_loss = torch.tensor([loss], dtype=torch.float64)
        dist.all_reduce(final_loss)
        gathered = [None] * args.ranks
        dist.all_gather_object(
            gathered, (times, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))

        if rank == 0:
            step_s = sum(max(t[i] for t, _ in gathered) for i in range(len(times))) / len(times)
            tps_total = args.global_batch * args.seq_len / step_s
            tps_per_rank = tps_total / args.ranks
            tflops_per_rank = lm.flops_per_token(model, args.seq_len) * tps_per_rank / 1e12
            results.put(json.dumps({
                "impl": f"pytorch-{args.mode}",
                "ranks": args.ranks,
                "flavor": args.flavor,
                "seq_len": args.seq_len,
                "global_batch": args.global_batch,
                "threads_per_rank": args.threads_per_rank,
                "tps_total": tps_total,
                "tps_per_rank": tps_per_rank,
                "step_s": step_s,
                "tflops_per_rank": tflops_per_rank,
                "mfu": tflops_per_rank / args.peak_tflops * 100.0,
                "peak_rss_bytes_per_rank": max(rss for _, rss in gathered),
                "final_loss": final_loss.item() / args.ranks,
            }))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--mode", choices=["zero", "ddp"], required=True)
    ap.add_argument("--flavor", choices=sorted(lm.FLAVORS), required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--global-batch", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True, help="total steps, warm-up included")
    ap.add_argument("--warmup-steps", type=int, default=1, help="untimed leading steps")
    ap.add_argument("--threads-per-rank", type=int, default=1)
    ap.add_argument("--peak-tflops", type=float, required=True,
                    help="peak TFLOP/s of one rank's cores, the MFU denominator")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-min", type=float, default=30.0,
                    help="kill every rank and fail after this many minutes")
    args = ap.parse_args()
    if args.ranks < 1:
        ap.error("--ranks must be >= 1")
    if args.global_batch % args.ranks or args.global_batch < args.ranks:
        ap.error("--global-batch must be a positive multiple of --ranks")
    if not 0 <= args.warmup_steps < args.steps:
        ap.error("need 0 <= --warmup-steps < --steps (at least one timed step)")
    if args.peak_tflops <= 0 or args.threads_per_rank < 1 or args.timeout_min <= 0:
        ap.error("--peak-tflops, --threads-per-rank and --timeout-min must be > 0")

    # Children inherit these: OpenMP starts with the right pool size; gloo binds to loopback.
    os.environ["OMP_NUM_THREADS"] = str(args.threads_per_rank)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"

    results = mp.get_context("spawn").SimpleQueue()
    ctx = mp.start_processes(worker, args=(args, free_port(), results), nprocs=args.ranks,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + args.timeout_min * 60
    try:
        while not ctx.join(timeout=2):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                for p in ctx.processes:
                    p.join()
                sys.exit(f"torch_dp: timed out after {args.timeout_min:g} min; ranks killed")
    except ProcessException as e:  # join() already terminated the other ranks
        sys.exit(f"torch_dp: rank {e.error_index} failed:\n{e}")
    if results.empty():
        sys.exit("torch_dp: rank 0 exited without a result")
    print(results.get())


if __name__ == "__main__":
    main()
