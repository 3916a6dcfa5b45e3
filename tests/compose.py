#!/usr/bin/python3
"""The composition matrix: every layout x precision x activation checkpointing x family x mode,
from one table (OPTIONS below), with the combinations that are refused and why (RULES).

  tests/compose.py --ctitan build/ctitan [--seed S]   the seeded pairwise (all-pairs) sample
  tests/compose.py --ctitan build/ctitan --full       every working combination
  tests/compose.py --list [--full]                    the cases, without running them
  tests/compose.py --write-readme | --check-readme    README's "Composition matrix" section
  (--only REGEX: of the cases picked, those whose name matches; --keep DIR keeps the runs)

Each case trains 3 steps on the layout's ranks (scripts/launch) and is compared with one rank
of the same family and precision (activation checkpointing "none": every mode must be neutral,
tests/neutral.sh), on the losses and gradient norms of steps 1-3 and on every parameter after
step 3 (gathered from the step-3 checkpoint's pieces through its manifest), within the
precision's tolerance (TOL). Mode "validation" also compares the validation loss of step 3;
mode "resume" saves step 2 in the layout, resumes it on another layout (RESUME_ON) and
compares that run's step 3 and parameters. The sample: a greedy covering design over the
working combinations (seeded; each pick covers the most still-uncovered pairs of option
values), printed with its seed and "pairs covered X/Y"; the 8-rank layout runs only with
--full (CI tests use at most 4 ranks).
"""
import argparse
import itertools
import json
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

# ---------------------------------------------------------------- the table

PP = "--parallelism.pipeline_parallel_degree=2"
TP = "--parallelism.tensor_parallel_degree=2"
ASYNC = "--parallelism.enable_async_tensor_parallel=true"
SHARD = "--parallelism.data_parallel_shard_degree=2"
REP = "--parallelism.data_parallel_replicate_degree=2"
CP = "--parallelism.context_parallel_degree=2"
RING = "--parallelism.context_parallel_rotate_method=alltoall"


def sched(name):
    return "--parallelism.pipeline_parallel_schedule=" + name


# name: (ranks, arguments, description)
LAYOUTS = {
    "1rank": (1, [], "one rank"),
    "fsdp2": (2, [SHARD], "FSDP, dp_shard 2"),
    "hsdp2x2": (4, [REP, SHARD], "HSDP, dp_replicate 2 x dp_shard 2"),
    "tp2": (2, [TP], "TP 2 (sequence parallel)"),
    "asynctp2": (2, [TP, ASYNC], "async TP 2"),
    "fsdp2xtp2": (4, [SHARD, TP], "FSDP 2 x TP 2"),
    "pp2-gpipe": (2, [PP, sched("GPipe")], "PP 2, GPipe"),
    "pp2-1f1b": (2, [PP, sched("1F1B")], "PP 2, 1F1B"),
    "pp2-i1f1b": (2, [PP, sched("Interleaved1F1B")], "PP 2, Interleaved1F1B (2 stages a rank)"),
    "pp2-zbh1": (2, [PP, sched("ZBH1")], "PP 2, ZB-H1 (split backward)"),
    "pp2xfsdp2": (4, [PP, sched("1F1B"), SHARD], "PP 2 (1F1B) x FSDP 2"),
    "pp2xtp2": (4, [PP, sched("1F1B"), TP], "PP 2 (1F1B) x TP 2"),
    "pp2xtp2-zbh1": (4, [PP, sched("ZBH1"), TP], "PP 2 (ZB-H1) x TP 2"),
    "pp2xasynctp2": (4, [PP, sched("Interleaved1F1B"), TP, ASYNC],
                     "PP 2 (Interleaved1F1B) x async TP 2"),
    "cp2": (2, [CP], "CP 2 (head-tail, K/V all-gathered)"),
    "cp2-ring": (2, [CP, RING], "CP 2 (head-tail, ring attention)"),
    "cp2xfsdp2": (4, [CP, SHARD], "CP 2 x FSDP 2 (parameters sharded over dp_shard x cp)"),
    "cp2xtp2": (4, [CP, TP], "CP 2 x TP 2"),
    "pp2xcp2": (4, [PP, sched("1F1B"), CP], "PP 2 (1F1B) x CP 2"),
    "pp2xcp2-zbh1": (4, [PP, sched("ZBH1"), CP], "PP 2 (ZB-H1) x CP 2"),
    "pp2xfsdp2xtp2": (8, [PP, sched("1F1B"), SHARD, TP], "3D: PP 2 x FSDP 2 x TP 2 (--full only)"),
}
F8 = "--model.converters=float8"
RECIPE = "--quantize.linear.float8.recipe_name="
PRECISIONS = {
    "fp32": ([], "fp32"),
    "bf16": (["--training.mixed_precision_param=bfloat16"],
             "bf16 compute and bf16 all-gather (one key, FSDP2's param_dtype)"),
    "f8-tensorwise": ([F8, RECIPE + "tensorwise"], "float8 tensorwise"),
    "f8-rowwise": ([F8, RECIPE + "rowwise"], "float8 rowwise"),
    "f8-rowwise-gw-hp": ([F8, RECIPE + "rowwise_with_gw_hp"], "float8 rowwise_with_gw_hp"),
    "f8-allgather": ([F8, RECIPE + "tensorwise",
                      "--quantize.linear.float8.enable_fsdp_float8_all_gather=true"],
                     "float8 tensorwise + fp8 all-gather"),
}
ACS = {m: (["--activation_checkpoint.mode=" + m], m) for m in ("none", "ffn", "selective", "full")}
# TorchTitan's per-layer option: full checkpointing on every second block, none on the others
ACS["layer2"] = (["--activation_checkpoint.mode=selective",
                  "--activation_checkpoint.selective_ac_option=2"],
                 "per-layer: full on every 2nd block")
