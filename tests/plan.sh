#!/usr/bin/env bash
# `ctitan plan`: predicted step time, memory and exposed communication for presets on many
# ranks, in seconds, without MPI. Every input of configs/8b.toml's plan is stated, so its
# figures are checked against an independent computation (FLOPs, ring bytes over the stated
# link) within a few percent, and step time and memory are pinned to the current cost model;
# Hyena and deepseek_v3 (MoE) plans, their planned activations equal to a trained model's;
# bad arguments exit 2.
#   tests/plan.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
H100="--metrics.peak_tflops=989 --comm.bandwidth_gbps=400 --comm.latency_us=30"
start=$(date +%s)
"$CTITAN" plan "$ROOT/configs/8b.toml" --world-size 128 > "$tmp/8b.txt" 2> "$tmp/8b.err"
check "8B on 128 ranks (H100 figures from configs/8b.toml)" $?
/usr/bin/python3 - "$tmp/8b.txt" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
def num(pat):
    return float(re.search(pat, t).group(1))
step = num(r"predicted step time\s+([\d.]+) s")
compute = num(r"\(compute ([\d.]+) s")
comm = num(r"communication ([\d.]+) s in")
ncoll = int(num(r"in (\d+) collectives"))
tps = num(r"throughput\s+(\d+) tokens/s per rank")
mfu = num(r"MFU ([\d.]+)%") / 100
fpt = num(r"model FLOPs ([\d.e+]+) per token")
nparam = num(r"([\d.e+]+) parameters")
mem = num(r"memory per rank\s+([\d.]+) GiB")
exp = num(r"exposed communication\s+([\d.]+) s")
# Every input is stated (configs/8b.toml: 989 TFLOP/s x 0.5, 400 Gbit/s + 30 us, bf16 gathers,
# 128 ranks, 1 x 8192 tokens), so the figures are checked against an independent computation:
L, D, V, T, N, peak, eff = 32, 4096, 128256, 8192, 128, 989e12, 0.5
bw, lat = 400e9 / 8, 30e-6
bad = []
def near(name, got, want, tol):
    print(f"  {name}: {got:.6g} (independent {want:.6g}, tolerance {tol:.1%})")
    if not abs(got - want) <= tol * abs(want):
        bad.append(name)
# TorchTitan's model FLOPs: 6 x non-embedding parameters + 12 x layers x dim x seq
near("model FLOPs per token", fpt, 6 * (nparam - V * D) + 12 * L * D * T, 0.005)
# compute = step FLOPs at peak x efficiency; selective AC recomputes a few cheap ops
near("compute s", compute, fpt * T / (peak * eff), 0.05)
# communication: bf16 all-gather of every parameter twice (forward; backward except the
# last bucket), fp32 reduce-scatter once, ring (N-1)/N of the bytes, plus latencies
near("communication s", comm, (2 * 2 + 4) * nparam * (N - 1) / N / bw + ncoll * lat, 0.03)
near("tokens/s per rank", tps, T / step, 0.002)
near("MFU", mfu, tps * fpt / peak, 0.01)
# the step lies between full overlap and none; exposed comm fits in what compute leaves
if not (max(compute, comm) <= step * 1.001 and step <= compute + comm):
    bad.append("step outside [max(compute, comm), compute + comm]")
if not 0 < exp <= (step - compute) * 1.001:
    bad.append("exposed communication outside (0, step - compute]")
# pinned figures of the current cost model (update them with the cost model, see README)
near("step s (pinned)", step, 1.318, 0.02)
near("exposed communication s (pinned)", exp, 0.274, 0.05)
near("memory GiB (pinned)", mem, 20.82, 0.02)
if not ("RECOMPUTE u1" in t and "AG b1 (recomputed)" in t and "buckets (34)" in t):
    bad.append("schedule structure")
