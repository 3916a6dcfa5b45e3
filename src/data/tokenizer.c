/* data/tokenizer: byte-level BPE (see tokenizer.h for the model, formats and ownership).
 *
 * Sections: small buffers and base64; the rank table (open addressing over token bytes); the
 * regex (pattern translation, compile, split); byte pair merge (short pieces: tiktoken's array
 * scan; long pieces: linked parts + min-heap; reference twin); the piece cache; encode and
 * decode; construction; rank-file and tokenizer.json loaders; save; training.
 */
#include "data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

/* ---- small buffers ------------------------------------------------------------------------- */

static void *xrealloc(void *p, size_t size)
{
	void *q = realloc(p, size ? size : 1);
	CHECK(q, "out of memory (%zu bytes)", size);
	return q;
}

static void ids_reserve(struct tok_ids *a, int64_t extra)
{
	if (a->n + extra <= a->cap)
		return;
	int64_t cap = a->cap ? a->cap : 256;
	while (cap < a->n + extra)
		cap *= 2;
	a->v = xrealloc(a->v, (size_t)cap * sizeof(*a->v));
	a->cap = cap;
}

static inline void ids_push(struct tok_ids *a, int32_t id)
{
	if (a->n == a->cap)
		ids_reserve(a, 1);
	a->v[a->n++] = id;
}

static void bytes_append(struct tok_bytes *b, const void *p, size_t n)
{
	if (b->n + n > b->cap) {
		size_t cap = b->cap ? b->cap : 1024;
		while (cap < b->n + n)
			cap *= 2;
		b->v = xrealloc(b->v, cap);
		b->cap = cap;
	}
	if (n)
		memcpy(b->v + b->n, p, n);
	b->n += n;
}

void tok_ids_free(struct tok_ids *a)
{
	free(a->v);
	memset(a, 0, sizeof(*a));
}

void tok_bytes_free(struct tok_bytes *b)
{
	free(b->v);
	memset(b, 0, sizeof(*b));
}

/* ---- base64 (standard alphabet, padded; decoding is strict: canonical input only) ---------- */

static const char b64_chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void b64_encode(struct tok_bytes *out, const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)p[i] << 16;
		if (i + 1 < n)
			v |= (uint32_t)p[i + 1] << 8;
		if (i + 2 < n)
			v |= p[i + 2];
		char q[4] = {b64_chars[v >> 18], b64_chars[(v >> 12) & 63],
		             i + 1 < n ? b64_chars[(v >> 6) & 63] : '=',
		             i + 2 < n ? b64_chars[v & 63] : '='};
		bytes_append(out, q, 4);
	}
}

static int b64_value(uint8_t c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+')
		return 62;
	if (c == '/')
		return 63;
	return -1;
}

/* Decodes s[0..n) into out (room for 3n/4 bytes); returns the byte count or -1. */
static int64_t b64_decode(const uint8_t *s, size_t n, uint8_t *out)
{
	if (n == 0 || n % 4)
		return -1;
	size_t o = 0;
	for (size_t i = 0; i < n; i += 4) {
		int v[4];
		int pad = 0;
		for (int k = 0; k < 4; k++) {
			if (s[i + k] == '=' && i + 4 == n && k >= 2) {
				v[k] = 0;
				pad++;
				continue;
			}
			if (pad) /* data after '=' */
				return -1;
			v[k] = b64_value(s[i + k]);
			if (v[k] < 0)
				return -1;
		}
		uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
		             (uint32_t)v[3];
		if ((pad == 1 && (w & 0xff)) || (pad == 2 && (w & 0xffff)))
			return -1; /* non-zero bits under the padding: not canonical */
		out[o++] = (uint8_t)(w >> 16);
		if (pad < 2)
			out[o++] = (uint8_t)(w >> 8);
		if (pad < 1)
			out[o++] = (uint8_t)w;
	}
	return (int64_t)o;
}

/* ---- hashing ------------------------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t h)
{
	h ^= h >> 31;
	h *= 0xd6e8feb86659fd93ull;
	h ^= h >> 32;
	return h;
}

static inline uint64_t hash_bytes(const uint8_t *p, size_t n)
{
	uint64_t h = 0x9e3779b97f4a7c15ull ^ ((uint64_t)n * 0xff51afd7ed558ccdull);
	while (n >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
		h ^= h >> 29;
		p += 8;
		n -= 8;
	}
	if (n) {
		uint64_t w = 0;
		for (size_t i = 0; i < n; i++)
			w |= (uint64_t)p[i] << (8 * i);
		h = (h ^ w) * 0x94d049bb133111ebull;
	}
	return mix64(h);
}

static uint64_t pow2_at_least(uint64_t n)
{
	uint64_t c = 16;
	while (c < n)
		c *= 2;
	return c;
}

/* ---- the tokenizer ------------------------------------------------------------------------- */

struct tok_slot {
	uint32_t tag; /* high half of the hash */
	int32_t rank; /* -1: empty */
};

struct tok_merge {
	uint64_t key; /* left << 32 | right; UINT64_MAX: empty */
	int32_t rank;
};

struct tok_special {
	char *name;
	size_t len;
	int32_t id;
};

/* Direct-mapped cache of merged pieces (pieces that are not tokens themselves). */
#define TOK_CACHE_SLOTS 4096
#define TOK_CACHE_BYTES 32
#define TOK_CACHE_IDS   12
struct tok_cache_entry {
	uint64_t hash;
	uint8_t len, n_ids; /* len 0: empty */
	uint8_t bytes[TOK_CACHE_BYTES];
	int32_t ids[TOK_CACHE_IDS];
};

/* Scratch for the heap merge of long pieces. */
struct tok_merge_buf {
	size_t cap;
	uint32_t *next, *prev;
	int32_t *pair_rank, *tok;
	uint64_t *heap;
};

struct tok_tokenizer {
	char name[512];
	int64_t n_vocab;
	uint8_t *bytes; /* token bytes, concatenated in rank order */
	int64_t *off;   /* n_vocab + 1 offsets into bytes */
	int32_t byte_rank[256];
	int32_t *pair2; /* 65536: rank of the 2-byte token (b0 << 8 | b1), or -1 */
	struct tok_slot *slots;
	uint64_t mask;
	/* merges: (left rank, right rank) -> rank of their concatenation, for every split of every
	 * token into two tokens. The parts of a piece are always tokens, so this answers every
	 * "do these two parts merge?" of byte pair merge without hashing bytes. */
	struct tok_merge *merges;
	uint64_t merge_mask;

	struct tok_special *sp; /* sorted by id */
	int n_special;
	/* encode_with_specials: specials hashed by bytes; the distinct name lengths, longest first
	 */
	int32_t *sp_slots; /* index into sp, -1 empty */
	uint64_t sp_mask;
	size_t *sp_lens;
	int n_sp_lens;
	bool sp_first[256];

	char *pattern;
	pcre2_code *re;
	pcre2_match_data *md;
	pcre2_match_context *mctx;
	pcre2_jit_stack *jstack;
	bool jit;

	struct tok_merge_buf mb;
	struct tok_cache_entry *cache;
};

int64_t tok_n_vocab(const struct tok_tokenizer *t)
{
	return t->n_vocab;
}
int tok_n_special(const struct tok_tokenizer *t)
{
	return t->n_special;
}
const char *tok_pattern(const struct tok_tokenizer *t)
{
	return t->pattern;
}

int64_t tok_n_ids(const struct tok_tokenizer *t)
{
	int64_t n = t->n_vocab;
	if (t->n_special && t->sp[t->n_special - 1].id + 1 > n)
		n = t->sp[t->n_special - 1].id + 1;
	return n;
}

int32_t tok_special_at(const struct tok_tokenizer *t, int i, const char **name)
{
	CHECK(i >= 0 && i < t->n_special, "special token %d of %d", i, t->n_special);
	if (name)
		*name = t->sp[i].name;
	return t->sp[i].id;
}

static inline size_t token_len(const struct tok_tokenizer *t, int32_t r)
{
	return (size_t)(t->off[r + 1] - t->off[r]);
}

/* The rank lookup on the hot path. */
static inline int32_t rank_lookup(const struct tok_tokenizer *t, const uint8_t *p, size_t n)
{
	if (n == 2)
		return t->pair2[(uint32_t)p[0] << 8 | p[1]];
	if (n == 1)
		return t->byte_rank[p[0]];
	uint64_t h = hash_bytes(p, n);
	uint32_t tag = (uint32_t)(h >> 32);
	for (uint64_t i = h & t->mask;; i = (i + 1) & t->mask) {
		const struct tok_slot *s = &t->slots[i];
		if (s->rank < 0)
			return -1;
		if (s->tag == tag && token_len(t, s->rank) == n &&
		    memcmp(t->bytes + t->off[s->rank], p, n) == 0)
			return s->rank;
	}
}

static inline uint64_t merge_hash(uint64_t key)
{
	return mix64(key * 0x9e3779b97f4a7c15ull);
}