FAMILIES = {
    "llama3": ([], "Llama 3 debugmodel"),
    "hyena": (["--model.name=hyena", "--model.flavor=hyena-debug"], "Hyena debug"),
    # the balancing bias on (the checkpoints hold it: resume restores it), at a coefficient
    # that moves the routing within the matrix's 3 steps; its 4 blocks split into
    # Interleaved1F1B's 4 stages only with the embedding and the output counted as no layer
    # (pipeline_parallel_first/last_stage_less_layers 0; read only under PP)
    "deepseek_v3": (["--model.name=deepseek_v3", "--model.flavor=deepseek_v3-debug",
                     "--model.moe_load_balance_coeff=0.02",
                     "--parallelism.pipeline_parallel_first_stage_less_layers=0",
                     "--parallelism.pipeline_parallel_last_stage_less_layers=0"],
                    "DeepSeek-V3-style MoE debug (8 experts top-2, balancing bias on)"),
}
MODES = {
    "plain": "train 3 steps",
    "validation": "and the validation loss of step 3",
    "resume": "save step 2, resume on another layout, step 3",
}
OPTIONS = [("layout", LAYOUTS), ("precision", PRECISIONS), ("ac", ACS), ("family", FAMILIES),
           ("mode", MODES)]
FULL_ONLY = {("layout", "pp2xfsdp2xtp2")}


def ranks(layout):
    return LAYOUTS[layout][0]


def is_tp(layout):
    return TP in LAYOUTS[layout][1]


def is_async(layout):
    return ASYNC in LAYOUTS[layout][1]


def is_pp(layout):
    return PP in LAYOUTS[layout][1]


def is_cp(layout):
    return CP in LAYOUTS[layout][1]


def is_f8(precision):
    return precision.startswith("f8-")


# Refusals: (name, predicate over a case dict, why, what ctitan's message says). Each is what
# ctitan refuses with exit 2 and the same reason; the matrix checks that too (one case of each
# rule must exit 2 with that message).
RULES = [
    ("hyena-asynctp", lambda c: c["family"] == "hyena" and is_async(c["layout"]),
     "Hyena's tensor parallelism is not sequence-parallel: the row-parallel out_proj and fc2 "
     "end in all-reduces, with no all-gather or reduce-scatter to decompose into ring steps",
     "its tensor parallelism is not sequence-parallel"),
    ("hyena-cp", lambda c: c["family"] == "hyena" and is_cp(c["layout"]),
     "Hyena's long convolution mixes every position with every earlier one through an FFT "
     "over the whole sequence: a sequence shard cannot be computed from its own tokens and a "
     "key/value exchange (README, Context parallelism and Hyena)",
     "its long convolution mixes every position"),
    ("moe-tp", lambda c: c["family"] == "deepseek_v3" and is_tp(c["layout"]),
     "not yet: the MoE family's experts and attention heads are not split over TP ranks",
     "the experts and attention heads are not split"),
    ("moe-cp", lambda c: c["family"] == "deepseek_v3" and is_cp(c["layout"]),
     "not yet: the MoE family's attention has no context-parallel glue",
     "has no context-parallel glue"),
]

