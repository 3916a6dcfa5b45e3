#!/usr/bin/python3
"""Pipeline-parallel benchmark, two tables from one invocation:

1. Measured bubble: the debug model on pp=2 (2 ranks) with GPipe, 1F1B, Interleaved1F1B and
   ZeroBubbleH1 for m = 4, 8, 16 micro-batches; each rank's idle fraction in the traced step
   (1 - compute time / step time, from rank<r>_trace.json) against theory: (p-1)/(m+p-1) for
   GPipe and 1F1B, (p-1)/(vm+p-1) with v = 2 for Interleaved1F1B, and ZB-H1's unit-time bound
   (p-1)/(3m+p-1) (F = I = W = 1).
2. pp=2 vs FSDP dp=2 on the 125M model, same global batch (micro-batches of one sequence),
   over a simulated 1 Gb/s link (comm.simulate_bandwidth_gbps=1, 50 us latency) and over no
   simulated link (shared memory): tokens/s per rank and the ratio pp / FSDP.

  /usr/bin/python3 bench/bench_pp.py [--ctitan build/ctitan] [--steps 2] [--seq 256]
                                     [--global-batch 8] [--skip-bubbles] [--skip-125m]

Prints the CPU, the matmul engine and oneDNN ISA (ctitan's "compute:" line) and the load
average before every row; timings on a shared machine are noisy, so compare the
ratios within one run.
"""

import argparse
import glob
import json
import os
import re
import tempfile

import ctbench
from ompi_env import ompi_env  # bench/ompi_env.py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MPI_ENV = ompi_env()  # scripts/ompi.env


def run(cmd, env):
    return ctbench.run(cmd, env, ROOT)


load = ctbench.load


def idle_fractions(trace_dir):
    out = {}
    for f in sorted(glob.glob(os.path.join(trace_dir, "rank*_trace.json"))):
        r = int(re.search(r"rank(\d+)_trace", f).group(1))
        ev = [e for e in json.load(open(f))["traceEvents"] if e.get("ph") == "X"]
        busy = sum(e["dur"] for e in ev if e["cat"] == "compute")
        span = max(e["ts"] + e["dur"] for e in ev)
        out[r] = 1.0 - busy / span
    return out


def bubbles(args, env):
    print(f"\n1. measured bubble, debug model, pp=2 (2 ranks), seq {args.seq}, micro-batches of 1")
    print(f"{'schedule':<16} {'m':>3} {'theory':>7} {'rank 0':>7} {'rank 1':>7}   load")
    for sched, v in (("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2), ("ZeroBubbleH1", 3)):
        for m in (4, 8, 16):
            with tempfile.TemporaryDirectory() as d:
                steps = 2
                cmd = ["mpiexec", "-n", "2", args.ctitan, "train", "configs/debug.toml",
                       f"--training.steps={steps}", f"--training.seq_len={args.seq}",
                       "--training.local_batch_size=1", f"--training.global_batch_size={m}",
                       "--parallelism.pipeline_parallel_degree=2",
                       f"--parallelism.pipeline_parallel_schedule={sched}",
                       "--profiling.enable_profiling=true", f"--profiling.profile_freq={steps}",
                       f"--job.dump_folder={d}", "--metrics.peak_tflops=0.1"]
                text = run(cmd, env)
                ctbench.engine_line(text)
                idle = idle_fractions(os.path.join(d, "profile_trace", f"iteration_{steps}"))
            theory = 1.0 / (v * m + 1)
            print(f"{sched:<16} {m:>3} {theory:>7.3f} {idle[0]:>7.3f} {idle[1]:>7.3f}   {load()}",
                  flush=True)


def tps(args, env, pp, gbps):
    with tempfile.TemporaryDirectory() as d:
        cmd = ["mpiexec", "-n", "2", args.ctitan, "train", "configs/125m.toml",
               f"--training.steps={args.steps + 1}", f"--training.seq_len={args.seq}",
               "--training.local_batch_size=1", f"--training.global_batch_size={args.global_batch}",
               f"--job.dump_folder={d}", "--metrics.peak_tflops=0.1"]
        if pp:
            cmd += ["--parallelism.pipeline_parallel_degree=2",
                    "--parallelism.pipeline_parallel_schedule=1F1B"]
        if gbps:
            cmd += [f"--comm.simulate_bandwidth_gbps={gbps}", "--comm.simulate_latency_us=50"]
        ctbench.engine_line(run(cmd, env))
        recs = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))][1:]
    step = sum(r["step_s"] for r in recs) / len(recs)
    return args.global_batch * args.seq / step / 2, step  # tokens/s per rank (2 ranks)


def compare(args, env):
    print(f"\n2. 125M, 2 ranks, global batch {args.global_batch} x {args.seq} tokens, "
          f"{args.steps} timed steps (after 1 warm-up)")
    print(f"{'link':<22} {'pp=2 1F1B':>12} {'FSDP dp=2':>12} {'pp/FSDP':>8}   load")
    for name, gbps in (("simulated 1 Gb/s", 1), ("none (shared memory)", 0)):
        p, ps = tps(args, env, True, gbps)
        f, fs = tps(args, env, False, gbps)
        print(f"{name:<22} {p:>8.0f} t/s {f:>8.0f} t/s {p / f:>8.2f}   {load()}"
              f"   (steps {ps:.2f} s / {fs:.2f} s)", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctitan", default="build/ctitan")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--skip-bubbles", action="store_true")
    ap.add_argument("--skip-125m", action="store_true")
    args = ap.parse_args()
    env = dict(os.environ, **MPI_ENV)
    print(f"CPU: {ctbench.cpu_name()}, {os.cpu_count()} cores; load average {load()}")
    if not args.skip_bubbles:
        bubbles(args, env)
    if not args.skip_125m:
        compare(args, env)


if __name__ == "__main__":
    main()
