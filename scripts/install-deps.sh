#!/usr/bin/env bash
# Installs the Debian packages ctitan needs. Idempotent: when every package is already present
# it does nothing (no network needed).
#   scripts/install-deps.sh           what building and running need (make build, make run)
#   scripts/install-deps.sh --test    that plus what the tests and benchmarks need (make test,
#                                     make asan, make tsan, make bench)
#   scripts/install-deps.sh --list [--test]   print the set's package names, install nothing
set -euo pipefail

# Build and run: the compiler and build tools, every library the binary links, the default
# corpus and the plotting tool `make run` uses.
RUN_PKGS=(
  build-essential cmake pkg-config
  libopenblas-openmp-dev     # sgemm (OpenMP build: one thread pool with our kernels)
  libdnnl-dev                # oneDNN matmul primitives (AMX / AVX512-BF16 / AVX-512 / AVX2)
  libopenmpi-dev openmpi-bin # MPI
  libcjson-dev               # JSON (metrics, manifests, JSON-lines corpora)
  libxxhash-dev              # checkpoint checksums
  libpcre2-dev               # tokenizer pre-split regex
  libfftw3-dev               # FFT long convolutions (Hyena, flash inference)
  zlib1g-dev                 # ctitan prepare reads .gz corpora
  libzstd-dev                # ctitan prepare reads .zst corpora
  libisal-dev                # ISA-L: CRC32C of TensorBoard event records
  bible-kjv                  # the default corpus (make run): 4.3 MB of English prose
  gnuplot-nox                # `ctitan plot` draws PNG charts with it
)
# Tests and benchmarks only; the product never needs them.
TEST_PKGS=(
  clang libclang-rt-14-dev    # libFuzzer harnesses (tests/fuzz): clang and its fuzzer runtime
  python3-torch python3-numpy # independent reference for tests and benchmarks
  nodejs npm                  # tokenizer_parity / bench_tokenizer: tiktoken and llama3-tokenizer-js
  zstd                        # the prepare test compresses its JSON-lines corpus with it
  iproute2                    # multi-host and fault tests: hosts as network namespaces (ip netns)
  protobuf-compiler           # tensorboard test: `protoc --decode_raw` reads our event files back
)

test=0 list=0
for a in "$@"; do
  case "$a" in
  --test) test=1 ;;
  --list) list=1 ;;
  *) echo "usage: scripts/install-deps.sh [--test] [--list]" >&2; exit 2 ;;
  esac
done
PKGS=("${RUN_PKGS[@]}")
if [ "$test" -eq 1 ]; then PKGS+=("${TEST_PKGS[@]}"); fi
if [ "$list" -eq 1 ]; then
  printf '%s\n' "${PKGS[@]}"
  exit 0
fi

# A package counts as present when it is installed or an installed package provides it (a
# nodejs build that bundles npm provides and conflicts with Debian's npm).
installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed" && return 0
  dpkg-query -W -f='${db:Status-Abbrev} ${Provides}\n' 2>/dev/null |
    awk -v p="$1" '$1 == "ii" { for (i = 2; i <= NF; i++) { sub(/,$/, "", $i); if ($i == p) f = 1 } }
                   END { exit !f }'
}
missing=()
for p in "${PKGS[@]}"; do
  if ! installed "$p"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends "${missing[@]}"
