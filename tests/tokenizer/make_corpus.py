#!/usr/bin/python3
"""Builds the tokenizer parity corpus: a deterministic, varied byte string of >= 1 MB.

  /usr/bin/python3 tests/tokenizer/make_corpus.py OUT [--size BYTES] [--seed N] [--no-invalid]

Pieces, interleaved by a seeded generator:
  - real text: /usr/share/common-licenses (Debian base-files) and Python's standard library
    sources (code), when present; the synthetic pieces alone reach the size otherwise;
  - many languages and scripts (Latin with diacritics, Greek, Cyrillic, Arabic, Hebrew,
    Devanagari, Thai, CJK, Hangul, kana), contractions in every case (also with U+017F and
    U+212A, which fold to s and k), numbers of every length and other-script digits;
  - emoji (skin tones, ZWJ families, flags, keycaps), symbols, punctuation runs;
  - whitespace runs: spaces, tabs, CR/LF mixes, NBSP, U+2000..U+200A, U+3000, U+0085, U+2028,
    U+FEFF, up to hundreds long, also at the end of lines and before letters;
  - special-token names as plain text (<|begin_of_text|>, <|endoftext|>, ...);
  - invalid UTF-8 (unless --no-invalid): stray continuation bytes, truncated sequences,
    overlongs, surrogates, code points above U+10FFFF, bytes F5..FF.
Only code points assigned in Unicode 14 (PCRE2 10.42's tables) are drawn, so the regex
engines agree on every character's category.
"""

import argparse
import glob
import os
import random

WORDS = {
    "en": "the of and to in is was he for it with as his on be at by had not are but from "
          "they you this which or have one were all we when your can said there use each "
          "tokenizer merge rank vocabulary gradient shard".split(),
    "de": "Straße Größe über Fräulein Mädchen schön Übermut Äpfel Öl Grüße ßig".split(),
    "fr": "élève déjà où garçon cœur Noël hôpital naïve façade être français".split(),
    "es": "niño año señor corazón mañana pingüino acción ¿qué? ¡hola!".split(),
    "pl": "zażółć gęślą jaźń łódź źdźbło".split(),
    "tr": "İstanbul ılık şöyle ağaç çiçek Iğdır".split(),
    "vi": "Tiếng Việt người nước đẹp quá".split(),
    "el": "Ελληνικά καλημέρα κόσμε ΑΒΓΔ λόγος ψυχή".split(),
    "ru": "Привет мир съешь же ещё этих мягких французских булок ЁЖ".split(),
    "uk": "Слава ґанок їжак єнот".split(),
    "ar": "مرحبا بالعالم العربية كتاب مدرسة".split(),
    "he": "שלום עולם עברית ספר".split(),
    "hi": "नमस्ते दुनिया हिन्दी भाषा क्षत्रिय".split(),
    "th": "สวัสดีชาวโลก ภาษาไทย".split(),
    "zh": "你好世界 中文 北京欢迎你 机器学习 分词器 我爱北京天安门".split(),
    "ja": "こんにちは世界 日本語 カタカナ ひらがな 東京都 ｶﾀｶﾅ".split(),
    "ko": "안녕하세요 세계 한국어 서울".split(),
}

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M",
                "'LL", "'lL", "'D", "'\u017f", "'x", "'", "''", "'\u212a", "'\u017fx", "'\u212aay",
                "'Sx", "'LLama", "'ve'd"]

EMOJI = ["😀", "👋🏽", "👨‍👩‍👧‍👦", "🇫🇷", "🇯🇵", "1️⃣", "❤️", "🔥", "🚀", "🤖",
         "🏳️‍🌈", "👍🏿", "🧑‍💻", "☕", "✨", "🙏🏼"]

SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\u00a0", "\u2002", "\u2003",
          "\u2009", "\u200a", "\u3000", "\u0085", "\u2028", "\u2029", "\u202f", "\u205f",
          "\ufeff", "\u000b", "\u000c", "\u1680"]

SYMBOLS = list("!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "->", "=>", "!=", "==", "/*",
                                                       "*/", "//", "«»", "—", "–", "€", "£",
                                                       "©", "®", "°", "±", "×", "÷", "∑",
                                                       "√", "∞", "≠", "≤", "→", "♥", "★"]

DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "๐๑๒๓๔๕๖๗๘๙"]

SPECIAL_NAMES = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|endoftext|>",
                 "<|reserved_special_token_7|>", "<|start_header_id|>", "<|", "|>"]

# Blocks whose characters were all assigned by Unicode 14.
RANDOM_BLOCKS = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x5d0, 0x5ea),
                 (0x620, 0x64a), (0x905, 0x939), (0xe01, 0xe3a), (0x3041, 0x3096),
                 (0x30a1, 0x30fa), (0x4e00, 0x9fa5), (0xac00, 0xd7a3), (0x2200, 0x22ff),
                 (0x1f300, 0x1f5ff), (0x1f600, 0x1f64f), (0x10330, 0x1034a), (0x1d400, 0x1d454)]

