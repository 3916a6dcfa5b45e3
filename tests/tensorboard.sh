#!/usr/bin/env bash
# TensorBoard event files, read back by tools independent of ctitan's writer: every record's
# two CRCs by a bitwise CRC32C in Python, every Event by Debian's `protoc --decode_raw`.
#  - 2 ranks, synthetic data: exactly one event file, under <dump_folder>/<save_tb_folder>/,
#    first record file_version "brain.Event:2", then for every step of metrics.jsonl each of
#    TorchTitan's scalar names once, equal to its metrics.jsonl value rounded to float32.
#  - 1 rank on token shards with validation every 2 steps, the rank killed in step 5: the file
#    holds steps 1-4 complete (validation_metrics/loss at 2 and 4), nothing after.
#   tests/tensorboard.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
if ! command -v protoc > /dev/null; then
  echo "protoc not found (Debian's protobuf-compiler): run scripts/install-deps.sh"
  exit 1
fi

COMMON=(--training.seq_len=128 --training.local_batch_size=2 --metrics.peak_tflops=0.1
        --metrics.enable_tensorboard=true)
run "$tmp/a.log" "$ROOT/scripts/launch" 2 "$CTITAN" train "$ROOT/configs/debug.toml" \
  --training.steps=3 --training.dataset=synthetic --job.dump_folder="$tmp/a" "${COMMON[@]}"
check "2-rank synthetic run with metrics.enable_tensorboard" $?

token_shards "$tmp/data" 11 0.8 5 3 train_000000=20000 val_000000=3000
("$CTITAN" train "$ROOT/configs/debug.toml" --training.steps=8 --training.dataset=mine \
  --training.dataset_path="$tmp/data" --model.vocab_size=509 --validation.enable=true \
  --validation.freq=2 --validation.steps=2 --metrics.save_tb_folder=board \
  --debug.fail_rank=0 --debug.fail_step=5 --job.dump_folder="$tmp/b" "${COMMON[@]}") \
  > "$tmp/b.log" 2>&1
[ $? -ne 0 ] && grep -q "kills itself in step 5" "$tmp/b.log"
check "1-rank run with validation, killed in step 5" $?

# check.py RUN_DIR TB_FOLDER STEPS VAL_STEPS
cat > "$tmp/check.py" <<'PY'
import glob, json, os, re, struct, subprocess, sys, time

run, folder, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
val_steps = {int(s) for s in sys.argv[4].split(",") if s}
bad = []

def crc32c(b):  # Castagnoli, bit by bit: not the product's ISA-L code path
    c = 0xFFFFFFFF
    for x in b:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF

def masked(c):
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF

def decode_raw(data):
    """protoc --decode_raw's text as a nested list of (field, value) pairs."""
    out = subprocess.run(["protoc", "--decode_raw"], input=data, capture_output=True)
    if out.returncode:
        raise ValueError("protoc: " + out.stderr.decode())
    stack = [[]]
    for line in out.stdout.decode().splitlines():
        line = line.strip()
        if line.endswith("{"):
            node = []
            stack[-1].append((int(line[:-1]), node))
            stack.append(node)
        elif line == "}":
            stack.pop()
        elif line:
            k, v = line.split(": ", 1)
            stack[-1].append((int(k), v))
    return stack[0]

files = [f for f in glob.glob(os.path.join(run, "**", "*"), recursive=True) if "tfevents" in f]
if len(files) != 1 or os.path.dirname(files[0]) != os.path.join(run, folder) or \
        not re.fullmatch(r"events\.out\.tfevents\.\d{10}\..+\.\d+\.\d+",
                         os.path.basename(files[0])):
    sys.exit(f"want one events.out.tfevents.<time>.<host>.<pid>.<n> in {run}/{folder}: {files}")
raw = open(files[0], "rb").read()
events, at = [], 0
while at < len(raw):
    if at + 12 > len(raw):
        bad.append(f"truncated record header at byte {at}")
        break
    n, = struct.unpack_from("<Q", raw, at)
    lcrc, = struct.unpack_from("<I", raw, at + 8)
    if lcrc != masked(crc32c(raw[at:at + 8])):
        bad.append(f"record {len(events)}: length CRC")
    data = raw[at + 12:at + 12 + n]
    if len(data) != n or at + 16 + n > len(raw):
        bad.append(f"record {len(events)}: truncated")
        break
    dcrc, = struct.unpack_from("<I", raw, at + 12 + n)
    if dcrc != masked(crc32c(data)):
        bad.append(f"record {len(events)}: data CRC")
    events.append(decode_raw(data))
    at += 16 + n

