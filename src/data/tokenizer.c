/* data/tokenizer: byte-level BPE (see tokenizer.h for the model, formats and ownership).
 *
 * This file: small buffers; the rank table (open addressing over token bytes); the regex
 * (pattern translation, compile, split); byte pair merge (short pieces: tiktoken's array scan;
 * long pieces: linked parts + min-heap; reference twin); the piece cache; encode and decode.
 * Construction, the file formats and save: tokenizer_files.c; training: tokenizer_train.c.
 */
#include "data/tokenizer_impl.h"

#include <errno.h>
#include <stdio.h>

/* ---- small buffers ------------------------------------------------------------------------- */

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
int tok_special_lookup(const struct tok_tokenizer *t, const uint8_t *p, size_t n)
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
	int k = tok_special_lookup(t, (const uint8_t *)name, strlen(name));
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

int tok_regex_compile(struct tok_tokenizer *t, const char *pattern)
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

void tok_merge_buf_free(struct tok_merge_buf *b)
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
			int j = tok_special_lookup(t, s + i, L);
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