/* Rank of tokens a and b merged, or -1. */
static inline int32_t merge_rank(const struct tok_tokenizer *t, int32_t a, int32_t b)
{
	uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	for (uint64_t i = merge_hash(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
		const struct tok_merge *m = &t->merges[i];
		if (m->key == key)
			return m->rank;
		if (m->key == UINT64_MAX)
			return -1;
	}
}

int32_t tok_rank(const struct tok_tokenizer *t, const void *bytes, size_t len)
{
	return len ? rank_lookup(t, bytes, len) : -1;
}

static const struct tok_special *special_by_id(const struct tok_tokenizer *t, int32_t id)
{
	int lo = 0, hi = t->n_special - 1;
	while (lo <= hi) {
		int mid = (lo + hi) / 2;
		if (t->sp[mid].id == id)
			return &t->sp[mid];
		if (t->sp[mid].id < id)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return NULL;
}

/* Index into sp of the special whose name is p[0..n), or -1. */
static int special_lookup(const struct tok_tokenizer *t, const uint8_t *p, size_t n)
{
	if (!t->sp_slots)
		return -1;
	for (uint64_t i = hash_bytes(p, n) & t->sp_mask;; i = (i + 1) & t->sp_mask) {
		int32_t k = t->sp_slots[i];
		if (k < 0)
			return -1;
		if (t->sp[k].len == n && memcmp(t->sp[k].name, p, n) == 0)
			return k;
	}
}

int32_t tok_special_id(const struct tok_tokenizer *t, const char *name)
{
	int k = special_lookup(t, (const uint8_t *)name, strlen(name));
	return k < 0 ? -1 : t->sp[k].id;
}

const uint8_t *tok_token_bytes(const struct tok_tokenizer *t, int32_t id, size_t *len)
{
	if (id >= 0 && id < t->n_vocab) {
		*len = token_len(t, id);
		return t->bytes + t->off[id];
	}
	const struct tok_special *s = special_by_id(t, id);
	if (!s)
		return NULL;
	*len = s->len;
	return (const uint8_t *)s->name;
}

/* ---- the regex ------------------------------------------------------------------------------ */

/* Rewrites the pattern so PCRE2's \s means Unicode White_Space as in tiktoken's Rust regex
 * (adds U+0085): outside classes \s -> [\s\x{85}], \S -> [^\s\x{85}]; inside a class \s ->
 * \s\x{85} (\S inside a class is left as it is). Escapes, \Q..\E and POSIX [:..:] are skipped. */
static char *pattern_translate(const char *pat)
{
	size_t n = strlen(pat);
	char *out = xcalloc(n * 6 + 1, 1);
	size_t o = 0;
	bool in_class = false, quoted = false;
	for (size_t i = 0; i < n; i++) {
		char c = pat[i];
		if (quoted) {
			if (c == '\\' && pat[i + 1] == 'E') {
				quoted = false;
				out[o++] = pat[i++];
			}
			out[o++] = pat[i];
			continue;
		}
		if (c == '\\' && i + 1 < n) {
			char e = pat[i + 1];
			const char *rep = NULL;
			if (e == 's')
				rep = in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
			else if (e == 'S' && !in_class)
				rep = "[^\\s\\x{85}]";
			else if (e == 'Q')
				quoted = true;
			if (rep) {
				memcpy(out + o, rep, strlen(rep));
				o += strlen(rep);
			} else {
				out[o++] = c;
				out[o++] = e;
			}
			i++;
			continue;
		}
		if (!in_class && c == '[') {
			in_class = true;
			out[o++] = c;
			/* a ']' right after '[' or '[^' is a literal */
			if (pat[i + 1] == '^')
				out[o++] = pat[++i];
			if (pat[i + 1] == ']')
				out[o++] = pat[++i];
			continue;
		}
		if (in_class && c == '[' && pat[i + 1] == ':') {
			const char *end = strstr(pat + i + 2, ":]");
			if (end) {
				size_t k = (size_t)(end + 2 - (pat + i));
				memcpy(out + o, pat + i, k);
				o += k;
				i += k - 1;
				continue;
			}
		}
		if (in_class && c == ']')
			in_class = false;
		out[o++] = c;
	}
	out[o] = 0;
	return out;
}

static int regex_compile(struct tok_tokenizer *t, const char *pattern)
{
	t->pattern = xstrdup(pattern);
	char *pcre_pat = pattern_translate(pattern);
	int errcode;
	PCRE2_SIZE erroff;
	t->re =
	    pcre2_compile((PCRE2_SPTR)pcre_pat, PCRE2_ZERO_TERMINATED,
	                  PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &errcode, &erroff, NULL);
	free(pcre_pat);
	if (!t->re) {
		PCRE2_UCHAR msg[256];
		pcre2_get_error_message(errcode, msg, sizeof(msg));
		LOG_ERROR("%s: bad pre-tokenization pattern at offset %zu: %s", t->name,
		          (size_t)erroff, (const char *)msg);
		return CT_ERR_RUNTIME;
	}
	t->jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
	t->md = pcre2_match_data_create_from_pattern(t->re, NULL);
	t->mctx = pcre2_match_context_create(NULL);
	CHECK(t->md && t->mctx, "out of memory (PCRE2)");
	if (t->jit) {
		/* Long whitespace or symbol runs backtrack deeply; 64 MiB is plenty for any input.
		 */
		t->jstack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, NULL);
		CHECK(t->jstack, "out of memory (PCRE2 JIT stack)");
		pcre2_jit_stack_assign(t->mctx, NULL, t->jstack);
	}
	/* The patterns above are linear; these limits only stop a pathological custom pattern. */
	pcre2_set_match_limit(t->mctx, UINT32_MAX);
	pcre2_set_depth_limit(t->mctx, UINT32_MAX);
	return CT_OK;
}

static int regex_match(struct tok_tokenizer *t, const uint8_t *s, size_t n, size_t at,
                       uint32_t opts)
{
	if (t->jit)
		return pcre2_jit_match(t->re, s, n, at, opts, t->md, t->mctx);
	return pcre2_match(t->re, s, n, at, opts, t->md, t->mctx);
}

static int regex_error(const struct tok_tokenizer *t, int rc)
{
	PCRE2_UCHAR msg[256];
	pcre2_get_error_message(rc, msg, sizeof(msg));
	LOG_ERROR("%s: pre-tokenization regex failed: %s", t->name, (const char *)msg);
	return CT_ERR_RUNTIME;
}

int tok_split(struct tok_tokenizer *t, const void *text, size_t len, tok_piece_fn fn, void *ctx)
{
	const uint8_t *s = text;
	size_t gap = 0, at = 0; /* bytes [gap, match start) belong to no match */
	while (at < len) {
		int rc = regex_match(t, s, len, at, 0);
		if (rc == PCRE2_ERROR_NOMATCH)
			break;
		if (rc < 0)
			return regex_error(t, rc);
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
		size_t a = ov[0], b = ov[1];
		if (a == b) { /* an empty match: look for a non-empty one here, else move on */
			rc = regex_match(t, s, len, a, PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED);
			if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)
				return regex_error(t, rc);
			if (rc < 0) {
				at = a + 1;
				while (at < len && (s[at] & 0xc0) == 0x80)
					at++;
				continue;
			}
			b = ov[1];
		}
		int r;
		if (a > gap && (r = fn(ctx, s + gap, a - gap)))
			return r;
		if ((r = fn(ctx, s + a, b - a)))
			return r;
		gap = at = b;
	}
	if (gap < len)
		return fn(ctx, s + gap, len - gap);
	return 0;
}

/* ---- byte pair merge --------------------------------------------------------------------- */

/* Pieces up to this length use the array scan (like tiktoken); longer ones the heap. */
#define TOK_SMALL_PIECE 64

/* tiktoken's _byte_pair_merge: parts k = 0..m-1 start at st[k] (st[m] = n is the end);
 * rk[k] is the rank of parts k and k+1 merged (INT32_MAX: not a token); tk[k] is the token of
 * part k. */
static void bpe_small(const struct tok_tokenizer *t, const uint8_t *p, size_t n,
                      struct tok_ids *out)
{
	uint32_t st[TOK_SMALL_PIECE + 1];
	int32_t rk[TOK_SMALL_PIECE + 1], tk[TOK_SMALL_PIECE];
	size_t m = n;
	for (size_t k = 0; k < n; k++) {
		st[k] = (uint32_t)k;
		tk[k] = t->byte_rank[p[k]];
		int32_t r = k + 1 < n ? t->pair2[(uint32_t)p[k] << 8 | p[k + 1]] : -1;
		rk[k] = r < 0 ? INT32_MAX : r;
	}
	st[n] = (uint32_t)n;
	for (;;) {
		int32_t best = INT32_MAX;
		size_t i = 0;
		for (size_t k = 0; k + 1 < m; k++)
			if (rk[k] < best) {
				best = rk[k];
				i = k;
			}
		if (best == INT32_MAX)
			break;
		/* merge parts i and i+1 */
		tk[i] = best;
		memmove(st + i + 1, st + i + 2, (m - i - 1) * sizeof(*st));
		memmove(rk + i + 1, rk + i + 2, (m - i - 2) * sizeof(*rk));
		memmove(tk + i + 1, tk + i + 2, (m - i - 2) * sizeof(*tk));
		m--;
		int32_t r = i + 1 < m ? merge_rank(t, tk[i], tk[i + 1]) : -1;
		rk[i] = r < 0 ? INT32_MAX : r;
		if (i > 0) {
			r = merge_rank(t, tk[i - 1], tk[i]);
			rk[i - 1] = r < 0 ? INT32_MAX : r;
		}
	}
	ids_reserve(out, (int64_t)m);
	for (size_t k = 0; k < m; k++)
		out->v[out->n++] = tk[k];
}

static void merge_buf_reserve(struct tok_merge_buf *b, size_t n)
{
	if (n <= b->cap)
		return;
	size_t cap = pow2_at_least(n);
	b->next = xrealloc(b->next, cap * sizeof(*b->next));
	b->prev = xrealloc(b->prev, cap * sizeof(*b->prev));
	b->pair_rank = xrealloc(b->pair_rank, cap * sizeof(*b->pair_rank));
	b->tok = xrealloc(b->tok, cap * sizeof(*b->tok));
	b->heap = xrealloc(b->heap, 3 * cap * sizeof(*b->heap));
	b->cap = cap;
}

static void merge_buf_free(struct tok_merge_buf *b)
{
	free(b->next);
	free(b->prev);
	free(b->pair_rank);
	free(b->tok);
	free(b->heap);
	memset(b, 0, sizeof(*b));
}

/* Min-heap of keys rank << 32 | part: lowest rank first, then leftmost part. */
static void heap_push(uint64_t *h, size_t *n, uint64_t key)
{
	size_t i = (*n)++;
	while (i > 0) {
		size_t up = (i - 1) / 2;
		if (h[up] <= key)
			break;
		h[i] = h[up];
		i = up;
	}
	h[i] = key;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
	uint64_t top = h[0], last = h[--*n];
	size_t i = 0, size = *n;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= size)
			break;
		if (c + 1 < size && h[c + 1] < h[c])
			c++;
		if (last <= h[c])
			break;
		h[i] = h[c];
		i = c;
	}
	if (size)
		h[i] = last;
	return top;
}

