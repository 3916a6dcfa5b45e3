/* data/tokenizer: byte-level BPE as in tiktoken and Llama 3 (train, encode, decode, load, save).
 *
 * A tokenizer is
 *   - N regular tokens, byte strings whose id is their rank 0..N-1; every single byte is one of
 *     them, so any byte string encodes, and decoding concatenates token bytes, so
 *     decode(encode(x)) == x for every byte string x, invalid UTF-8 included;
 *   - a pre-tokenization regex (PCRE2, UTF + UCP + MATCH_INVALID_UTF, JIT when available) that
 *     splits text into pieces; bytes no match covers (invalid UTF-8 never matches) form pieces of
 *     their own;
 *   - special tokens (`<|begin_of_text|>`, ...) with ids >= N. Plain encode never produces them:
 *     their names in a text are ordinary text. tok_encode_with_specials parses them.
 *
 * Encoding a piece (tiktoken's algorithm): a piece that is itself a token becomes that token;
 * otherwise start from its bytes and repeatedly merge the adjacent pair whose concatenation has
 * the lowest rank, leftmost first, until no adjacent pair concatenates to a token. Merges are
 * ranked by the vocabulary itself; there is no separate merges list.
 *
 * Regex semantics follow tiktoken (Rust `regex`), where \s is Unicode White_Space: PCRE2's \s
 * lacks U+0085 (NEL), so the pattern is compiled with `\s` widened to `[\s\x{85}]` (and `\S`
 * narrowed to match) outside character classes, and U+0085 added inside classes that use \s.
 * The pattern as given is what tok_pattern returns and tok_save writes.
 *
 * Files (docs/tokenizer.md):
 *   - tiktoken rank files (Llama 3's `tokenizer.model`, `cl100k_base.tiktoken`): one line per
 *     token, "BASE64 RANK\n"; ranks must be exactly 0..N-1 (any order), bytes unique. A file
 *     without a header gets the Llama 3 pattern and Llama 3's 256 special tokens (ids N..N+255).
 *   - the same, with a header written by tok_save (lines starting with '#', before the tokens):
 *         #ctitan-tokenizer 1
 *         #pattern BASE64(pattern)
 *         #special BASE64(name) ID        (one per special token; none when absent)
 *     Removing the '#' lines gives a file tiktoken itself loads.
 *   - Hugging Face `tokenizer.json` for byte-level BPE: model.vocab (GPT-2 byte-to-unicode
 *     strings), added_tokens as special tokens, the Split regex of the pre_tokenizer (or GPT-2's
 *     pattern for a plain ByteLevel pre-tokenizer).
 * Every loader validates the whole file and returns CT_ERR_RUNTIME with a message naming the file
 * (and line, for rank files) on any problem.
 *
 * Ownership and threads: every tokenizer is owned by its creator and freed with tok_free. The
 * vocabulary is immutable after load, but encode keeps its scratch (regex match data, merge
 * buffers, a piece cache) in the tokenizer: one tokenizer must not encode on two threads at once
 * (load one per thread).
 */
#ifndef CT_DATA_TOKENIZER_H
#define CT_DATA_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Llama 3 / cl100k_base pre-tokenization. */
#define TOK_PATTERN_LLAMA3                                                                         \
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                 \
	"?[^\\s\\p{L}\\p{N}]+"                                                                     \
	"[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* GPT-2 / r50k_base pre-tokenization (Hugging Face's ByteLevel pre-tokenizer). */
#define TOK_PATTERN_GPT2                                                                           \
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* Llama 3 (3.1 naming) has 256 special tokens after its 128000 regular ones. */
#define TOK_LLAMA3_N_SPECIAL 256

struct tok_tokenizer;

/* Growable outputs. Zero-initialise; encode and decode append; reuse across calls. */
struct tok_ids {
	int32_t *v;
	int64_t n, cap;
};
struct tok_bytes {
	uint8_t *v;
	size_t n, cap;
};
void tok_ids_free(struct tok_ids *a);
void tok_bytes_free(struct tok_bytes *b);

/* ---- construction, loading, saving ------------------------------------------------------ */

/* A tokenizer from its regular tokens (tokens[r], lens[r] for rank r = 0..n-1; all 256 single
 * bytes among them, no duplicates), a pattern (NULL: Llama 3) and special token names given ids
 * n, n+1, ... (specials == NULL: Llama 3's 256). `name` is used in messages. */
int tok_build(struct tok_tokenizer **out, const uint8_t *const *tokens, const size_t *lens,
              int64_t n, const char *pattern, const char *const *specials, int n_special,
              const char *name);
