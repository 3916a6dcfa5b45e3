#!/usr/bin/python3
"""Tokenizer benchmark: ctitan vs tiktoken (npm, WASM) encode, ctitan vs sentencepiece training.

  /usr/bin/python3 bench/bench_tokenizer.py [--ctitan build/ctitan] [--repeat 5]
                                           [--vocab 2048,8192] [--skip-train] [--skip-encode]

Encode: single-threaded MB/s of `ctitan tokenizer encode` (the encode call alone, best of
--repeat, text already in memory) against tiktoken's encode_ordinary in node (same: best of
--repeat after a warm-up, the JS string built beforehand), on the same texts and vocabularies:
cl100k_base and Llama 3 (tiktoken built from llama3-tokenizer-js's ranks, see
tests/tokenizer/export_vocab.js). Texts: the King James Bible (Debian's bible-kjv) and the
tokenizer parity corpus (tests/tokenizer/make_corpus.py --no-invalid: code, many scripts, emoji,
whitespace runs). Token counts must agree; the ratio is ctitan / tiktoken.

Training: wall time of `ctitan tokenizer train --vocab-size N` (one thread) and of Debian's
`spm_train --model_type=bpe --byte_fallback=true --vocab_size=N --num_threads=1` on the Bible,
and bytes per token of each on the same text (spm_encode works line by line, so newlines cost it
no tokens; ctitan counts them). Installs bible-kjv and sentencepiece with apt-get, and the npm
packages under <build>/tokenizer_parity/npm, when missing.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

NODE_BENCH = r"""
const fs = require('fs'), path = require('path');
const [mods, ranksFile, textFile, repeat] = process.argv.slice(1);
const tiktoken = require(path.join(mods, 'tiktoken'));
const PAT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const enc = ranksFile === 'cl100k_base' ? tiktoken.get_encoding('cl100k_base')
    : new tiktoken.Tiktoken(fs.readFileSync(ranksFile, 'utf8'), {}, PAT);
