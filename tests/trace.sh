#!/usr/bin/env bash
# Chrome traces of a 4-rank run with prefetch on a simulated link: one valid trace per rank
# under <dump_folder>/<save_traces_folder>/iteration_<step>/, compute and comm on separate
# tracks with bucket bytes in the args, and the all-gather of bucket k+1 running while bucket
# k computes its forward: issued ahead in all 24 cases (6 blocks x 4 ranks), and seen running
# during it on the comm thread in at least one (how many is the OS scheduler's).
#   tests/trace.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
"$ROOT/scripts/launch" 4 "$CTITAN" train "$ROOT/configs/debug.toml" --training.steps=2 \
  --training.seq_len=128 --training.local_batch_size=2 --job.dump_folder="$tmp/run" \
  --comm.progress=thread --comm.prefetch=1 --comm.simulate_bandwidth_gbps=10 \
  --profiling.enable_profiling=true --profiling.profile_freq=2 --metrics.peak_tflops=0.1 \
  > "$tmp/train.log" 2>&1
check "4-rank run with profiling" $?
/usr/bin/python3 - "$tmp/run/profile_trace/iteration_2" <<'PY'
import json, os, sys
d = sys.argv[1]
overlaps, issued, checked, bad = 0, 0, 0, []
for r in range(4):
    ev = json.load(open(os.path.join(d, f"rank{r}_trace.json")))["traceEvents"]
    x = [e for e in ev if e.get("ph") == "X"]
    if not any(e["tid"] == 1 for e in x) or not any(e["tid"] == 2 for e in x):
        bad.append(f"rank {r}: missing a track")
    comm = [e for e in x if e["tid"] == 2]
    if any(e["args"].get("bytes", 0) <= 0 or "units" not in e["args"] for e in comm):
        bad.append(f"rank {r}: comm event without bytes/units")
    # forward units of micro-batch 0: bucket b = unit u under per_block
    fwd = {int(e["name"].split("u")[1]): e for e in x if e["name"].startswith("FWD u")}
    ag = {}
    for e in comm:
        if e["name"] == "all-gather" and e["args"]["bucket"] not in ag:
            ag[e["args"]["bucket"]] = e  # the first (forward) gather of each bucket
    # the issue events of the all-gathers on the compute track (the first, forward, one each)
    issue = {}
    for e in x:
        if e["tid"] == 1 and e.get("cat") == "issue" and e["name"].startswith("AG b") \
                and e["args"]["bucket"] not in issue:
            issue[e["args"]["bucket"]] = e
    for k in range(1, 7):  # blocks: bucket k computes while bucket k+1 gathers
        if k in fwd and k + 1 in ag and k + 1 in issue:
            f, g, i = fwd[k], ag[k + 1], issue[k + 1]
            checked += 1
            if i["ts"] + i["dur"] <= f["ts"]:
                issued += 1
            if g["ts"] < f["ts"] + f["dur"] and g["ts"] + g["dur"] > f["ts"]:
                overlaps += 1
print(f"all-gather of bucket k+1 issued before the forward of bucket k in {issued} of {checked} "
      f"cases; running during it on the comm thread in {overlaps} of {checked}")
for b in bad:
    print(b)
# What the code promises, in every case: prefetch 1 issues bucket k+1's gather before bucket k's
# forward. Whether the comm thread then runs it during that forward is up to the OS scheduler
# (4 ranks with a comm thread each on this machine's 2 cores): seen in 24, 22 (load 27), 15
# (beside another test) and 11 (a quiet fresh-clone CI run, which failed the old floor of half)
# of 24. So the share is printed, and one case is required: a serial executor shows none.
sys.exit(0 if not bad and checked == 24 and issued == checked and overlaps >= 1 else 1)
PY
check "traces: two tracks, bytes in args, bucket k+1's all-gather during bucket k's compute" $?
finish
