#!/usr/bin/env bash
# Expert parallelism's dispatch posted beside the shared expert: moe-debug on 2 ranks, ep 2,
# comm.progress = thread, a simulated link (GBPS, default 1 Gbit/s, 50 us), tokens/s per rank
# (median of steps 3-10) and exposed communication, for each checkout given (e.g. this one
# and a worktree of the commit before the EP schedule nodes, whose exchanges block), ROUNDS
# (3) rounds alternating; CT_MATMUL_ENGINE onednn unless set (auto's choices move between
# runs). CPU and engine: the runs' own start-up lines.
#   bench/ep_overlap.sh CHECKOUT...   (each with its build/ctitan)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export $(grep -E '^[A-Za-z_]+=' "$ROOT/scripts/ompi.env" | xargs) CT_MATMUL_ENGINE=${CT_MATMUL_ENGINE:-onednn}
GBPS=${GBPS:-1}
[ $# -gt 0 ] || set -- "$ROOT"
grep -m1 'model name' /proc/cpuinfo
for round in $(seq ${ROUNDS:-3}); do
for b in "$@"; do
  d=$(mktemp -d /tmp/epb.XXXX)
  "$b/scripts/launch" 2 "$b/build/ctitan" train "$b/configs/moe-debug.toml" \
    --training.dataset=synthetic --model.tokenizer_path= --model.vocab_size=2048 \
    --training.steps=10 --parallelism.data_parallel_shard_degree=2 \
    --parallelism.expert_parallel_degree=2 --comm.progress=thread \
    --comm.simulate_bandwidth_gbps=$GBPS --comm.simulate_latency_us=50 \
    --metrics.peak_tflops=0.1 --job.dump_folder=$d > $d.log 2>&1 || { echo "$b failed"; tail -5 $d.log; }
  [ $round = 1 ] && grep -m2 -iE 'engine|isa' "$d.log" | sed 's/^/  /'
  /usr/bin/python3 - "$b" "$d" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[2] + "/metrics.jsonl")]
tps = [r["tps"] for r in rows if "tps" in r and r.get("step", 0) >= 3]
ex = [r.get("exposed_comm_s", 0) for r in rows if "tps" in r and r.get("step", 0) >= 3]
print(f"{sys.argv[1]}: tokens/s per rank median {statistics.median(tps):.0f}  exposed comm {statistics.median(ex):.4f} s  loss@10 {rows[-1].get('loss')}")
PY
  rm -rf $d $d.log
done
done