INVALID = [b"\x80", b"\xbf", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc0\xaf", b"\xe0\x80\xaf",
           b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5", b"\xff", b"\xfe\xff",
           b"\xc3\x28", b"\xe2\x28\xa1", b"\x80\x80\x80", b"\xf8\x88\x80\x80\x80"]


def real_text():
    """(name, bytes) of real files, in a fixed order."""
    files = sorted(glob.glob("/usr/share/common-licenses/*"))
    pyfiles = []
    for d in sorted(glob.glob("/usr/lib/python3*")):
        pyfiles = sorted(glob.glob(os.path.join(d, "*.py")))
        if pyfiles:
            break
    out = []
    for f in files[:12] + pyfiles[:40]:
        if os.path.isfile(f) and not os.path.islink(f):
            with open(f, "rb") as fh:
                out.append(fh.read()[:60000])
    return out


def synthetic(rng, invalid):
    """One synthetic chunk."""
    kind = rng.randrange(10)
    if kind == 0:  # a sentence in some language, with contractions and numbers
        lang = rng.choice(sorted(WORDS))
        words = [rng.choice(WORDS[lang]) for _ in range(rng.randint(3, 20))]
        for i in range(len(words)):
            r = rng.random()
            if r < 0.1:
                words[i] += rng.choice(CONTRACTIONS)
            elif r < 0.15:
                words[i] = str(rng.randrange(10 ** rng.randint(1, 12)))
            elif r < 0.2:
                words[i] = words[i].upper()
        return (" ".join(words) + rng.choice([".", "!", "?", ",", "", ";"])).encode()
    if kind == 1:  # numbers
        d = rng.choice(DIGITS)
        n = "".join(rng.choice(d) for _ in range(rng.randint(1, 25)))
        return rng.choice(["", " ", "$", "-", "x"]).encode() + n.encode() + \
            rng.choice(["", ".5", ",000", "%", "th", "px", " km"]).encode()
    if kind == 2:  # emoji and symbols
        return "".join(rng.choice(EMOJI + SYMBOLS) for _ in range(rng.randint(1, 8))).encode()
    if kind == 3:  # whitespace runs, sometimes long
        n = rng.choice([1, 2, 3, 5, 8, 40, 300]) if rng.random() < 0.9 else 1000
        return "".join(rng.choice(SPACES) for _ in range(rng.randint(1, n))).encode()
    if kind == 4:  # code-like text
        ident = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(1, 12)))
        tmpl = rng.choice(["int {0} = {1};\n", "    if ({0} != NULL) {{\n\t\treturn {1};\n    }}\n",
                           "def {0}(x, y={1}):\n    return x ** y\n", "const {0} = () => `{1}`;\n",
                           "{0}[{1}] += 0x{1:x};  // {0}\n", "#define {0}_MAX ({1}ULL << 3)\n",
                           "SELECT {0} FROM t WHERE id={1};\r\n", "<div class=\"{0}\">{1}</div>\n"])
        return tmpl.format(ident, rng.randrange(100000)).encode()
    if kind == 5:  # random code points from assigned blocks
        out = []
        for _ in range(rng.randint(1, 30)):
            lo, hi = rng.choice(RANDOM_BLOCKS)
            out.append(chr(rng.randint(lo, hi)))
        return "".join(out).encode("utf-8", "surrogatepass")
    if kind == 6:  # special token names as plain text
        return (rng.choice(["", " ", "\n"]) + rng.choice(SPECIAL_NAMES) +
                rng.choice(["", "hello", " ", "\n"])).encode()
    if kind == 7 and invalid:  # invalid UTF-8, alone or glued to text
        return rng.choice([b"", b"a", b" ", b"\n", "é".encode()]) + rng.choice(INVALID) + \
            rng.choice([b"", b"b", b" x", b"\n", "中".encode(), b"123"])
    if kind == 8:  # repetitive runs that stress merging
        unit = rng.choice(["a", "ab", "=", "-", "_", "0", "\u00e9", "\u4e2d", "ha", "!?"])
        return (unit * rng.randint(2, 200)).encode()
    # mixed script words glued together
    return "".join(rng.choice(WORDS[rng.choice(sorted(WORDS))]) for _ in range(rng.randint(2, 5))).encode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--size", type=int, default=1_500_000)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-invalid", action="store_true")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    real = real_text()
    parts, size = [], 0
    while size < args.size:
        if real and rng.random() < 0.02:
            text = real[rng.randrange(len(real))]
            a = rng.randrange(len(text))
            chunk = text[a:a + rng.randint(100, 20000)]
            if args.no_invalid:
                chunk = chunk.decode("utf-8", "ignore").encode()
        else:
            chunk = synthetic(rng, not args.no_invalid)
        parts.append(chunk)
        sep = rng.choice([b" ", b"", b"\n", b"\n\n", b"  ", b"\t", b"\r\n"])
        parts.append(sep)
        size += len(chunk) + len(sep)
    data = b"".join(parts)
    with open(args.out, "wb") as f:
        f.write(data)
    print(f"make_corpus: {args.out}: {len(data)} bytes")


if __name__ == "__main__":
    main()
