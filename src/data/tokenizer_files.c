/* data/tokenizer_files: building a tokenizer from its ranks (validation, the rank table,
 * merges, special tokens), the rank-file and Hugging Face tokenizer.json loaders, and save.
 */
#include "data/tokenizer_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>

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
	tok_merge_buf_free(&t->mb);
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
		if (tok_special_lookup(t, (const uint8_t *)sp[k].name, sp[k].len) >= 0) {
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
		rc = tok_regex_compile(t, pattern ? pattern : TOK_PATTERN_LLAMA3);
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