/* Long pieces: parts are a doubly linked list over their start offsets (part k starts at byte k;
 * dead parts are skipped); pair_rank[k] is the rank of part k merged with its successor. A heap
 * entry is current iff its part is alive and its rank equals pair_rank[part] (equal ranks mean
 * equal bytes, so an entry that survived a neighbour's merge is still the same merge). */
static void bpe_heap(struct tok_tokenizer *t, const uint8_t *p, size_t n, struct tok_ids *out)
{
	struct tok_merge_buf *b = &t->mb;
	merge_buf_reserve(b, n + 1);
	const uint32_t NIL = UINT32_MAX;
	size_t hn = 0;
	for (size_t k = 0; k < n; k++) {
		b->next[k] = (uint32_t)(k + 1);
		b->prev[k] = k ? (uint32_t)(k - 1) : NIL;
		b->tok[k] = t->byte_rank[p[k]];
		b->pair_rank[k] = k + 1 < n ? t->pair2[(uint32_t)p[k] << 8 | p[k + 1]] : -1;
		if (b->pair_rank[k] >= 0)
			heap_push(b->heap, &hn, (uint64_t)b->pair_rank[k] << 32 | k);
	}
	/* next[k] == n is the end; a dead part has tok -1 */
	while (hn) {
		uint64_t key = heap_pop(b->heap, &hn);
		uint32_t i = (uint32_t)key;
		int32_t r = (int32_t)(key >> 32);
		if (b->tok[i] < 0 || b->pair_rank[i] != r)
			continue;
		uint32_t j = b->next[i];
		b->tok[i] = r;
		b->tok[j] = -1;
		uint32_t nj = b->next[j];
		b->next[i] = nj;
		if (nj < n)
			b->prev[nj] = i;
		if (nj < n) {
			b->pair_rank[i] = merge_rank(t, r, b->tok[nj]);
			if (b->pair_rank[i] >= 0)
				heap_push(b->heap, &hn, (uint64_t)b->pair_rank[i] << 32 | i);
		} else {
			b->pair_rank[i] = -1;
		}
		uint32_t pi = b->prev[i];
		if (pi != NIL) {
			b->pair_rank[pi] = merge_rank(t, b->tok[pi], r);
			if (b->pair_rank[pi] >= 0)
				heap_push(b->heap, &hn, (uint64_t)b->pair_rank[pi] << 32 | pi);
		}
	}
	for (uint32_t k = 0; k < n; k = b->next[k])
		ids_push(out, b->tok[k]);
}

void tok_bpe(struct tok_tokenizer *t, const uint8_t *piece, size_t len, struct tok_ids *out)
{
	if (len == 0)
		return;
	if (len <= TOK_SMALL_PIECE)
		bpe_small(t, piece, len, out);
	else
		bpe_heap(t, piece, len, out);
}

void tok_bpe_ref(const struct tok_tokenizer *t, const uint8_t *piece, size_t len,
                 struct tok_ids *out)
{
	if (len == 0)
		return;
	/* parts as (start, end) pairs; merge the leftmost lowest-rank adjacent pair until none */
	size_t *st = xcalloc(len + 1, sizeof(*st));
	size_t m = len;
	for (size_t k = 0; k <= len; k++)
		st[k] = k;
	for (;;) {
		int32_t best = -1;
		size_t at = 0;
		for (size_t k = 0; k + 1 < m; k++) {
			int32_t r = tok_rank(t, piece + st[k], st[k + 2] - st[k]);
			if (r >= 0 && (best < 0 || r < best)) {
				best = r;
				at = k;
			}
		}
		if (best < 0)
			break;
		memmove(st + at + 1, st + at + 2, (m - at - 1) * sizeof(*st));
		m--;
	}
	for (size_t k = 0; k < m; k++) {
		int32_t r = tok_rank(t, piece + st[k], st[k + 1] - st[k]);
		CHECK(r >= 0, "bpe_ref: part is not a token");
		ids_push(out, r);
	}
	free(st);
}

/* ---- encode, decode ------------------------------------------------------------------------- */

struct encode_ctx {
	struct tok_tokenizer *t;
	struct tok_ids *out;
};

static void encode_piece(struct tok_tokenizer *t, const uint8_t *p, size_t n, struct tok_ids *out)
{
	int32_t r = rank_lookup(t, p, n);
	if (r >= 0) { /* tiktoken's shortcut: a piece that is a token is that token */
		ids_push(out, r);
		return;
	}
	if (n > TOK_CACHE_BYTES) {
		tok_bpe(t, p, n, out);
		return;
	}
	uint64_t h = hash_bytes(p, n);
	struct tok_cache_entry *e = &t->cache[h & (TOK_CACHE_SLOTS - 1)];
	if (e->len == n && e->hash == h && memcmp(e->bytes, p, n) == 0) {
		ids_reserve(out, e->n_ids);
		memcpy(out->v + out->n, e->ids, e->n_ids * sizeof(int32_t));
		out->n += e->n_ids;
		return;
	}
	int64_t first = out->n;
	tok_bpe(t, p, n, out);
	int64_t k = out->n - first;
	if (k <= TOK_CACHE_IDS) {
		e->hash = h;
		e->len = (uint8_t)n;
		e->n_ids = (uint8_t)k;
		memcpy(e->bytes, p, n);
		memcpy(e->ids, out->v + first, (size_t)k * sizeof(int32_t));
	}
}

static int encode_piece_cb(void *ctx, const uint8_t *p, size_t n)
{
	struct encode_ctx *c = ctx;
	encode_piece(c->t, p, n, c->out);
	return 0;
}

int tok_encode(struct tok_tokenizer *t, const void *text, size_t len, struct tok_ids *out)
{
	struct encode_ctx c = {t, out};
	ids_reserve(out, (int64_t)(len / 4 + 16));
	return tok_split(t, text, len, encode_piece_cb, &c);
}

int tok_encode_with_specials(struct tok_tokenizer *t, const void *text, size_t len,
                             struct tok_ids *out)
{
	const uint8_t *s = text;
	size_t start = 0;
	for (size_t i = 0; i < len; i++) {
		if (!t->sp_first[s[i]])
			continue;
		for (int k = 0; k < t->n_sp_lens; k++) {
			size_t L = t->sp_lens[k];
			if (L > len - i)
				continue;
			int j = special_lookup(t, s + i, L);
			if (j < 0)
				continue;
			int rc = tok_encode(t, s + start, i - start, out);
			if (rc)
				return rc;
			ids_push(out, t->sp[j].id);
			start = i + L;
			i = start - 1;
			break;
		}
	}
	return tok_encode(t, s + start, len - start, out);
}

int tok_decode(const struct tok_tokenizer *t, const int32_t *ids, int64_t n, struct tok_bytes *out)
{
	for (int64_t i = 0; i < n; i++) {
		size_t len;
		const uint8_t *p = tok_token_bytes(t, ids[i], &len);
		if (!p) {
			LOG_ERROR("%s: token id %d (position %lld) is not assigned (ids 0..%lld)",
			          t->name, (int)ids[i], (long long)i, (long long)tok_n_ids(t) - 1);
			return CT_ERR_RUNTIME;
		}
		bytes_append(out, p, len);
	}
	return CT_OK;
}

/* ---- construction ------------------------------------------------------------------------ */

void tok_free(struct tok_tokenizer *t)
{
	if (!t)
		return;
	free(t->bytes);
	free(t->off);
	free(t->pair2);
	free(t->slots);
	free(t->merges);
	for (int i = 0; i < t->n_special; i++)
		free(t->sp[i].name);
	free(t->sp);
	free(t->sp_slots);
	free(t->sp_lens);
	free(t->pattern);
	if (t->md)
		pcre2_match_data_free(t->md);
	if (t->mctx)
		pcre2_match_context_free(t->mctx);
	if (t->jstack)
		pcre2_jit_stack_free(t->jstack);
	if (t->re)
		pcre2_code_free(t->re);
	merge_buf_free(&t->mb);
	free(t->cache);
	free(t);
}

/* Names for messages: a short, printable rendering of token bytes. */
static void render_bytes(char *buf, size_t cap, const uint8_t *p, size_t n)
{
	size_t o = 0;
	for (size_t i = 0; i < n && o + 5 < cap; i++) {
		if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\')
			buf[o++] = (char)p[i];
		else
			o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", p[i]);
	}
	buf[o] = 0;
}

/* Inserts rank r; returns the rank already holding these bytes, or -1. */
static int32_t slots_insert(struct tok_tokenizer *t, int32_t r)
{
	const uint8_t *p = t->bytes + t->off[r];
	size_t n = token_len(t, r);
	uint64_t h = hash_bytes(p, n);
	uint32_t tag = (uint32_t)(h >> 32);
	for (uint64_t i = h & t->mask;; i = (i + 1) & t->mask) {
		struct tok_slot *s = &t->slots[i];
		if (s->rank < 0) {
			s->tag = tag;
			s->rank = r;
			return -1;
		}
		if (s->tag == tag && token_len(t, s->rank) == n &&
		    memcmp(t->bytes + t->off[s->rank], p, n) == 0)
			return s->rank;
	}
}

static int cmp_special_id(const void *a, const void *b)
{
	const struct tok_special *x = a, *y = b;
	return (x->id > y->id) - (x->id < y->id);
}

static int cmp_size_desc(const void *a, const void *b)
{
	size_t x = *(const size_t *)a, y = *(const size_t *)b;
	return (x < y) - (x > y);
}

/* Takes ownership of sp[].name. Validates ids (>= n_vocab, unique) and names (non-empty,
 * unique). */