def f64(v):
    return struct.unpack("<d", struct.pack("<Q", int(v, 16)))[0]

def f32(v):
    return struct.unpack("<f", struct.pack("<I", int(v, 16)))[0]

first = dict(events[0]) if events else {}
if first.get(3) != '"brain.Event:2"' or 5 in first:
    bad.append(f"first event is not the file version: {events[:1]}")
now = time.time()
got = {}  # (step, tag) -> value
for i, ev in enumerate(events[1:], 1):
    fields = [k for k, _ in ev]
    d = dict(ev)
    if fields != [1, 2, 5] or not (now - 3600 < f64(d[1]) <= now + 1):
        bad.append(f"event {i}: fields {fields}, wall_time {d.get(1)}")
        continue
    summary = d[5]
    if len(summary) != 1 or summary[0][0] != 1:
        bad.append(f"event {i}: summary {summary}")
        continue
    value = summary[0][1]
    if [k for k, _ in value] != [1, 2]:
        bad.append(f"event {i}: value {value}")
        continue
    tag, v = dict(value)[1], dict(value)[2]
    key = (int(d[2]), json.loads(tag))
    if key in got:
        bad.append(f"event {i}: {key} written twice")
    got[key] = f32(v)

def is_f32_of(t, x):
    """t is x rounded to float32. cJSON prints a double with 15 digits when they read back
    within DBL_EPSILON relative (not always exactly), so where x lies that close to the
    midpoint between two float32s, either neighbour is the rounding of the double printed."""
    f = struct.unpack("<f", struct.pack("<f", x))[0]
    if t == f:
        return True
    bits = struct.unpack("<I", struct.pack("<f", f))[0]
    for nb in (bits - 1, bits + 1):
        g = struct.unpack("<f", struct.pack("<I", nb & 0xFFFFFFFF))[0]
        if t == g and abs(x - (f + g) / 2) <= 4e-16 * abs(x):
            return True
    return False

recs = {}
for line in open(os.path.join(run, "metrics.jsonl")):
    r = json.loads(line)
    recs.setdefault(r["step"], {}).update(r)
names = {"loss_metrics/global_avg_loss": "global_avg_loss", "grad_norm": "grad_norm",
         "lr": "lr", "throughput(tps)": "tps", "tflops": "tflops", "mfu(%)": "mfu",
         "memory/max_active(GiB)": "memory_max_active_gib",
         "time_metrics/end_to_end(s)": "step_s", "time_metrics/data_loading(s)": "data_loading_s",
         "n_tokens_seen": "tokens_seen", "validation_metrics/loss": "validation_loss"}
if sorted(recs) != list(range(1, steps + 1)):
    bad.append(f"metrics.jsonl steps {sorted(recs)}, want 1..{steps}")
want = set()
for s, r in recs.items():
    for tag, k in names.items():
        if k == "validation_loss" and s not in val_steps:
            continue
        want.add((s, tag))
        if (s, tag) not in got:
            bad.append(f"step {s}: no {tag}")
        elif not is_f32_of(got[(s, tag)], r[k]):
            bad.append(f"step {s}: {tag} = {got[(s, tag)]!r}, metrics.jsonl {k} = {r[k]!r}")
extra = sorted(set(got) - want)
if extra:
    bad.append(f"scalars not in metrics.jsonl: {extra[:5]}")
print(f"{files[0]}: {len(events)} records, {len(got)} scalars over steps "
      f"{sorted({s for s, _ in got})}")
for b in bad[:10]:
    print("  " + b)
sys.exit(1 if bad else 0)
PY
/usr/bin/python3 "$tmp/check.py" "$tmp/a" tb 3 ""
check "2 ranks: one event file, CRCs, file_version, every scalar = metrics.jsonl (float32)" $?
/usr/bin/python3 "$tmp/check.py" "$tmp/b" board 4 "2,4"
check "killed run: steps 1-4 kept, with validation_metrics/loss at 2 and 4" $?
finish
