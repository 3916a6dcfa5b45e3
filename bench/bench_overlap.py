#!/usr/bin/python3
"""Overlap benchmark (bench/overlap): the 125M config on 2 ranks, one schedule per row, all
measured in the same run, over the simulated link (--gbps, default 10 Gb/s) and without one
(--gbps 0 runs over plain shared memory; --both runs both):

  no overlap        per-unit buckets, every collective blocking (comm.progress = inline,
                    no prefetch, reduce-scatters waited at once) — the baseline
  per-block+reorder per-unit buckets, all-gathers prefetched one ahead and reduce-scatter
                    waits deferred one, on the communication thread
  manual 2-block    buckets of two blocks each, reordered
  auto              buckets, prefetch depth and deferral chosen by the cost model's search

Prints per row: step time, exposed communication (time compute waited on collectives) and its
share of the step, peak tracked memory per rank, the cost model's predicted step and exposed
time (calibrated at the start of the same run), the prediction's error against the measured
step, and ratios against the baseline. Steps after the first are averaged; the rows run
round-robin --rounds times and each row reports the median of its rounds, with the load
average when it ran (the machine may be shared: compare the rows of one run, not runs).

  /usr/bin/python3 bench/bench_overlap.py [--ctitan build/ctitan] [--steps 3] [--rounds 3]
                                         [--gbps 10 | --both] [--batch 2] [--seq 256]
                                         [--threads N]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import ctbench

from ompi_env import ompi_env  # noqa: E402  (bench/ompi_env.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MPI_ENV = ompi_env()  # scripts/ompi.env
GIB = 2.0 ** 30
CATS = ["params", "grads", "optimizer", "full_params", "full_grads", "activations", "comm"]

ROWS = [
    ("no overlap", ["--comm.progress=inline", "--comm.buckets=per_block", "--comm.prefetch=0",
                    "--comm.reduce_scatter_defer=0"]),
    ("per-block+reorder", ["--comm.progress=thread", "--comm.buckets=per_block",
                           "--comm.prefetch=1", "--comm.reduce_scatter_defer=1"]),
    ("manual 2-block", ["--comm.progress=thread",
                        "--comm.buckets=embed+0+1,2+3,4+5,6+7,8+9,10+11+norm",
                        "--comm.prefetch=1", "--comm.reduce_scatter_defer=1"]),
    ("auto", ["--comm.progress=thread", "--comm.buckets=auto", "--comm.prefetch=1",
              "--comm.reduce_scatter_defer=1"]),
]


def run(cmd, env):
    with tempfile.TemporaryFile() as out:
        p = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed ({p.returncode}):\n{text[-4000:]}")
    ctbench.engine_line(text)
    return text


def load():
    return float(open("/proc/loadavg").read().split()[0])


def one_link(a, gbps, env, tmp):
    print(f"\n125M, 2 ranks, {'simulated link %g Gbit/s' % gbps if gbps > 0 else 'no simulated link (shared memory)'}, "
          f"batch {a.batch} x seq {a.seq}, {a.steps} steps (first not counted), median of "
          f"{a.rounds} rounds")
    print(f"uptime: {os.popen('uptime').read().strip()}", flush=True)
    rounds = [[] for _ in ROWS]
    for rnd in range(a.rounds):
        for i, (name, flags) in enumerate(ROWS):
            dump = os.path.join(tmp, f"{gbps}_{rnd}_{i}")
            cmd = [os.path.join(ROOT, "scripts", "launch"), "2", a.ctitan, "train",
                   os.path.join(ROOT, "configs", "125m.toml"), f"--job.dump_folder={dump}",
                   f"--training.steps={a.steps}", f"--training.local_batch_size={a.batch}",
                   f"--training.seq_len={a.seq}", "--metrics.peak_tflops=0.1",
                   f"--comm.simulate_bandwidth_gbps={gbps}",
                   "--profiling.enable_profiling=true", "--profiling.profile_freq=1000000"]
            l0 = load()
            text = run(cmd + flags, env)
            recs = [json.loads(l) for l in open(os.path.join(dump, "metrics.jsonl"))]
            tail = recs[1:] if len(recs) > 1 else recs
            step = sum(r["step_s"] for r in tail) / len(tail)
            exp = sum(r["exposed_comm_s"] for r in tail) / len(tail)
            mem = sum(recs[-1][f"memory_{c}_peak_bytes"] for c in CATS)
            m = re.search(r"cost model: step ([\d.]+) s \(compute ([\d.]+) s, comm ([\d.]+) s, "
                          r"exposed ([\d.]+) s\)", text)
            b = re.search(r"schedule: \d+ nodes, (\d+) buckets \(([^)]*)\), prefetch (\d+), "
                          r"reduce-scatter defer (\d+)", text)
            r = dict(name=name, step=step, exp=exp, mem=mem, load=(l0 + load()) / 2,
                     pstep=float(m.group(1)) if m else float("nan"),
                     pcomm=float(m.group(3)) if m else float("nan"),
                     pexp=float(m.group(4)) if m else float("nan"),
                     buckets=f"{b.group(2)} (prefetch {b.group(3)}, defer {b.group(4)})" if b else "?")
            rounds[i].append(r)
            print(f"  round {rnd + 1}, {name}: {step:.3f} s/step, exposed {exp:.3f} s, "
                  f"predicted {r['pstep']:.3f} s, load {r['load']:.1f}", flush=True)
    # per row: the round with the median measured step
    res = [sorted(rs, key=lambda r: r["step"])[len(rs) // 2] for rs in rounds]
    base = res[0]
    print()
    print(f"{'schedule':<19} {'step s':>8} {'exposed s':>10} {'exposed %':>10} {'peak MiB':>9} "
          f"{'pred step':>10} {'pred err':>9} {'pred exp':>9} {'step/base':>10} {'load':>5}")
    for r in res:
        print(f"{r['name']:<19} {r['step']:>8.3f} {r['exp']:>10.3f} "
              f"{100 * r['exp'] / r['step']:>9.1f}% {r['mem'] / 2**20:>9.0f} "
              f"{r['pstep']:>10.3f} {100 * (r['pstep'] / r['step'] - 1):>+8.1f}% "
              f"{r['pexp']:>9.3f} {r['step'] / base['step']:>10.3f} {r['load']:>5.1f}")
    print()
    for r in res:
        print(f"  {r['name']}: buckets {r['buckets']}")
    best_manual = min(r["step"] for r in res[1:3])
    auto = res[3]
    print(f"\nreordering: exposed communication {100 * res[1]['exp'] / res[1]['step']:.1f}% of "
          f"the step (predicted comm {res[1]['pcomm']:.3f} s vs step {res[1]['pstep']:.3f} s)")
    print(f"auto vs best manual: {auto['step'] / best_manual:.3f}x the measured step (target "
          f"<= 1.0), {auto['pstep'] / min(r['pstep'] for r in res[1:3]):.3f}x predicted")
    # paired: each round's auto against the better manual row of the same round (the rows of a
    # round run minutes apart at most, so machine drift between rounds cancels)
    paired = sorted(rounds[3][k]["step"] / min(rounds[1][k]["step"], rounds[2][k]["step"])
                    for k in range(len(rounds[3])))
    print(f"auto vs best manual, paired by round: median {paired[len(paired) // 2]:.3f}x, "
          f"rounds {' '.join(f'{x:.3f}' for x in paired)}; auto's plan per round: "
          f"{'; '.join(r['buckets'] for r in rounds[3])}")
    print(f"prediction error: worst {max(abs(r['pstep'] / r['step'] - 1) for r in res) * 100:.1f}% "
          f"(target 10%)")
    print(f"uptime: {os.popen('uptime').read().strip()}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctitan", default=os.path.join(ROOT, "build", "ctitan"))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gbps", type=float, default=10.0)
    ap.add_argument("--both", action="store_true", help="the simulated link, then none")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=0, help="OpenMP threads per rank "
                    "(default: cores / 2)")
    a = ap.parse_args()
    # one OpenMP thread per core and rank: ranks x threads never oversubscribe the cores
    env = dict(os.environ, **MPI_ENV,
               OMP_NUM_THREADS=str(a.threads or max(1, (os.cpu_count() or 2) // 2)))
    print(f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']} per rank")
    with tempfile.TemporaryDirectory() as tmp:
        for g in ([a.gbps, 0.0] if a.both else [a.gbps]):
            one_link(a, g, env, tmp)


if __name__ == "__main__":
    main()