static int specials_set(struct tok_tokenizer *t, struct tok_special *sp, int n)
{
	t->sp = sp;
	t->n_special = n;
	if (n > 0)
		qsort(sp, (size_t)n, sizeof(*sp), cmp_special_id);
	t->sp_mask = pow2_at_least(2 * (uint64_t)n) - 1;
	t->sp_slots = xcalloc(t->sp_mask + 1, sizeof(*t->sp_slots));
	memset(t->sp_slots, 0xff, (t->sp_mask + 1) * sizeof(*t->sp_slots));
	t->sp_lens = xcalloc((size_t)n + 1, sizeof(*t->sp_lens));
	for (int k = 0; k < n; k++) {
		if (sp[k].id < t->n_vocab || (k && sp[k].id == sp[k - 1].id)) {
			LOG_ERROR(
			    "%s: special token '%s' has id %d: ids must be unique and >= %lld "
			    "(the regular vocabulary size)",
			    t->name, sp[k].name, (int)sp[k].id, (long long)t->n_vocab);
			return CT_ERR_RUNTIME;
		}
		if (sp[k].len == 0) {
			LOG_ERROR("%s: special token with id %d has an empty name", t->name,
			          (int)sp[k].id);
			return CT_ERR_RUNTIME;
		}
		if (special_lookup(t, (const uint8_t *)sp[k].name, sp[k].len) >= 0) {
			LOG_ERROR("%s: special token '%s' given twice", t->name, sp[k].name);
			return CT_ERR_RUNTIME;
		}
		uint64_t i = hash_bytes((const uint8_t *)sp[k].name, sp[k].len) & t->sp_mask;
		while (t->sp_slots[i] >= 0)
			i = (i + 1) & t->sp_mask;
		t->sp_slots[i] = k;
		t->sp_first[(uint8_t)sp[k].name[0]] = true;
		bool seen = false;
		for (int j = 0; j < t->n_sp_lens; j++)
			seen |= t->sp_lens[j] == sp[k].len;
		if (!seen)
			t->sp_lens[t->n_sp_lens++] = sp[k].len;
	}
	qsort(t->sp_lens, (size_t)t->n_sp_lens, sizeof(size_t), cmp_size_desc);
	return CT_OK;
}

/* Llama 3.1's special tokens, ids n_vocab + i. */
static struct tok_special *llama3_specials(int64_t n_vocab)
{
	static const char *const named[] = {
	    "<|begin_of_text|>",
	    "<|end_of_text|>",
	    "<|reserved_special_token_0|>",
	    "<|reserved_special_token_1|>",
	    "<|finetune_right_pad_id|>",
	    "<|reserved_special_token_2|>",
	    "<|start_header_id|>",
	    "<|end_header_id|>",
	    "<|eom_id|>",
	    "<|eot_id|>",
	    "<|python_tag|>",
	};
	const int n_named = (int)(sizeof(named) / sizeof(named[0]));
	struct tok_special *sp = xcalloc(TOK_LLAMA3_N_SPECIAL, sizeof(*sp));
	for (int i = 0; i < TOK_LLAMA3_N_SPECIAL; i++) {
		char buf[64];
		if (i < n_named)
			snprintf(buf, sizeof(buf), "%s", named[i]);
		else
			snprintf(buf, sizeof(buf), "<|reserved_special_token_%d|>",
			         i - n_named + 3);
		sp[i].name = xstrdup(buf);
		sp[i].len = strlen(buf);
		sp[i].id = (int32_t)(n_vocab + i);
	}
	return sp;
}

static void merges_insert(struct tok_tokenizer *t, int32_t a, int32_t b, int32_t r)
{
	uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	uint64_t i = merge_hash(key) & t->merge_mask;
	while (t->merges[i].key != UINT64_MAX && t->merges[i].key != key)
		i = (i + 1) & t->merge_mask;
	t->merges[i].key = key;
	t->merges[i].rank = r;
}

/* Every split of every token into two tokens. Two passes: count, then fill. */
static void merges_build(struct tok_tokenizer *t)
{
	uint64_t count = 0;
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1) {
			t->merge_mask = pow2_at_least(2 * count + 1) - 1;
			t->merges = xcalloc(t->merge_mask + 1, sizeof(*t->merges));
			for (uint64_t i = 0; i <= t->merge_mask; i++)
				t->merges[i].key = UINT64_MAX;
		}
		for (int64_t r = 0; r < t->n_vocab; r++) {
			const uint8_t *p = t->bytes + t->off[r];
			size_t n = token_len(t, (int32_t)r);
			for (size_t k = 1; k < n; k++) {
				int32_t a = rank_lookup(t, p, k);
				if (a < 0)
					continue;
				int32_t b = rank_lookup(t, p + k, n - k);
				if (b < 0)
					continue;
				if (pass == 0)
					count++;
				else
					merges_insert(t, a, b, (int32_t)r);
			}
		}
	}
}

/* Takes the concatenated token bytes and offsets (ranks 0..n-1) and `line` (for messages, may be
 * NULL: line of rank r in the source file). Validates uniqueness and the 256 single bytes. */
static int tok_init(struct tok_tokenizer *t, uint8_t *bytes, int64_t *off, int64_t n,
                    const int64_t *line)
{
	t->bytes = bytes;
	t->off = off;
	t->n_vocab = n;
	if (n <= 0 || n > INT32_MAX - (1 << 20)) {
		LOG_ERROR("%s: %lld regular tokens (need 256 .. 2^31 - 2^20)", t->name,
		          (long long)n);
		return CT_ERR_RUNTIME;
	}
	t->mask = pow2_at_least(2 * (uint64_t)n) - 1;
	t->slots = xcalloc(t->mask + 1, sizeof(*t->slots));
	for (uint64_t i = 0; i <= t->mask; i++)
		t->slots[i].rank = -1;
	for (int k = 0; k < 256; k++)
		t->byte_rank[k] = -1;
	t->pair2 = xcalloc(65536, sizeof(*t->pair2));
	memset(t->pair2, 0xff, 65536 * sizeof(*t->pair2));
	for (int64_t r = 0; r < n; r++) {
		size_t len = token_len(t, (int32_t)r);
		const uint8_t *p = bytes + off[r];
		char shown[96];
		if (len == 0) {
			if (line)
				LOG_ERROR("%s:%lld: empty token (rank %lld)", t->name,
				          (long long)line[r], (long long)r);
			else
				LOG_ERROR("%s: empty token (rank %lld)", t->name, (long long)r);
			return CT_ERR_RUNTIME;
		}
		int32_t dup = slots_insert(t, (int32_t)r);
		if (dup >= 0) {
			render_bytes(shown, sizeof(shown), p, len);
			if (line)
				LOG_ERROR("%s:%lld: token '%s' (rank %lld) duplicates rank %d "
				          "(line %lld)",
				          t->name, (long long)line[r], shown, (long long)r,
				          (int)dup, (long long)line[dup]);
			else
				LOG_ERROR("%s: token '%s' (rank %lld) duplicates rank %d", t->name,
				          shown, (long long)r, (int)dup);
			return CT_ERR_RUNTIME;
		}
		if (len == 1)
			t->byte_rank[p[0]] = (int32_t)r;
		else if (len == 2)
			t->pair2[(uint32_t)p[0] << 8 | p[1]] = (int32_t)r;
	}
	for (int k = 0; k < 256; k++)
		if (t->byte_rank[k] < 0) {
			LOG_ERROR(
			    "%s: byte 0x%02x is not a token (byte-level BPE needs all 256 single "
			    "bytes)",
			    t->name, k);
			return CT_ERR_RUNTIME;
		}
	merges_build(t);
	t->cache = xcalloc(TOK_CACHE_SLOTS, sizeof(*t->cache));
	return CT_OK;
}

