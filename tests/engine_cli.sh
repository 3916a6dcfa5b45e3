#!/usr/bin/env bash
# The matmul engine from the command line: a bad engine name exits 2 naming the key; each
# engine trains in fp32 and bf16 and says what it ran on; the OpenBLAS CPU-table guard
# re-executes (same process, also under mpiexec) when OpenBLAS picked a generic kernel.
# Usage: tests/engine_cli.sh path/to/ctitan
set -u
CT=${1:?ctitan binary}
. "$(dirname "$0")/lib.sh"
SRC=$(cd "$(dirname "$0")/.." && pwd)
unset CT_MATMUL_ENGINE # this test chooses the engine with --compute.matmul_engine
TINY=(--model.name=llama3 --model.flavor=debugmodel --training.steps=2 --training.seq_len=32
      --training.local_batch_size=2 --metrics.enable_jsonl=false)

out=$("$CT" train "$SRC/configs/debug.toml" "${TINY[@]}" --compute.matmul_engine=mkl 2>&1)
rc=$?
echo "$out" | tail -2
[ $rc -eq 2 ] && echo "$out" | grep -q "compute.matmul_engine"
check "unknown engine exits 2 naming compute.matmul_engine" $?

for eng in onednn openblas auto; do
  for dt in float32 bfloat16; do
    out=$("$CT" train "$SRC/configs/debug.toml" "${TINY[@]}" --job.dump_folder="$tmp/$eng" \
      --compute.matmul_engine=$eng --training.mixed_precision_param=$dt 2>&1)
    rc=$?
    want=fp32; [ $dt = bfloat16 ] && want=bf16
    [ $rc -eq 0 ] && echo "$out" | grep -q "matmul engine $eng, compute $want" &&
      echo "$out" | grep -q "peak .* GFLOP/s per rank (theoretical, $want"
    check "train with $eng $dt" $?
  done
done

# The guard: pretend OpenBLAS picked Prescott; on a CPU with AVX2 the process restarts itself
# with OPENBLAS_CORETYPE set, and OpenBLAS then reports that kernel.
if grep -qw avx2 /proc/cpuinfo; then
  out=$(env -u OPENBLAS_CORETYPE CT_OPENBLAS_GUARD_ASSUME=Prescott OPENBLAS_VERBOSE=2 \
    "$CT" --help 2>&1)
  want=$(echo "$out" | sed -n 's/.*restarting with OPENBLAS_CORETYPE=\([A-Za-z]*\).*/\1/p')
  echo "guard chose: ${want:-nothing}"
  [ -n "$want" ] && echo "$out" | grep -q "^Core: $want"
  check "guard re-executes with a kernel for this CPU" $?
  out=$(env -u OPENBLAS_CORETYPE CT_OPENBLAS_GUARD_ASSUME=Prescott mpiexec -n 2 "$CT" train \
    "$SRC/configs/debug.toml" "${TINY[@]}" --job.dump_folder="$tmp/mpi" 2>&1)
  rc=$?
  n=$(echo "$out" | grep -c "restarting with OPENBLAS_CORETYPE")
  echo "$out" | tail -1
  [ $rc -eq 0 ] && [ "$n" -eq 2 ] && echo "$out" | grep -q "training done"
  check "guard under mpiexec: both ranks restart, the job trains" $?
fi
out=$(OPENBLAS_CORETYPE=Prescott CT_OPENBLAS_GUARD_ASSUME=Prescott "$CT" --help 2>&1)
! echo "$out" | grep -q restarting
check "a user-set OPENBLAS_CORETYPE is respected" $?
finish
