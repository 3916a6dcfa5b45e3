#!/usr/bin/python3
"""Tensor-parallel benchmark: the 125M-class model on 2 ranks as tp=2 (sequence + loss
parallel) and as dp_shard=2 (FSDP), against 1 rank, same global batch, one run.

  /usr/bin/python3 bench/bench_tp.py [--ctitan build/ctitan] [--steps 3] [--warmup 1]
                                     [--seq 256] [--global-batch 4]

Prints per layout: tokens/s per rank (global tokens / step time / ranks) and its ratio to 1
rank, the step's exposed communication (for tp=2 every TP collective: they run on the
compute path), and rank 0's peak memory by category (parameters, gradients, AdamW moments, gathered
parameters, activations) with the ratios to 1 rank. Timings on a shared machine are noisy:
compare the ratios of one run, and read the load average printed with them. Every layout saves
all activations (activation_checkpoint.mode = none).

Then async against plain TP (tp=2) over a simulated link of --sim-gbps (default 10) Gbit/s
(comm.simulate_bandwidth_gbps: every TP collective lasts at least its ring bytes over that
link; an async ring transfer arrives no earlier than its bytes over it after it was posted):
the exposed TP communication per step (time blocked on TP transfers on the compute path;
dp_shard is 1, so no FSDP traffic), step time and tokens/s per rank.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import ctbench
from ompi_env import ompi_env  # bench/ompi_env.py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MPI_ENV = ompi_env()  # scripts/ompi.env
MIB = 2.0 ** 20
CATS = ["params", "grads", "optimizer", "full_params", "activations"]


def bench(args, ranks, tp, env, extra=()):
    dp = ranks // tp
    with tempfile.TemporaryDirectory() as d:
        cmd = ["mpiexec", "-n", str(ranks), args.ctitan, "train", "configs/125m.toml",
               f"--training.steps={args.steps + args.warmup}", f"--training.seq_len={args.seq}",
               f"--training.local_batch_size={args.global_batch // dp}",
               f"--parallelism.tensor_parallel_degree={tp}", f"--job.dump_folder={d}",
               "--metrics.peak_tflops=1", "--training.dataset=synthetic",
               "--activation_checkpoint.mode=none", *extra]
        with tempfile.TemporaryFile() as out:
            p = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            out.seek(0)
            text = out.read().decode(errors="replace")
            if p.returncode != 0:
                sys.exit(f"bench: {' '.join(cmd)} failed:\n{text[-3000:]}")
            ctbench.engine_line(text)
        recs = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]
    timed = recs[args.warmup:]
    step_s = sorted(r["step_s"] for r in timed)[len(timed) // 2]
    last = recs[-1]
    mem = {c: last.get(f"memory_{c}_peak_bytes", 0) / MIB for c in CATS}
    comm = sorted(r["exposed_comm_s"] for r in timed)[len(timed) // 2]
    return dict(tps=args.global_batch * args.seq / step_s / ranks, step_s=step_s, mem=mem,
                loss=last["loss"], comm=comm)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctitan", default="build/ctitan")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--sim-gbps", type=float, default=10.0)
    ap.add_argument("--async-only", action="store_true", help="only the async vs plain rows")
    args = ap.parse_args()
    env = dict(os.environ, **MPI_ENV)
    if not args.async_only:
        layouts(args, env)
    async_rows(args, env)


def layouts(args, env):
    rows = [("1 rank", 1, 1), ("2 ranks, dp_shard=2 (FSDP)", 2, 1),
            ("2 ranks, tp=2 (TP + SP + loss parallel)", 2, 2)]
    res = [(name, bench(args, n, tp, env)) for name, n, tp in rows]
    base = res[0][1]
    print(f"125M, global batch {args.global_batch} x seq {args.seq}, {args.steps} timed steps "
          f"(median); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'layout':42s} {'tok/s/rank':>10s} {'vs 1':>6s} {'step s':>7s} {'exposed':>8s} "
          f"{'loss':>8s}  "
          + "  ".join(f"{c:>16s}" for c in CATS))
    for name, r in res:
        cells = "  ".join(f"{r['mem'][c]:8.1f} ({r['mem'][c] / base['mem'][c]:.2f})"
                          if base["mem"][c] else f"{r['mem'][c]:16.1f}" for c in CATS)
        print(f"{name:42s} {r['tps']:10.1f} {r['tps'] / base['tps']:6.2f} {r['step_s']:7.2f} "
              f"{r['comm']:8.3f} {r['loss']:8.4f}  "
              + cells)
    print("exposed: seconds per step blocked on communication (FSDP waits + TP collectives);"
          " memory: MiB peak on rank 0 (ratio to 1 rank)")


def async_rows(args, env):
    # async TP's ring transfers: non-blocking point-to-point under comm.progress = inline (MPI
    # advances them inside the waits), ops on the comm stream's thread under "thread"
    sim = [f"--comm.simulate_bandwidth_gbps={args.sim_gbps}"]
    ares = [(name, bench(args, 2, 2, env,
                         sim + [f"--parallelism.enable_async_tensor_parallel={a}",
                                f"--comm.progress={prog}"]))
            for name, a, prog in (("tp=2 plain", "false", "inline"),
                                  ("tp=2 async, point-to-point (inline)", "true", "inline"),
                                  ("tp=2 async, on the comm stream (thread)", "true", "thread"))]
    print(f"\nasync vs plain TP over a simulated {args.sim_gbps:g} Gbit/s link; load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'layout':42s} {'tok/s/rank':>10s} {'step s':>7s} {'exposed TP comm s':>18s} "
          f"{'loss':>10s}")
    for name, r in ares:
        print(f"{name:42s} {r['tps']:10.1f} {r['step_s']:7.2f} {r['comm']:18.3f} "
              f"{r['loss']:10.6f}")
    p = ares[0][1]
    for name, a in ares[1:]:
        print(f"{name}: exposes {a['comm'] / p['comm'] if p['comm'] else 0:.2f} of plain TP's "
              f"communication; step time ratio {a['step_s'] / p['step_s']:.2f}")


if __name__ == "__main__":
    main()
