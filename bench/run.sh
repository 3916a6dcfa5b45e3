#!/usr/bin/env bash
# `make bench`: every benchmark, each printing ratios against a baseline measured in the same run.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
/usr/bin/python3 bench/bench_train.py --ctitan "$BUILD/ctitan"
