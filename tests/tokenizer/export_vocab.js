// tests/tokenizer/export_vocab.js: writes the vocabularies of the npm reference tokenizers as
// tiktoken rank files ("BASE64 RANK" lines, no header), for ctitan to load.
//
//   node export_vocab.js NODE_MODULES_DIR OUT_DIR
//
// OUT_DIR/cl100k_base.tiktoken  from `tiktoken` (the Rust core compiled to WASM): the bytes of
//                               every rank 0..n-1 via decode_single_token_bytes.
// OUT_DIR/llama3.tiktoken       from `llama3-tokenizer-js`, which exposes its vocabulary as
//                               `vocabById`: 128000 regular tokens as Hugging Face byte-level
//                               strings (GPT-2's byte-to-unicode map; id = rank), followed by its
//                               256 special tokens, which go to llama3_specials.txt (id name).
// OUT_DIR/llama3_tokenizer.json the same vocabulary in Hugging Face's tokenizer.json layout
//                               (as Meta's Llama-3 repository ships it), for ctitan's HF loader.
'use strict';
const fs = require('fs');
const path = require('path');

const LLAMA3_PATTERN = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function b64(bytes) { return Buffer.from(bytes).toString('base64'); }

// GPT-2's bytes_to_unicode, inverted: unicode char -> byte.
function unicodeToByte() {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) { bs.push(b); cs.push(256 + n); n++; }
  }
  const m = new Map();
  bs.forEach((b, i) => m.set(String.fromCharCode(cs[i]), b));
  return m;
}

async function main() {
  const [modDir, outDir] = process.argv.slice(2);
  if (!modDir || !outDir) throw new Error('usage: node export_vocab.js NODE_MODULES_DIR OUT_DIR');
  fs.mkdirSync(outDir, { recursive: true });

  // cl100k_base: ranks are contiguous 0..100255 (the specials start at 100257).
  const tiktoken = require(path.join(modDir, 'tiktoken'));
  const enc = tiktoken.get_encoding('cl100k_base');
  const n = enc.token_byte_values().length; // the regular tokens, ranks 0..n-1
  const lines = [];
  for (let r = 0; r < n; r++) lines.push(b64(enc.decode_single_token_bytes(r)) + ' ' + r);
  enc.free();
  fs.writeFileSync(path.join(outDir, 'cl100k_base.tiktoken'), lines.join('\n') + '\n');

  // Llama 3: vocabById = regular tokens then specials (llama3-tokenizer-js appends them).
  const mod = await import(path.join(modDir, 'llama3-tokenizer-js/bundle/llama3-tokenizer-with-baked-data.js'));
  const tok = mod.default;
  const u2b = unicodeToByte();
  const special = (s) => /^<\|.*\|>$/.test(s) && tok.getSpecialTokenId(s) >= 128000;
  const out = [], specials = [];
  tok.vocabById.forEach((s, id) => {
    if (id >= 128000) { specials.push(id + ' ' + s); return; }
    if (special(s)) throw new Error('special token inside the regular vocabulary: ' + s);
    const bytes = Array.from(s, (ch) => {
      if (!u2b.has(ch)) throw new Error(`token ${id} has a char outside the byte map`);
      return u2b.get(ch);
    });
    out.push(b64(bytes) + ' ' + id);
  });
  if (out.length !== 128000 || specials.length !== 256)
    throw new Error(`unexpected llama3 vocabulary: ${out.length} + ${specials.length}`);
  fs.writeFileSync(path.join(outDir, 'llama3.tiktoken'), out.join('\n') + '\n');
  fs.writeFileSync(path.join(outDir, 'llama3_specials.txt'), specials.join('\n') + '\n');

  // The same vocabulary as a Hugging Face tokenizer.json (the layout of Meta's
  // Llama-3 tokenizer.json: byte-level vocab, merges, added_tokens, Split + ByteLevel).
  const vocab = {};
  tok.vocabById.forEach((s, id) => { if (id < 128000) vocab[s] = id; });
  const hf = {
    version: '1.0',
    added_tokens: tok.vocabById.slice(128000).map((s, i) => ({
      id: 128000 + i, content: s, single_word: false, lstrip: false, rstrip: false,
      normalized: false, special: true })),
    normalizer: null,
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: LLAMA3_PATTERN }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: false, byte_fallback: false,
             ignore_merges: true, vocab, merges: Array.from(tok.merges.keys()) },
  };
  fs.writeFileSync(path.join(outDir, 'llama3_tokenizer.json'), JSON.stringify(hf));
  console.log(`export_vocab: cl100k_base ${lines.length} tokens, llama3 ${out.length} + ${specials.length} special`);
}

main().catch((e) => { console.error('export_vocab: ' + (e.stack || e)); process.exit(1); });
