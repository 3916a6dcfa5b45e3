#!/usr/bin/env bash
# `make bench`: every benchmark, each printing ratios against a baseline measured in the same run.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
echo "== training throughput and memory: ctitan vs PyTorch (1 process) =="
/usr/bin/python3 bench/bench_train.py --ctitan "$BUILD/ctitan"
echo "== FSDP: 125M on 1, 2, 4 ranks vs PyTorch ZeRO on 2 ranks =="
/usr/bin/python3 bench/bench_fsdp.py --ctitan "$BUILD/ctitan"
echo "== tokenizer: encode vs tiktoken (npm), training vs spm_train =="
/usr/bin/python3 bench/bench_tokenizer.py --ctitan "$BUILD/ctitan"
echo "== checkpoints: async vs synchronous save stall, 125M =="
/usr/bin/python3 bench/bench_checkpoint.py --ctitan "$BUILD/ctitan"
echo "== checkpoints: 24 SIGKILL trials during saves =="
bash tests/checkpoint_kill.sh "$BUILD/ctitan" 24
echo "== overlap: 125M on 2 ranks over a simulated 10 Gb/s link, four schedules =="
/usr/bin/python3 bench/bench_overlap.py --ctitan "$BUILD/ctitan"
echo "== Hyena generation: flash vs lazy / eager / mixer-only recompute, L = 2^10..2^17 =="
OMP_NUM_THREADS=${FLASH_THREADS:-1} "$BUILD/bench/flash_inference"
