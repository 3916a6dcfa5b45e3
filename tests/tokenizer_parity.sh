#!/usr/bin/env bash
# tests/tokenizer_parity.sh CTITAN: ctitan's tokenizer against the npm reference tokenizers.
#
#  1. CLI checks that need no network: usage errors exit 2, a bad file exits 1 and is named,
#     train -> encode -> decode round-trips a text with invalid UTF-8.
#  2. npm install (once, reused) of `tiktoken` (the Rust core as WASM) and `llama3-tokenizer-js`
#     into <build>/tokenizer_parity/npm; tests/tokenizer/export_vocab.js writes their vocabularies
#     as tiktoken rank files (cl100k_base: 100256 tokens; Llama 3: 128000 + 256 special), and
#     Llama 3's also as a tokenizer.json.
#  3. tests/tokenizer/make_corpus.py builds a deterministic 1.5 MB corpus (code, many scripts,
#     emoji, whitespace runs, special-token names as text, invalid UTF-8).
#  4. Identical ids and exact decode for:
#       cl100k           tiktoken cl100k_base encode_ordinary      vs ctitan encode
#       llama3           tiktoken with Llama 3's ranks and pattern vs ctitan encode
#       llama3-specials  the same, encode(text, "all")             vs ctitan encode --specials
#       llama3js         llama3-tokenizer-js's own encoder          vs ctitan encode --specials,
#                        on the corpus without U+0085 and U+FEFF: its JavaScript regex's \s
#                        differs from Unicode White_Space (tiktoken's) on exactly these two.
#     Also: ctitan's Llama 3 special tokens equal llama3-tokenizer-js's, and the same vocabulary
#     written as a Hugging Face tokenizer.json loads and encodes identically.
# node and npm are Debian packages (scripts/install-deps.sh): without them the test fails. When
# the npm packages are not cached yet and the registry cannot be reached, it prints "SKIPPED: npm
# registry unreachable" after step 1 and exits 77, which CTest reports as skipped (never passed).
set -euo pipefail

CTITAN=$(realpath "$1")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${CT_BUILD_DIR:-$(dirname "$CTITAN")}
WORK="$BUILD/tokenizer_parity"
NPM_DIR="$WORK/npm"
mkdir -p "$WORK"
cd "$WORK"

fail() { echo "FAIL: $*" >&2; exit 1; }
expect_rc() { # expected-rc command...
	local want=$1; shift
	set +e; "$@" >/dev/null 2>"$WORK/stderr"; local rc=$?; set -e
	[ "$rc" = "$want" ] || fail "exit $rc, want $want: $* ($(cat "$WORK/stderr"))"
}

# ---- 1. CLI, no network ----------------------------------------------------------------------
expect_rc 0 "$CTITAN" tokenizer --help
expect_rc 2 "$CTITAN" tokenizer
expect_rc 2 "$CTITAN" tokenizer frobnicate
expect_rc 2 "$CTITAN" tokenizer train --input x --out y
expect_rc 2 "$CTITAN" tokenizer train --vocab-size lots --input x --out y
expect_rc 2 "$CTITAN" tokenizer encode --bogus
expect_rc 2 "$CTITAN" tokenizer encode
printf 'not base64 0\n' > bad.tiktoken
expect_rc 1 "$CTITAN" tokenizer encode --tokenizer bad.tiktoken --input /dev/null
grep -q "bad.tiktoken:1:" "$WORK/stderr" || fail "the bad rank file is not named: $(cat "$WORK/stderr")"
expect_rc 1 "$CTITAN" tokenizer encode --tokenizer /nonexistent.tiktoken --input /dev/null
/usr/bin/python3 "$ROOT/tests/tokenizer/make_corpus.py" small.bin --size 300000 --seed 7 >/dev/null
"$CTITAN" tokenizer train --vocab-size 1000 --input small.bin small.bin --out small.tok >/dev/null
# --vocab-size counts the specials: ids 0..999 in all, so model.vocab_size = 1000 fits
[ "$("$CTITAN" tokenizer info --tokenizer small.tok | awk '/^regular tokens:/{r=$3} /^special tokens:/{s=$3} END{print r+s}')" = 1000 ] ||
	fail "--vocab-size 1000 did not give 1000 ids in all"
