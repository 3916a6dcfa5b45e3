#!/usr/bin/python3
"""Training benchmark: ctitan vs PyTorch on the same machine, same shapes, same threads, same run.

  /usr/bin/python3 bench/bench_train.py [--ctitan build/ctitan] [--threads 2] [--steps 6]
                                       [--warmup 2] [--only debug|125m|125m-noac ...]

For each case (TorchTitan's debug model at seq 256 x batch 8, the 125M-class model at seq 512 x
batch 4) it runs `ctitan train` and bench/torch_train.py as child processes, one at a time, and
prints tokens/s, MFU and peak RSS of both and the ratios. Peak RSS is the child's own ru_maxrss
(os.wait4). Both MFUs use one peak: ctitan's sgemm measurement, taken once at the start.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CASES = {
    "debug": dict(config="configs/debug.toml", flavor="debugmodel", seq=256, batch=8),
    # as shipped: the FFN up-projections are recomputed in backward (activation_checkpoint.mode)
    "125m": dict(config="configs/125m.toml", flavor="125M", seq=512, batch=4),
    # the same saving every activation
    "125m-noac": dict(config="configs/125m.toml", flavor="125M", seq=512, batch=4,
                      extra=["--activation_checkpoint.mode=none"]),
}


def run_child(cmd, env):
    """Run cmd, return (stdout, peak RSS bytes of that child alone)."""
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, ru = os.wait4(p.pid, 0)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed:\n{text}")
    return text, ru.ru_maxrss * 1024


def measure_peak(ctitan, env):
    """ctitan prints the sgemm peak it measured at start-up; a 1-step debug run suffices."""
    with tempfile.TemporaryDirectory() as d:
        text, _ = run_child([ctitan, "train", "configs/debug.toml", "--training.steps=1",
                             f"--job.dump_folder={d}", "--metrics.enable_jsonl=false"], env)
    m = re.search(r"peak ([0-9.]+) GFLOP/s", text)
    if not m:
        sys.exit("bench: could not read the measured peak from ctitan's output")
    return float(m.group(1)) / 1e3  # TFLOP/s


def bench_ctitan(ctitan, case, steps, warmup, peak_tflops, env):
    with tempfile.TemporaryDirectory() as d:
        cmd = [ctitan, "train", case["config"], f"--training.steps={steps}",
               f"--training.seq_len={case['seq']}", f"--training.local_batch_size={case['batch']}",
               f"--job.dump_folder={d}", f"--metrics.peak_tflops={peak_tflops}"]
        cmd += case.get("extra", [])
        _, rss = run_child(cmd, env)
        recs = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]
    timed = recs[warmup:]
    step_s = sum(r["step_s"] for r in timed) / len(timed)
    tps = case["seq"] * case["batch"] / step_s
    mfu = sum(r["mfu"] for r in timed) / len(timed)
    return dict(impl="ctitan", tps=tps, mfu=mfu, peak_rss_bytes=rss, final_loss=recs[-1]["loss"])


def bench_torch(case, steps, warmup, threads, peak_tflops, env):
    cmd = ["/usr/bin/python3", os.path.join(HERE, "torch_train.py"), "--flavor", case["flavor"],
           "--seq-len", str(case["seq"]), "--batch", str(case["batch"]), "--steps", str(steps),
           "--warmup-steps", str(warmup), "--threads", str(threads),
           "--peak-tflops", str(peak_tflops)]
    text, rss = run_child(cmd, env)
    rec = json.loads(text.strip().splitlines()[-1])
    rec["peak_rss_bytes"] = rss
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctitan", default=os.path.join(ROOT, "build", "ctitan"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--only", choices=sorted(CASES), action="append")
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    peak = measure_peak(args.ctitan, env)
    print(f"threads {args.threads}; sgemm peak {peak * 1e3:.1f} GFLOP/s (measured by ctitan)")
    print(f"{'case':<10}{'impl':<9}{'tokens/s':>10}{'MFU %':>8}{'peak RSS GiB':>14}"
          f"{'final loss':>12}")
    torch_runs = {}
    for name, case in CASES.items():
        if args.only and name not in args.only:
            continue
        c = bench_ctitan(args.ctitan, case, args.steps, args.warmup, peak, env)
        key = (case["flavor"], case["seq"], case["batch"])
        if key not in torch_runs:  # one PyTorch run per shape
            torch_runs[key] = bench_torch(case, args.steps, args.warmup, args.threads, peak, env)
        t = torch_runs[key]
        for r in (c, t):
            print(f"{name:<10}{r['impl']:<9}{r['tps']:>10.0f}{r['mfu']:>8.1f}"
                  f"{r['peak_rss_bytes'] / 2**30:>14.2f}{r['final_loss']:>12.4f}")
        print(f"{name:<10}{'ratio':<9}{c['tps'] / t['tps']:>9.2f}x{'':>8}"
              f"{c['peak_rss_bytes'] / t['peak_rss_bytes']:>13.2f}x")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