print("mismatches:", ", ".join(bad) or "none")
sys.exit(1 if bad else 0)
PY
check "8B: compute, comm, tokens/s, MFU and exposed comm equal an independent computation; selective AC in the schedule" $?
grep -q "plans compared" "$tmp/8b.txt" && grep -q "^  #1 .*per_block" "$tmp/8b.txt" && grep -q "lower bound" "$tmp/8b.txt"
check "8B: the plans the automatic search compared are printed" $?
"$CTITAN" plan "$ROOT/configs/8b.toml" --world-size 128 > "$tmp/8b2.txt" 2>&1 && cmp -s "$tmp/8b.txt" "$tmp/8b2.txt"
check "8B: the plan depends only on its inputs (two runs print the same)" $?
"$CTITAN" plan "$ROOT/configs/8b.toml" --world-size 128 --comm.buckets=auto --comm.memory_budget_gb=10 > /dev/null 2> "$tmp/err"
[ $? -eq 2 ] && grep -q "memory_budget_gb.*no plan fits.*smallest predicted peak is 2[0-9.]* GiB" "$tmp/err"
check "a memory budget no plan fits: exit 2 with the smallest predicted peak" $?
for c in 70b 405b; do
  "$CTITAN" plan "$ROOT/configs/$c.toml" --world-size 512 $H100 --comm.buckets=auto \
    --activation_checkpoint.mode=full --training.mixed_precision_param=bfloat16 \
    > "$tmp/$c.txt" 2>&1 && grep -q "predicted step time" "$tmp/$c.txt"
  check "$c on 512 ranks with auto bucketing" $?
done
"$CTITAN" plan "$ROOT/configs/8b.toml" --world-size 64 --comm.buckets="embed+0,1+2" > /dev/null 2> "$tmp/err"
[ $? -eq 2 ] && grep -q "comm.buckets" "$tmp/err"; check "bad bucket plan: named, exit 2" $?
# TorchTitan's Table 2 (Llama 3.1 8B on 8 H100s, local batch 1, full AC, Float8; FSDP 8 x CP 1
# at 32k, FSDP 1 x CP 8 at 262k): the stated target (README, Context parallelism in the cost
# model). The attention FLOPs of a cp rank (1/cp of the sequence's causal ones, head-tail) are
# checked independently through plan.attention_efficiency (the step's compute moves by exactly
# their time at the two rates), the K/V bytes against 4 x layers x K/V x (cp-1)/cp (allgather
# with full AC: forward, recompute and backward gathers, backward reduce-scatter), tokens/s
# against the step; the throughput is pinned to the current model (TorchTitan measured 3,890
# and 548).
TT="--activation_checkpoint.mode=full --model.converters=float8 --plan.fp8_peak_tflops=1979
    --comm.bandwidth_gbps=2880 --comm.latency_us=10 --parallelism.tp_bandwidth_gbps=2880"
for row in "32768 1" "262144 8"; do
  set -- $row
  for e in 0.30 0.60; do
    # shellcheck disable=SC2086
    "$CTITAN" plan "$ROOT/configs/8b.toml" --world-size 8 $TT --plan.attention_efficiency=$e \
      --training.seq_len=$1 --parallelism.context_parallel_degree=$2 > "$tmp/tt_$1_$e.txt" 2>&1
    check "TorchTitan's Table 2 row seq $1, cp $2, attention efficiency $e" $?
  done
done
/usr/bin/python3 - "$tmp" <<'PY'
import re, sys
d = sys.argv[1]
def num(t, pat):
    return float(re.search(pat, t).group(1))
bad = 0
L, H, D, KVD = 32, 32, 128, 1024
for T, cp, pin, tt in ((32768, 1, 4763, 3890), (262144, 8, 881, 548)):
    a = open(f"{d}/tt_{T}_0.30.txt").read()
    b = open(f"{d}/tt_{T}_0.60.txt").read()
    step = num(a, r"predicted step time\s+([\d.]+) s")
    tps = num(a, r"throughput\s+(\d+) tokens/s per rank")
    # a rank's causal attention FLOPs: forward 2 H T^2 D / cp, recomputed, backward 2.5x
    attn = 2.0 * H * T * T * D / cp * (1 + 1 + 2.5) * L
    want = attn / (0.30 * 989e12) - attn / (0.60 * 989e12)
    got = num(a, r"\(compute ([\d.]+) s") - num(b, r"\(compute ([\d.]+) s")
    if abs(got - want) > 0.01 * want:
        print(f"  seq {T}: attention time {got:.3f} s at 0.30 - 0.60, want {want:.3f} s"); bad = 1
    if abs(tps - T / cp / step) > 0.005 * tps:
        print(f"  seq {T}: {tps} tokens/s, but {T // cp} tokens / {step} s"); bad = 1
    if cp > 1:
        mib = num(a, r"K/V all-gathered .*: ([\d.]+) MiB sent per step")
        kv = 2 * T * KVD * 2  # K and V of the sequence, bf16
        want_b = 4 * L * kv * (cp - 1) / cp / 2**20
        if abs(mib - want_b) > 0.05:
            print(f"  seq {T}: K/V {mib} MiB per step, want {want_b}"); bad = 1
    if abs(tps - pin) > 0.02 * pin:
        print(f"  seq {T}: {tps} tokens/s, pinned {pin}"); bad = 1
    print(f"  Table 2, seq {T} cp {cp}: predicted {tps:.0f} tokens/s per GPU, TorchTitan "
          f"measured {tt} ({100 * (tps / tt - 1):+.0f}%)")