static struct tok_tokenizer *tok_alloc(const char *name)
{
	struct tok_tokenizer *t = xcalloc(1, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s", name ? name : "tokenizer");
	return t;
}

/* Common tail of every constructor: vocabulary, specials (owned), pattern. */
static int tok_finish(struct tok_tokenizer **out, struct tok_tokenizer *t, uint8_t *bytes,
                      int64_t *off, int64_t n, const int64_t *line, struct tok_special *sp,
                      int n_special, const char *pattern)
{
	int rc = tok_init(t, bytes, off, n, line);
	if (rc) {
		for (int i = 0; i < n_special; i++)
			free(sp[i].name);
		free(sp);
		goto out_free;
	}
	rc = specials_set(t, sp, n_special);
	if (!rc)
		rc = regex_compile(t, pattern ? pattern : TOK_PATTERN_LLAMA3);
	if (rc)
		goto out_free;
	*out = t;
	return CT_OK;
out_free:
	tok_free(t);
	*out = NULL;
	return rc;
}

int tok_build(struct tok_tokenizer **out, const uint8_t *const *tokens, const size_t *lens,
              int64_t n, const char *pattern, const char *const *specials, int n_special,
              const char *name)
{
	struct tok_tokenizer *t = tok_alloc(name);
	size_t total = 0;
	for (int64_t r = 0; r < n; r++)
		total += lens[r];
	uint8_t *bytes = xcalloc(total + 1, 1);
	int64_t *off = xcalloc((size_t)(n > 0 ? n : 0) + 1, sizeof(*off));
	for (int64_t r = 0; r < n; r++) {
		memcpy(bytes + off[r], tokens[r], lens[r]);
		off[r + 1] = off[r] + (int64_t)lens[r];
	}
	struct tok_special *sp;
	if (!specials) {
		n_special = TOK_LLAMA3_N_SPECIAL;
		sp = llama3_specials(n);
	} else {
		sp = xcalloc((size_t)n_special + 1, sizeof(*sp));
		for (int i = 0; i < n_special; i++) {
			sp[i].name = xstrdup(specials[i]);
			sp[i].len = strlen(specials[i]);
			sp[i].id = (int32_t)(n + i);
		}
	}
	return tok_finish(out, t, bytes, off, n, NULL, sp, n_special, pattern);
}

/* ---- loaders -------------------------------------------------------------------------------- */

static int read_file(const char *path, char **data, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		LOG_ERROR("%s: cannot open: %s", path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	struct tok_bytes b = {0};
	char buf[1 << 16];
	size_t k;
	while ((k = fread(buf, 1, sizeof(buf), f)) > 0)
		bytes_append(&b, buf, k);
	int err = ferror(f);
	fclose(f);
	if (err) {
		LOG_ERROR("%s: read error", path);
		tok_bytes_free(&b);
		return CT_ERR_RUNTIME;
	}
	bytes_append(&b, "", 1); /* NUL for the JSON parser; not counted */
	*data = (char *)b.v;
	*len = b.n - 1;
	return CT_OK;
}

/* Parses a decimal in [0, max]; returns -1 otherwise. */
static int64_t parse_uint(const uint8_t *s, size_t n, int64_t max)
{
	if (n == 0 || n > 10)
		return -1;
	int64_t v = 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (s[i] - '0');
	}
	return v <= max ? v : -1;
}

/* One "#..." header line of a ctitan rank file. */
static int parse_directive(const char *name, int64_t lineno, const uint8_t *s, size_t n,
                           char **pattern, struct tok_special **sp, int *n_sp, int *cap_sp)
{
	const uint8_t *sep = memchr(s, ' ', n);
	size_t kw = sep ? (size_t)(sep - s) : n;
	const uint8_t *arg = sep ? sep + 1 : s + n;
	size_t alen = (size_t)(s + n - arg);
	uint8_t *dec = xcalloc(alen + 1, 1);
	int rc = CT_ERR_RUNTIME;
	if (kw == 8 && memcmp(s, "#pattern", 8) == 0) {
		int64_t k = b64_decode(arg, alen, dec);
		if (k < 0 || *pattern || memchr(dec, 0, (size_t)k)) {
			LOG_ERROR("%s:%lld: bad #pattern line (base64 of the pattern, once)", name,
			          (long long)lineno);
			goto out;
		}
		*pattern = (char *)dec;
		return CT_OK;
	}
	if (kw == 8 && memcmp(s, "#special", 8) == 0) {
		const uint8_t *sp2 = memchr(arg, ' ', alen);
		int64_t k = sp2 ? b64_decode(arg, (size_t)(sp2 - arg), dec) : -1;
		int64_t id =
		    sp2 ? parse_uint(sp2 + 1, (size_t)(arg + alen - sp2 - 1), INT32_MAX - 1) : -1;
		if (k <= 0 || id < 0 || memchr(dec, 0, (size_t)k)) {
			LOG_ERROR("%s:%lld: bad #special line (want '#special BASE64(name) ID')",
			          name, (long long)lineno);
			goto out;
		}
		if (*n_sp == *cap_sp) {
			*cap_sp = *cap_sp ? 2 * *cap_sp : 16;
			*sp = xrealloc(*sp, (size_t)*cap_sp * sizeof(**sp));
		}
		(*sp)[*n_sp].name = (char *)dec;
		(*sp)[*n_sp].len = (size_t)k;
		(*sp)[*n_sp].id = (int32_t)id;
		(*n_sp)++;
		return CT_OK;
	}
	LOG_ERROR("%s:%lld: unknown header line (known: #ctitan-tokenizer, #pattern, #special)",
	          name, (long long)lineno);
out:
	free(dec);
	return rc;
}

int tok_load_ranks_mem(struct tok_tokenizer **out, const void *data, size_t len, const char *name)
{
	const uint8_t *s = data;
	*out = NULL;
	int rc = CT_ERR_RUNTIME;
	/* count token lines to size the arrays; then parse */
	int64_t cap = 1;
	for (size_t i = 0; i < len; i++)
		cap += s[i] == '\n';
	uint8_t *bytes = xcalloc(len + 1, 1);
	int64_t *pos = xcalloc((size_t)cap, sizeof(*pos)); /* by line order: offset in bytes */
	int64_t *ln = xcalloc((size_t)cap, sizeof(*ln));   /* by line order: line number */
	int64_t *rk = xcalloc((size_t)cap, sizeof(*rk));   /* by line order: rank */
	int64_t *by_rank =
	    xcalloc((size_t)cap, sizeof(*by_rank)); /* rank -> line order index + 1 */
	char *pattern = NULL;
	struct tok_special *sp = NULL;
	int n_sp = 0, cap_sp = 0;
	bool header = false;
	int64_t n = 0, lineno = 0;
	size_t used = 0;
	for (size_t i = 0; i < len;) {
		const uint8_t *nl = memchr(s + i, '\n', len - i);
		lineno++;
		if (!nl) {
			LOG_ERROR("%s:%lld: last line has no newline (truncated file?)", name,
			          (long long)lineno);
			goto out_free;
		}
		size_t e = (size_t)(nl - s), L = e - i;
		const uint8_t *line = s + i;
		i = e + 1;
		if (L && line[L - 1] == '\r')
			L--;
		if (L == 0)
			continue;
		if (line[0] == '#') {
			if (lineno == 1 && L == 19 &&
			    memcmp(line, "#ctitan-tokenizer 1", 19) == 0) {
				header = true;
				continue;
			}
			if (!header || n > 0) {
				LOG_ERROR("%s:%lld: '#' line %s", name, (long long)lineno,
				          header ? "after the first token"
				                 : "without '#ctitan-tokenizer 1' on line 1");
				goto out_free;
			}
			rc = parse_directive(name, lineno, line, L, &pattern, &sp, &n_sp, &cap_sp);
			if (rc)
				goto out_free;
			rc = CT_ERR_RUNTIME;
			continue;
		}
		const uint8_t *sep = memchr(line, ' ', L);
		if (!sep) {
			LOG_ERROR("%s:%lld: expected 'BASE64 RANK'", name, (long long)lineno);
			goto out_free;
		}
		int64_t k = b64_decode(line, (size_t)(sep - line), bytes + used);
		if (k < 0) {
			LOG_ERROR("%s:%lld: bad base64 token", name, (long long)lineno);
			goto out_free;
		}
		int64_t r = parse_uint(sep + 1, (size_t)(line + L - sep - 1), INT32_MAX);
		if (r < 0) {
			LOG_ERROR("%s:%lld: bad rank (want a decimal integer)", name,
			          (long long)lineno);
			goto out_free;
		}
		pos[n] = (int64_t)used;
		ln[n] = lineno;
		rk[n] = r;
		used += (size_t)k;
		n++;
	}
	/* ranks: exactly 0..n-1 */
	for (int64_t j = 0; j < n; j++) {
		if (rk[j] >= n) {
			LOG_ERROR("%s:%lld: rank %lld, but the file has %lld tokens: ranks must be "
			          "0..%lld, so some rank is missing",
			          name, (long long)ln[j], (long long)rk[j], (long long)n,
			          (long long)n - 1);
			goto out_free;
		}
		if (by_rank[rk[j]]) {
			LOG_ERROR("%s:%lld: rank %lld already given on line %lld", name,
			          (long long)ln[j], (long long)rk[j],
			          (long long)ln[by_rank[rk[j]] - 1]);
			goto out_free;
		}
		by_rank[rk[j]] = j + 1;
	}
	/* reorder by rank */
	uint8_t *tb = xcalloc(used + 1, 1);
	int64_t *off = xcalloc((size_t)n + 1, sizeof(*off));
	int64_t *line_of = xcalloc((size_t)n + 1, sizeof(*line_of));
	for (int64_t r = 0; r < n; r++) {
		int64_t j = by_rank[r] - 1;
		int64_t end = j + 1 < n ? pos[j + 1] : (int64_t)used;
		memcpy(tb + off[r], bytes + pos[j], (size_t)(end - pos[j]));
		off[r + 1] = off[r] + end - pos[j];
		line_of[r] = ln[j];
	}
	if (!header) {
		n_sp = TOK_LLAMA3_N_SPECIAL;
		sp = llama3_specials(n);
	}
	struct tok_tokenizer *t = tok_alloc(name);
	rc = tok_finish(out, t, tb, off, n, line_of, sp, n_sp, pattern);
	sp = NULL;
	n_sp = 0;
	free(line_of);
out_free:
	for (int i = 0; i < n_sp; i++)
		free(sp[i].name);
	free(sp);
	free(pattern);
	free(by_rank);
	free(rk);
	free(ln);
	free(pos);
	free(bytes);
	return rc;
}

int tok_load_ranks(struct tok_tokenizer **out, const char *path)
{
	char *data;
	size_t len;
	*out = NULL;
	int rc = read_file(path, &data, &len);
	if (rc)
		return rc;
	rc = tok_load_ranks_mem(out, data, len, path);
	free(data);
	return rc;
}

/* GPT-2's byte <-> unicode map: printable Latin-1 bytes map to themselves, the other 68 bytes to
 * U+0100.. in byte order. unicode_to_byte[c] for c < 0x144, -1 elsewhere. */
static void gpt2_byte_map(int unicode_to_byte[0x144])
{
	for (int c = 0; c < 0x144; c++)
		unicode_to_byte[c] = -1;
	int extra = 0;
	for (int b = 0; b < 256; b++) {
		bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
		unicode_to_byte[printable ? b : 256 + extra++] = b;
	}
}

/* Decodes one UTF-8 code point; returns its length or 0 if invalid. */
static int utf8_decode(const uint8_t *s, size_t n, uint32_t *cp)
{
	if (n >= 1 && s[0] < 0x80) {
		*cp = s[0];
		return 1;
	}
	if (n >= 2 && (s[0] & 0xe0) == 0xc0 && (s[1] & 0xc0) == 0x80) {
		*cp = (uint32_t)(s[0] & 0x1f) << 6 | (s[1] & 0x3f);
		return *cp >= 0x80 ? 2 : 0;
	}
	if (n >= 3 && (s[0] & 0xf0) == 0xe0 && (s[1] & 0xc0) == 0x80 && (s[2] & 0xc0) == 0x80) {
		*cp = (uint32_t)(s[0] & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
		return *cp >= 0x800 ? 3 : 0;
	}
	return 0; /* 4-byte sequences are never byte-level symbols */
}

/* The regex of a tokenizer.json pre_tokenizer: a Split's Regex, or GPT-2's for ByteLevel with
 * use_regex (the default). *pattern stays NULL when nothing splits (no pre_tokenizer, or a
 * ByteLevel that only maps bytes). Returns CT_ERR_RUNTIME after logging if unsupported. */
static int hf_pattern(const char *name, const cJSON *pre, const char **pattern)
{
	if (!pre || cJSON_IsNull(pre))
		return CT_OK;
	const cJSON *type = cJSON_GetObjectItemCaseSensitive(pre, "type");
	const char *ty = cJSON_IsString(type) ? type->valuestring : "";
	if (strcmp(ty, "Sequence") == 0) {
		const cJSON *list = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers"), *p;
		cJSON_ArrayForEach (p, list) {
			const char *pat = NULL;
			if (hf_pattern(name, p, &pat))
				return CT_ERR_RUNTIME;
			if (pat && *pattern) {
				LOG_ERROR("%s: pre_tokenizer has more than one regex split "
				          "(unsupported)",
				          name);
				return CT_ERR_RUNTIME;
			}
			if (pat)
				*pattern = pat;
		}
		return CT_OK;
	}
	if (strcmp(ty, "Split") == 0) {
		const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pre, "pattern");
		const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
		if (!cJSON_IsString(re)) {
			LOG_ERROR("%s: pre_tokenizer Split without a Regex pattern (unsupported)",
			          name);
			return CT_ERR_RUNTIME;
		}
		*pattern = re->valuestring;
		return CT_OK;
	}
	if (strcmp(ty, "ByteLevel") == 0) {
		const cJSON *ur = cJSON_GetObjectItemCaseSensitive(pre, "use_regex");
		if (!cJSON_IsFalse(ur))
			*pattern = TOK_PATTERN_GPT2;
		return CT_OK;
	}
	LOG_ERROR("%s: pre_tokenizer type '%s' is not supported (byte-level BPE needs Split or "
	          "ByteLevel)",
	          name, ty);
	return CT_ERR_RUNTIME;
}

struct hf_entry {
	int64_t id;
	const char *key;
};

static int cmp_hf_entry(const void *a, const void *b)
{
	const struct hf_entry *x = a, *y = b;
	return (x->id > y->id) - (x->id < y->id);
}

int tok_load_hf_mem(struct tok_tokenizer **out, const char *json, size_t len, const char *name)
{
	*out = NULL;
	cJSON *root = cJSON_ParseWithLength(json, len);
	if (!root) {
		LOG_ERROR("%s: not valid JSON (near byte %lld)", name,
		          (long long)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - json : 0));
		return CT_ERR_RUNTIME;
	}
	int rc = CT_ERR_RUNTIME;
	struct hf_entry *ent = NULL;
	struct tok_special *sp = NULL;
	int n_sp = 0;
	uint8_t *bytes = NULL;
	int64_t *off = NULL;
	const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
	const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
	const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
	if (!cJSON_IsObject(model) ||
	    (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "BPE") == 0))) {
		LOG_ERROR("%s: model.type must be \"BPE\"", name);
		goto out_free;
	}
	if (!cJSON_IsObject(vocab)) {
		LOG_ERROR("%s: model.vocab missing or not an object", name);
		goto out_free;
	}
	const char *pattern = NULL;
	if (hf_pattern(name, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), &pattern))
		goto out_free;

	/* added tokens: specials (dropped from the regular vocabulary if it holds them too) */
	const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), *a;
	int n_added = cJSON_GetArraySize(added);
	sp = xcalloc((size_t)n_added + 1, sizeof(*sp));
	cJSON_ArrayForEach (a, added) {
		const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
		const cJSON *content = cJSON_GetObjectItemCaseSensitive(a, "content");
		if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > INT32_MAX - 1 ||
		    id->valuedouble != (double)(int64_t)id->valuedouble ||
		    !cJSON_IsString(content)) {
			LOG_ERROR("%s: added_tokens[%d] needs an integer id and a string content",
			          name, n_sp);
			goto out_free;
		}
		sp[n_sp].name = xstrdup(content->valuestring);
		sp[n_sp].len = strlen(content->valuestring);
		sp[n_sp].id = (int32_t)id->valuedouble;
		n_sp++;
	}

	int n = cJSON_GetArraySize(vocab);
	ent = xcalloc((size_t)n + 1, sizeof(*ent));
	int m = 0;
	const cJSON *v;
	cJSON_ArrayForEach (v, vocab) {
		if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > INT32_MAX - 1 ||
		    v->valuedouble != (double)(int64_t)v->valuedouble) {
			LOG_ERROR("%s: model.vocab[\"%s\"] is not a non-negative integer id", name,
			          v->string);
			goto out_free;
		}
		bool is_special = false;
		for (int k = 0; k < n_sp; k++)
			is_special |= sp[k].id == (int32_t)v->valuedouble &&
			              strcmp(sp[k].name, v->string) == 0;
		if (is_special)
			continue;
		ent[m].id = (int64_t)v->valuedouble;
		ent[m].key = v->string;
		m++;
	}
	qsort(ent, (size_t)m, sizeof(*ent), cmp_hf_entry);
	int u2b[0x144];
	gpt2_byte_map(u2b);
	size_t total = 0;
	for (int k = 0; k < m; k++)
		total += strlen(ent[k].key);
	bytes = xcalloc(total + 1, 1);
	off = xcalloc((size_t)m + 1, sizeof(*off));
	for (int k = 0; k < m; k++) {
		if (ent[k].id != k) {
			LOG_ERROR(
			    "%s: model.vocab ids must be 0..%d without gaps or repeats; id %lld "
			    "%s",
			    name, m - 1, (long long)(k < ent[k].id ? k : ent[k].id),
			    k < ent[k].id ? "is missing" : "is repeated");
			goto out_free;
		}
		const uint8_t *s = (const uint8_t *)ent[k].key;
		size_t L = strlen(ent[k].key), o = (size_t)off[k];
		for (size_t i = 0; i < L;) {
			uint32_t cp;
			int c = utf8_decode(s + i, L - i, &cp);
			if (!c || cp >= 0x144 || u2b[cp] < 0) {
				LOG_ERROR(
				    "%s: model.vocab token \"%s\" is not in GPT-2's byte-level "
				    "alphabet (not a byte-level BPE?)",
				    name, ent[k].key);
				goto out_free;
			}
			bytes[o++] = (uint8_t)u2b[cp];
			i += (size_t)c;
		}
		off[k + 1] = (int64_t)o;
	}
	struct tok_tokenizer *t = tok_alloc(name);
	rc = tok_finish(out, t, bytes, off, m, NULL, sp, n_sp, pattern);
	bytes = NULL;
	off = NULL;
	sp = NULL;
	n_sp = 0;
