#!/usr/bin/env bash
# Memory snapshots ([profiling] enable_memory_snapshot), checked against what metrics.jsonl and
# base/mem report:
#  - the snapshotted steps: the first step without profiling (1 and 2 ranks), every
#    profile_freq-th step with it (beside that step's trace);
#  - in every snapshot each sample holds a byte count per category, times do not go back, the
#    peak of the samples' totals equals mem.c's peak of the step (peak_total_bytes); on rank 0,
#    which writes metrics.jsonl, it also equals that step's memory_max_active_gib (the run's
#    peak so far: ctitan allocates nothing at set-up above what the first step holds), and the
#    last sample's categories equal that step's memory_<category>_bytes; on 1 rank with the
#    auto matmul engine, whose tuning scratch is freed within the step, that peak is a
#    transient, above the step's first and last samples;
#  - on 2 ranks the samples name the schedule's nodes: every growth of the comm category
#    happens in an all-gather or reduce-scatter node (the only nodes that take comm buffers);
#  - an allocation that cannot succeed (activations of a million 8192-token sequences) writes
#    iteration_0_exit/rank0_memory_snapshot.json, with the failed request, before the abort;
#  - `ctitan plot` draws memory_timeline.png from the run folder.
#   tests/memory_snapshot.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
COMMON=(--training.seq_len=128 --training.local_batch_size=2 --metrics.peak_tflops=0.1
        --profiling.enable_memory_snapshot=true)

# the auto engine times each matmul shape on its first call, into scratch it frees again: on
# one rank (whose step allocates nothing else) a peak above the step's start and end
run "$tmp/a.log" env -u CT_MATMUL_ENGINE "$CTITAN" train "$ROOT/configs/debug.toml" \
  --compute.matmul_engine=auto --training.steps=1 --job.dump_folder="$tmp/a" "${COMMON[@]}"
check "1-rank run with a memory snapshot" $?
run "$tmp/b.log" "$ROOT/scripts/launch" 2 "$CTITAN" train "$ROOT/configs/debug.toml" \
  --training.steps=2 --job.dump_folder="$tmp/b" "${COMMON[@]}"
check "2-rank run with a memory snapshot" $?
run "$tmp/c.log" "$CTITAN" train "$ROOT/configs/debug.toml" --training.steps=2 \
  --profiling.enable_profiling=true --profiling.profile_freq=2 \
  --profiling.save_memory_snapshot_folder=snaps --job.dump_folder="$tmp/c" "${COMMON[@]}"
check "1-rank profiled run with a memory snapshot" $?
# the sanitizer build's allocator refuses such a request itself unless told to return NULL
(ASAN_OPTIONS=${ASAN_OPTIONS:-}:allocator_may_return_null=1 "$CTITAN" train \
  "$ROOT/configs/debug.toml" "${COMMON[@]}" --training.steps=2 --training.seq_len=8192 \
  --training.local_batch_size=1000000 --job.dump_folder="$tmp/d") > "$tmp/d.log" 2>&1
[ $? -ne 0 ] && grep -q "memory snapshot: allocation of .* failed; wrote" "$tmp/d.log"
check "an impossible allocation fails the run, naming the snapshot it wrote" $?

# check.py RUN_DIR FOLDER RANKS [--transient] STEPS...: the snapshots of exactly STEPS, one per
# rank; --transient: the peak lies above the first and the last sample
cat > "$tmp/check.py" <<'PY'
import glob, json, os, sys
run, folder, ranks = sys.argv[1], sys.argv[2], int(sys.argv[3])
transient = "--transient" in sys.argv
steps = [int(s) for s in sys.argv[4:] if s != "--transient"]
bad = []
recs = {}
for line in open(os.path.join(run, "metrics.jsonl")):
    r = json.loads(line)
    recs.setdefault(r["step"], {}).update(r)
cats = [k[len("memory_"):-len("_peak_bytes")] for k in recs[1] if k.endswith("_peak_bytes")]
found = sorted(os.path.basename(d) for d in glob.glob(os.path.join(run, folder, "*")))
if found != [f"iteration_{s}" for s in sorted(steps)]:
    bad.append(f"snapshot folders {found}, want steps {steps}")
