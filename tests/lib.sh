# tests/lib.sh: shared by the shell tests. Source it after `set -u`; it provides
#   $tmp      a scratch folder, removed at exit (kept, and reused, when KEEP_TMP names one)
#   check NAME STATUS   count a result: STATUS 0 passes
#   finish    print "N passed, N failed" (CTest-readable) and return the verdict
tmp=${KEEP_TMP:-$(mktemp -d)}
[ -n "${KEEP_TMP:-}" ] || trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
check() {
  if [ "$2" -eq 0 ]; then
    pass=$((pass + 1))
    echo "[ ok ] $1"
  else
    fail=$((fail + 1))
    echo "[FAIL] $1"
  fi
}
finish() {
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
}
#   metric FILE FIRST LAST [KEY...]   from a metrics.jsonl, one line per step FIRST..LAST with
#             the KEYs' values (default: loss grad_norm; records of a step merged, later ones
#             winning) at full precision; status 1 and a message when the file, a step or a key
#             is missing, so a run that wrote nothing cannot compare equal to another
#   close A B [TOL]   A and B (metric outputs) have the same non-zero number of lines and
#             fields, each value within TOL (default 1e-5) relative to B's
#   same A B  A and B are byte-identical and not empty
#   run LOG CMD...    CMD with stdout+stderr to LOG (appended); its status, LOG's tail on failure
#   samples_once FULL SAVED RESUMED CUT STEPS COUNT   from --debug.sample_log prefixes: steps
#             1..CUT of SAVED and CUT+1..STEPS of RESUMED together trained COUNT samples, each
#             once, every step the same set as in the uninterrupted run FULL (steps 1..STEPS)
#   token_shards DIR SEED P MUL ADD NAME=COUNT...   token shards (CTTOKENS, vocabulary 509) in
#             a new folder DIR, NAME.bin of COUNT tokens each, from one random.Random(SEED)
#             stream: each token is (previous * MUL + ADD) % 509 with probability P (starting
#             from 1 in each shard; learnable), else a uniform draw (P = 0: uniform only)
metric() {
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
path, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
keys = sys.argv[4:] or ["loss", "grad_norm"]
try:
    steps = {}
    for line in open(path):
        r = json.loads(line)
        steps.setdefault(r["step"], {}).update(r)
    for s in range(first, last + 1):
        print(" ".join(repr(steps[s][k]) for k in keys))
except (OSError, ValueError, KeyError) as e:
    sys.exit(f"metric: {path}: steps {first}-{last} {keys}: {type(e).__name__} {e}")
PY
}
close() {
  /usr/bin/python3 - "$1" "$2" "${3:-1e-5}" <<'PY'
import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open(sys.argv[2])]
tol = float(sys.argv[3])
ok = len(a) == len(b) > 0 and all(len(x) == len(y) > 0 for x, y in zip(a, b))
ok = ok and all(abs(float(u) - float(v)) <= tol * abs(float(v))
                for x, y in zip(a, b) for u, v in zip(x, y))
if not ok:
    print(f"close: {sys.argv[1]} vs {sys.argv[2]} (rel tol {tol}):", file=sys.stderr)
    for x, y in list(zip(a, b))[:8]:
        print("   ", " ".join(x), "|", " ".join(y), file=sys.stderr)
    if len(a) != len(b) or not a:
        print(f"    {len(a)} lines vs {len(b)}", file=sys.stderr)
sys.exit(0 if ok else 1)
PY
}
same() { [ -s "$1" ] && [ -s "$2" ] && cmp -s "$1" "$2"; }
run() {
  local log=$1 rc
  shift
  "$@" >> "$log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || { echo "  exit $rc: $*" >&2; tail -5 "$log" >&2; }
  return $rc
}
token_shards() {
  /usr/bin/python3 - "$@" <<'PY'
import os, random, struct, sys
d, seed, p, mul, add = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
os.makedirs(d)
rng = random.Random(seed)
for spec in sys.argv[6:]:
    name, n = spec.split("=")
    n, toks, cur = int(n), [], 1
    for _ in range(n):
        cur = (cur * mul + add) % 509 if p > 0 and rng.random() < p else rng.randrange(509)
        toks.append(cur)
    with open(f"{d}/{name}.bin", "wb") as f:
        f.write(b"CTTOKENS" + struct.pack("<IIQ", 1, 2, n) + struct.pack(f"<{n}H", *toks))
PY
}
samples_once() {
  /usr/bin/python3 - "$@" <<'PY'
import collections, glob, sys
def read(prefix, keep):
    out = collections.defaultdict(list)
    for f in glob.glob(prefix + ".rank-*"):
        for line in open(f):
            s, x = map(int, line.split())
            if keep(s): out[s].append(x)
    return out
cut, steps, count = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
full = read(sys.argv[1], lambda s: True)
got = read(sys.argv[2], lambda s: s <= cut)
for s, xs in read(sys.argv[3], lambda s: s > cut).items():
    got[s] += xs
allx = [x for s in got for x in got[s]]
want = list(range(1, steps + 1))
ok = sorted(got) == want and len(allx) == len(set(allx)) == count
ok = ok and sorted(full) == want and all(sorted(got[s]) == sorted(full[s]) for s in full)
if not ok:
    print("  samples:", dict(got), "uninterrupted:", dict(full), file=sys.stderr)
sys.exit(0 if ok else 1)
PY
}