sys.exit(bad)
PY
check "Table 2 rows: a cp rank's attention FLOPs, K/V bytes and tokens/s as computed here" $?
# Calibrated on TorchTitan's Table 1 (same benchmark file: 8B on 8 H100s, seq 8192, local batch
# 2, selective AC, compile): plan.compute_efficiency 0.44 reproduces its bf16 row (6,667) and
# plan.fp8_peak_tflops 1630 its Float8 row (8,532), each within 1%; with them the held-out
# Table 2 row at 32k (3,890) is predicted within 15% (README, "Calibrated on TorchTitan's
# Table 1").
CAL="--plan.compute_efficiency=0.44 --plan.attention_efficiency=0.30 --comm.bandwidth_gbps=2880
     --comm.latency_us=10 --parallelism.tp_bandwidth_gbps=2880"
tps() { grep -o 'throughput *[0-9]*' "$1" | grep -o '[0-9]*$'; }
within() { /usr/bin/python3 -c "import sys; a, b, r = map(float, sys.argv[1:]); sys.exit(abs(a / b - 1) > r)" "$@"; }
# shellcheck disable=SC2086
"$CTITAN" plan "$ROOT/configs/8b.toml" --world-size 8 $CAL --training.seq_len=8192 \
  --training.local_batch_size=2 --activation_checkpoint.mode=selective > "$tmp/t1_bf16.txt" 2>&1
# shellcheck disable=SC2086
"$CTITAN" plan "$ROOT/configs/8b.toml" --world-size 8 $CAL --training.seq_len=8192 \
  --training.local_batch_size=2 --activation_checkpoint.mode=selective \
  --model.converters=float8 --plan.fp8_peak_tflops=1630 > "$tmp/t1_fp8.txt" 2>&1
# shellcheck disable=SC2086
"$CTITAN" plan "$ROOT/configs/8b.toml" --world-size 8 $CAL --training.seq_len=32768 \
  --activation_checkpoint.mode=full --model.converters=float8 --plan.fp8_peak_tflops=1630 \
  > "$tmp/t2_cal.txt" 2>&1
a=$(tps "$tmp/t1_bf16.txt") b=$(tps "$tmp/t1_fp8.txt") c=$(tps "$tmp/t2_cal.txt")
echo "  Table 1 calibration: bf16 $a (measured 6667), Float8 $b (8532); Table 2 32k: $c (3890)"
within "${a:-0}" 6667 0.01 && within "${b:-0}" 8532 0.01 && within "${c:-0}" 3890 0.15
check "Table 1 calibration reproduces its rows, and Table 2's 32k row within 15%" $?
# Hyena (its family's cost model, model/hyena/hyena_cost.c): the plan runs and prints the step
# time and memory; the activation bytes it plans for one model equal what a 1-rank training
# run of the same shapes allocates (metrics.jsonl's memory_activations_bytes), every mode.
"$CTITAN" plan "$ROOT/configs/hyena-small.toml" --world-size 8 $H100 > "$tmp/hy.txt" 2>&1 &&
  grep -q "predicted step time  *[0-9.]* s" "$tmp/hy.txt" &&
  grep -q "memory per rank  *[0-9.]* GiB peak" "$tmp/hy.txt"
check "hyena-small on 8 ranks: a plan with step time and memory" $?
HY=(--model.name=hyena --model.flavor=hyena-debug --training.seq_len=64
    --training.local_batch_size=2 --training.global_batch_size=2 --metrics.peak_tflops=1
    --comm.bandwidth_gbps=100)