# Tolerances (relative; parameters: per tensor, |got - ref| / |ref| in the L2 norm), from the
# formats. Parameters: Adam moves a weight by about +-lr per step whatever its gradient's size,
# so a weight whose gradient is at the precision's noise level can move the other way in the
# other run, by up to 2 x sum(lr) = 2.6e-3 absolute over the 3 steps; against weights of
# standard deviation ~0.02 a tensor in which every update flipped would differ by ~0.13 in
# the norm. Order-only fp32 differences never flip a sign that matters (seen <= 3e-6); bf16
# and float8 flip a few percent of them (seen <= 1.2e-3 bf16, 7e-3 float8): 2e-2 and 3e-2.
# A wrong piece, layout or resume differs by O(1).
#  fp32: layouts differ only in the order of fp32 sums (TP's row-parallel partial sums, FSDP's
#    reduce-scatter tree, accumulation of micro-batches), ~1e-7 relative per sum; three AdamW
#    steps keep that below 1e-6 (seen ~1e-8): 1e-5, as tests/test_pp.c and tests/pp_cli.sh.
#  bf16: the matmul operands are rounded to bf16 (8 bits); a 1e-7 difference in an fp32 input
#    moves its bf16 rounding (a 2^-8 step) with probability ~1e-5, so the runs part slowly:
#    1e-3 on losses and norms (tests/test_fsdp.c: 1e-4 on losses from step 3 for FSDP
#    alone; TP's partial sums add more order changes).
#  float8: step 1 casts the same weights with the same scales and only fp32 order differs,
#    which moves an element across an e4m3 boundary (a 2^-4 step) with probability ~1e-6:
#    the step-1 loss within 1e-6 (a scale from half a tensor under TP re-rounds every element
#    and moves it ~1e-5: tests/float8_cli.sh); from step 2 the weights part chaotically
#    across e4m3 steps: 3e-3 on losses and norms (tests/test_fsdp.c's derivation), raised to
#    5e-3 after a Hyena TP 2 tensorwise run (--seed 19694, also f8-allgather) whose step-1
#    gradients differed by 2.4e-5 (the half-tensor scale) and its step-2 grad_norm by 3.4e-3
#    (2.8323 vs 2.8419; step 3 by 2.7e-3): Adam turns the step-1 differences of
#    near-zero gradients into whole-lr updates. A missing reduction or a wrong piece moves a
#    norm by >= 1e-2.
#  fp32 parameters: the same Adam sign flips happen in fp32 on the rare weight whose gradient
#    is at the order-of-summation noise (seen once in ~100 cases: attention.wo under TP, 1.0e-5
#    with --seed 84762); one flipped element of a 256 x 256 weight moves its L2 norm by up to
#    ~5e-4 relative, so 1e-3 admits a couple while a wrong piece or layout is still O(1).
#  zero-initialised tensors (Hyena's linear and LayerNorm biases): after 3 steps such a
#    tensor is its Adam updates alone, ~sum(lr) per element, so the flips above are of the
#    size of its own norm. Under bf16 and float8, whose runs part chaotically, a bias is
#    therefore measured against the larger of its norm and that of a weight of standard
#    deviation 0.02 (W_STD, the scale the tolerances assume; weights keep their own norm);
#    seen: a float8 tensorwise PP 2 x FSDP 2 Hyena run (--seed
#    12242) moved 89 of in_proj.bias's 192 elements (3.2e-2 of its norm, 1.9e-3 of a
#    weight's), its weights by <= 3.5e-3 of their norms (in_proj 2.7e-3). A bias left
#    untrained or from the wrong piece still differs by >= its own norm, ~6e-2 on that scale.
#  float8 step-1 loss under ring attention (cp*-ring layouts): the ring merges each query
#    block's partial outputs through exp(m_i - m) rescalings, a few more fp32 roundings than a
#    reordered sum, and everything after the first attention differs by them; the rowwise
#    recipes cast each token on its own (a fine grid for a row's small elements), so more
#    elements cross an e4m3 boundary: seen 3.8e-6 (cp2-ring, every rowwise recipe, --seed
#    87823; eight other seeds within 1e-6; allgather CP and tensorwise ring within 1e-6 at
#    that seed). 2e-5 there; must-fail: the ring's last partial left unmerged moves that
#    case's step-1 loss by 1.4e-3.
W_STD = 0.02
TOL = {"fp32": (1e-5, 1e-5, 1e-3), "bf16": (1e-3, 1e-3, 2e-2)}
for _p in PRECISIONS:
    if is_f8(_p):
        TOL[_p] = (1e-6, 5e-3, 3e-2)  # step-1 loss, losses and norms, parameters