/* Rank file or tokenizer.json, chosen by content (a JSON file starts with '{'). */
int tok_load(struct tok_tokenizer **out, const char *path);
int tok_load_ranks(struct tok_tokenizer **out, const char *path);
int tok_load_ranks_mem(struct tok_tokenizer **out, const void *data, size_t len, const char *name);
int tok_load_hf(struct tok_tokenizer **out, const char *path);
int tok_load_hf_mem(struct tok_tokenizer **out, const char *json, size_t len, const char *name);
/* Rank file with the ctitan header (see above). Written to PATH.tmp, then renamed. */
int tok_save(const struct tok_tokenizer *t, const char *path);
void tok_free(struct tok_tokenizer *t);

/* ---- queries ------------------------------------------------------------------------------ */

int64_t tok_n_vocab(const struct tok_tokenizer *t); /* regular tokens N */
int64_t tok_n_ids(const struct tok_tokenizer *t);   /* 1 + the largest id, specials included */
int tok_n_special(const struct tok_tokenizer *t);
const char *tok_pattern(const struct tok_tokenizer *t);
/* The i-th special token (in id order): its name, and its id as the return value. */
int32_t tok_special_at(const struct tok_tokenizer *t, int i, const char **name);
/* Id of a special token by name, or -1. */
int32_t tok_special_id(const struct tok_tokenizer *t, const char *name);
/* Bytes of any id (a special's name for specials); NULL for an id that is not assigned. */
const uint8_t *tok_token_bytes(const struct tok_tokenizer *t, int32_t id, size_t *len);
/* Rank of a byte string, or -1 if it is not a regular token. */
int32_t tok_rank(const struct tok_tokenizer *t, const void *bytes, size_t len);

/* ---- encode, decode ------------------------------------------------------------------------ */

/* Append the ids of `text` to out. Special token names are plain text here. Returns 0, or
 * CT_ERR_RUNTIME if the regex engine fails (e.g. a pattern exhausting its limits). */
int tok_encode(struct tok_tokenizer *t, const void *text, size_t len, struct tok_ids *out);
/* As tok_encode, but every occurrence of a special token's name becomes its id (longest name
 * first); the text between them is encoded as independent texts, as tiktoken does. */
int tok_encode_with_specials(struct tok_tokenizer *t, const void *text, size_t len,
                             struct tok_ids *out);
/* Append the bytes of ids to out; an unassigned id is an error (CT_ERR_RUNTIME, named). */
int tok_decode(const struct tok_tokenizer *t, const int32_t *ids, int64_t n, struct tok_bytes *out);

/* Call fn on each pre-tokenization piece of text, in order (the pieces tile the text). A
 * non-zero return from fn stops the split and is returned. */
typedef int (*tok_piece_fn)(void *ctx, const uint8_t *piece, size_t len);
int tok_split(struct tok_tokenizer *t, const void *text, size_t len, tok_piece_fn fn, void *ctx);

/* Byte pair merge of one piece (no whole-piece shortcut): linked parts + a min-heap for long
 * pieces, tiktoken's array scan for short ones. tok_bpe_ref is the reference twin for tests: the
 * O(n^2) loop written as plainly as possible. */
void tok_bpe(struct tok_tokenizer *t, const uint8_t *piece, size_t len, struct tok_ids *out);
void tok_bpe_ref(const struct tok_tokenizer *t, const uint8_t *piece, size_t len,
                 struct tok_ids *out);

/* ---- training ------------------------------------------------------------------------------ */

struct tok_train_opts {
	int64_t vocab_size;          /* regular tokens: 256 bytes + merges (>= 256) */
	int64_t min_count;           /* stop when the best pair occurs fewer times; 0 means 2 */
	const char *pattern;         /* NULL: Llama 3 */
	const char *const *specials; /* NULL: <|begin_of_text|>, <|end_of_text|> */
	int n_special;               /* entries in specials when it is not NULL */
	bool progress;               /* log progress (LOG_INFO) */
};

/* Streaming trainer: add any number of texts (each pre-split on its own; only distinct pieces
 * and their counts are kept), then finish. Pairs are counted once per distinct piece times its
 * frequency and updated incrementally: each merge touches only the pieces containing the pair;
 * a lazy max-heap picks the most frequent pair (ties: smallest ids). Token ranks are the merge
 * order, bytes 0..255 first; a merge whose bytes already are a token adds no token. */
struct tok_trainer;
int tok_trainer_new(struct tok_trainer **out, const struct tok_train_opts *o);
int tok_trainer_add(struct tok_trainer *tr, const void *text, size_t len);
int tok_trainer_finish(struct tok_trainer *tr, struct tok_tokenizer **out);
void tok_trainer_free(struct tok_trainer *tr);
/* One text in one call. */
int tok_train(struct tok_tokenizer **out, const struct tok_train_opts *o, const void *text,
              size_t len);

#endif
