#!/usr/bin/env bash
# Builds every libFuzzer harness with clang (ASan + UBSan) and runs each briefly from an empty
# corpus: a crash, a leak or a failed check fails the test. Long campaigns use the same binaries
# with a larger -max_total_time (see the comment at the top of each harness).
#   tests/fuzz/smoke.sh BUILD_DIR [SECONDS]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:?build dir}/fuzz
SECS=${2:-10}
mkdir -p "$OUT"
# The harnesses need clang and its libFuzzer runtime, test-only packages (make test installs
# them): without them the test is skipped (exit 77), never passed.
probe='int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return (int)(d && n) * 0; }'
if ! command -v clang > /dev/null ||
  ! echo "$probe" | clang -fsanitize=fuzzer -x c - -o "$OUT/probe" > "$OUT/probe.log" 2>&1; then
  echo "skipped: clang with its libFuzzer runtime is missing (scripts/install-deps.sh --test" \
    "installs clang and libclang-rt-14-dev)"
  exit 77
fi
CC="clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Wno-unknown-pragmas -I$ROOT/src"
build() { # name sources... -- libs...
  local name=$1
  shift
  $CC "$@" -o "$OUT/$name"
}
cd "$ROOT"
build fuzz_config tests/fuzz/fuzz_config.c src/io/config.c src/io/config_schema.c src/io/config_toml.c \
  src/io/config_print.c src/io/config_keys.c src/base/log.c -lm
build fuzz_shards tests/fuzz/fuzz_shards.c src/data/shards.c src/data/loader.c src/base/log.c \
  src/base/mem.c src/base/mem_timeline.c src/base/rng.c -lcjson -lm -lpthread
build fuzz_tokenizer tests/fuzz/fuzz_tokenizer.c src/data/tokenizer.c src/data/tokenizer_files.c \
  src/data/tokenizer_train.c src/base/log.c -lpcre2-8 \
  -lcjson -lm
build fuzz_checkpoint tests/fuzz/fuzz_checkpoint.c src/train/ckpt_manifest.c src/io/safetensors.c src/io/file.c \
  src/base/log.c -lcjson -lxxhash -lm
pass=0
fail=0
for h in fuzz_config fuzz_shards fuzz_tokenizer fuzz_checkpoint; do
  corpus="$OUT/${h}_corpus"
  mkdir -p "$corpus"
  seeds="$ROOT/tests/fuzz/seeds/${h#fuzz_}"
  if [ -d "$seeds" ]; then cp "$seeds"/* "$corpus"/; fi
  if "$OUT/$h" -max_total_time="$SECS" -close_fd_mask=2 "$corpus" > "$OUT/$h.log" 2>&1; then
    runs=$(grep -oE 'Done [0-9]+ runs' "$OUT/$h.log" || echo "? runs")
    echo "[ ok ] $h: $runs in ${SECS}s"
    pass=$((pass + 1))
  else
    echo "[FAIL] $h (log: $OUT/$h.log)"
    tail -30 "$OUT/$h.log"
    fail=$((fail + 1))
  fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