expect_rc 2 "$CTITAN" tokenizer train --vocab-size 257 --input small.bin --out never.tok
"$CTITAN" tokenizer encode --tokenizer small.tok --input small.bin --output small.ids
"$CTITAN" tokenizer decode --tokenizer small.tok --input small.ids --output small.out
cmp -s small.bin small.out || fail "trained tokenizer: decode(encode(x)) != x"
echo "cli: usage/exit codes ok; train (1000 ids, specials included) + encode + decode round trip ok"

# ---- 2. npm packages -------------------------------------------------------------------------
command -v npm >/dev/null && command -v node >/dev/null ||
	fail "node/npm not installed (scripts/install-deps.sh installs Debian's nodejs and npm)"
# npm's own download cache lives with the packages, not in the user's home
export npm_config_cache="$WORK/npm-cache"
SKIP=77
if [ ! -f "$NPM_DIR/node_modules/tiktoken/package.json" ] ||
	[ ! -f "$NPM_DIR/node_modules/llama3-tokenizer-js/package.json" ]; then
	if ! timeout 40 npm ping --fetch-retries=1 --fetch-timeout=15000 >/dev/null 2>&1; then
		echo "SKIPPED: npm registry unreachable"
		exit $SKIP
	fi
	mkdir -p "$NPM_DIR"
	timeout 170 npm install --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error \
		tiktoken@1.0.22 llama3-tokenizer-js@1.2.0 >/dev/null ||
		fail "npm install failed although the registry answers"
fi
MODS="$NPM_DIR/node_modules"
[ -f vocab/llama3.tiktoken ] && [ -f vocab/cl100k_base.tiktoken ] && [ -f vocab/llama3_tokenizer.json ] ||
	node "$ROOT/tests/tokenizer/export_vocab.js" "$MODS" vocab

# ---- 3. corpus ---------------------------------------------------------------------------
/usr/bin/python3 "$ROOT/tests/tokenizer/make_corpus.py" corpus.bin
/usr/bin/python3 - <<'EOF'
d = open("corpus.bin", "rb").read()
for ch in ("\u0085", "\ufeff"):
    d = d.replace(ch.encode(), b"")
open("corpus_js.bin", "wb").write(d)
EOF

# ---- 4. parity -------------------------------------------------------------------------------
"$CTITAN" tokenizer info --tokenizer vocab/llama3.tiktoken | awk '/^  [0-9]+ /{print $1, $2}' > specials_ctitan.txt
cmp -s specials_ctitan.txt vocab/llama3_specials.txt || fail "Llama 3 special tokens differ from llama3-tokenizer-js's"

check() { # name mode rankfile corpus ctitan-flags...
	local name=$1 mode=$2 ranks=$3 corpus=$4; shift 4
	node "$ROOT/tests/tokenizer/encode_ref.js" "$MODS" "$mode" "$ranks" "$corpus" "ref_$name.ids" \
		vocab/llama3_specials.txt >/dev/null
	"$CTITAN" tokenizer encode --tokenizer "$ranks" --input "$corpus" --output "ct_$name.ids" "$@"
	if ! cmp -s "ref_$name.ids" "ct_$name.ids"; then
		diff "ref_$name.ids" "ct_$name.ids" | head -20 >&2 || true
		fail "$name: ids differ from the reference (ref_$name.ids vs ct_$name.ids in $WORK)"
	fi
	"$CTITAN" tokenizer decode --tokenizer "$ranks" --input "ct_$name.ids" --output "ct_$name.out"
	cmp -s "$corpus" "ct_$name.out" || fail "$name: decode is not exact"
	echo "$name: $(wc -l < "ct_$name.ids") ids identical on $(wc -c < "$corpus") bytes; decode exact"
}
check cl100k cl100k vocab/cl100k_base.tiktoken corpus.bin
check llama3 llama3 vocab/llama3.tiktoken corpus.bin
check llama3-specials llama3-specials vocab/llama3.tiktoken corpus.bin --specials
check llama3js llama3js vocab/llama3.tiktoken corpus_js.bin --specials
"$CTITAN" tokenizer encode --specials --tokenizer vocab/llama3_tokenizer.json --input corpus.bin \
	--output ct_hf.ids
cmp -s ct_hf.ids ref_llama3-specials.ids || fail "Llama 3 from tokenizer.json: ids differ"
echo "llama3 from tokenizer.json (Hugging Face layout): ids identical to llama3-specials"
echo "tokenizer parity: PASSED"