F8_RING_STEP1 = 2e-5


def why_refused(c):
    for name, pred, why, _ in RULES:
        if pred(c):
            return name, why
    return None


def resume_layout(c):
    """Where a resume case continues: one rank for a multi-rank layout, else FSDP 2."""
    return "fsdp2" if c["layout"] == "1rank" else "1rank"


def all_cases():
    keys = [k for k, _ in OPTIONS]
    for vals in itertools.product(*[list(t) for _, t in OPTIONS]):
        yield dict(zip(keys, vals))


def full_only(c):
    return any((k, c[k]) in FULL_ONLY for k in c)


# CI's sample pairs each layout with a class of these values, not each value: the float8
# recipes other than the fp8 all-gather differ only in their scales' shape, which no layout
# touches (each recipe still meets every other option value, and the seed rotates which layout
# it meets); "ffn", "selective" and "layer2" recompute a subset of what "full" recomputes, and
# tests/neutral.sh holds every mode bit-equal to "none" on five layouts. 20 layouts x 6
# precisions alone needed 120 cases (205 s on an AVX2 EPYC); this needs about 80.
LAYOUT_CLASS = {
    "precision": {"f8-tensorwise": "f8", "f8-rowwise": "f8", "f8-rowwise-gw-hp": "f8"},
    "ac": {"ffn": "partial", "selective": "partial", "layer2": "partial"},
}


def pairs_of(c):
    keys = [k for k, _ in OPTIONS]

    def val(k, other):
        return LAYOUT_CLASS.get(k, {}).get(c[k], c[k]) if other == "layout" else c[k]
    return {((a, val(a, b)), (b, val(b, a))) for a, b in itertools.combinations(keys, 2)}


def pairwise(cases, seed):
    """A greedy covering design: every pair of option values that some working case has is in
    at least one picked case. Candidates in a seeded random order; each pick covers the most
    still-uncovered pairs (first in that order among equals)."""
    rng = random.Random(seed)
    order = list(cases)
    rng.shuffle(order)
    need = set().union(*(pairs_of(c) for c in order))
    total = len(need)
    pick = []
    while need:
        best = max(order, key=lambda c: len(pairs_of(c) & need))
        pick.append(best)
        need -= pairs_of(best)
    return pick, total, total - len(need)


def case_name(c):
    return "/".join(c[k] for k, _ in OPTIONS)


# ---------------------------------------------------------------- README

BEGIN = "<!-- compose:begin (generated by tests/compose.py --write-readme) -->"
END = "<!-- compose:end -->"


def readme_section():
    cases = list(all_cases())
    working = [c for c in cases if not why_refused(c)]
    L = [BEGIN, ""]
    L.append(f"{len(cases):,} combinations of the options below; {len(working):,} compose, the "
             f"rest fall under {len(RULES)} refusal rules (exit 2 with the reason). "
             "`tests/compose.py` walks them: CTest `compose` runs a seeded pairwise sample "
             "(every pair of option values at least once, except that a layout meets the "
             "float8 recipes tensorwise/rowwise/rowwise_with_gw_hp as one class and the AC "
             "modes ffn/selective/layer2 as one, the seed rotating which member; its coverage "
             "line printed), "
             "`--full` every working combination, `--list` lists them. Each case equals one "
             "rank on losses, gradient norms and every parameter after 3 steps; "
             "tolerances per precision are derived in the file.")
    L.append("")
    L.append("| option | values |")
    L.append("|---|---|")
    for key, table in OPTIONS:
        vals = []
        for v, spec in table.items():
            desc = spec if isinstance(spec, str) else spec[-1]
            vals.append(f"`{v}` ({desc})")
        L.append(f"| {key} | " + ", ".join(vals) + " |")
    L.append("")
    L.append("| refused | why | combinations |")
    L.append("|---|---|---|")
    for name, pred, why, _ in RULES:
        n = sum(1 for c in cases if why_refused(c) and why_refused(c)[0] == name)
        L.append(f"| `{name}` | {why} | {n} |")
    L.append("")
    L.append(END)
    return "\n".join(L)


