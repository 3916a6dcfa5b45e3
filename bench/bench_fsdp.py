#!/usr/bin/python3
"""FSDP benchmark: the 125M-class model on 1, 2 and 4 ranks (oversubscribed where needed) with
a fixed global batch, against PyTorch's CPU data-parallel baseline on 2 ranks, same run.

  /usr/bin/python3 bench/bench_fsdp.py [--ctitan build/ctitan] [--steps 4] [--warmup 1]
                                      [--ranks 1,2,4] [--flavor-config configs/125m.toml]
                                      [--seq 512] [--global-batch 4] [--torch-mode zero]

Prints per rank count: tokens/s per rank and in total, MFU, persistent memory per rank
(parameters + gradients + AdamW moments, which FSDP shards 1/N), the peak of gathered
full-parameter buffers, and peak RSS per rank; then PyTorch (bench/torch_dp.py) on 2 ranks and
the ratios ctitan(2 ranks) / PyTorch. One MFU peak for all: ctitan's theoretical fp32 peak of the
whole machine, divided by the ranks sharing it.

Like for like: both sides run cores / ranks threads per rank (ctitan's default; PyTorch gets
the same through --threads-per-rank). The PyTorch baseline is DDP + ZeRO-1 (torch 1.13's
ZeroRedundancyOptimizer sharding AdamW's state), not FSDP: PyTorch's FSDP does not run on CPU.
Its attention materialises the T x T score matrix (torch 1.13 has no fused attention), ctitan's
is tiled (O(T) memory per head), so RSS differences at long T are partly that.
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
GIB = 2.0 ** 30


def run(cmd, env):
    with tempfile.TemporaryFile() as out:
        p = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed ({p.returncode}):\n{text[-4000:]}")
    ctbench.engine_line(text)
    return text


def machine_peak(ctitan, env):
    with tempfile.TemporaryDirectory() as d:
        text = run([ctitan, "train", "configs/debug.toml", "--training.steps=1",
                    f"--job.dump_folder={d}", "--metrics.enable_jsonl=false"], env)
    return float(re.search(r"peak ([0-9.]+) GFLOP/s", text).group(1)) / 1e3


def bench_ctitan(args, n, peak_per_rank, env):
    local = args.global_batch // n
    with tempfile.TemporaryDirectory() as d:
        cmd = ["mpiexec", "-n", str(n), args.ctitan, "train", args.config,
               f"--training.steps={args.steps + args.warmup}", f"--training.seq_len={args.seq}",
               f"--training.local_batch_size={local}", f"--job.dump_folder={d}",
               f"--metrics.peak_tflops={peak_per_rank}", f"--comm.progress={args.progress}"]
        # metrics.jsonl is rank 0's; FSDP ranks are symmetric, so its memory stands for all.
        run(cmd, env)
        recs = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]
    timed = recs[args.warmup:]
    step_s = sum(r["step_s"] for r in timed) / len(timed)
    last = recs[-1]
    persistent = sum(last[f"memory_{c}_bytes"] for c in ("params", "grads", "optimizer"))
    return dict(impl="ctitan", ranks=n, tps_per_rank=local * args.seq / step_s,
                tps_total=args.global_batch * args.seq / step_s,
                mfu=sum(r["mfu"] for r in timed) / len(timed),
                persistent=persistent, full_params_peak=last["memory_full_params_peak_bytes"],
                rss=last["memory_peak_rss_gib"] * GIB, loss=last["loss"],
                exposed=sum(r["exposed_comm_s"] for r in timed) / len(timed), step_s=step_s)


def bench_torch(args, peak_per_rank, threads, env):
    cmd = ["/usr/bin/python3", os.path.join(HERE, "torch_dp.py"), "--ranks", "2",
           "--mode", args.torch_mode, "--flavor", args.flavor, "--seq-len", str(args.seq),
           "--global-batch", str(args.global_batch), "--steps", str(args.steps + args.warmup),
           "--warmup-steps", str(args.warmup), "--threads-per-rank", str(threads),
           "--peak-tflops", str(peak_per_rank)]
    rec = json.loads(run(cmd, env).strip().splitlines()[-1])
    return dict(impl=rec["impl"], ranks=2, tps_per_rank=rec["tps_per_rank"],
                tps_total=rec["tps_total"], mfu=rec["mfu"], persistent=float("nan"),
                full_params_peak=float("nan"), rss=rec["peak_rss_bytes_per_rank"],
                loss=rec["final_loss"], exposed=float("nan"), step_s=float("nan"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctitan", default=os.path.join(ROOT, "build", "ctitan"))
    ap.add_argument("--config", default="configs/125m.toml")
    ap.add_argument("--flavor", default="125M", help="PyTorch flavor matching --config")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3, help="timed steps")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--torch-mode", default="zero", choices=["zero", "ddp", "none"])
    ap.add_argument("--progress", default="inline", choices=["inline", "thread"],
                    help="comm.progress: how ctitan's comm stream advances")
    args = ap.parse_args()
    env = dict(os.environ, **MPI_ENV)
    env.pop("OMP_NUM_THREADS", None)
    cores = os.cpu_count()
    peak = machine_peak(args.ctitan, env)
    print(f"{args.config}: seq {args.seq}, global batch {args.global_batch}; {cores} cores; "
          f"comm.progress {args.progress}; "
          f"sgemm peak {peak * 1e3:.1f} GFLOP/s for the machine")
    hdr = (f"{'impl':<14}{'ranks':>6}{'tok/s/rank':>11}{'tok/s':>8}{'MFU%':>7}"
           f"{'persist MiB':>12}{'full-param MiB':>15}{'RSS GiB':>9}{'exposed s':>10}"
           f"{'loss':>8}")
    print(hdr)
    rows = {}
    for n in [int(x) for x in args.ranks.split(",")]:
        # n ranks share the machine (threads per rank = cores / n, at least 1): peak / n each
        r = bench_ctitan(args, n, peak / n, env)
        rows[n] = r
        print(f"{'ctitan':<14}{n:>6}{r['tps_per_rank']:>11.1f}{r['tps_total']:>8.1f}"
              f"{r['mfu']:>7.1f}{r['persistent'] / 2**20:>12.1f}"
              f"{r['full_params_peak'] / 2**20:>15.1f}{r['rss'] / GIB:>9.2f}"
              f"{r['exposed']:>10.3f}{r['loss']:>8.4f}", flush=True)
    if 1 in rows:
        for n, r in rows.items():
            print(f"  persistent memory {n} ranks / 1 rank = {r['persistent'] / rows[1]['persistent']:.3f}"
                  f" (ideal {1 / n:.3f})")
    if args.torch_mode != "none":
        threads = max(1, cores // 2)  # what ctitan's 2 ranks run (comm_init: cores / ranks)
        print(f"PyTorch baseline: DDP + ZeRO-1 on 2 ranks x {threads} threads (the same threads "
              f"per rank as ctitan's 2 ranks; PyTorch FSDP does not run on CPU); its attention "
              f"materialises T x T")
        t = bench_torch(args, peak / 2, threads, env)
        print(f"{t['impl']:<14}{2:>6}{t['tps_per_rank']:>11.1f}{t['tps_total']:>8.1f}"
              f"{t['mfu']:>7.1f}{'':>12}{'':>15}{t['rss'] / GIB:>9.2f}{'':>10}{t['loss']:>8.4f}")
        if 2 in rows:
            c = rows[2]
            print(f"ctitan / {t['impl']} on 2 ranks: tokens/s {c['tps_total'] / t['tps_total']:.2f}x,"
                  f" peak RSS per rank {c['rss'] / t['rss']:.2f}x")


if __name__ == "__main__":
    main()