for ac in none ffn selective full selective:2; do
  acs=(--activation_checkpoint.mode="${ac%%:*}")
  [ "$ac" != "${ac#*:}" ] && acs+=(--activation_checkpoint.selective_ac_option="${ac#*:}")
  "$CTITAN" plan "$ROOT/configs/debug.toml" --world-size 1 "${HY[@]}" "${acs[@]}" \
    > "$tmp/hyp.txt" 2>&1
  planned=$(sed -n "s/.*activations of one micro-batch's model \([0-9]*\) bytes.*/\1/p" "$tmp/hyp.txt")
  "$CTITAN" train "$ROOT/configs/debug.toml" "${HY[@]}" "${acs[@]}" --training.steps=1 \
    --job.dump_folder="$tmp/hy_$ac" > "$tmp/hyt.log" 2>&1
  built=$(metric "$tmp/hy_$ac/metrics.jsonl" 1 1 memory_activations_bytes 2>/dev/null)
  [ -n "$planned" ] && [ "$planned" = "${built%.0}" ]
  check "hyena-debug, activation checkpointing $ac: planned activations $planned bytes = the trained model's ${built:-?}" $?
done
# deepseek_v3 (the MoE family's cost model, model/moe/moe_cost.c): moe-debug, 16B and 671B
# plan (exit 0); the model FLOPs per token are 6 x the active parameters (top_k routed +
# shared experts, the router, attention; not all E) less the embedding, + 12 L C T, computed
# here from the presets' shapes; under expert parallelism each MoE layer's forward sends
# N top_k (ep - 1) / ep rows of C bf16 elements twice (dispatch, combine) + the counts, at
# latency + bytes / link each, and a MoE block gathers only its E / ep experts; the
# activation bytes planned for one model equal a 1-rank training run's.
"$CTITAN" plan "$ROOT/configs/moe-debug.toml" --world-size 8 $H100 > "$tmp/moe.txt" 2>&1 &&
  grep -q "predicted step time  *[0-9.]* s" "$tmp/moe.txt" &&
  grep -q "memory per rank  *[0-9.]* GiB peak" "$tmp/moe.txt"
check "moe-debug on 8 ranks: a plan with step time and memory" $?
MOEBIG=(--training.local_batch_size=1 --training.seq_len=4096
        --training.mixed_precision_param=bfloat16)
"$CTITAN" plan "$ROOT/configs/moe-debug.toml" --model.flavor=deepseek_v3-16B --world-size 64 \
  --parallelism.expert_parallel_degree=8 "${MOEBIG[@]}" $H100 > "$tmp/m16.txt" 2>&1
check "deepseek_v3-16B on 64 ranks, ep 8: exit 0" $?
"$CTITAN" plan "$ROOT/configs/moe-debug.toml" --model.flavor=deepseek_v3-671B --world-size 256 \
  --parallelism.expert_parallel_degree=64 "${MOEBIG[@]}" $H100 > "$tmp/m671.txt" 2>&1
check "deepseek_v3-671B on 256 ranks, ep 64: exit 0" $?
/usr/bin/python3 - "$tmp/m16.txt" "$tmp/m671.txt" <<'PY'
import re, sys
# (vocab, dim, layers, heads, kv heads, dense ffn, expert ffn, dense layers, experts, shared,
#  top_k, ep): the presets (src/model/moe/moe.c) and the ep of the plans above
shapes = [(102400, 2048, 27, 16, 16, 10944, 1408, 1, 64, 2, 6, 8),
          (129280, 7168, 61, 128, 128, 18432, 2048, 3, 256, 1, 8, 64)]
