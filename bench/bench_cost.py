#!/usr/bin/python3
"""Cost model vs measured step (bench/cost): the debug and 125M models on 1, 2 and 4 ranks.

Each run trains a few steps with profiling on, so the cost model is calibrated at start-up in
the same run (rates at the model's shapes, median over ranks) and the last step is compared
with it per node kind. Prints one row per (model, ranks): the predicted step, the measured step
(mean of the steps after the first), the profiled step alone, the error of the prediction
against both, and the load average while the run ran (OpenMP threads per rank: cores / ranks) — on a shared machine, load that changes
between the calibration and the steps shows up as error that is not the model's.

--pp adds pipeline rows (issue 26: the cost model predicts a pipeline step from the same
schedule nodes the executor runs): the debug model on pp=2 (2 ranks) and pp=2 x dp_shard=2
(4 ranks), 1F1B, micro-batches of 1 sequence; their prediction is the whole pipeline's (every
rank's node list timed together).

With --rounds R the rows run round-robin R times and the table gives each row's median
prediction, median measured step and the error of the two medians, and the range of the
rounds' own errors (the machine's speed drifts between a calibration and the steps).

  /usr/bin/python3 bench/bench_cost.py [--ctitan build/ctitan] [--steps 4] [--ranks 1,2,4]
                                      [--models debug,125m] [--rounds 1] [--pp]
                                      [--only-pp]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import ctbench
from ompi_env import ompi_env  # bench/ompi_env.py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MPI_ENV = ompi_env()  # scripts/ompi.env
# per model: batch x seq per rank (the 125M run of bench_overlap; the debug config's own)
SHAPES = {"debug": (8, 256), "125m": (2, 256)}


def load():
    return float(open("/proc/loadavg").read().split()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctitan", default=os.path.join(ROOT, "build", "ctitan"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--models", default="debug,125m")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--pp", action="store_true", help="add the pipeline rows")
    ap.add_argument("--only-pp", action="store_true", help="only the pipeline rows")
    a = ap.parse_args()
    env = dict(os.environ, **MPI_ENV)
    print(f"uptime: {os.popen('uptime').read().strip()}", flush=True)
    rows = []
    # (model, ranks, extra arguments, label)
    cases = [] if a.only_pp else [(model, int(x), (), str(x)) for model in a.models.split(",")
                                  for x in a.ranks.split(",")]
    if a.pp or a.only_pp:
        pp = ("--parallelism.pipeline_parallel_degree=2",
              "--parallelism.pipeline_parallel_schedule=1F1B")
        cases += [("debug", 2, pp + ("--parallelism.data_parallel_shard_degree=1",), "pp2"),
                  ("debug", 4, pp + ("--parallelism.data_parallel_shard_degree=2",), "pp2xdp2")]
    with tempfile.TemporaryDirectory() as tmp:
        for rnd, (model, n, extra, label) in [(r, c) for r in range(a.rounds) for c in cases]:
            if True:
                dump = os.path.join(tmp, f"{model}_{label}")
                B, T = SHAPES[model]
                cmd = [os.path.join(ROOT, "scripts", "launch"), str(n), a.ctitan, "train",
                       os.path.join(ROOT, "configs", f"{model}.toml"),
                       f"--job.dump_folder={dump}", f"--training.steps={a.steps}",
                       f"--training.local_batch_size={B}", f"--training.seq_len={T}",
                       "--training.dataset=synthetic", "--metrics.log_freq=1",
                       "--profiling.enable_profiling=true",
                       f"--profiling.profile_freq={a.steps}"] + list(extra)
                l0 = load()
                # one OpenMP thread per core and rank: no oversubscription of our own
                th = str(max(1, (os.cpu_count() or 2) // n))
                p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env=dict(env, OMP_NUM_THREADS=th), cwd=ROOT)
                text = p.stdout.decode(errors="replace")
                if p.returncode != 0:
                    sys.exit(f"bench: {' '.join(cmd)} failed:\n{text[-3000:]}")
                ctbench.engine_line(text)
                recs = [json.loads(l) for l in open(os.path.join(dump, "metrics.jsonl"))]
                tail = recs[1:] if len(recs) > 1 else recs
                meas = sum(r["step_s"] for r in tail) / len(tail)
                pred = float(re.search(r"cost model: step ([\d.]+) s", text).group(1))
                m = re.search(r"(?:^|\n)\S*\s*step\s+\d+\s+([\d.]+)s\s+([\d.]+)s", text)
                m1 = re.search(r"predicted ([\d.]+) s, measured ([\d.]+) s", text)
                prof = float(m.group(2)) if m else float(m1.group(2)) if m1 else float("nan")
                table = re.findall(r"cost model vs this step.*?(?=\nstep:)", text, re.S)
                rows.append((model, label, pred, meas, prof, (l0 + load()) / 2))
                print(f"  round {rnd + 1}, {model} x{label}: predicted {pred:.3f} s, measured {meas:.3f} s "
                      f"(profiled step {prof:.3f} s), load {rows[-1][5]:.1f}", flush=True)
                if table and n > 1:
                    print("\n".join("    " + l for l in table[0].splitlines()[1:]))
    print()
    print(f"{'model':<7} {'ranks':>7} {'predicted s':>12} {'measured s':>11} {'error':>8} "
          f"{'profiled s':>11} {'error':>8} {'load':>5}   (medians of {a.rounds} round(s); "
          f"range of the rounds' errors)")
    med = lambda v: sorted(v)[len(v) // 2]
    for model, n, _, label in cases:
        rs = [r for r in rows if r[0] == model and r[1] == label]
        pred, meas, prof = (med([r[k] for r in rs]) for k in (2, 3, 4))
        ld = med([r[5] for r in rs])
        errs = [100 * (r[2] / r[3] - 1) for r in rs]
        rng = f"   {min(errs):+.1f}% .. {max(errs):+.1f}%" if len(rs) > 1 else ""
        print(f"{model:<7} {label:>7} {pred:>12.3f} {meas:>11.3f} {100 * (pred / meas - 1):>+7.1f}% "
              f"{prof:>11.3f} {100 * (pred / prof - 1):>+7.1f}% {ld:>5.1f}{rng}")
    print(f"uptime: {os.popen('uptime').read().strip()}")


if __name__ == "__main__":
    main()
