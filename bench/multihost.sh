#!/usr/bin/env bash
# Multi-host bench (issue 16): all-gather / reduce-scatter bus bandwidth and the 125M FSDP step
# on 4 ranks, one host (shared memory) vs two network-namespace hosts x 2 ranks (TCP over a
# veth pair and a bridge). Root only (network namespaces). Prints tables and ratios.
#   bench/multihost.sh [BUILD_DIR]           (PARTS=bw or PARTS=step: one part; STEPS=N for
#                                            the 125M runs, default 4, step 1 left out)
set -u
build=$(readlink -f "${1:-build}")
src=$(cd "$(dirname "$0")/.." && pwd)
hosts=$src/scripts/netns-hosts
p=ctbm$$
tmp=$(mktemp -d)
trap '"$hosts" down "$p"; rm -rf "$tmp"' EXIT
"$hosts" up "$p" 2 || exit 1
printf "10.77.0.1 slots=2\n10.77.0.2 slots=2\n" > "$tmp/hostfile"
unset OMPI_MCA_btl
export OMPI_MCA_plm_rsh_agent="$hosts agent"
on_host0() { ip netns exec "$p-h0" unshare --uts /bin/sh -c "hostname $p-h0; exec \"\$@\"" sh "$@"; }
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'); load: $(uptime | sed 's/.*load average: //')"
PARTS=${PARTS:-bw,step}
if [ "${PARTS#*bw}" != "$PARTS" ]; then
echo "== bus bandwidth, 1 host x 4 ranks (shared memory)"
OMPI_MCA_btl=self,vader OMP_NUM_THREADS=1 on_host0 "$src/scripts/launch" 4 "$build/bench/bench_comm" 64
echo "== bus bandwidth, 2 hosts x 2 ranks (TCP between hosts)"
OMP_NUM_THREADS=1 on_host0 "$src/scripts/launch" --hostfile "$tmp/hostfile" --net 10.77.0.0/24 4 \
  "$build/bench/bench_comm" 64
fi
[ "${PARTS#*step}" != "$PARTS" ] || exit 0
TRAIN=(train "$src/configs/125m.toml" --training.steps=${STEPS:-4} --training.local_batch_size=1
  --training.seq_len=256 --metrics.log_freq=1)
step_time() { /usr/bin/python3 -c "
import json,sys
r=[json.loads(l) for l in open(sys.argv[1])][1:]
print('%.2f s/step, %.0f tok/s/rank' % (sum(x['step_s'] for x in r)/len(r), sum(x['tps'] for x in r)/len(r)))" "$1"; }
echo "== 125M FSDP step, 4 ranks (steps 2-${STEPS:-4} averaged)"
OMPI_MCA_btl=self,vader on_host0 "$src/scripts/launch" 4 "$build/ctitan" "${TRAIN[@]}" \
  --job.dump_folder="$tmp/one" > "$tmp/one.log" 2>&1 && echo "1 host x 4 (shared memory): $(step_time "$tmp/one/metrics.jsonl")"
on_host0 "$src/scripts/launch" --hostfile "$tmp/hostfile" --net 10.77.0.0/24 4 "$build/ctitan" \
  "${TRAIN[@]}" --job.dump_folder="$tmp/two" > "$tmp/two.log" 2>&1 &&
  echo "2 hosts x 2 (TCP):          $(step_time "$tmp/two/metrics.jsonl")"
echo "load after: $(uptime | sed 's/.*load average: //')"
