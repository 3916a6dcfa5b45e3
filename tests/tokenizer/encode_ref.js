// tests/tokenizer/encode_ref.js: token ids of a byte file from the npm reference tokenizers,
// one id per line, for tests/tokenizer_parity.sh.
//
//   node encode_ref.js NODE_MODULES_DIR MODE RANKFILE CORPUS OUT [SPECIALS_TXT]
//
// MODE
//   cl100k           tiktoken (WASM) cl100k_base, encode_ordinary
//   llama3           tiktoken (WASM) built from RANKFILE with the Llama 3 pattern, encode_ordinary
//                    (Meta's Llama 3 tokenizer is exactly tiktoken with these ranks and pattern)
//   llama3-specials  the same with the special tokens of SPECIALS_TXT, encode(text, "all")
//   llama3js         llama3-tokenizer-js's own encoder (its JS regex and merges list), no BOS/EOS;
//                    it parses special token names, like llama3-specials
//
// The JS tokenizers take strings, so the bytes are split into maximal valid UTF-8 runs and
// invalid runs. Each valid run is encoded as its own text; each invalid run is byte-pair merged
// over RANKFILE's ranks by the plain tiktoken loop below. That is the reference for ctitan's
// PCRE2 split with MATCH_INVALID_UTF, where an invalid sequence is a barrier no match crosses.
'use strict';
const fs = require('fs');
const path = require('path');

const LLAMA3_PATTERN = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Length of the well-formed UTF-8 sequence at b[i] (Unicode table 3-7), or 0.
function utf8Len(b, i) {
  const c = b[i], n = b.length;
  const cont = (k, lo = 0x80, hi = 0xbf) => i + k < n && b[i + k] >= lo && b[i + k] <= hi;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) return cont(1) ? 2 : 0;
  if (c === 0xe0) return cont(1, 0xa0) && cont(2) ? 3 : 0;
  if ((c >= 0xe1 && c <= 0xec) || c === 0xee || c === 0xef) return cont(1) && cont(2) ? 3 : 0;
  if (c === 0xed) return cont(1, 0x80, 0x9f) && cont(2) ? 3 : 0;
  if (c === 0xf0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (c >= 0xf1 && c <= 0xf3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (c === 0xf4) return cont(1, 0x80, 0x8f) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

// [valid, start, end] runs tiling the buffer.
function runs(b) {
  const out = [];
  let i = 0;
  while (i < b.length) {
    const start = i, valid = utf8Len(b, i) > 0;
    while (i < b.length) {
      const k = utf8Len(b, i);
      if ((k > 0) !== valid) break;
      i += k > 0 ? k : 1;
    }
    out.push([valid, start, i]);
  }
  return out;
}

function loadRanks(file) {
  const ranks = new Map();
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    if (!line) continue;
    const [b64, r] = line.split(' ');
    ranks.set(Buffer.from(b64, 'base64').toString('latin1'), Number(r));
  }
  return ranks;
}

// tiktoken's byte_pair_encode: merge the leftmost lowest-ranked adjacent pair until none.
function bytePairEncode(bytes, ranks) {
  const whole = ranks.get(bytes.toString('latin1'));
  if (whole !== undefined) return [whole];
  let parts = Array.from(bytes, (x) => String.fromCharCode(x));
  for (;;) {
    let best = -1, at = -1;
    for (let k = 0; k + 1 < parts.length; k++) {
      const r = ranks.get(parts[k] + parts[k + 1]);
      if (r !== undefined && (best < 0 || r < best)) { best = r; at = k; }
    }
    if (best < 0) break;
    parts.splice(at, 2, parts[at] + parts[at + 1]);
  }
  return parts.map((p) => ranks.get(p));
}

async function main() {
  const [modDir, mode, rankFile, corpus, outFile, specialsFile] = process.argv.slice(2);
  const tiktoken = require(path.join(modDir, 'tiktoken'));
  const ranks = loadRanks(rankFile);
  let encodeText;
  if (mode === 'cl100k') {
    const enc = tiktoken.get_encoding('cl100k_base');
    encodeText = (s) => enc.encode_ordinary(s);
  } else if (mode === 'llama3' || mode === 'llama3-specials') {
    const specials = {};
    if (mode === 'llama3-specials')
      for (const line of fs.readFileSync(specialsFile, 'utf8').split('\n')) {
        if (!line) continue;
        const sp = line.indexOf(' ');
        specials[line.slice(sp + 1)] = Number(line.slice(0, sp));
      }
    const enc = new tiktoken.Tiktoken(fs.readFileSync(rankFile, 'utf8'), specials, LLAMA3_PATTERN);
    encodeText = mode === 'llama3' ? (s) => enc.encode_ordinary(s) : (s) => enc.encode(s, 'all');
  } else if (mode === 'llama3js') {
    const mod = await import(path.join(modDir, 'llama3-tokenizer-js/bundle/llama3-tokenizer-with-baked-data.js'));
    encodeText = (s) => mod.default.encode(s, { bos: false, eos: false });
  } else {
    throw new Error('unknown mode ' + mode);
  }
  const b = fs.readFileSync(corpus);
  const ids = [];
  const t0 = process.hrtime.bigint();
  for (const [valid, s, e] of runs(b)) {
    const part = b.subarray(s, e);
    const got = valid ? encodeText(part.toString('utf8')) : bytePairEncode(part, ranks);
    for (const id of got) ids.push(id);
  }
  const dt = Number(process.hrtime.bigint() - t0) / 1e9;
  fs.writeFileSync(outFile, ids.join('\n') + (ids.length ? '\n' : ''));
  console.log(`encode_ref ${mode}: ${b.length} bytes -> ${ids.length} tokens in ${dt.toFixed(2)} s`);
}

main().catch((e) => { console.error('encode_ref: ' + (e.stack || e)); process.exit(1); });
