#!/usr/bin/python3
"""MoE benchmark: ctitan's deepseek_v3-debug against its dense equivalent and PyTorch, same run.

  /usr/bin/python3 bench/bench_moe.py [--ctitan build/ctitan] [--threads 2] [--steps 8]
                                      [--warmup 2] [--rounds 1]

Rows (synthetic data, seq 256 x batch 8 per rank, fp32, every process on the same threads):
  moe ep1      the debug MoE on 1 rank (8 routed experts top-2 + 1 shared, hidden 128)
  dense        its dense equivalent on 1 rank: the same family and shapes with 2 routed experts
               both chosen for every token (moe_n_routed_experts = moe_top_k = 2): the same
               active parameters and FLOPs per token, every expert matmul over all tokens, no
               routing sparsity (the issue's target: moe >= 0.7x dense tokens/s)
  moe ep2/ep4  expert parallelism on 2 / 4 ranks (dp_shard = ep), threads split over the ranks;
               tokens/s of all ranks together (4 ranks on fewer cores are oversubscribed: said)
  pytorch      bench/torch_moe.py: tests/reference/moe_ref.py's MoE in float32, same shapes
Each row names the CPU and ctitan's matmul engine. With --rounds N each ctitan row and PyTorch
alternate N times and the rows report medians.
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
SEQ, BATCH = 256, 8


def run(cmd, env):
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bench_moe: {' '.join(cmd)} failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return p.stdout + p.stderr


def ctitan_row(args, ranks, extra, env):
    with tempfile.TemporaryDirectory() as d:
        cmd = ([os.path.join(ROOT, "scripts", "launch"), str(ranks)] if ranks > 1 else [])
        cmd += [args.ctitan, "train", "configs/moe-debug.toml", "--training.dataset=synthetic",
                f"--training.steps={args.steps}", f"--training.seq_len={SEQ}",
                f"--training.local_batch_size={BATCH}", f"--job.dump_folder={d}",
                "--metrics.log_freq=1"] + extra
        text = run(cmd, env)
        recs = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]
    steps = sorted(r["step_s"] for r in recs[args.warmup:])
    step_s = steps[len(steps) // 2]
    m = re.search(r"([0-9.e+]+) FLOPs/token", text)
    eng = re.search(r"matmul engine (\S+), compute (\S+); oneDNN ISA (\S+)", text)
    rag = len(re.findall(r"ragged, oneDNN run-time sizes", text))
    return dict(tps=ranks * SEQ * BATCH / step_s, flops_tok=float(m.group(1)) if m else 0.0,
                loss=recs[-1]["loss"],
                engine=(f"{eng.group(1)} {eng.group(2)} {eng.group(3)}" if eng else "?") +
                (f"; {rag} ragged families" if rag else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctitan", default=os.path.join(ROOT, "build", "ctitan"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    cores = os.cpu_count()
    cpu = "?"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    print(f"CPU {cpu}; {cores} cores; threads {args.threads}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    cases = [("moe ep1", 1, []),
             ("dense", 1, ["--model.moe_n_routed_experts=2", "--model.moe_top_k=2"]),
             ("moe ep2", 2, ["--parallelism.expert_parallel_degree=2"]),
             ("moe ep4", 4, ["--parallelism.expert_parallel_degree=4"])]
    res = {name: [] for name, _, _ in cases}
    res["pytorch"] = []
    for rnd in range(args.rounds):
        for name, ranks, extra in cases:
            env = dict(os.environ, OMP_NUM_THREADS=str(max(1, args.threads // ranks)))
            res[name].append(ctitan_row(args, ranks, extra, env))
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        out = run(["/usr/bin/python3", os.path.join(HERE, "torch_moe.py"), "--seq-len", str(SEQ),
                   "--batch", str(BATCH), "--steps", str(args.steps), "--warmup-steps",
                   str(args.warmup), "--threads", str(args.threads)], env)
        res["pytorch"].append(json.loads(out.strip().splitlines()[-1]))
        if args.rounds > 1:
            print(f"  round {rnd + 1}: " + ", ".join(f"{k} {v[-1]['tps']:.0f}"
                                                     for k, v in res.items()))
    med = {k: sorted(v, key=lambda r: r["tps"])[(len(v) - 1) // 2] for k, v in res.items()}
    print(f"{'row':<9}{'ranks':>6}{'threads/rank':>13}{'tokens/s':>10}{'FLOPs/token':>13}"
          f"{'final loss':>12}  engine")
    for name, ranks, _ in cases:
        r = med[name]
        over = " (oversubscribed)" if ranks * max(1, args.threads // ranks) > cores else ""
        print(f"{name:<9}{ranks:>6}{max(1, args.threads // ranks):>13}{r['tps']:>10.0f}"
              f"{r['flops_tok']:>13.3g}{r['loss']:>12.4f}  {r['engine']}{over}")
    t = med["pytorch"]
    print(f"{'pytorch':<9}{1:>6}{args.threads:>13}{t['tps']:>10.0f}{'':>13}"
          f"{t['final_loss']:>12.4f}  moe_ref.py float32 (per-expert mask + index_add)")
    moe, dense = med["moe ep1"], med["dense"]
    rate = (moe["tps"] * moe["flops_tok"]) / (dense["tps"] * dense["flops_tok"])
    print(f"moe ep1 / dense: {moe['tps'] / dense['tps']:.2f}x tokens/s, {rate:.2f}x FLOP/s "
          f"(FLOPs/token {moe['flops_tok']:.3g} vs {dense['flops_tok']:.3g}; target >= 0.7x)")
    print(f"moe ep1 / pytorch: {moe['tps'] / t['tps']:.2f}x tokens/s")


if __name__ == "__main__":
    main()
