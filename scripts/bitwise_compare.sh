#!/usr/bin/env bash
# Compare two ctitan binaries' training results bit for bit, layout by layout (a refactor
# must change no result bit): each layout trains the debug model 4 steps on synthetic data
# with one matmul engine (auto's choice is timed, so it may differ between processes), and
# the loss and grad_norm of every step must be identical.
#   scripts/bitwise_compare.sh OLD_CTITAN NEW_CTITAN
set -u
old=$1 new=$2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export CT_MATMUL_ENGINE=${CT_MATMUL_ENGINE:-onednn}
COMMON=(--training.dataset=synthetic --training.steps=4 --training.seq_len=64
        --training.local_batch_size=2 --training.global_batch_size=8 --metrics.peak_tflops=0.1)
fail=0
while read -r name n cfg args; do
  [ -n "$name" ] || continue
  [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $name "* ]] || continue
  for which in old new; do
    bin=$old; [ $which = new ] && bin=$new
    # shellcheck disable=SC2086
    "$ROOT/scripts/launch" "$n" "$bin" train "$ROOT/configs/$cfg" "${COMMON[@]}" $args \
      --job.dump_folder="$tmp/$name-$which" < /dev/null > "$tmp/$name-$which.log" 2>&1 ||
      { echo "$name: $which run failed (tail of its log below)"; tail -3 "$tmp/$name-$which.log"; }
    /usr/bin/python3 -c "
import json,sys
for l in open(sys.argv[1]):
    r=json.loads(l); print(r['step'], repr(r['loss']), repr(r['grad_norm']))" \
      "$tmp/$name-$which/metrics.jsonl" > "$tmp/$name-$which.txt" 2>/dev/null
  done
  if [ -s "$tmp/$name-old.txt" ] && cmp -s "$tmp/$name-old.txt" "$tmp/$name-new.txt"; then
    echo "same   $name ($n ranks): $(tail -1 "$tmp/$name-new.txt")"
  else
    echo "DIFFER $name ($n ranks)"; diff "$tmp/$name-old.txt" "$tmp/$name-new.txt" | head -4
    fail=1
  fi
done <<'LAYOUTS'
one 1 debug.toml
one_accum 1 debug.toml --training.local_batch_size=1
one_bf16 1 debug.toml --training.mixed_precision_param=bfloat16
fsdp2 2 debug.toml
fsdp2_prefetch 2 debug.toml --comm.progress=thread --comm.buckets=per_block --comm.prefetch=1
hsdp4 4 debug.toml --parallelism.data_parallel_replicate_degree=2
tp2 2 debug.toml --parallelism.tensor_parallel_degree=2
tp2_async 2 debug.toml --parallelism.tensor_parallel_degree=2 --parallelism.enable_async_tensor_parallel=true --comm.progress=thread
tp2_fsdp2 4 debug.toml --parallelism.tensor_parallel_degree=2
pp2_1f1b 2 debug.toml --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule=1F1B
pp2_interleaved 2 debug.toml --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule=Interleaved1F1B
pp2_zbh1 2 debug.toml --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule=ZeroBubbleH1
pp2_tp2 4 debug.toml --parallelism.pipeline_parallel_degree=2 --parallelism.tensor_parallel_degree=2
hyena1 1 hyena-small.toml --training.seq_len=128 --validation.enable=false --model.tokenizer_path=
hyena_fsdp2 2 hyena-small.toml --training.seq_len=128 --validation.enable=false --model.tokenizer_path=
LAYOUTS
exit $fail
