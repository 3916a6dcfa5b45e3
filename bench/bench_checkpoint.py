#!/usr/bin/python3
"""Checkpoint save cost on the 125M model (configs/125m.toml, one rank).

Two runs of the same steps, saving every 4 steps: synchronous saves (training stalls while
the state is written and fsynced; the steps themselves are undisturbed, so they are the
baseline) and async saves (the state is copied into a staging buffer and written by a
background thread while the next steps run). Prints the baseline step time, the time of the
two steps after each async save (the background write overlaps them), and the stall of each
kind of save; the ratio "during an async save / baseline" is the issue's target (< 1.20).

    /usr/bin/python3 bench/bench_checkpoint.py --ctitan build/ctitan [--steps 9]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(ctitan, mode, steps, folder):
    cmd = [os.path.join(ROOT, "scripts", "launch"), "1", ctitan, "train",
           os.path.join(ROOT, "configs", "125m.toml"), f"--training.steps={steps}",
           f"--job.dump_folder={folder}", "--checkpoint.enable=true", "--checkpoint.interval=4",
           "--checkpoint.keep_latest_k=2", f"--checkpoint.async_mode={mode}",
           "--metrics.peak_tflops=1"]
    log = subprocess.run(cmd, capture_output=True, text=True)
    if log.returncode:
        sys.exit(f"{mode} run failed:\n{log.stdout[-3000:]}{log.stderr[-3000:]}")
    recs = {}
    for line in open(os.path.join(folder, "metrics.jsonl")):
        r = json.loads(line)
        recs[r["step"]] = r
    bg = [float(l.split(" in ")[-1].split()[0]) for l in log.stdout.splitlines() + log.stderr.splitlines()
          if "written in the background in" in l]
    return recs, bg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctitan", default=os.path.join(ROOT, "build", "ctitan"))
    ap.add_argument("--steps", type=int, default=11)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench_ckpt_")
    try:
        res = {}
        for mode in ("disabled", "async"):
            res[mode] = run(a.ctitan, mode, a.steps, os.path.join(tmp, mode))
            shutil.rmtree(os.path.join(tmp, mode, "checkpoint"), ignore_errors=True)
        sync, _ = res["disabled"]
        asy, bg = res["async"]
        n = a.steps
        saves = [s for s in range(4, n, 4)]
        overlapped = [asy[s + k]["step_s"] for s in saves for k in (1, 2) if s + k in asy]
        normal = [sync[s]["step_s"] for s in range(2, n + 1) if s in sync]
        stall_sync = [sync[s]["checkpoint_s"] for s in saves + [n] if s in sync]
        stall_async = [asy[s]["checkpoint_s"] for s in saves if s in asy]
        base = statistics.median(normal)
        print(f"125M, 1 rank, {n} steps, a checkpoint every 4 steps "
              f"({os.getloadavg()[0]:.1f} load average)")
        print(f"{'':34s} {'median':>9s} {'max':>9s}")
        print(f"{'step time, no write in flight':34s} {base:8.3f}s {max(normal):8.3f}s")
        print(f"{'step time during an async save':34s} {statistics.median(overlapped):8.3f}s "
              f"{max(overlapped):8.3f}s")
        print(f"{'stall of a synchronous save':34s} {statistics.median(stall_sync):8.3f}s "
              f"{max(stall_sync):8.3f}s")
        print(f"{'stall of an async save (snapshot)':34s} {statistics.median(stall_async):8.3f}s "
              f"{max(stall_async):8.3f}s")
        if bg:
            print(f"{'background write time':34s} {statistics.median(bg):8.3f}s {max(bg):8.3f}s")
        ratio = max(overlapped) / base
        print(f"worst step during an async save / normal step: {ratio:.3f} (target < 1.20)")
        worst = max(overlapped) + max(stall_async)
        print(f"same, counting the snapshot copy: {worst / base:.3f}")
        print(f"synchronous stall / normal step: {statistics.median(stall_sync) / base:.3f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
