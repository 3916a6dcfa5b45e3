#!/usr/bin/env bash
# Context parallelism through `ctitan train` (filled in below)
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
finish