out_free:
	for (int k = 0; k < n_sp; k++)
		free(sp[k].name);
	free(sp);
	free(ent);
	free(bytes);
	free(off);
	cJSON_Delete(root);
	return rc;
}

int tok_load_hf(struct tok_tokenizer **out, const char *path)
{
	char *data;
	size_t len;
	*out = NULL;
	int rc = read_file(path, &data, &len);
	if (rc)
		return rc;
	rc = tok_load_hf_mem(out, data, len, path);
	free(data);
	return rc;
}

int tok_load(struct tok_tokenizer **out, const char *path)
{
	char *data;
	size_t len;
	*out = NULL;
	int rc = read_file(path, &data, &len);
	if (rc)
		return rc;
	size_t i = 0;
	while (i < len && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r'))
		i++;
	if (i < len && data[i] == '{')
		rc = tok_load_hf_mem(out, data, len, path);
	else
		rc = tok_load_ranks_mem(out, data, len, path);
	free(data);
	return rc;
}

/* ---- save --------------------------------------------------------------------------------- */

int tok_save(const struct tok_tokenizer *t, const char *path)
{
	struct tok_bytes b = {0};
	char num[32];
	bytes_append(&b, "#ctitan-tokenizer 1\n#pattern ", 29);
	b64_encode(&b, (const uint8_t *)t->pattern, strlen(t->pattern));
	bytes_append(&b, "\n", 1);
	for (int i = 0; i < t->n_special; i++) {
		bytes_append(&b, "#special ", 9);
		b64_encode(&b, (const uint8_t *)t->sp[i].name, t->sp[i].len);
		int k = snprintf(num, sizeof(num), " %d\n", (int)t->sp[i].id);
		bytes_append(&b, num, (size_t)k);
	}
	for (int64_t r = 0; r < t->n_vocab; r++) {
		b64_encode(&b, t->bytes + t->off[r], token_len(t, (int32_t)r));
		int k = snprintf(num, sizeof(num), " %lld\n", (long long)r);
		bytes_append(&b, num, (size_t)k);
	}
	size_t plen = strlen(path);
	char *tmp = xcalloc(plen + 5, 1);
	memcpy(tmp, path, plen);
	memcpy(tmp + plen, ".tmp", 4);
	int rc = CT_OK;
	FILE *f = fopen(tmp, "wb");
	if (!f) {
		LOG_ERROR("%s: cannot create: %s", tmp, strerror(errno));
		rc = CT_ERR_RUNTIME;
		goto out_free;
	}
	bool ok = fwrite(b.v, 1, b.n, f) == b.n;
	ok &= fclose(f) == 0;
	if (!ok || rename(tmp, path) != 0) {
		LOG_ERROR("%s: write failed: %s", path, strerror(errno));
		remove(tmp);
		rc = CT_ERR_RUNTIME;
	}
out_free:
	free(tmp);
	tok_bytes_free(&b);
	return rc;
}

/* ---- training ------------------------------------------------------------------------------ */

/* Words are the distinct pre-split pieces with their counts; each is a run of symbols (token ids)
 * in one arena, shrinking in place as merges apply. Pairs live in an open-addressing map from
 * (a, b) to an index into flat arrays: count (occurrences weighted by word counts), the words
 * that contain or once contained it (may repeat or be stale; processing checks), and a lazy
 * max-heap over (count, pair). */

struct tok_trainer {
	struct tok_train_opts o;
	struct tok_tokenizer *splitter; /* the regex; its vocabulary is the 256 bytes */
	/* distinct pieces while counting */
	struct tok_bytes wbytes; /* concatenated piece bytes */
	int64_t *woff, *wcount;  /* woff[w]..woff[w+1]; count */
	int64_t n_words, cap_words;
	int64_t *wslots; /* word index, -1 empty */
	uint64_t wmask;
	int64_t bytes_seen;
};

struct pair_list {
	int32_t *v;
	int32_t n, cap;
};

struct train_state {
	int32_t *sym;   /* symbols of all words */
	int64_t *soff;  /* start of word w in sym */
	int32_t *slen;  /* current length of word w */
	int64_t *cnt;   /* count of word w */
	int64_t *stamp; /* last merge that visited word w */
	int64_t n_words;
	/* pairs */
	uint64_t *pkey; /* a << 32 | b */
	int64_t *pcount;
	struct pair_list *pwords;
	int64_t n_pairs, cap_pairs;
	int64_t *pslots; /* pair index, -1 empty */
	uint64_t pmask;
	int64_t *touched; /* pairs whose count rose during this merge */
	int64_t n_touched, cap_touched;
	int64_t *tstamp; /* per pair: last merge that touched it */
	/* heap of pair indices, ordered by (count desc, key asc) at push time */
	struct heap_ent {
		int64_t count;
		int64_t pair;
	} * heap;
	int64_t hn, hcap;
	/* vocabulary being built, and a map from its bytes to ids */
	struct tok_bytes vbytes;
	int64_t *voff;
	int64_t n_vocab;
	int32_t *vslots; /* id, -1 empty */
	uint64_t vmask;
};

/* Id of the token with bytes p[0..n), or -1; with add, a missing one becomes token n_vocab. */
static int32_t vocab_find(struct train_state *s, const uint8_t *p, size_t n, bool add)
{
	uint64_t i = hash_bytes(p, n) & s->vmask;
	for (;; i = (i + 1) & s->vmask) {
		int32_t r = s->vslots[i];
		if (r < 0)
			break;
		if ((size_t)(s->voff[r + 1] - s->voff[r]) == n &&
		    memcmp(s->vbytes.v + s->voff[r], p, n) == 0)
			return r;
	}
	if (!add)
		return -1;
	int32_t r = (int32_t)s->n_vocab++;
	bytes_append(&s->vbytes, p, n);
	s->voff[r + 1] = (int64_t)s->vbytes.n;
	s->vslots[i] = r;
	return r;
}

static void trainer_words_grow(struct tok_trainer *tr)
{
	uint64_t cap = (tr->wmask + 1) * 2;
	int64_t *slots = xcalloc(cap, sizeof(*slots));
	memset(slots, 0xff, cap * sizeof(*slots));
	for (int64_t w = 0; w < tr->n_words; w++) {
		const uint8_t *p = tr->wbytes.v + tr->woff[w];
		uint64_t i = hash_bytes(p, (size_t)(tr->woff[w + 1] - tr->woff[w])) & (cap - 1);
		while (slots[i] >= 0)
			i = (i + 1) & (cap - 1);
		slots[i] = w;
	}
	free(tr->wslots);
	tr->wslots = slots;
	tr->wmask = cap - 1;
}

static int trainer_piece(void *ctx, const uint8_t *p, size_t n)
{
	struct tok_trainer *tr = ctx;
	if (n >= INT32_MAX || tr->n_words >= INT32_MAX - 2) {
		LOG_ERROR("tokenizer training: a piece of %zu bytes or over 2^31 distinct pieces",
		          n);
		return CT_ERR_RUNTIME;
	}
	uint64_t i = hash_bytes(p, n) & tr->wmask;
	for (;; i = (i + 1) & tr->wmask) {
		int64_t w = tr->wslots[i];
		if (w < 0)
			break;
		if ((size_t)(tr->woff[w + 1] - tr->woff[w]) == n &&
		    memcmp(tr->wbytes.v + tr->woff[w], p, n) == 0) {
			tr->wcount[w]++;
			return 0;
		}
	}
	if (tr->n_words + 2 > tr->cap_words) {
		tr->cap_words *= 2;
		tr->woff = xrealloc(tr->woff, (size_t)tr->cap_words * sizeof(*tr->woff));
		tr->wcount = xrealloc(tr->wcount, (size_t)tr->cap_words * sizeof(*tr->wcount));
	}
	int64_t w = tr->n_words++;
	bytes_append(&tr->wbytes, p, n);
	tr->woff[w + 1] = (int64_t)tr->wbytes.n;
	tr->wcount[w] = 1;
	tr->wslots[i] = w;
	if ((uint64_t)tr->n_words * 2 > tr->wmask)
		trainer_words_grow(tr);
	return 0;
}

int tok_trainer_new(struct tok_trainer **out, const struct tok_train_opts *o)
{
	*out = NULL;
	if (o->vocab_size < 256 || o->vocab_size > INT32_MAX / 2) {
		LOG_ERROR("tokenizer training: vocab_size %lld out of range (256 .. 2^30)",
		          (long long)o->vocab_size);
		return CT_ERR_USAGE;
	}
	uint8_t b256[256];
	const uint8_t *toks[256];
	size_t lens[256];
	for (int i = 0; i < 256; i++) {
		b256[i] = (uint8_t)i;
		toks[i] = b256 + i;
		lens[i] = 1;
	}
	static const char *const no_specials[1] = {NULL};
	struct tok_trainer *tr = xcalloc(1, sizeof(*tr));
	tr->o = *o;
	int rc = tok_build(&tr->splitter, toks, lens, 256, o->pattern, no_specials, 0,
	                   "tokenizer training");
	if (rc) {
		free(tr);
		return CT_ERR_USAGE; /* a bad pattern is a bad option */
	}
	tr->cap_words = 1024;
	tr->woff = xcalloc((size_t)tr->cap_words, sizeof(*tr->woff));
	tr->wcount = xcalloc((size_t)tr->cap_words, sizeof(*tr->wcount));
	tr->wmask = 1023;
	tr->wslots = xcalloc(tr->wmask + 1, sizeof(*tr->wslots));
	memset(tr->wslots, 0xff, (tr->wmask + 1) * sizeof(*tr->wslots));
	*out = tr;
	return CT_OK;
}

int tok_trainer_add(struct tok_trainer *tr, const void *text, size_t len)
{
	tr->bytes_seen += (int64_t)len;
	return tok_split(tr->splitter, text, len, trainer_piece, tr);
}

void tok_trainer_free(struct tok_trainer *tr)
{
	if (!tr)
		return;
	tok_free(tr->splitter);
	tok_bytes_free(&tr->wbytes);
	free(tr->woff);
	free(tr->wcount);
	free(tr->wslots);
	free(tr);
}

static inline bool heap_less(const struct heap_ent *x, const struct heap_ent *y,
                             const uint64_t *pkey)
{
	/* x ranks below y: fewer occurrences, or as many and a larger pair */
	if (x->count != y->count)
		return x->count < y->count;
	return pkey[x->pair] > pkey[y->pair];
}

static void train_heap_push(struct train_state *s, int64_t pair)
{
	if (s->hn == s->hcap) {
		s->hcap = s->hcap ? 2 * s->hcap : 1024;
		s->heap = xrealloc(s->heap, (size_t)s->hcap * sizeof(*s->heap));
	}
	struct heap_ent e = {s->pcount[pair], pair};
	int64_t i = s->hn++;
	while (i > 0) {
		int64_t up = (i - 1) / 2;
		if (!heap_less(&s->heap[up], &e, s->pkey))
			break;
		s->heap[i] = s->heap[up];
		i = up;
	}
	s->heap[i] = e;
}

static struct heap_ent train_heap_pop(struct train_state *s)
{
	struct heap_ent top = s->heap[0], last = s->heap[--s->hn];
	int64_t i = 0;
	for (;;) {
		int64_t c = 2 * i + 1;
		if (c >= s->hn)
			break;
		if (c + 1 < s->hn && heap_less(&s->heap[c], &s->heap[c + 1], s->pkey))
			c++;
		if (!heap_less(&last, &s->heap[c], s->pkey))
			break;
		s->heap[i] = s->heap[c];
		i = c;
	}
	if (s->hn)
		s->heap[i] = last;
	return top;
}

static void pairs_grow(struct train_state *s)
{
	uint64_t cap = (s->pmask + 1) * 2;
	int64_t *slots = xcalloc(cap, sizeof(*slots));
	memset(slots, 0xff, cap * sizeof(*slots));
	for (int64_t p = 0; p < s->n_pairs; p++) {
		uint64_t i = mix64(s->pkey[p]) & (cap - 1);
		while (slots[i] >= 0)
			i = (i + 1) & (cap - 1);
		slots[i] = p;
	}
	free(s->pslots);
	s->pslots = slots;
	s->pmask = cap - 1;
}

static int64_t pair_get(struct train_state *s, int32_t a, int32_t b)
{
	uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	uint64_t i = mix64(key) & s->pmask;
	for (;; i = (i + 1) & s->pmask) {
		int64_t p = s->pslots[i];
		if (p < 0)
			break;
		if (s->pkey[p] == key)
			return p;
	}
	if (s->n_pairs == s->cap_pairs) {
		s->cap_pairs = s->cap_pairs ? 2 * s->cap_pairs : 4096;
		s->pkey = xrealloc(s->pkey, (size_t)s->cap_pairs * sizeof(*s->pkey));
		s->pcount = xrealloc(s->pcount, (size_t)s->cap_pairs * sizeof(*s->pcount));
		s->pwords = xrealloc(s->pwords, (size_t)s->cap_pairs * sizeof(*s->pwords));
		s->tstamp = xrealloc(s->tstamp, (size_t)s->cap_pairs * sizeof(*s->tstamp));
	}
	int64_t p = s->n_pairs++;
	s->pkey[p] = key;
	s->pcount[p] = 0;
	memset(&s->pwords[p], 0, sizeof(s->pwords[p]));
	s->tstamp[p] = -1;
	s->pslots[i] = p;
	if ((uint64_t)s->n_pairs * 2 > s->pmask)
		pairs_grow(s);
	return p;
}

static void pair_add_word(struct train_state *s, int64_t p, int64_t w)
{
	struct pair_list *l = &s->pwords[p];
	if (l->n && l->v[l->n - 1] == (int32_t)w)
		return;
	if (l->n == l->cap) {
		l->cap = l->cap ? 2 * l->cap : 4;
		l->v = xrealloc(l->v, (size_t)l->cap * sizeof(*l->v));
	}
	l->v[l->n++] = (int32_t)w;
}

/* A count change from a merge; rises are remembered so the heap gets the new count once. */
static void pair_change(struct train_state *s, int32_t a, int32_t b, int64_t delta, int64_t w,
                        int64_t merge)
{
	int64_t p = pair_get(s, a, b);
	s->pcount[p] += delta;
	if (delta > 0) {
		pair_add_word(s, p, w);
		if (s->tstamp[p] != merge) {
			s->tstamp[p] = merge;
			if (s->n_touched == s->cap_touched) {
				s->cap_touched = s->cap_touched ? 2 * s->cap_touched : 1024;
				s->touched = xrealloc(s->touched,
				                      (size_t)s->cap_touched * sizeof(*s->touched));
			}
			s->touched[s->n_touched++] = p;
		}
	}
}

/* Replace every (a, b) in word w by c, left to right, updating neighbour pair counts. */
static void word_merge(struct train_state *s, int64_t w, int32_t a, int32_t b, int32_t c,
                       int64_t merge)
{
	int32_t *x = s->sym + s->soff[w];
	int32_t n = s->slen[w], o = 0;
	int64_t f = s->cnt[w];
	for (int32_t i = 0; i < n; i++) {
		if (i + 1 < n && x[i] == a && x[i + 1] == b) {
			if (o > 0) {
				pair_change(s, x[o - 1], a, -f, w, merge);
				pair_change(s, x[o - 1], c, f, w, merge);
			}
			if (i + 2 < n) {
				pair_change(s, b, x[i + 2], -f, w, merge);
				pair_change(s, c, x[i + 2], f, w, merge);
			}
			x[o++] = c;
			i++;
		} else {
			x[o++] = x[i];
		}
	}
	s->slen[w] = o;
}

static void train_state_free(struct train_state *s)
{
	free(s->sym);
	free(s->soff);
	free(s->slen);
	free(s->cnt);
	free(s->stamp);
	for (int64_t p = 0; p < s->n_pairs; p++)
		free(s->pwords[p].v);
	free(s->pkey);
	free(s->pcount);
	free(s->pwords);
	free(s->pslots);
	free(s->touched);
	free(s->tstamp);
	free(s->heap);
	tok_bytes_free(&s->vbytes);
	free(s->voff);
	free(s->vslots);
}

/* Words -> symbols; initial pair counts and heap. */
static void train_state_init(struct train_state *s, const struct tok_trainer *tr)
{
	s->n_words = tr->n_words;
	s->sym = xcalloc(tr->wbytes.n + 1, sizeof(*s->sym));
	s->soff = xcalloc((size_t)s->n_words + 1, sizeof(*s->soff));
	s->slen = xcalloc((size_t)s->n_words + 1, sizeof(*s->slen));
	s->cnt = xcalloc((size_t)s->n_words + 1, sizeof(*s->cnt));
	s->stamp = xcalloc((size_t)s->n_words + 1, sizeof(*s->stamp));
	s->pmask = 4095;
	s->pslots = xcalloc(s->pmask + 1, sizeof(*s->pslots));
	memset(s->pslots, 0xff, (s->pmask + 1) * sizeof(*s->pslots));
	for (int64_t w = 0; w < s->n_words; w++) {
		s->soff[w] = tr->woff[w];
		s->slen[w] = (int32_t)(tr->woff[w + 1] - tr->woff[w]);
		s->cnt[w] = tr->wcount[w];
		s->stamp[w] = -1;
		int32_t *x = s->sym + s->soff[w];
		for (int32_t i = 0; i < s->slen[w]; i++)
			x[i] = tr->wbytes.v[s->soff[w] + i];
		for (int32_t i = 0; i + 1 < s->slen[w]; i++) {
			int64_t p = pair_get(s, x[i], x[i + 1]);
			s->pcount[p] += s->cnt[w];
			pair_add_word(s, p, w);
		}
	}
	for (int64_t p = 0; p < s->n_pairs; p++)
		train_heap_push(s, p);
	s->voff = xcalloc((size_t)tr->o.vocab_size + 1, sizeof(*s->voff));
	s->vmask = pow2_at_least(2 * (uint64_t)tr->o.vocab_size) - 1;
	s->vslots = xcalloc(s->vmask + 1, sizeof(*s->vslots));
	memset(s->vslots, 0xff, (s->vmask + 1) * sizeof(*s->vslots));
	for (int b = 0; b < 256; b++) {
		uint8_t c = (uint8_t)b;
		vocab_find(s, &c, 1, true);
	}
}

int tok_trainer_finish(struct tok_trainer *tr, struct tok_tokenizer **out)
{
	*out = NULL;
	struct train_state s;
	memset(&s, 0, sizeof(s));
	train_state_init(&s, tr);
	int64_t min_count = tr->o.min_count > 0 ? tr->o.min_count : 2;
	/* the token id of each symbol is its rank; a merge into existing bytes reuses that id */
	struct tok_tokenizer *vocab_map = NULL;
	int64_t merge = 0;
	int64_t progress_every = tr->o.vocab_size / 10 > 1000 ? tr->o.vocab_size / 10 : 1000;
	while (s.n_vocab < tr->o.vocab_size && s.hn > 0) {
		struct heap_ent e = train_heap_pop(&s);
		int64_t p = e.pair;
		if (e.count != s.pcount[p]) {
			if (s.pcount[p] > 0 && s.pcount[p] < e.count)
				train_heap_push(&s, p);
			continue;
		}
		if (e.count < min_count)
			break;
		int32_t a = (int32_t)(s.pkey[p] >> 32), b = (int32_t)(uint32_t)s.pkey[p];
		/* the new token's bytes; reuse the id if they already are a token */
		size_t la = (size_t)(s.voff[a + 1] - s.voff[a]),
		       lb = (size_t)(s.voff[b + 1] - s.voff[b]);
		uint8_t *nb = xcalloc(la + lb, 1);
		memcpy(nb, s.vbytes.v + s.voff[a], la);
		memcpy(nb + la, s.vbytes.v + s.voff[b], lb);
		int32_t c = vocab_find(&s, nb, la + lb, true);
		free(nb);
		/* the word list is detached first: pair_get may move the pair arrays */
		struct pair_list l = s.pwords[p];
		memset(&s.pwords[p], 0, sizeof(s.pwords[p]));
		s.n_touched = 0;
		for (int32_t k = 0; k < l.n; k++) {
			int64_t w = l.v[k];
			if (s.stamp[w] == merge)
				continue;
			s.stamp[w] = merge;
			word_merge(&s, w, a, b, c, merge);
		}
		free(l.v);
		s.pcount[p] = 0;
		for (int64_t k = 0; k < s.n_touched; k++)
			if (s.pcount[s.touched[k]] > 0)
				train_heap_push(&s, s.touched[k]);
		merge++;
		if (tr->o.progress && merge % progress_every == 0)
			LOG_INFO("tokenizer training: %lld / %lld tokens", (long long)s.n_vocab,
			         (long long)tr->o.vocab_size);
	}
	if (s.n_vocab < tr->o.vocab_size)
		LOG_WARN("tokenizer training: the corpus supports only %lld tokens (no pair occurs "
		         "%lld times or more); asked for %lld",
		         (long long)s.n_vocab, (long long)min_count, (long long)tr->o.vocab_size);
	/* build the tokenizer: ranks = ids */
	const uint8_t **toks = xcalloc((size_t)s.n_vocab, sizeof(*toks));
	size_t *lens = xcalloc((size_t)s.n_vocab, sizeof(*lens));
	for (int64_t r = 0; r < s.n_vocab; r++) {
		toks[r] = s.vbytes.v + s.voff[r];
		lens[r] = (size_t)(s.voff[r + 1] - s.voff[r]);
	}
	static const char *const default_specials[] = {"<|begin_of_text|>", "<|end_of_text|>"};
	const char *const *specials = tr->o.specials ? tr->o.specials : default_specials;
	int n_special = tr->o.specials ? tr->o.n_special : 2;
	int rc = tok_build(&vocab_map, toks, lens, s.n_vocab, tok_pattern(tr->splitter), specials,
	                   n_special, "trained tokenizer");
	free(toks);
	free(lens);
	train_state_free(&s);
	if (rc)
		return rc;
	if (tr->o.progress)
		LOG_INFO("tokenizer training: %lld tokens from %lld bytes (%lld distinct pieces)",
		         (long long)tok_n_vocab(vocab_map), (long long)tr->bytes_seen,
		         (long long)tr->n_words);
	*out = vocab_map;
	return CT_OK;
}

int tok_train(struct tok_tokenizer **out, const struct tok_train_opts *o, const void *text,
              size_t len)
{
	struct tok_trainer *tr;
	*out = NULL;
	int rc = tok_trainer_new(&tr, o);
	if (rc)
		return rc;
	rc = tok_trainer_add(tr, text, len);
	if (!rc)
		rc = tok_trainer_finish(tr, out);
	tok_trainer_free(tr);
	return rc;
}
