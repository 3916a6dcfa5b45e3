#!/usr/bin/env bash
# Installs the Debian packages ctitan needs to build, run and test. Idempotent: when every
# package is already present it does nothing (no network needed).
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config clang
  libopenblas-openmp-dev     # sgemm (OpenMP build: one thread pool with our kernels)
  libdnnl-dev                # oneDNN matmul primitives (AMX / AVX512-BF16 / AVX-512 / AVX2)
  libopenmpi-dev openmpi-bin # MPI
  libcjson-dev               # JSON (metrics, manifests)
  libxxhash-dev              # checkpoint checksums
  libpcre2-dev               # tokenizer pre-split regex
  libfftw3-dev               # FFT long convolutions (Hyena, flash inference)
  libisal-dev                # ISA-L: CRC32C of TensorBoard event records
  bible-kjv                  # the default corpus (make run): 4.3 MB of English prose
  gnuplot-nox                # `ctitan plot` draws PNG charts with it
  libclang-rt-14-dev         # libFuzzer runtime for the fuzz harnesses (tests)
  python3-torch python3-numpy # independent reference for tests and benchmarks
  protobuf-compiler          # tests only: `protoc --decode_raw` reads our TensorBoard events
  nodejs npm                 # tokenizer_parity / bench_tokenizer: tiktoken and llama3-tokenizer-js
)

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
