#!/usr/bin/env bash
# ctitan prepare on JSON lines (plain, gzip, zstd), malformed lines, and mixing by weight, on
# a corpus made here from the Debian licence texts (/usr/share/common-licenses):
#  1. the same documents as a folder of plain files, one plain file with a separator, the
#     same file gzip- and zstd-compressed, and JSON lines (.jsonl, .jsonl.gz, .jsonl.zst; one
#     file per line) give byte-identical shards (train and val); so do they on a corpus
#     larger than one read buffer; truncated .gz and .zst files are errors (exit 1);
#  2. malformed JSON lines (not JSON, no such field, a number for the text) at random lines:
#     exit 2 naming the first one's file:line and reason, no shard left; with
#     --skip-bad-lines exit 0, the count and the first one reported, and the shards of the
#     corpus without those lines;
#  3. mixing sources by (random) weight: every output document is the next one of a source,
#     with two sources each one's token share stays within one document of its weight at every
#     point (three: at most one document over, two under), --mix-stop first stops when one
#     source runs out (nothing repeated), --mix-stop all repeats until all were read through;
#  4. the loader on a mixed dataset: a 2-rank run stopped after step 4 and resumed on 1 rank
#     trains each sample once and matches the uninterrupted run.
#   tests/prepare.sh build/ctitan
set -u
CTITAN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
PY=/usr/bin/python3
LIC=/usr/share/common-licenses
SEED=${CT_SEED:-$(( $(date +%s) % 32768 ))}
RANDOM=$SEED # the bad lines' places and the mixing weights
echo "seed $SEED (CT_SEED=$SEED reproduces this run)"
if ! command -v zstd > /dev/null || ! command -v gzip > /dev/null || [ ! -d $LIC ]; then
  echo "skipped: needs zstd and gzip (scripts/install-deps.sh --test) and $LIC"
  exit 77
