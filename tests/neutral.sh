#!/usr/bin/env bash
# Options that must not change a result bit, each against its neutral value, fp32:
#  1. activation checkpointing: every mode (ffn, selective, full) equals mode "none" on
#     1 rank, FSDP (dp_shard 2), TP 2, PP 2 (1F1B) and PP 2 x TP 2: loss and grad_norm of
#     steps 1-3 and every parameter after step 3 within 1e-9 (relative; recomputation runs
#     the same kernels on the same inputs, so any real difference is far larger: the bug of
#     issue 31 moved the step-2 loss by 1e-3);
#  2. on one rank, every schedule option against its neutral value: buckets (per_block,
#     groups, auto), prefetch, reduce-scatter defer, comm progress inline, reshard after
#     forward (always, never), async checkpointing.
# Parameters come from each run's step-3 checkpoint, exported to one safetensors file
# (ctitan export: every rank's shard, resharded), so every rank's part of the state counts.
#   tests/neutral.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
LAUNCH="$ROOT/scripts/launch"
PY=/usr/bin/python3
SEED=${CT_SEED:-$(( $(date +%s) % 100000 ))}
echo "seed $SEED (CT_SEED=$SEED reproduces this run)"
COMMON=(--training.dataset=synthetic --training.seq_len=64 --training.local_batch_size=2
        --training.global_batch_size=4 --training.steps=3 --lr_scheduler.warmup_steps=1
        --training.mixed_precision_param=float32 --metrics.peak_tflops=0.1
        --debug.seed="$SEED" --checkpoint.enable=true --checkpoint.interval=3
        --checkpoint.async_mode=disabled)
train() { # RANKS NAME args...: run, then export its step-3 checkpoint
  local n=$1 d="$tmp/$2"
  shift 2
  "$LAUNCH" "$n" "$CTITAN" train "$ROOT/configs/debug.toml" "${COMMON[@]}" \
    --job.dump_folder="$d" "$@" > "$d.log" 2>&1 &&
    "$CTITAN" export "$d/checkpoint/step-00000003" "$d/hf" >> "$d.log" 2>&1
}
# same A B: steps 1-3 of loss and grad_norm, and every exported tensor, within 1e-9
same() {
  $PY - "$tmp/$1" "$tmp/$2" <<'PY'
import json, struct, sys
import numpy as np
def metrics(d):
    steps = {}
    for line in open(d + "/metrics.jsonl"):
        r = json.loads(line)
        steps.setdefault(r["step"], {}).update(r)
    return [(steps[s]["loss"], steps[s]["grad_norm"]) for s in (1, 2, 3)]
def tensors(d):
    raw = open(d + "/hf/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(raw, dtype="<f4", count=(b - a) // 4,
                               offset=8 + n + a).astype(np.float64)
    return out
a, b = sys.argv[1], sys.argv[2]
try:
    ma, mb = metrics(a), metrics(b)
    ta, tb = tensors(a), tensors(b)
except (OSError, KeyError, ValueError) as e:
    sys.exit(f"cannot read a run: {type(e).__name__} {e}")
worst = max(abs(x - y) / max(abs(y), 1e-30) for p, q in zip(ma, mb) for x, y in zip(p, q))
ok = worst <= 1e-9 and sorted(ta) == sorted(tb) and len(ta) > 0
pw, pn = 0.0, ""
for k in tb:
    scale = max(float(np.abs(tb[k]).max(initial=0.0)), 1e-30)
    ok_shape = k in ta and ta[k].shape == tb[k].shape
    d = float(np.abs(ta[k] - tb[k]).max(initial=0.0)) / scale if ok_shape else 1.0
    if d > pw:
        pw, pn = d, k
ok = ok and pw <= 1e-9
print(f"  loss/grad_norm max rel diff {worst:.3g}; parameters max diff {pw:.3g} of the tensor's max ({pn or '-'})")
sys.exit(0 if ok else 1)
PY
}

# 1. activation checkpointing on every layout
for layout in "1 one" "2 fsdp2" "2 tp2" "2 pp2" "4 pp2tp2"; do
  set -- $layout
  n=$1 name=$2
  extra=()
  case $name in
    tp2) extra=(--parallelism.tensor_parallel_degree=2) ;;
    pp2) extra=(--parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule=1F1B) ;;
    pp2tp2) extra=(--parallelism.pipeline_parallel_degree=2 --parallelism.tensor_parallel_degree=2) ;;
  esac
  train "$n" "${name}_none" "${extra[@]}" --activation_checkpoint.mode=none
  check "$name, mode none runs and exports" $?
  # layer2: TorchTitan's per-layer option, full checkpointing on blocks 2, 4, ... only (one
  # rank and across pipeline stages here; tests/compose.py pairs it with every layout)
  modes="ffn selective full"
  case $name in one|pp2) modes="$modes layer2" ;; esac
  for mode in $modes; do
    ac=(--activation_checkpoint.mode=$mode)
    [ $mode = layer2 ] && ac=(--activation_checkpoint.mode=selective --activation_checkpoint.selective_ac_option=2)
    train "$n" "${name}_$mode" "${extra[@]}" "${ac[@]}"
    rc=$?
    [ $rc -eq 0 ] && same "${name}_$mode" "${name}_none"
    check "$name: ${ac[*]#--activation_checkpoint.} equals none (loss, grad_norm, parameters)" $?
  done
done

# 2. one rank: schedule options against their neutral values (the "one" runs above)
for opt in "buckets_per_block --comm.buckets=per_block" "buckets_groups --comm.buckets=embed+0+1,2+3+4,5+norm" \
           "buckets_auto --comm.buckets=auto" "prefetch --comm.prefetch=1" \
           "rs_defer --comm.reduce_scatter_defer=0" "thread --comm.progress=thread" \
           "reshard_always --parallelism.fsdp_reshard_after_forward=always" \
           "reshard_never --parallelism.fsdp_reshard_after_forward=never" \
           "async_ckpt --checkpoint.async_mode=async" \
           "selective_prefetch_buckets --activation_checkpoint.mode=selective --comm.buckets=per_block --comm.prefetch=1"; do
  set -- $opt
  name=$1
  shift
  train 1 "opt_$name" "$@"
  rc=$?
  [ $rc -eq 0 ] && same "opt_$name" one_none
  check "one rank: $* equals the neutral run" $?
done
finish