def readme_replace(text):
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < 0:
        return None
    return text[:i] + readme_section() + text[j + len(END):]


# ---------------------------------------------------------------- running


def shards(d, seed):
    os.makedirs(d)
    rng = random.Random(seed)
    for name, n in (("train_000000", 30000), ("val_000000", 4000)):
        toks, cur = [], 1
        for _ in range(n):
            cur = (cur * 7 + 1) % 509 if rng.random() < 0.8 else rng.randrange(509)
            toks.append(cur)
        with open(f"{d}/{name}.bin", "wb") as f:
            f.write(b"CTTOKENS" + struct.pack("<IIQ", 1, 2, n) + struct.pack(f"<{n}H", *toks))


class Runner:
    def __init__(self, ctitan, tmp, seed):
        self.ctitan, self.tmp, self.seed = ctitan, tmp, seed
        self.data = os.path.join(tmp, "data")
        shards(self.data, seed)
        self.refs = {}
        self.n = 0
        # one OpenMP thread a rank: the cases and their references run alike, and up to 4
        # ranks on 2 shared cores do not spin against each other (60x slower with a thread
        # per core each)
        self.env = dict(os.environ, OMP_NUM_THREADS="1")

    def common(self, c):
        # micro-batches of one sequence everywhere (PP's micro-batch size): a tensorwise
        # float8 scale is per micro-batch, so every layout casts the same tensors
        return ([os.path.join(ROOT, "configs", "debug.toml"), "--training.dataset=mine",
                 "--training.dataset_path=" + self.data, "--model.vocab_size=509",
                 "--training.seq_len=16", "--training.local_batch_size=1",
                 "--training.global_batch_size=4", "--training.steps=3",
                 "--lr_scheduler.warmup_steps=1", "--lr_scheduler.min_lr_factor=0.5",
                 "--metrics.peak_tflops=0.1",
                 f"--debug.seed={self.seed}", "--checkpoint.enable=true",
                 # step 3's checkpoint for the parameters; a resume case's step 2 too
                 "--checkpoint.interval=%d" % (2 if c["mode"] == "resume" else 3),
                 "--checkpoint.async_mode=disabled",
                 "--comm.timeout_seconds=120"]
                + FAMILIES[c["family"]][0] + PRECISIONS[c["precision"]][0] + ACS[c["ac"]][0])

    def train(self, layout, c, d, extra=()):
        n, args, _ = LAYOUTS[layout]
        cmd = ([os.path.join(ROOT, "scripts", "launch"), str(n), self.ctitan, "train"]
               + self.common(c) + args + ["--job.dump_folder=" + d] + list(extra))
        with open(d + ".log", "a") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        self.n += 1
        return rc

    def ref(self, c):
        key = (c["family"], c["precision"])
        if key not in self.refs:
            d = os.path.join(self.tmp, "ref-" + "-".join(key))
            rc = self.train("1rank", dict(c, ac="none"), d,
                            ["--validation.enable=true", "--validation.freq=3",
                             "--validation.steps=1"])
            self.refs[key] = d if rc == 0 else None
        return self.refs[key]


def metrics(d):
    steps = {}
    for line in open(os.path.join(d, "metrics.jsonl")):
        r = json.loads(line)
        steps.setdefault(r["step"], {}).update(r)
    return steps


_PARAMS = {}


