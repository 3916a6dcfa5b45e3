/* data/tokenizer_train: byte-level BPE training (tok_trainer_*, tok_train). */
#include "data/tokenizer_impl.h"

#include <stdio.h>

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
