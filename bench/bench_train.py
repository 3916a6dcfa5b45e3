#!/usr/bin/python3
"""Training benchmark: ctitan vs PyTorch on the same machine, same shapes, same threads, same run.

  /usr/bin/python3 bench/bench_train.py [--ctitan build/ctitan] [--threads 2] [--steps 6]
                                       [--warmup 2] [--only debug|125m|125m-noac ...]
                                       [--rounds 1] [--own-blas-kernel] [--no-profile]

For each case (TorchTitan's debug model at seq 256 x batch 8, the 125M-class model at seq 512 x
batch 4) it runs `ctitan train` and bench/torch_train.py as child processes, one at a time, and
prints tokens/s, MFU and peak RSS of both and the ratios. Peak RSS is the child's own ru_maxrss
(os.wait4). The bf16 cases (training.mixed_precision_param = bfloat16) compare against PyTorch
with torch.autocast("cpu", bfloat16). Every row names the CPU, the matmul engine and the ISA it
ran on. MFU is against the theoretical peak ctitan derives from the CPU's features (fp32 for fp32
rows, bf16 for bf16 rows). With --rounds N the two sides alternate N times per case (ctitan,
PyTorch, ctitan, ...), each round is printed, and the rows report each side's median round and
the ratio of the medians, with the range of the per-round ratios: on a shared machine the
speed drifts between runs minutes apart by more than the gaps being measured. After the timed
steps ctitan runs one more, profiled (not timed): a line per case says where that step went by
node kind (forward/backward blocks, head and loss, collectives, optimizer; --no-profile skips
it). The engine column also names the attention kernel (bf16 on AVX512-BF16, else fp32) and
the model's FLOP rate as a share of the engine's own measured matmul rate at the model's
shapes over the run so far (metrics.jsonl `mfu_engine`).
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
    "debug-bf16": dict(config="configs/debug.toml", flavor="debugmodel", seq=256, batch=8,
                       bf16=True),
    "125m-bf16": dict(config="configs/125m.toml", flavor="125M", seq=512, batch=4, bf16=True),
    # like for like with autocast, which saves every activation too
    "125m-bf16-noac": dict(config="configs/125m.toml", flavor="125M", seq=512, batch=4, bf16=True,
                           extra=["--activation_checkpoint.mode=none"]),
}
BF16 = ["--training.mixed_precision_param=bfloat16"]


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


def measure_peak(ctitan, env, bf16):
    """ctitan prints the theoretical peak it derives at start-up; a 1-step debug run suffices.
    Returns (TFLOP/s, derivation, CPU brand)."""
    with tempfile.TemporaryDirectory() as d:
        text, _ = run_child([ctitan, "train", "configs/debug.toml", "--training.steps=1",
                             f"--job.dump_folder={d}", "--metrics.enable_jsonl=false"] +
                            (BF16 if bf16 else []), env)
    m = re.search(r"peak ([0-9.]+) GFLOP/s per rank \((.*)\)", text)
    cpu = re.search(r"compute: (.*?); matmul engine", text)
    if not m or not cpu:
        sys.exit("bench: could not read the peak from ctitan's output")
    return float(m.group(1)) / 1e3, m.group(2), cpu.group(1)


def ctitan_engine(text):
    """'onednn/avx512_core_bf16' from the engine summary ctitan logs after step 1."""
    m = re.search(r"matmul engine (\S+), compute (\S+); oneDNN ISA (\S+) \(bf16 implementation "
                  r"([^)]*)\), OpenBLAS kernel (\S+);", text)
    if not m:
        return "?"
    # "onednn", "onednn on B transposed" (-bt), "onednn gemm:jit" (oneDNN's second
    # implementation), "openblas"
    kept = set(re.findall(r"^\s+[NT][NT] M=.*?: (onednn|openblas)( on B transposed| [^ ,]+)?,",
                          text, re.M))
    kept = {e + ("-bt" if v == " on B transposed" else "-" + v.strip() if v else "")
            for e, v in kept}
    isa = m.group(4) if m.group(2) == "bf16" else m.group(3)
    att = re.search(r"attention kernel (\S+)", text)
    return (f"{m.group(1)}({'+'.join(sorted(kept)) or '-'}) {isa}; OpenBLAS {m.group(5)}"
            f"; attention {att.group(1) if att else '?'}")


PROFILE_ROW = re.compile(r"^  (\S.*?)\s+(\d+)\s+([0-9.]+)s\s+([0-9.]+)s\s+[+-]?[0-9.]+%$")


def ctitan_profile(text):
    """The measured seconds per node kind of the profiled step (ctitan's 'cost model vs this
    step' table), as [(kind, seconds)], the step's own row last."""
    rows, inside = [], False
    for line in text.splitlines():
        if line.startswith("cost model vs this step (rank's own times"):
            rows, inside = [], True
            continue
        if inside:
            m = PROFILE_ROW.match(line)
            if m:
                rows.append((m.group(1), float(m.group(4))))
                if m.group(1) == "step":
                    inside = False
            elif not line.startswith("  "):
                inside = False
    return rows


def profile_line(rows):
    if not rows or rows[-1][0] != "step":
        return "  ctitan profile: none (the run printed no per-node-kind table)"
    step = rows[-1][1]
    parts = [f"{k} {t:.3f}s {100 * t / step:.0f}%" for k, t in rows[:-1] if t >= 0.02 * step]
    rest = sum(t for k, t in rows[:-1] if t < 0.02 * step)
    return (f"  ctitan profile (one profiled step after the timed ones, rank 0, measured; step "
            f"{step:.3f}s): " + ", ".join(parts) + f", the rest {rest:.3f}s")


def torch_engine(autocast, env):
    """PyTorch's matmul path: oneDNN under bf16 autocast; else its BLAS (Debian's torch links
    libblas.so.3, which the alternatives system may point at OpenBLAS: then its kernel)."""
    if autocast:
        return "oneDNN bf16 (autocast)"
    lib = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    probe = ("import ctypes; l = ctypes.CDLL('libblas.so.3'); f = l.openblas_get_corename; "
             "f.restype = ctypes.c_char_p; print(f().decode())")
    try:
        core = subprocess.run(["/usr/bin/python3", "-c", probe], env=env, capture_output=True,
                              text=True, timeout=60).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        core = "?"
    return f"libblas.so.3 = {os.path.basename(os.path.dirname(lib))}, kernel {core}"


def bench_ctitan(ctitan, case, steps, warmup, peak_tflops, env, profile):
    with tempfile.TemporaryDirectory() as d:
        # with profile, one more step, traced and compared node by node (not timed)
        prof = ["--profiling.enable_profiling=true",
                f"--profiling.profile_freq={steps + 1}"] if profile else []
        cmd = [ctitan, "train", case["config"], f"--training.steps={steps + bool(profile)}",
               f"--training.seq_len={case['seq']}", f"--training.local_batch_size={case['batch']}",
               f"--job.dump_folder={d}", f"--metrics.peak_tflops={peak_tflops}"]
        cmd += case.get("extra", []) + (BF16 if case.get("bf16") else []) + prof
        text, rss = run_child(cmd, env)
        recs = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))][:steps]
    timed = sorted(recs[warmup:], key=lambda r: r["step_s"])
    med = timed[len(timed) // 2]  # the median step, as torch_train.py reports PyTorch's
    tps = case["seq"] * case["batch"] / med["step_s"]
    mfu = med["mfu"]
    # the model's FLOP rate against the engine's own measured matmul rate at the model's shapes
    # (metrics.jsonl mfu_engine), in the engine column
    eng = ctitan_engine(text) + f"; model FLOP rate {med.get('mfu_engine', 0):.0f}% of the engine's"
    return dict(impl="ctitan", tps=tps, mfu=mfu, peak_rss_bytes=rss, final_loss=recs[-1]["loss"],
                engine=eng, profile=ctitan_profile(text))


def bench_torch(case, steps, warmup, threads, peak_tflops, env):
    cmd = ["/usr/bin/python3", os.path.join(HERE, "torch_train.py"), "--flavor", case["flavor"],
           "--seq-len", str(case["seq"]), "--batch", str(case["batch"]), "--steps", str(steps),
           "--warmup-steps", str(warmup), "--threads", str(threads),
           "--peak-tflops", str(peak_tflops),
           "--autocast", "bfloat16" if case.get("bf16") else "none"]
    text, rss = run_child(cmd, env)
    rec = json.loads(text.strip().splitlines()[-1])
    rec["peak_rss_bytes"] = rss
    rec["engine"] = torch_engine(case.get("bf16"), env)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctitan", default=os.path.join(ROOT, "build", "ctitan"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--only", choices=sorted(CASES), action="append")
    ap.add_argument("--torch-own-blas-kernel", action="store_true",
                    help="run PyTorch with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (some "
                         "machines set them for old OpenBLAS builds; unset, OpenBLAS picks its "
                         "own kernel for this CPU)")
    ap.add_argument("--own-blas-kernel", action="store_true",
                    help="the same for both sides: ctitan's OpenBLAS engine (one of auto's "
                         "candidates) then runs OpenBLAS's own kernel choice too, like for like")
    ap.add_argument("--no-profile", action="store_true",
                    help="skip the profiled step after ctitan's timed ones (its per-node-kind "
                         "line: where the step goes)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternate ctitan and PyTorch this many times per case; the rows "
                         "report each side's median round")
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if args.own_blas_kernel:
        for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
            env.pop(k, None)
    torch_env = dict(env)
    if args.torch_own_blas_kernel:
        torch_env.pop("OPENBLAS_CORETYPE", None)
        torch_env.pop("OPENBLAS_L2_SIZE", None)
    peaks = {bf: measure_peak(args.ctitan, env, bf) for bf in (False, True)}
    print(f"CPU {peaks[False][2]}; threads {args.threads}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for bf, (p, why, _) in peaks.items():
        print(f"{'bf16' if bf else 'fp32'} peak {p * 1e3:.1f} GFLOP/s ({why})")
    print(f"{'case':<15}{'impl':<9}{'tokens/s':>10}{'MFU %':>8}{'peak RSS GiB':>14}"
          f"{'final loss':>12}  engine / ISA")
    torch_runs = {}
    for name, case in CASES.items():
        if args.only and name not in args.only:
            continue
        peak = peaks[bool(case.get("bf16"))][0]
        cs, ts = [], []
        for rnd in range(args.rounds):
            c = bench_ctitan(args.ctitan, case, args.steps, args.warmup, peak, env,
                             not args.no_profile)
            key = (case["flavor"], case["seq"], case["batch"], bool(case.get("bf16")), rnd)
            if key not in torch_runs:  # one PyTorch run per shape and round
                torch_runs[key] = bench_torch(case, args.steps, args.warmup, args.threads, peak,
                                              torch_env)
            t = torch_runs[key]
            cs.append(c)
            ts.append(t)
            if args.rounds > 1:
                print(f"  {name} round {rnd + 1}: ctitan {c['tps']:.0f}, PyTorch {t['tps']:.0f} "
                      f"tokens/s, {c['tps'] / t['tps']:.2f}x (load {os.getloadavg()[0]:.2f})")
                sys.stdout.flush()
        c = sorted(cs, key=lambda r: r["tps"])[(len(cs) - 1) // 2]
        t = sorted(ts, key=lambda r: r["tps"])[(len(ts) - 1) // 2]
        for r in (c, t):
            print(f"{name:<15}{r['impl']:<9}{r['tps']:>10.0f}{r['mfu']:>8.1f}"
                  f"{r['peak_rss_bytes'] / 2**30:>14.2f}{r['final_loss']:>12.4f}  {r['engine']}")
        rounds = [a["tps"] / b["tps"] for a, b in zip(cs, ts)]
        spread = (f"  (median of {len(cs)} rounds each; per-round ratios "
                  f"{min(rounds):.2f}-{max(rounds):.2f}x)" if len(cs) > 1 else "")
        print(f"{name:<15}{'ratio':<9}{c['tps'] / t['tps']:>9.2f}x{'':>8}"
              f"{c['peak_rss_bytes'] / t['peak_rss_bytes']:>13.2f}x{spread}")
        if not args.no_profile:
            print(profile_line(c["profile"]))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