def params(ckpt, cache=False):
    """Every model tensor of a checkpoint, gathered from its pieces (numpy arrays)."""
    if ckpt in _PARAMS:
        return _PARAMS[ckpt]
    import numpy as np
    man = json.load(open(os.path.join(ckpt, "manifest.json")))
    files = {}
    out = {}
    for name, t in man["tensors"].items():
        if name.endswith(".exp_avg") or name.endswith(".exp_avg_sq"):
            continue
        a = np.zeros(t["shape"], dtype=np.float32)
        for p in t["pieces"]:
            if p["file"] not in files:
                raw = open(os.path.join(ckpt, p["file"]), "rb").read()
                n = struct.unpack("<Q", raw[:8])[0]
                files[p["file"]] = (json.loads(raw[8:8 + n]), raw, 8 + n)
            head, raw, base = files[p["file"]]
            h = head[name]
            lo, hi = h["data_offsets"]
            v = np.frombuffer(raw[base + lo:base + hi], dtype=np.float32).reshape(h["shape"])
            r0, r1 = p["rows"]
            if "cols" in p:
                c0, c1 = p["cols"]
                a[r0:r1, c0:c1] = v
            else:
                a[r0:r1] = v
        out[name] = a
    if cache:
        _PARAMS[ckpt] = out
    return out


def compare(c, got, ref, steps, want_val):
    """'' when run `got` equals `ref` within c's precision's tolerance, else why not."""
    t1, tl, tp = TOL[c["precision"]]
    if is_f8(c["precision"]) and c["layout"].endswith("-ring"):
        t1 = F8_RING_STEP1
    mg, mr = metrics(got), metrics(ref)
    worst = 0.0
    for s in steps:
        for k in ("loss", "grad_norm") + (("validation_loss",) if want_val and s == 3 else ()):
            if k not in mg.get(s, {}) or k not in mr.get(s, {}):
                return f"step {s}: no {k}"
            x, y = mg[s][k], mr[s][k]
            d = abs(x - y) / max(abs(y), 1e-30)
            tol = t1 if (s == 1 and k == "loss") else tl
            if not d <= tol:
                return f"step {s} {k} {x!r} vs {y!r}: {d:.2g} > {tol:g}"
            worst = max(worst, d)
    pg = params(os.path.join(got, "checkpoint", "step-00000003"))
    pr = params(os.path.join(ref, "checkpoint", "step-00000003"), cache=True)
    if sorted(pg) != sorted(pr) or not pr:
        return "parameter names differ"
    pw = 0.0
    for k in pr:
        if pg[k].shape != pr[k].shape:
            return f"{k}: shape {pg[k].shape} vs {pr[k].shape}"
        import numpy as np
        scale = float(np.linalg.norm(pr[k]))
        if c["precision"] != "fp32" and k.endswith("bias"):  # zero-initialised
            scale = max(scale, W_STD * math.sqrt(pr[k].size))
        d = float(np.linalg.norm(pg[k] - pr[k])) / max(scale, 1e-30)
        if not d <= tp:
            return f"parameter {k}: {d:.2g} > {tp:g} (relative, L2)"
        pw = max(pw, d)
    return f"ok (metrics {worst:.1g}, parameters {pw:.1g})"


def run_case(R, c):
    d = os.path.join(R.tmp, "c%03d" % R.n)
    ref = R.ref(c)
    if ref is None:
        return "FAIL", "the 1-rank reference did not train"
    extra = []
    if c["mode"] == "validation":
        extra = ["--validation.enable=true", "--validation.freq=3", "--validation.steps=1"]
    rc = R.train(c["layout"], c, d, extra)
    if rc != 0:
        return "FAIL", f"exit {rc} ({d}.log)"
    if c["mode"] != "resume":
        v = compare(c, d, ref, (1, 2, 3), c["mode"] == "validation")
        return ("ok" if v.startswith("ok") else "FAIL"), v
    v = compare(c, d, ref, (1, 2, 3), False)
    if not v.startswith("ok"):
        return "FAIL", "before the resume: " + v
    to = resume_layout(c)
    d2 = d + "-on-" + to
    os.makedirs(os.path.join(d2, "checkpoint"))
    shutil.copytree(os.path.join(d, "checkpoint", "step-00000002"),
                    os.path.join(d2, "checkpoint", "step-00000002"))
    rc = R.train(to, c, d2, ["--checkpoint.load_step=2"])
    if rc != 0:
        return "FAIL", f"resume on {to}: exit {rc} ({d2}.log)"
    if "loaded step 2" not in open(d2 + ".log").read():
        return "FAIL", f"resume on {to}: did not load step 2"
    v = compare(c, d2, ref, (3,), False)
    return ("ok" if v.startswith("ok") else "FAIL"), f"resumed on {to}: " + v


