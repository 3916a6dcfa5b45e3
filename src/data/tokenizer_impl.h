/* data/tokenizer_impl.h: internals shared by data/tokenizer.c (rank table, regex, merge,
 * encode/decode), data/tokenizer_files.c (construction, rank-file and tokenizer.json loaders,
 * save) and data/tokenizer_train.c (BPE training). Not part of the data/ interface. */
#ifndef CT_DATA_TOKENIZER_IMPL_H
#define CT_DATA_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "data/tokenizer.h"

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

/* ---- small buffers and hashing -------------------------------------------------------------- */

static inline void *xrealloc(void *p, size_t size)
{
	void *q = realloc(p, size ? size : 1);
	CHECK(q, "out of memory (%zu bytes)", size);
	return q;
}

static inline void bytes_append(struct tok_bytes *b, const void *p, size_t n)
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

static inline uint64_t pow2_at_least(uint64_t n)
{
	uint64_t c = 16;
	while (c < n)
		c *= 2;
	return c;
}

/* ---- the rank table's hot path ---------------------------------------------------------------- */

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

/* ---- shared by the three files --------------------------------------------------------------- */

void tok_merge_buf_free(struct tok_merge_buf *b);
int tok_regex_compile(struct tok_tokenizer *t, const char *pattern);
int tok_special_lookup(const struct tok_tokenizer *t, const uint8_t *p, size_t n);

#endif