for s in steps:
    for r in range(ranks):
        p = os.path.join(run, folder, f"iteration_{s}", f"rank{r}_memory_snapshot.json")
        try:
            js = json.load(open(p))
        except (OSError, ValueError) as e:
            bad.append(f"{p}: {e}")
            continue
        name = f"step {s} rank {r}"
        if (js["rank"], js["step"], js["reason"], js["dropped_samples"]) != (r, s, "step", 0):
            bad.append(f"{name}: header {js['rank'], js['step'], js['reason']}")
        if js["categories"] != cats:
            bad.append(f"{name}: categories {js['categories']}, metrics.jsonl {cats}")
        sm = js["samples"]
        if len(sm) < 2 or any(len(x["bytes"]) != len(cats) or min(x["bytes"]) < 0 or
                              not x["node"] for x in sm):
            bad.append(f"{name}: malformed samples")
            continue
        if any(b["t"] < a["t"] for a, b in zip(sm, sm[1:])):
            bad.append(f"{name}: time goes back")
        peak = max(sum(x["bytes"]) for x in sm)
        if peak != js["peak_total_bytes"]:
            bad.append(f"{name}: samples peak at {peak}, mem.c's peak of the step "
                       f"{js['peak_total_bytes']}")
        ends = max(sum(sm[0]["bytes"]), sum(sm[-1]["bytes"]))
        if transient and peak <= ends:
            bad.append(f"{name}: no transient: peak {peak}, first/last sample {ends}")
        if r == 0:
            rec = recs[s]
            if peak != round(rec["memory_max_active_gib"] * 2**30):
                bad.append(f"{name}: samples peak at {peak}, metrics.jsonl "
                           f"memory_max_active_gib {rec['memory_max_active_gib']} GiB")
            last = {c: v for c, v in zip(cats, sm[-1]["bytes"])}
            want = {c: rec[f"memory_{c}_bytes"] for c in cats}
            if last != want:
                bad.append(f"{name}: last sample {last}, metrics.jsonl {want}")
        if ranks > 1 and s == 1:
            comm = cats.index("comm")
            grow = [b["node"] for a, b in zip(sm, sm[1:]) if b["bytes"][comm] > a["bytes"][comm]]
            if not grow or any(not n.startswith(("AG b", "RS b")) for n in grow):
                bad.append(f"{name}: comm buffers taken in nodes {grow}")
        print(f"{name}: {len(sm)} samples, peak {peak} bytes, nodes "
              f"{sorted({x['node'] for x in sm})[:6]}")
for b in bad[:10]:
    print("  " + b)
sys.exit(1 if bad else 0)
PY
/usr/bin/python3 "$tmp/check.py" "$tmp/a" memory_snapshot 1 --transient 1
check "1 rank: the first step's snapshot, a transient peak = mem.c's = metrics.jsonl's" $?
/usr/bin/python3 "$tmp/check.py" "$tmp/b" memory_snapshot 2 1
check "2 ranks: the first step's snapshots, peaks as reported, comm growth in AG/RS nodes" $?
/usr/bin/python3 "$tmp/check.py" "$tmp/c" snaps 1 2
[ $? -eq 0 ] && [ ! -e "$tmp/c/memory_snapshot" ]
check "profiling every 2 steps: a snapshot of step 2 only, in save_memory_snapshot_folder" $?

/usr/bin/python3 - "$tmp/d/memory_snapshot" <<'PY'
import json, os, sys
d = sys.argv[1]
js = json.load(open(os.path.join(d, "iteration_0_exit", "rank0_memory_snapshot.json")))
f, last = js["failed_alloc"], js["samples"][-1]["bytes"]
cats = js["categories"]
ok = (os.listdir(d) == ["iteration_0_exit"] and js["reason"] == "alloc_failure" and
      f["category"] == "activations" and f["bytes"] > 2**40 and f["node"] == "setup" and
      len(js["samples"]) > 0 and last[cats.index("activations")] == 0 and
      max(sum(x["bytes"]) for x in js["samples"]) == js["peak_total_bytes"])
print("failure snapshot:", f, "last sample", last)
sys.exit(0 if ok else 1)
PY
check "allocation failure: iteration_0_exit snapshot with the request and the state before it" $?

run "$tmp/plot.log" "$CTITAN" plot "$tmp/b" &&
  grep -qx "$tmp/b/memory_timeline.png" "$tmp/plot.log" &&
  [ "$(head -c 8 "$tmp/b/memory_timeline.png" | od -An -tx1 | tr -d ' ')" = 89504e470d0a1a0a ]
check "ctitan plot draws memory_timeline.png from the snapshot" $?
finish