def check_refusal(R, c, msg):
    """A refused case exits 2 with its reason's gist (the matrix checks the rule is real)."""
    d = os.path.join(R.tmp, "x%03d" % R.n)
    extra = (["--validation.enable=true"] if c["mode"] == "validation" else [])
    rc = R.train(c["layout"], c, d, extra)
    return rc == 2 and msg in open(d + ".log").read()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctitan")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--write-readme", action="store_true")
    ap.add_argument("--check-readme", action="store_true")
    ap.add_argument("--keep", help="keep the runs in this folder")
    ap.add_argument("--only", help="of the cases picked, only those whose name (layout/"
                    "precision/ac/family/mode) matches this regular expression")
    a = ap.parse_args()
    if a.write_readme or a.check_readme:
        text = open(README).read()
        new = readme_replace(text)
        if new is None:
            print(f"README.md has no {BEGIN} ... {END} section")
            return 1
        if a.write_readme:
            open(README, "w").write(new)
            print("README.md: composition matrix written")
            return 0
        ok = new == text
        print("1 passed, 0 failed" if ok else
              "README.md's composition matrix is stale: run tests/compose.py --write-readme\n"
              "0 passed, 1 failed")
        return 0 if ok else 1
    cases = list(all_cases())
    working = [c for c in cases if not why_refused(c)]
    seed = a.seed if a.seed is not None else int(os.environ.get("CT_SEED", time.time() % 100000))
    if a.full:  # in a seeded order, so that a run cut short has sampled every option
        pick, total, covered = list(working), None, None
        random.Random(seed).shuffle(pick)
    else:
        pick, total, covered = pairwise([c for c in working if not full_only(c)], seed)
    print(f"composition matrix: {len(cases)} combinations, {len(working)} working, "
          f"{len(RULES)} refusal rules; seed {seed} (--seed {seed} reproduces this sample)")
    if total is not None:
        print(f"pairwise sample: {len(pick)} cases; pairs covered {covered}/{total}")
    if a.only:
        pick = [c for c in pick if re.search(a.only, case_name(c))]
        print(f"--only {a.only}: {len(pick)} of them")
    if a.list:
        for c in pick:
            print("  " + case_name(c))
        return 0
    if not a.ctitan:
        ap.error("--ctitan is needed to run the cases")
    tmp = a.keep or tempfile.mkdtemp(prefix="ct_compose_")
    os.makedirs(tmp, exist_ok=True)
    R = Runner(os.path.abspath(a.ctitan), tmp, seed)
    t0 = time.time()
    fails = 0
    for i, c in enumerate(pick):
        t1 = time.time()
        n0 = R.n
        st, why = run_case(R, c)
        fails += st != "ok"
        if st == "ok" and not a.keep:  # a passed case's runs (checkpoints) go at once
            for k in range(n0, R.n + 1):
                for p in ("c%03d" % k, "c%03d-on-1rank" % k, "c%03d-on-fsdp2" % k):
                    shutil.rmtree(os.path.join(tmp, p), ignore_errors=True)
        print(f"[{'ok' if st == 'ok' else 'FAIL'}] {i + 1:3d} {case_name(c)}: {why} "
              f"[{time.time() - t1:.1f} s]", flush=True)
    # each rule once: the refusal is real (exit 2), not only in this table
    rng = random.Random(seed)
    for name, pred, why, msg in ([] if a.only else RULES):
        # a case only this rule refuses: ctitan names the first refusal it checks
        cs = [c for c in cases if not full_only(c)
              and [r[0] for r in RULES if r[1](c)] == [name]]
        c = rng.choice(cs)
        ok = check_refusal(R, c, msg)
        fails += not ok
        print(f"[{'ok' if ok else 'FAIL'}] refused {name}: {case_name(c)} exits 2", flush=True)
    nref = 0 if a.only else len(RULES)
    print(f"{len(pick)} cases and {nref} refusals in {time.time() - t0:.0f} s, "
          f"{R.n} runs; {len(pick) + nref - fails} passed, {fails} failed")
    if not a.keep and fails == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    elif fails:
        print(f"runs kept in {tmp}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