const buf = fs.readFileSync(textFile), text = buf.toString('utf8');
let n = enc.encode_ordinary(text).length, best = 1e30;  // warm-up
for (let r = 0; r < Number(repeat); r++) {
  const t0 = process.hrtime.bigint();
  n = enc.encode_ordinary(text).length;
  best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
}
console.log(JSON.stringify({ bytes: buf.length, tokens: n, seconds: best }));
"""


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, **kw)
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p


def apt_install(pkg, probe):
    if shutil.which(probe):
        return
    print(f"bench: installing {pkg} (apt-get)", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", pkg], env=env,
                      capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True)
        run(["apt-get", "install", "-y", "--no-install-recommends", pkg], env=env)


def npm_modules(build):
    """The npm packages' folder; None only when they are not cached and the registry cannot be
    reached. node and npm are Debian packages (scripts/install-deps.sh): missing is an error."""
    mods = os.path.join(build, "tokenizer_parity", "npm")
    if not os.path.exists(os.path.join(mods, "node_modules", "tiktoken", "package.json")) or \
            not os.path.exists(os.path.join(mods, "node_modules", "llama3-tokenizer-js")):
        if not shutil.which("npm") or not shutil.which("node"):
            sys.exit("bench: node/npm not installed (scripts/install-deps.sh installs them)")
        env = dict(os.environ, npm_config_cache=os.path.join(build, "tokenizer_parity", "npm-cache"))
        ping = subprocess.run(["timeout", "40", "npm", "ping", "--fetch-retries=1",
                               "--fetch-timeout=15000"], capture_output=True, env=env)
        if ping.returncode != 0:
            return None
        print("bench: npm install tiktoken llama3-tokenizer-js", flush=True)
        p = subprocess.run(["npm", "install", "--prefix", mods, "--no-audit", "--no-fund",
                            "tiktoken@1.0.22", "llama3-tokenizer-js@1.2.0"], capture_output=True,
                           env=env)
        if p.returncode != 0:
            sys.exit("bench: npm install failed although the registry answers:\n" +
                     p.stderr.decode(errors="replace"))
    return os.path.join(mods, "node_modules")


def ctitan_encode(ctitan, tok, text, repeat):
    p = run([ctitan, "tokenizer", "encode", "--tokenizer", tok, "--input", text, "--quiet",
             "--stats", "--repeat", str(repeat)])
    # encode: B bytes -> T tokens (x bytes/token) in S s: M MB/s
    w = p.stderr.split()
    return dict(bytes=int(w[1]), tokens=int(w[4]), seconds=float(w[9]))


def bench_encode(args, work):
    mods = npm_modules(args.build)
    if not mods:
        print("encode: SKIPPED (npm registry unreachable: no tiktoken)")
        return
    vocab = os.path.join(work, "vocab")
    run(["node", os.path.join(ROOT, "tests", "tokenizer", "export_vocab.js"), mods, vocab])
    texts = [("bible-kjv", os.path.join(work, "bible.txt")),
             ("parity-corpus", os.path.join(work, "corpus.txt"))]
    run(["/usr/bin/python3", os.path.join(ROOT, "tests", "tokenizer", "make_corpus.py"),
         texts[1][1], "--no-invalid"])
    print(f"\nencode, single thread, best of {args.repeat} (MB/s = 1e6 bytes/s)")
    print(f"{'text':<15}{'vocab':<13}{'MB':>7}{'tokens':>10}{'ctitan MB/s':>13}"
          f"{'tiktoken MB/s':>15}{'ratio':>8}")
    for tname, tpath in texts:
        for vname, ct_tok, node_tok in [
                ("cl100k_base", os.path.join(vocab, "cl100k_base.tiktoken"), "cl100k_base"),
                ("llama3", os.path.join(vocab, "llama3.tiktoken"),
                 os.path.join(vocab, "llama3.tiktoken"))]:
            c = ctitan_encode(args.ctitan, ct_tok, tpath, args.repeat)
            p = run(["node", "-e", NODE_BENCH, mods, node_tok, tpath, str(args.repeat)])
            n = json.loads(p.stdout)
            if n["tokens"] != c["tokens"]:
                sys.exit(f"bench: token counts differ on {tname}/{vname}: "
                         f"ctitan {c['tokens']}, tiktoken {n['tokens']}")
            cm, nm = c["bytes"] / c["seconds"] / 1e6, n["bytes"] / n["seconds"] / 1e6
            print(f"{tname:<15}{vname:<13}{c['bytes'] / 1e6:>7.2f}{c['tokens']:>10}"
                  f"{cm:>13.1f}{nm:>15.1f}{cm / nm:>7.1f}x")


def count_spm_tokens(model, text):
    with open(text, "rb") as f:
        p = subprocess.run(["spm_encode", f"--model={model}", "--output_format=id"], stdin=f,
                           capture_output=True, check=True)
    return sum(len(line.split()) for line in p.stdout.splitlines())


def bench_train(args, work):
    apt_install("sentencepiece", "spm_train")
    text = os.path.join(work, "bible.txt")
    nbytes = os.path.getsize(text)
    with open(text, "rb") as f:
        newlines = f.read().count(b"\n")
    print(f"\nBPE training on the King James Bible ({nbytes / 1e6:.2f} MB), one thread")
    print(f"{'vocab':>6}  {'impl':<14}{'train s':>9}{'bytes/token':>13}")
    for v in args.vocab:
        out = os.path.join(work, f"ct{v}.tok")
        t0 = time.perf_counter()
        run([args.ctitan, "tokenizer", "train", "--vocab-size", str(v), "--input", text,
             "--out", out])
        ct_s = time.perf_counter() - t0
        ct_tokens = ctitan_encode(args.ctitan, out, text, 1)["tokens"]
        prefix = os.path.join(work, f"spm{v}")
        t0 = time.perf_counter()
        run(["spm_train", f"--input={text}", f"--model_prefix={prefix}", f"--vocab_size={v}",
             "--model_type=bpe", "--byte_fallback=true", "--num_threads=1",
             "--minloglevel=2"])
        spm_s = time.perf_counter() - t0
        spm_tokens = count_spm_tokens(prefix + ".model", text)
        print(f"{v:>6}  {'ctitan':<14}{ct_s:>9.2f}{nbytes / ct_tokens:>13.3f}")
        print(f"{v:>6}  {'spm_train':<14}{spm_s:>9.2f}{nbytes / spm_tokens:>13.3f}")
        print(f"{v:>6}  {'  +1/newline':<14}{'':>9}{nbytes / (spm_tokens + newlines):>13.3f}"
              "   (spm with one token per newline, as ctitan must spend)")
        print(f"{v:>6}  {'ratio':<14}{spm_s / ct_s:>8.1f}x{(nbytes / ct_tokens) / (nbytes / spm_tokens):>12.2f}x"
              "   (speed: spm/ctitan; bytes/token: ctitan/spm)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctitan", default=os.path.join(ROOT, "build", "ctitan"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--vocab", default="2048,8192")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--skip-encode", action="store_true")
    args = ap.parse_args()
    args.ctitan = os.path.abspath(args.ctitan)
    args.build = os.path.dirname(args.ctitan)
    args.vocab = [int(v) for v in args.vocab.split(",")]
    apt_install("bible-kjv", "bible")
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "bible.txt"), "wb") as f:
            subprocess.run(["bible", "gen1:1-rev22:21"], stdin=subprocess.DEVNULL, stdout=f,
                           check=True)
        if not args.skip_encode:
            bench_encode(args, work)
        if not args.skip_train:
            bench_train(args, work)


if __name__ == "__main__":
    main()
