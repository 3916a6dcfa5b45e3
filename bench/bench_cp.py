#!/usr/bin/python3
"""Context parallelism at long context (issue 28), two tables from one invocation:

1. Training: the debug model, one sequence per step (local batch 1), at each --seqs length on
   cp = 1, 2 and 4 ranks (cp ranks only: no data parallelism, so every row trains the same
   tokens; head-tail load balancing, K/V all-gathered), --steps steps; per row the tokens/s of
   the last step (the sequence's tokens over the step time: the cp ranks share it), the step
   time, rank 0's peak activation bytes and peak RSS from the memory accounting
   (metrics.jsonl), and the activations against the cp = 1 row's at the same length. With
   cp ranks on 2 cores, cp = 2 and 4 time-share the machine: their tokens/s are the machine's,
   not a cluster's; the memory figures do not depend on it.
2. Load balance: build/bench/bench_cp_balance (each cp rank's attention timed alone, one rank
   after another, so time-sharing does not blur it): slowest rank / mean with head-tail and
   without (contiguous shards).

  /usr/bin/python3 bench/bench_cp.py [--ctitan build/ctitan] [--seqs 8192,16384,32768]
                                     [--cps 1,2,4] [--steps 2] [--balance-seqs 8192,16384]

Prints the CPU, the matmul engine and oneDNN ISA (ctitan's "compute:" line) and the load
average beside every row.
"""

import argparse
import json
import os
import tempfile

import ctbench
from ompi_env import ompi_env  # bench/ompi_env.py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MPI_ENV = ompi_env()  # scripts/ompi.env


def run(cmd, env):
    return ctbench.run(cmd, env, ROOT)


load = ctbench.load


def train_row(args, env, seq, cp):
    with tempfile.TemporaryDirectory() as d:
        cmd = [] if cp == 1 else ["mpiexec", "-n", str(cp)]
        cmd += [args.ctitan, "train", "configs/debug.toml", f"--training.steps={args.steps}",
                f"--training.seq_len={seq}", "--training.local_batch_size=1",
                f"--job.dump_folder={d}", "--metrics.peak_tflops=0.1"]
        if cp > 1:
            cmd.append(f"--parallelism.context_parallel_degree={cp}")
        text = run(cmd, env)
        ctbench.engine_line(text)
        rows = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]
    last = rows[-1]
    return {"tps": seq / last["step_s"], "step_s": last["step_s"],
            "act": max(r["memory_activations_peak_bytes"] for r in rows),
            "rss": max(r["memory_peak_rss_gib"] for r in rows)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctitan", default=os.path.join(ROOT, "build", "ctitan"))
    ap.add_argument("--seqs", default="8192,16384,32768")
    ap.add_argument("--cps", default="1,2,4")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--balance-seqs", default="8192,16384")
    ap.add_argument("--skip-train", action="store_true")
    a = ap.parse_args()
    env = dict(os.environ, **MPI_ENV)
    seqs = [int(s) for s in a.seqs.split(",")]
    cps = [int(c) for c in a.cps.split(",")]
    print(f"uptime: {os.popen('uptime').read().strip()}", flush=True)
    if not a.skip_train:
        print(f"\n1. training, debug model, 1 sequence a step, cp ranks only (head-tail, "
              f"K/V all-gathered), step {a.steps} of {a.steps}")
        print(f"{'seq_len':>8} {'cp':>3} {'tokens/s':>9} {'step s':>8} {'activations':>12} "
              f"{'vs cp=1':>8} {'peak RSS':>9}   load")
        for seq in seqs:
            base = None
            for cp in cps:
                r = train_row(a, env, seq, cp)
                if cp == 1:
                    base = r["act"]
                ratio = f"{r['act'] / base:8.3f}" if base else f"{'-':>8}"
                print(f"{seq:>8} {cp:>3} {r['tps']:>9.1f} {r['step_s']:>8.2f} "
                      f"{r['act'] / 2**20:>9.1f} MiB {ratio} {r['rss']:>6.2f} GiB   {load()}",
                      flush=True)
    print("\n2. load balance (bench_cp_balance: each rank's attention alone)", flush=True)
    bal = os.path.join(os.path.dirname(a.ctitan), "bench", "bench_cp_balance")
    cp_list = ",".join(str(c) for c in cps if c > 1)
    print(run([bal, "--seq", a.balance_seqs, "--cp", cp_list], env), end="", flush=True)


if __name__ == "__main__":
    main()