fi
# bounded, so that a defect that never stops mixing cannot fill the disk
prep() { timeout 30 "$CTITAN" prepare --tokenizer "$tmp/tok.model" "$@"; }
SEP='
@@DOC@@
'
cat $LIC/* > "$tmp/all.txt"
"$CTITAN" tokenizer train --vocab-size 512 --input "$tmp/all.txt" --out "$tmp/tok.model" > "$tmp/tok.log" 2>&1
check "tokenizer trained on the licence texts" $?

# 1. one document per licence file, in name order, in every format
$PY - "$tmp" "$LIC" "$SEP" <<'PY'
import json, os, sys
tmp, lic, sep = sys.argv[1:4]
texts = [open(os.path.join(lic, n), encoding="utf-8").read() for n in sorted(os.listdir(lic))]
assert all(sep not in t for t in texts)
open(f"{tmp}/plain.txt", "w").write(sep.join(texts))
with open(f"{tmp}/lic.jsonl", "w") as f:
    for i, t in enumerate(texts):  # the text among other fields, not always first
        f.write(json.dumps({"id": i, "text": t, "meta": {"text": 1}} if i % 2 else {"text": t}) + "\n")
PY
gzip -k "$tmp/lic.jsonl" && gzip -k "$tmp/plain.txt" && zstd -q "$tmp/lic.jsonl" && zstd -q "$tmp/plain.txt"
check "corpus written as JSON lines and plain text, gzip and zstd" $?
prep --input $LIC --out "$tmp/ref" --val-fraction 0.2 > "$tmp/ref.log" 2>&1 &&
  [ -s "$tmp/ref/train_000000.bin" ] && [ -s "$tmp/ref/val_000000.bin" ]
check "the licence folder: train and val shards" $?
for f in lic.jsonl lic.jsonl.gz lic.jsonl.zst plain.txt plain.txt.gz plain.txt.zst; do
  prep --input "$tmp/$f" --out "$tmp/o_$f" --doc-separator "$SEP" --val-fraction 0.2 > "$tmp/o_$f.log" 2>&1 &&
    same "$tmp/ref/train_000000.bin" "$tmp/o_$f/train_000000.bin" &&
    same "$tmp/ref/val_000000.bin" "$tmp/o_$f/val_000000.bin" &&
    [ "$(ls "$tmp/o_$f")" = "$(ls "$tmp/ref")" ]
  check "$f: the same token ids and splits as the plain files" $?
done
# past one read buffer (1 MiB): five documents of every licence text each, 1.3 MB in all
$PY - "$tmp" "$SEP" <<'PY'
import json, sys
tmp, sep = sys.argv[1:3]
texts = [f"[{i}]\n" + open(f"{tmp}/all.txt", encoding="utf-8").read() for i in range(5)]
open(f"{tmp}/big.txt", "w").write(sep.join(texts))
open(f"{tmp}/big.jsonl", "w").write("".join(json.dumps({"text": t}) + "\n" for t in texts))
PY
gzip -k "$tmp/big.txt" "$tmp/big.jsonl" && zstd -q "$tmp/big.txt" "$tmp/big.jsonl" &&
  prep --input "$tmp/big.txt" --out "$tmp/big" --doc-separator "$SEP" > "$tmp/big.log" 2>&1
check "a 1.3 MB corpus" $?
for f in big.txt.gz big.txt.zst big.jsonl big.jsonl.gz big.jsonl.zst; do
  prep --input "$tmp/$f" --out "$tmp/o_$f" --doc-separator "$SEP" > "$tmp/o_$f.log" 2>&1 &&
    same "$tmp/big/train_000000.bin" "$tmp/o_$f/train_000000.bin"
  check "$f: the same token ids as the plain file" $?
done
head -c $(($(stat -c %s "$tmp/big.jsonl.zst") / 2)) "$tmp/big.jsonl.zst" > "$tmp/cut.jsonl.zst"
prep --input "$tmp/cut.jsonl.zst" --out "$tmp/cut1" > "$tmp/cut1.log" 2>&1
[ $? -eq 1 ] && grep -q "cut.jsonl.zst': truncated zstd data" "$tmp/cut1.log"
check "a truncated .zst: exit 1 naming the file" $?
head -c $(($(stat -c %s "$tmp/big.txt.gz") / 2)) "$tmp/big.txt.gz" > "$tmp/cut.txt.gz"
prep --input "$tmp/cut.txt.gz" --out "$tmp/cut2" > "$tmp/cut2.log" 2>&1
[ $? -eq 1 ] && grep -q "cut.txt.gz': bad gzip data: .*unexpected end of file" "$tmp/cut2.log"
check "a truncated .gz: exit 1 naming the file" $?

# 2. malformed lines: one document per paragraph, three bad lines at random places
$PY - "$tmp" "$LIC" "$RANDOM" <<'PY'
import json, os, random, sys
tmp, lic = sys.argv[1:3]
rng = random.Random(int(sys.argv[3]))
paras = [p for n in sorted(os.listdir(lic))
         for p in open(os.path.join(lic, n), encoding="utf-8").read().split("\n\n") if p.strip()]
good = [json.dumps({"text": p}) for p in paras]
bad = list(good)
reason = {'{"text": "unterminated': "not JSON", '{"title": "no text field"}': 'no field "text"',
          '{"text": 42}': 'field "text" is a number'}
kinds = list(reason)
rng.shuffle(kinds)
at = sorted(rng.sample(range(1, len(good)), 3))
for i, k in zip(at, kinds):
    bad.insert(i, k)
lines = [i + 1 for i, l in enumerate(bad) if l in kinds]
open(f"{tmp}/good.jsonl", "w").write("\n".join(good) + "\n")
open(f"{tmp}/bad.jsonl", "w").write("\n".join(bad) + "\n")
open(f"{tmp}/bad.expect", "w").write(f"{lines[0]}\n{reason[bad[lines[0] - 1]]}\n")
PY
zstd -q --rm "$tmp/good.jsonl" && zstd -q --rm "$tmp/bad.jsonl"
{ read -r bad_line; read -r bad_why; } < "$tmp/bad.expect"
echo "  first malformed line: $bad_line ($bad_why)"
prep --input "$tmp/bad.jsonl.zst" --out "$tmp/bad" --shard-tokens 5000 > "$tmp/bad.log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "bad.jsonl.zst:$bad_line: malformed line: $bad_why" "$tmp/bad.log" &&
  [ -z "$(ls "$tmp/bad")" ]
check "a malformed line: exit 2 (got $rc), its file:line and reason named, no shard left" $?
prep --input "$tmp/good.jsonl.zst" --out "$tmp/good" > "$tmp/good.log" 2>&1
check "the corpus without the bad lines" $?
prep --input "$tmp/bad.jsonl.zst" --out "$tmp/skip" --skip-bad-lines > "$tmp/skip.log" 2>&1 &&
  grep -q "skipped 3 malformed line(s) .*(first: .*bad.jsonl.zst:$bad_line: $bad_why" "$tmp/skip.log" &&
  same "$tmp/good/train_000000.bin" "$tmp/skip/train_000000.bin" &&
  same "$tmp/good/val_000000.bin" "$tmp/skip/val_000000.bin"
check "--skip-bad-lines: exit 0, 3 lines and the first reported, the rest tokenized as without them" $?

# 3. mixing: source A the even paragraphs (JSON lines, zstd), B the odd ones (plain text), C
# every third one (.jsonl.gz); a tag in each document keeps them apart
$PY - "$tmp" "$LIC" <<'PY'
import json, os, sys
tmp, lic = sys.argv[1:3]
paras = [p for n in sorted(os.listdir(lic))
         for p in open(os.path.join(lic, n), encoding="utf-8").read().split("\n\n") if p.strip()]
for name, part in (("a", paras[0::2]), ("c", paras[0::3])):
    with open(f"{tmp}/{name}.jsonl", "w") as f:
        for p in part:
            f.write(json.dumps({"text": f"[{name}] " + p}) + "\n")
open(f"{tmp}/b.txt", "w").write("\n\n".join("[b] " + p for p in paras[1::2]))
PY
zstd -q --rm "$tmp/a.jsonl" && gzip "$tmp/c.jsonl"
MIX=(--doc-separator '\n\n' --val-fraction 0)
prep --input "$tmp/a.jsonl.zst" --out "$tmp/a" "${MIX[@]}" > /dev/null 2>&1 &&
  prep --input "$tmp/b.txt" --out "$tmp/b" "${MIX[@]}" > /dev/null 2>&1 &&
  prep --input "$tmp/c.jsonl.gz" --out "$tmp/c" "${MIX[@]}" > /dev/null 2>&1
check "each source alone" $?
mixcheck() { # MIXED_DIR first|all SOURCE_DIR WEIGHT [SOURCE_DIR WEIGHT ...]
  $PY - "$@" <<'PY'
import struct, sys
def docs(d):
    b = open(f"{d}/train_000000.bin", "rb").read()
    n = struct.unpack("<Q", b[16:24])[0]
    t = struct.unpack(f"<{n}H", b[24:])
    starts = [i for i, x in enumerate(t) if x == t[0]] + [n]  # t[0] = <|begin_of_text|>
    return [t[s:e] for s, e in zip(starts, starts[1:])]
mixed, mode = docs(sys.argv[1]), sys.argv[2]
src = [docs(d) for d in sys.argv[3::2]]
w = [float(x) for x in sys.argv[4::2]]
f = [x / sum(w) for x in w]
n = len(src)
longest = max(len(d) for s in src for d in s)
took, tok = [0] * n, [0] * n
over = under = 0.0  # the worst excess and shortfall over all prefixes, in longest documents
for k, d in enumerate(mixed):
    i = next((i for i in range(n) if d == src[i][took[i] % len(src[i])]), None)
    if i is None:
        sys.exit(f"mixed document {k} is not the next document of any source")
    took[i], tok[i] = took[i] + 1, tok[i] + len(d)
    T = sum(tok)
    over = max([over] + [(tok[j] - f[j] * T) / longest for j in range(n)])
    under = max([under] + [(f[j] * T - tok[j]) / longest for j in range(n)])
T = sum(tok)
print(f"  {mode}: " + ", ".join(f"{took[i]}/{len(src[i])} docs {tok[i] / T:.4f} (weight {f[i]:.4f})"
      for i in range(n)) + f"; worst over {over:.2f}, under {under:.2f} documents of {longest} tokens")
if over > 1 or under > n - 1:
    sys.exit(f"a share is off by more than the bound (1 document over, {n - 1} under)")
used = [took[i] / len(src[i]) for i in range(n)]
if mode == "first" and not (max(used) <= 1 and max(used) == 1):
    sys.exit(f"first: expected one source used up and nothing repeated ({used})")
if mode == "all" and not (min(used) >= 1 and max(used) > 1):
    sys.exit(f"all: expected every source read through and one repeated ({used})")
PY
}
wa=0.$((RANDOM % 50 + 25)) # 0.25 .. 0.74
wb=$($PY -c "print(round(1 - $wa, 2))")
prep --input "$tmp/a.jsonl.zst:$wa" "$tmp/b.txt:$wb" --out "$tmp/m1" "${MIX[@]}" > "$tmp/m1.log" 2>&1 &&
  mixcheck "$tmp/m1" first "$tmp/a" "$wa" "$tmp/b" "$wb"
check "mix A:$wa B:$wb, --mix-stop first: shares within one document, nothing repeated" $?
grep -q "source 1 .*a.jsonl.zst: weight $wa" "$tmp/m1.log"; check "the summary names each source and its weight" $?
prep --input "$tmp/a.jsonl.zst:1" "$tmp/b.txt:4" --out "$tmp/m2" "${MIX[@]}" --mix-stop all > "$tmp/m2.log" 2>&1 &&
  mixcheck "$tmp/m2" all "$tmp/a" 1 "$tmp/b" 4
check "mix A:1 B:4, --mix-stop all: shares within one document, A read through, B repeated" $?
w3=($((RANDOM % 9 + 1)) $((RANDOM % 9 + 1)) $((RANDOM % 9 + 1)))
prep --input "$tmp/a.jsonl.zst:${w3[0]}" "$tmp/b.txt:${w3[1]}" "$tmp/c.jsonl.gz:${w3[2]}" --out "$tmp/m4" \
  "${MIX[@]}" --mix-stop all > "$tmp/m4.log" 2>&1 &&
  mixcheck "$tmp/m4" all "$tmp/a" "${w3[0]}" "$tmp/b" "${w3[1]}" "$tmp/c" "${w3[2]}"
check "mix of three A:${w3[0]} B:${w3[1]} C:${w3[2]}, --mix-stop all: at most 1 document over, 2 under" $?
prep --input "$tmp/a.jsonl.zst:0.5" "$tmp/b.txt" --out "$tmp/m3" > "$tmp/m3.log" 2>&1
[ $? -eq 2 ] && grep -q "every input a weight" "$tmp/m3.log"
check "a weight on some inputs only: exit 2" $?

# 4. the loader on the mixed dataset (shards like any other: resumable on another rank count)
prep --input "$tmp/a.jsonl.zst:0.6" "$tmp/b.txt:0.4" --out "$tmp/md" --doc-separator '\n\n' \
  --val-fraction 0 --shard-tokens 20000 > "$tmp/md.log" 2>&1
check "a mixed dataset in several shards" $?
TRAIN=(train "$ROOT/configs/debug.toml" --training.dataset=mine --training.dataset_path="$tmp/md"
       --model.vocab_size=512 --model.tokenizer_path="$tmp/tok.model" --training.steps=6
       --training.seq_len=32 --training.global_batch_size=4 --training.local_batch_size=2
       --lr_scheduler.warmup_steps=2 --metrics.peak_tflops=0.1 --checkpoint.interval=4)
run "$tmp/u.log" "$ROOT/scripts/launch" 2 "$CTITAN" "${TRAIN[@]}" --job.dump_folder="$tmp/u" \
  --debug.sample_log="$tmp/u.samples"
check "2 ranks, uninterrupted" $?
"$ROOT/scripts/launch" 2 "$CTITAN" "${TRAIN[@]}" --job.dump_folder="$tmp/r" --checkpoint.enable=true \
  --debug.fail_rank=1 --debug.fail_step=5 --debug.sample_log="$tmp/r1.samples" > "$tmp/r1.log" 2>&1
run "$tmp/r2.log" "$CTITAN" "${TRAIN[@]}" --job.dump_folder="$tmp/r" --checkpoint.enable=true \
  --training.local_batch_size=4 --debug.sample_log="$tmp/r2.samples" &&
  grep -q "loaded step 4 " "$tmp/r2.log"
check "stopped in step 5 on 2 ranks, resumed from step 4 on 1 rank" $?
metric "$tmp/u/metrics.jsonl" 5 6 > "$tmp/u.l" && metric "$tmp/r/metrics.jsonl" 5 6 > "$tmp/r.l" &&
  close "$tmp/r.l" "$tmp/u.l" && samples_once "$tmp/u.samples" "$tmp/r1.samples" "$tmp/r2.samples" 4 6 24
check "resumed steps 5-6 match the uninterrupted run, every sample trained once" $?
finish