T, bad = 4096, 0
for path, (V, C, L, H, KV, F, Fm, Ld, E, S, K, ep) in zip(sys.argv[1:], shapes):
    t = open(path).read()
    D = C // H
    attn = 2 * C * H * D + 2 * C * KV * D + 2 * C
    active = L * attn + Ld * 3 * C * F + (L - Ld) * (3 * C * Fm * (K + S) + E * C) + 2 * V * C + C
    want = 6 * (active - V * C) + 12 * L * C * T
    got = float(re.search(r"model FLOPs ([0-9.e+]+) per token", t).group(1))
    layer = 2 * T * K * (ep - 1) / ep * C * 2 / 2**20  # dispatch + combine, bf16, MiB
    a2a = float(re.search(r"([0-9.]+) MiB sent per MoE layer", t).group(1))
    tps = float(re.search(r"throughput +([0-9.]+) tokens/s", t).group(1))
    mem = float(re.search(r"memory per rank +([0-9.]+) GiB", t).group(1))
    # on the wire: n x latency (30 us) + bytes / 400 Gbit/s; the posted dispatches partly
    # hidden by the shared experts' compute (exposed less than on the wire, more than none)
    n, sent, secs, exposed = re.search(
        r"; (\d+) per step, ([0-9.]+) MiB sent, ([0-9.]+) s on the wire, ([0-9.]+) s exposed",
        t).groups()
    a2a_s = int(n) * 30e-6 + float(sent) * 2**20 / 50e9
    ok_hidden = 0 < float(exposed) < float(secs)
    # a MoE block's bucket gathers its E / ep experts only (bf16 MiB, the 3rd bucket)
    blk = (2 * C * H * D + 2 * C * KV * D + 2 * C + E * C + 3 * C * Fm * (E // ep + S)) * 2 / 2**20
    bucket = float(re.findall(r"([0-9.]+) MiB", t.split("bucket sizes")[1])[Ld + 1])
    ok = abs(got / want - 1) < 0.006 and abs(a2a - layer) < 0.01 and tps > 0 and mem > 0
    ok = ok and abs(float(secs) - a2a_s) < 0.0015 and abs(bucket - blk) < 1 and ok_hidden
    print(f"  {path.rsplit('/', 1)[1]}: {active / 1e9:.1f}B active parameters, "
          f"{got:.3g} FLOPs/token (6 N_active form {want:.4g}), all-to-all {a2a:.2f} MiB "
          f"per MoE layer forward (balanced {layer:.2f}), {secs} s of them per step "
          f"({a2a_s:.3f}) on the wire, {exposed} s exposed, a MoE block's bucket {bucket:.0f} MiB ({blk:.0f} with its E/ep "
          f"experts), {tps:.0f} tokens/s per rank, {mem:.1f} GiB per rank"
          f"{'' if ok else '  <- wrong'}")
    bad |= not ok
sys.exit(bad)
PY
check "MoE plans: FLOPs per token over the active parameters, all-to-all bytes and time, a block's gathered experts" $?
MO=(--training.dataset=synthetic --model.tokenizer_path= --model.vocab_size=509
    --training.seq_len=32 --training.local_batch_size=2 --training.global_batch_size=2
    --metrics.peak_tflops=1 --comm.bandwidth_gbps=100)
"$CTITAN" plan "$ROOT/configs/moe-debug.toml" --world-size 1 "${MO[@]}" > "$tmp/mop.txt" 2>&1
planned=$(sed -n "s/.*activations of one micro-batch's model \([0-9]*\) bytes.*/\1/p" "$tmp/mop.txt")
"$CTITAN" train "$ROOT/configs/moe-debug.toml" "${MO[@]}" --training.steps=1 \
  --job.dump_folder="$tmp/mo_run" > "$tmp/mot.log" 2>&1
built=$(metric "$tmp/mo_run/metrics.jsonl" 1 1 memory_activations_bytes 2>/dev/null)
[ -n "$planned" ] && [ "$planned" = "${built%.0}" ]
check "moe-debug: planned activations $planned bytes = the trained model's ${built:-?}" $?
# no wall-clock check (a loaded machine fails it; timings belong to bench/): the time is shown
echo "  (plans so far took $(( $(date +%s) - start )) s)"
"$CTITAN" plan "$ROOT/configs/8b.toml" > /dev/null 2>&1; [ $? -eq 2 ]; check "no --world-size: exit 2" $?
"$CTITAN" plan --world-size 8 > /dev/null 2>&1; [ $? -eq 2 ]; check "no config: exit 2" $?
"$CTITAN" plan "$ROOT/configs/8b.toml" --world-size x > /dev/null 2>&1; [ $? -eq 2 ]; check "bad --world-size: exit 2" $?
"$CTITAN" plan "$ROOT/configs/8b.toml" --world-size 100 --parallelism.data_parallel_replicate_degree=3 > /dev/null 2>&1
[ $? -eq 2 ]; check "world not replicate x shard: exit 2" $?
"$CTITAN" plan "$ROOT/configs/debug.toml" --world-size 8 > /dev/null 2> "$tmp/err"
[ $? -eq 2 ] && grep -q "peak_tflops" "$tmp/err"; check "no target figures: named, exit 2" $?
"$CTITAN" plan "$ROOT/configs/8b.toml" --world-size 8 --comm.nope=1 > /dev/null 2>&1; [ $? -eq 2 ]; check "unknown key: exit 2" $?
"$CTITAN" plan --help | grep -q "world-size"; check "--help" $?
finish
