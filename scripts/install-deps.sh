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
  bible-kjv                  # the default corpus (make run): 4.3 MB of English prose
  gnuplot-nox                # `ctitan plot` draws PNG charts with it
  libclang-rt-14-dev         # libFuzzer runtime for the fuzz harnesses (tests)
  python3-torch python3-numpy # independent reference for tests and benchmarks
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
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
