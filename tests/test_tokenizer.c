/* tests/test_tokenizer: byte-level BPE (data/tokenizer).
 *
 * Round trips of arbitrary bytes (invalid UTF-8 included), the Llama 3 split pattern case by
 * case, special tokens never coming from plain text, loader errors naming file and line,
 * save/load, Hugging Face tokenizer.json, the fast merge against its reference twin, training
 * against a naive trainer (same merges), compression growing with the vocabulary, and long
 * inputs. Parity with tiktoken and llama3-tokenizer-js is tests/tokenizer_parity.sh.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "data/tokenizer.h"
#include "testutil.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static uint64_t rng_state;
static uint32_t rnd(void)
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rng_state >> 33);
}

static struct tok_tokenizer *bytes_only(const char *pattern)
{
	uint8_t b[256];
	const uint8_t *toks[256];
	size_t lens[256];
	for (int i = 0; i < 256; i++) {
		b[i] = (uint8_t)i;
		toks[i] = b + i;
		lens[i] = 1;
	}
	struct tok_tokenizer *t;
	CHECK(tok_build(&t, toks, lens, 256, pattern, NULL, 0, "bytes") == 0, "tok_build");
	return t;
}

/* The fortunes when present, topped up to 200 kB with deterministic text: a lexicon of 4000
 * made-up words (syllables) drawn Zipf-like, with numbers, code, contractions and non-ASCII. */
static char *training_text(size_t *len)
{
	static const char *const syl[] = {
	    "the", "an",       "re",       "in",           "er",
	    "on",  "at",       "es",       "or",           "te",
	    "of",  "ed",       "is",       "it",           "al",
	    "ar",  "st",       "to",       "nt",           "ng",
	    "se",  "ha",       "as",       "ou",           "io",
	    "le",  "ve",       "co",       "me",           "de",
	    "hi",  "ri",       "ro",       "ic",           "ne",
	    "ea",  "ra",       "ce",       "li",           "ch",
	    "ll",  "be",       "ma",       "si",           "om",
	    "ur",  "\xc3\xbc", "\xc3\xa9", "\xe5\x8c\x97", "\xd0\xbc\xd0\xb8",
	};
	static const char *const extra[] = {"don't",   "it's",      "we'll", "1999", "3.14159",
	                                    "x += 1;", "return 0;", "\t",    "\n",   "\n\n",
	                                    "(",       ")",         ","};
	const int ns = (int)(sizeof(syl) / sizeof(syl[0])),
	          ne = (int)(sizeof(extra) / sizeof(extra[0]));
	size_t cap = 1 << 20, n = 0;
	char *s = xcalloc(cap + 64, 1);
	FILE *f = fopen("/usr/share/games/fortunes/fortunes", "rb");
	if (f) {
		n = fread(s, 1, cap, f);
		fclose(f);
	}
	uint64_t saved = rng_state;
	rng_state = 42;
	static char lex[4000][24];
	for (int w = 0; w < 4000; w++) {
		int k = 1 + (int)(rnd() % 4);
		lex[w][0] = 0;
		for (int j = 0; j < k; j++)
			strcat(lex[w], syl[rnd() % (uint32_t)ns]);
	}
	while (n < 200000) {
		double u = (double)rnd() / 4294967296.0;
		int k = (int)(4000.0 * u * u * u); /* low indices far more often */
		const char *w = rnd() % 10 ? lex[k] : extra[rnd() % (uint32_t)ne];
		size_t L = strlen(w);
		memcpy(s + n, w, L);
		n += L;
		s[n++] = rnd() % 9 ? ' ' : '.';
	}
	rng_state = saved;
	*len = n;
	return s;
}

static struct tok_tokenizer *trained(int64_t vocab)
{
	size_t n;
	char *text = training_text(&n);
	struct tok_train_opts o = {.vocab_size = vocab};
	struct tok_tokenizer *t;
	CHECK(tok_train(&t, &o, text, n) == 0, "tok_train");
	free(text);
	return t;
}

static bool roundtrip(struct tok_tokenizer *t, const void *text, size_t n, bool specials)
{
	struct tok_ids ids = {0};
	struct tok_bytes out = {0};
	int rc =
	    specials ? tok_encode_with_specials(t, text, n, &ids) : tok_encode(t, text, n, &ids);
	bool ok = rc == 0 && tok_decode(t, ids.v, ids.n, &out) == 0 && out.n == n &&
	          (n == 0 || memcmp(out.v, text, n) == 0);
	for (int64_t i = 0; !specials && i < ids.n; i++)
		ok &= ids.v[i] >= 0 && ids.v[i] < tok_n_vocab(t);
	tok_ids_free(&ids);
	tok_bytes_free(&out);
	return ok;
}

/* Runs fn with stderr captured; returns what it printed (caller frees). */
static char *capture_stderr(int (*fn)(void *), void *arg, int *rc)
{
	char path[] = "/tmp/ct_tok_err_XXXXXX";
	int fd = mkstemp(path);
	CHECK(fd >= 0, "mkstemp");
	fflush(stderr);
	int saved = dup(2);
	dup2(fd, 2);
	*rc = fn(arg);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	lseek(fd, 0, SEEK_SET);
	char *buf = xcalloc(8192, 1);
	ssize_t k = read(fd, buf, 8191);
	buf[k > 0 ? k : 0] = 0;
	close(fd);
	unlink(path);
	return buf;
}

static void write_file(const char *path, const void *data, size_t n)
{
	FILE *f = fopen(path, "wb");
	CHECK(f, "cannot write %s", path);
	fwrite(data, 1, n, f);
	fclose(f);
}

/* A rank file: the 256 bytes (rank = byte) plus `extra` lines, as given. */
static size_t rank_file(char *buf, size_t cap, const char *extra)
{
	static const char b64[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t o = 0;
	for (int b = 0; b < 256; b++)
		o += (size_t)snprintf(buf + o, cap - o, "%c%c== %d\n", b64[b >> 2],
		                      b64[(b & 3) << 4], b);
	o += (size_t)snprintf(buf + o, cap - o, "%s", extra);
	return o;
}

/* ---- the split pattern ------------------------------------------------------------------- */

struct pieces {
	char items[64][64];
	int n;
};

static int collect(void *ctx, const uint8_t *p, size_t n)
{
	struct pieces *ps = ctx;
	if (ps->n < 64 && n < 64) {
		memcpy(ps->items[ps->n], p, n);
		ps->items[ps->n][n] = 0;
	}
	ps->n++;
	return 0;
}

/* expected: pieces separated by '|' ('|' itself never appears in these cases). */
static void expect_split(struct tok_tokenizer *t, const char *text, const char *expected)
{
	struct pieces ps = {.n = 0};
	EXPECT(tok_split(t, text, strlen(text), collect, &ps) == 0, "split failed");
	char got[1024] = "";
	for (int i = 0; i < ps.n && i < 64; i++) {
		if (i)
			strcat(got, "|");
		strncat(got, ps.items[i], sizeof(got) - strlen(got) - 2);
	}
	EXPECT(strcmp(got, expected) == 0, "split of \"%s\": got \"%s\", want \"%s\"", text, got,
	       expected);
}

TEST_CASE(split_pattern)
{
	struct tok_tokenizer *t = bytes_only(NULL);
	/* words, contractions (any case), numbers in groups of at most three */
	expect_split(t, "Hello world", "Hello| world");
	expect_split(t, "don't", "don|'t");
	expect_split(t, "I'M HERE", "I|'M| HERE");
	expect_split(t, "we'll've they'RE", "we|'ll|'ve| they|'RE");
	expect_split(t, "it'Sx", "it|'S|x");
	expect_split(t, "it'\u017fx", "it|'\u017f|x"); /* long s folds to s, as in Rust's regex */
	expect_split(t, "12345678", "123|456|78");
	expect_split(t, "abc123def", "abc|123|def");
	expect_split(t, " 42", " |42");
	expect_split(t, "$100.50", "$|100|.|50");
	expect_split(t, "\u0663\u0664\u0665\u0666", "\u0663\u0664\u0665|\u0666"); /* Arabic-Indic */
	/* whitespace runs: the last space joins the next word; newlines collect */
	expect_split(t, "a  b", "a| | b");
	expect_split(t, "a\n\nb", "a|\n\n|b");
	expect_split(t, "x   \n  y", "x|   \n| | y");
	expect_split(t, "end   ", "end|   ");
	expect_split(t, "\r\n\r\n", "\r\n\r\n");
	expect_split(t, "a\tb", "a|\tb");
	/* NEL (U+0085) is \s, as in tiktoken */
	expect_split(t,
	             "a\xc2\x85\xc2\x85"
	             "b",
	             "a|\xc2\x85|\xc2\x85"
	             "b");
	expect_split(t, "x\u3000\u3000y", "x|\u3000|\u3000y");
	/* punctuation, symbols, emoji, CJK */
	expect_split(t, "hi \xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd!",
	             "hi| \xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd!");
	expect_split(t, "...\n\nok", "...\n\n|ok");
	expect_split(t, "\u6211\u7231\u5317\u4eac", "\u6211\u7231\u5317\u4eac");
	expect_split(t, "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 ok",
	             "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8| ok");
	expect_split(t, "\u041f\u0440\u0438\u0432\u0435\u0442, \u03ba\u03cc\u03c3\u03bc\u03b5",
	             "\u041f\u0440\u0438\u0432\u0435\u0442|,| \u03ba\u03cc\u03c3\u03bc\u03b5");
	/* invalid UTF-8 is a barrier: its bytes form pieces of their own */
	expect_split(t,
	             "ab\x80\x80"
	             "cd",
	             "ab|\x80\x80|cd");
	expect_split(t,
	             "a\xff"
	             "b",
	             "a|\xff|b");
	expect_split(t, "\xe2\x82", "\xe2\x82");
	expect_split(t, "x  \xc0\xaf", "x|  |\xc0\xaf");
	expect_split(t, "\xed\xa0\x80z", "\xed\xa0\x80|z"); /* a surrogate is invalid */
	/* the "<|endoftext|>" case: three pieces */
	struct pieces ps = {.n = 0};
	tok_split(t, "<|endoftext|>", 13, collect, &ps);
	EXPECT(ps.n == 3 && !strcmp(ps.items[0], "<|") && !strcmp(ps.items[1], "endoftext"),
	       "<|endoftext|> splits into <| endoftext |>");
	tok_free(t);

	t = bytes_only(TOK_PATTERN_GPT2);
	expect_split(t, "I'M 12345 hi  there", "I|'|M| 12345| hi| | there");
	tok_free(t);
}

/* ---- round trips ------------------------------------------------------------------------- */

TEST_CASE(roundtrip_random_bytes)
{
	struct tok_tokenizer *t = trained(1024);
	struct tok_tokenizer *b = bytes_only(NULL);
	rng_state = test_seed();
	uint8_t *buf = xcalloc(4096, 1);
	int bad = 0;
	for (int it = 0; it < 1500; it++) {
		size_t n = rnd() % 4096;
		int kind = it % 5;
		for (size_t i = 0; i < n; i++) {
			uint32_t r = rnd();
			switch (kind) {
			case 0:
				buf[i] = (uint8_t)r;
				break; /* any bytes */
			case 1:
				buf[i] = (uint8_t)(0x80 | (r & 0x7f));
				break; /* high bytes */
			case 2:
				buf[i] = " \t\n\ra'0.\xc3\xa9"[r % 11];
				break; /* splitters */
			case 3:
				buf[i] = "etaoin shrdlu"[r % 13];
				break; /* text-like */
			default:
				buf[i] = r % 3 ? (uint8_t)("abc \n"[r % 5]) : (uint8_t)r;
				break;
			}
		}
		bad += !roundtrip(t, buf, n, false) || !roundtrip(b, buf, n, false) ||
		       !roundtrip(t, buf, n, true);
	}
	EXPECT(bad == 0, "%d random inputs failed to round-trip", bad);
	EXPECT(roundtrip(t, "", 0, false), "empty input");
	free(buf);
	tok_free(b);
	tok_free(t);
}

TEST_CASE(roundtrip_invalid_utf8)
{
	struct tok_tokenizer *t = trained(600);
	static const char *const cases[] = {
	    "\x80",
	    "\xbf\xbf",
	    "\xc3",
	    "\xc3(",
	    "\xe2\x82",
	    "\xe2\x28\xa1",
	    "\xf0\x9f\x98",
	    "\xc0\xaf",
	    "\xe0\x80\xaf",
	    "\xed\xa0\x80",
	    "\xf4\x90\x80\x80",
	    "\xf5\xff\xfe",
	    "ok\xff",
	    "\xff ok",
	    "a \x80 b",
	    "\xf0\x9f\x98\x80\xf0\x9f\x98",
	    "  \xc3\n\n\xa9  ",
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		EXPECT(roundtrip(t, cases[i], strlen(cases[i]), false), "case %zu", i);
	tok_free(t);
}

TEST_CASE(long_inputs)
{
	struct tok_tokenizer *t = trained(600);
	size_t n = 1 << 20;
	char *s = xcalloc(n, 1);
	const char fills[] = {' ', 'a', '\n', '7', '!'};
	for (int k = 0; k < 5; k++) {
		memset(s, fills[k], n);
		EXPECT(roundtrip(t, s, n, false), "1 MiB of 0x%02x", fills[k]);
	}
	for (size_t i = 0; i < n; i++)
		s[i] = i % 3 ? ' ' : '\n';
	EXPECT(roundtrip(t, s, n, false), "1 MiB of whitespace runs");
	tok_free(t);
	free(s);
}

/* ---- merges ------------------------------------------------------------------------------ */

TEST_CASE(bpe_matches_reference)
{
	struct tok_tokenizer *t = trained(2000);
	rng_state = test_seed() ^ 7;
	uint8_t buf[700];
	int bad = 0;
	struct tok_ids a = {0}, b = {0};
	for (int it = 0; it < 2000; it++) {
		size_t n = 1 + rnd() % (it % 2 ? 60 : sizeof(buf) - 1);
		for (size_t i = 0; i < n; i++)
			buf[i] = (uint8_t) "the and tokenizer e\xc3\xa9"[rnd() % 22];
		a.n = b.n = 0;
		tok_bpe(t, buf, n, &a);
		tok_bpe_ref(t, buf, n, &b);
		bad += a.n != b.n || memcmp(a.v, b.v, (size_t)a.n * sizeof(int32_t)) != 0;
	}
	EXPECT(bad == 0, "%d pieces where the fast merge differs from the reference", bad);
	tok_ids_free(&a);
	tok_ids_free(&b);
	tok_free(t);
}

/* ---- special tokens ------------------------------------------------------------------------ */

TEST_CASE(special_tokens)
{
	struct tok_tokenizer *t = trained(700);
	int32_t bos = tok_special_id(t, "<|begin_of_text|>"),
	        eos = tok_special_id(t, "<|end_of_text|>");
	EXPECT(bos == 700 && eos == 701, "special ids after the vocabulary: %d %d", bos, eos);
	EXPECT(tok_n_ids(t) == 702 && tok_n_special(t) == 2, "ids");
	const char *text =
	    "<|begin_of_text|>hello <|end_of_text|><|end_of_text|> x<|begin_of_text|";
	struct tok_ids ids = {0};
	EXPECT(tok_encode(t, text, strlen(text), &ids) == 0, "encode");
	bool any = false;
	for (int64_t i = 0; i < ids.n; i++)
		any |= ids.v[i] >= tok_n_vocab(t);
	EXPECT(!any, "plain encode produced a special token");
	EXPECT(roundtrip(t, text, strlen(text), false) && roundtrip(t, text, strlen(text), true),
	       "round trips");
	ids.n = 0;
	EXPECT(tok_encode_with_specials(t, text, strlen(text), &ids) == 0, "encode_with_specials");
	int n_bos = 0, n_eos = 0;
	for (int64_t i = 0; i < ids.n; i++) {
		n_bos += ids.v[i] == bos;
		n_eos += ids.v[i] == eos;
	}
	EXPECT(ids.n > 0 && ids.v[0] == bos && n_bos == 1 && n_eos == 2,
	       "encode_with_specials parses the names (bos %d, eos %d)", n_bos, n_eos);
	size_t len;
	const uint8_t *p = tok_token_bytes(t, eos, &len);
	EXPECT(p && len == 15 && !memcmp(p, "<|end_of_text|>", 15), "special bytes");
	EXPECT(tok_token_bytes(t, 702, &len) == NULL && tok_token_bytes(t, -1, &len) == NULL,
	       "unassigned ids");
	/* Llama 3's defaults for a plain rank file */
	struct tok_tokenizer *b = bytes_only(NULL);
	EXPECT(tok_n_special(b) == 256 && tok_special_id(b, "<|begin_of_text|>") == 256 &&
	           tok_special_id(b, "<|eot_id|>") == 256 + 9 &&
	           tok_special_id(b, "<|reserved_special_token_247|>") == 511,
	       "Llama 3 special tokens");
	tok_free(b);
	tok_ids_free(&ids);
	tok_free(t);
}

/* ---- loaders --------------------------------------------------------------------------------- */

struct load_arg {
	const char *path;
	struct tok_tokenizer *t;
};

static int do_load(void *arg)
{
	struct load_arg *a = arg;
	return tok_load(&a->t, a->path);
}

static void expect_load_error(const char *name, const char *content, size_t n, const char *want1,
                              const char *want2)
{
	char path[256];
	snprintf(path, sizeof(path), "/tmp/ct_tok_%d_%s", (int)getpid(), name);
	write_file(path, content, n);
	struct load_arg a = {path, NULL};
	int rc;
	char *msg = capture_stderr(do_load, &a, &rc);
	EXPECT(rc == CT_ERR_RUNTIME && a.t == NULL, "%s: loaded (rc %d)", name, rc);
	EXPECT(strstr(msg, path) != NULL, "%s: message does not name the file: %s", name, msg);
	EXPECT(!want1 || strstr(msg, want1), "%s: message lacks '%s': %s", name, want1, msg);
	EXPECT(!want2 || strstr(msg, want2), "%s: message lacks '%s': %s", name, want2, msg);
	free(msg);
	tok_free(a.t);
	unlink(path);
}

TEST_CASE(loader_errors)
{
	size_t cap = 1 << 16;
	char *buf = xcalloc(cap, 1);
	size_t n;
	n = rank_file(buf, cap, "YWI= 256\n");
	char path[256];
	snprintf(path, sizeof(path), "/tmp/ct_tok_%d_good", (int)getpid());
	write_file(path, buf, n);
	struct tok_tokenizer *t;
	EXPECT(tok_load(&t, path) == 0 && t && tok_n_vocab(t) == 257 && tok_rank(t, "ab", 2) == 256,
	       "a valid rank file loads");
	tok_free(t);
	unlink(path);

	n = rank_file(buf, cap, "YWI= 5\n");
	expect_load_error("dup_rank", buf, n, ":257:", "rank 5 already given on line 6");
	n = rank_file(buf, cap, "YWI= 300\n");
	expect_load_error("missing_rank", buf, n, ":257:", "missing");
	n = rank_file(buf, cap, "Y!I= 256\n");
	expect_load_error("bad_base64", buf, n, ":257:", "base64");
	n = rank_file(buf, cap, "YWI= 256\nYWJj");
	expect_load_error("truncated", buf, n, ":258:", "truncated");
	n = rank_file(buf, cap, "YWI= 256\nYWJj 2");
	expect_load_error("truncated_rank", buf, n, ":258:", NULL);
	n = rank_file(buf, cap, "YWI= 256\nYWI= 257\n");
	expect_load_error("dup_bytes", buf, n, ":258:", "duplicates rank 256");
	n = rank_file(buf, cap, "YWI=256\n");
	expect_load_error("no_space", buf, n, ":257:", "BASE64 RANK");
	n = rank_file(buf, cap, "YWI= 25x\n");
	expect_load_error("bad_rank", buf, n, ":257:", "bad rank");
	n = rank_file(buf, cap, "");
	char *p = strstr(buf, "QQ== 65\n"); /* drop byte 'A' and renumber the last rank */
	memmove(p, p + 8, n - (size_t)(p + 8 - buf));
	n -= 8;
	n -= strlen("/w== 255\n");
	n += (size_t)sprintf(buf + n, "/w== 65\n");
	expect_load_error("missing_byte", buf, n, "byte 0x41", NULL);
	expect_load_error("empty", "", 0, NULL, NULL);
	n = rank_file(buf, cap, "#pattern YQ==\n");
	expect_load_error("late_header", buf, n, ":257:", NULL);
	const char *js = "{\"model\": {";
	expect_load_error("bad_json", js, strlen(js), "JSON", NULL);
	js = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\xe2\x96\x81the\":0}}}";
	expect_load_error("hf_not_bytelevel", js, strlen(js), "alphabet", NULL);
	struct load_arg a = {"/nonexistent/ct_tokenizer.model", NULL};
	int rc;
	char *msg = capture_stderr(do_load, &a, &rc);
	EXPECT(rc == CT_ERR_RUNTIME && strstr(msg, "/nonexistent/ct_tokenizer.model"),
	       "missing file named: %s", msg);
	free(msg);
	free(buf);
}

TEST_CASE(save_load)
{
	struct tok_tokenizer *t = trained(800), *u = NULL;
	char path[256];
	snprintf(path, sizeof(path), "/tmp/ct_tok_%d_saved", (int)getpid());
	EXPECT(tok_save(t, path) == 0, "save");
	EXPECT(tok_load(&u, path) == 0 && u, "load");
	if (!u)
		goto out;
	EXPECT(tok_n_vocab(u) == 800 && tok_n_special(u) == 2 &&
	           strcmp(tok_pattern(u), tok_pattern(t)) == 0 &&
	           tok_special_id(u, "<|end_of_text|>") == 801,
	       "header survives");
	size_t n;
	char *text = training_text(&n);
	struct tok_ids a = {0}, b = {0};
	tok_encode(t, text, n, &a);
	tok_encode(u, text, n, &b);
	EXPECT(a.n == b.n && memcmp(a.v, b.v, (size_t)a.n * sizeof(int32_t)) == 0,
	       "same ids after save/load");
	/* without its '#' lines the file is a plain tiktoken file: Llama 3 defaults */
	FILE *f = fopen(path, "rb");
	char *line = NULL;
	size_t cap = 0;
	ssize_t k;
	struct tok_bytes plain = {0};
	while ((k = getline(&line, &cap, f)) > 0) {
		if (line[0] == '#')
			continue;
		size_t o = plain.n;
		plain.v = realloc(plain.v, plain.n + (size_t)k);
		memcpy(plain.v + o, line, (size_t)k);
		plain.n += (size_t)k;
	}
	free(line);
	fclose(f);
	struct tok_tokenizer *w = NULL;
	EXPECT(tok_load_ranks_mem(&w, plain.v, plain.n, "plain") == 0 && w &&
	           tok_n_vocab(w) == 800 && tok_n_special(w) == 256,
	       "plain rank file");
	tok_free(w);
	free(plain.v);
	tok_ids_free(&a);
	tok_ids_free(&b);
	free(text);
out:
	unlink(path);
	tok_free(u);
	tok_free(t);
}

/* GPT-2's byte -> code point map, written out as UTF-8. */
static size_t gpt2_char(int b, char *out)
{
	int extra = 0, cp = -1;
	for (int x = 0; x < 256; x++) {
		bool printable = (x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || x >= 0xae;
		int c = printable ? x : 256 + extra++;
		if (x == b)
			cp = c;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	out[0] = (char)(0xc0 | (cp >> 6));
	out[1] = (char)(0x80 | (cp & 0x3f));
	return 2;
}

TEST_CASE(hf_tokenizer_json)
{
	/* ids: bytes in GPT-2's order (like real files, the printable ones first), then merges */
	size_t cap = 1 << 16, o = 0;
	char *js = xcalloc(cap, 1);
	o += (size_t)snprintf(
	    js + o, cap - o,
	    "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":260,\"content\":"
	    "\"<|endoftext|>\",\"special\":true}],\"pre_tokenizer\":{\"type\":"
	    "\"ByteLevel\",\"add_prefix_space\":false},\"model\":{\"type\":\"BPE\","
	    "\"vocab\":{");
	int id = 0;
	for (int pass = 0; pass < 2; pass++)
		for (int b = 0; b < 256; b++) {
			bool printable =
			    (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
			if (printable != (pass == 0))
				continue;
			char ch[4] = {0};
			size_t k = gpt2_char(b, ch);
			js[o++] = '"';
			if (b == '"' || b == '\\')
				js[o++] = '\\';
			memcpy(js + o, ch, k);
			o += k;
			o += (size_t)snprintf(js + o, cap - o, "\":%d,", id++);
		}
	/* "\u0120" is GPT-2's space */
	o += (size_t)snprintf(
	    js + o, cap - o,
	    "\"\\u0120t\":256,\"he\":257,\"\\u0120the\":258,\"\\u0120\\u0120\":259,"
	    "\"<|endoftext|>\":260},\"merges\":[\"\\u0120 t\",\"h e\",\"\\u0120t he\","
	    "\"\\u0120 \\u0120\"]}}");
	struct tok_tokenizer *t = NULL;
	EXPECT(tok_load_hf_mem(&t, js, o, "handmade.json") == 0 && t,
	       "load handmade tokenizer.json");
	if (t) {
		EXPECT(tok_n_vocab(t) == 260 && tok_n_special(t) == 1 &&
		           tok_special_id(t, "<|endoftext|>") == 260,
		       "vocab %lld, specials %d", (long long)tok_n_vocab(t), tok_n_special(t));
		EXPECT(strcmp(tok_pattern(t), TOK_PATTERN_GPT2) == 0,
		       "ByteLevel means GPT-2's regex");
		EXPECT(tok_rank(t, " the", 4) == 258 && tok_rank(t, "!", 1) == 0 &&
		           tok_rank(t, " ", 1) == 188 + 32,
		       "byte-level strings map to bytes");
		struct tok_ids ids = {0};
		tok_encode(t, "the the<|endoftext|>", 20, &ids);
		EXPECT(ids.n >= 3 && ids.v[0] == 't' - '!' && ids.v[1] == 257 && ids.v[2] == 258,
		       "encode with the handmade merges");
		ids.n = 0;
		tok_encode_with_specials(t, " the<|endoftext|>", 17, &ids);
		EXPECT(ids.n == 2 && ids.v[0] == 258 && ids.v[1] == 260, "special parsed");
		tok_ids_free(&ids);
		EXPECT(roundtrip(t, "the  \xff the", 10, false), "round trip");
	}
	tok_free(t);
	free(js);
}

/* ---- training ----------------------------------------------------------------------------- */

/* The plainest trainer: recount every pair of every distinct piece at every step. */
struct naive_word {
	int32_t sym[256];
	int n;
	int64_t count;
};
struct naive {
	struct naive_word *w;
	int n, cap;
};

static int naive_piece(void *ctx, const uint8_t *p, size_t n)
{
	struct naive *nv = ctx;
	if (n > 256)
		return 1;
	for (int i = 0; i < nv->n; i++)
		if ((size_t)nv->w[i].n == n) {
			bool same = true;
			for (size_t k = 0; k < n && same; k++)
				same = nv->w[i].sym[k] == p[k];
			if (same) {
				nv->w[i].count++;
				return 0;
			}
		}
	if (nv->n == nv->cap) {
		nv->cap = nv->cap ? 2 * nv->cap : 256;
		nv->w = realloc(nv->w, (size_t)nv->cap * sizeof(*nv->w));
	}
	struct naive_word *w = &nv->w[nv->n++];
	w->n = (int)n;
	w->count = 1;
	for (size_t k = 0; k < n; k++)
		w->sym[k] = p[k];
	return 0;
}

TEST_CASE(train_matches_naive)
{
	size_t n;
	char *text = training_text(&n);
	n = n < 60000 ? n : 60000;
	const int vocab = 420;
	struct tok_train_opts o = {.vocab_size = vocab};
	struct tok_tokenizer *t;
	EXPECT(tok_train(&t, &o, text, n) == 0, "train");
	struct tok_tokenizer *splitter = bytes_only(NULL);
	struct naive nv = {0};
	EXPECT(tok_split(splitter, text, n, naive_piece, &nv) == 0, "naive split");
	/* token bytes by id */
	static uint8_t tb[1024][64];
	static int tl[1024];
	for (int b = 0; b < 256; b++) {
		tb[b][0] = (uint8_t)b;
		tl[b] = 1;
	}
	int nt = 256, mismatches = 0;
	static int64_t pc[1024][1024];
	while (nt < vocab) {
		memset(pc, 0, sizeof(pc));
		for (int i = 0; i < nv.n; i++)
			for (int k = 0; k + 1 < nv.w[i].n; k++)
				pc[nv.w[i].sym[k]][nv.w[i].sym[k + 1]] += nv.w[i].count;
		int64_t best = 0;
		int ba = -1, bb = -1;
		for (int a = 0; a < nt; a++)
			for (int b = 0; b < nt; b++)
				if (pc[a][b] > best) {
					best = pc[a][b];
					ba = a;
					bb = b;
				}
		if (best < 2)
			break;
		CHECK(tl[ba] + tl[bb] <= 64, "naive token too long");
		memcpy(tb[nt], tb[ba], (size_t)tl[ba]);
		memcpy(tb[nt] + tl[ba], tb[bb], (size_t)tl[bb]);
		tl[nt] = tl[ba] + tl[bb];
		int c = nt;
		for (int j = 256; j < nt; j++)
			if (tl[j] == tl[nt] && !memcmp(tb[j], tb[nt], (size_t)tl[nt]))
				c = j;
		if (c == nt)
			nt++;
		for (int i = 0; i < nv.n; i++) {
			struct naive_word *w = &nv.w[i];
			int m = 0;
			for (int k = 0; k < w->n; k++) {
				if (k + 1 < w->n && w->sym[k] == ba && w->sym[k + 1] == bb) {
					w->sym[m++] = c;
					k++;
				} else {
					w->sym[m++] = w->sym[k];
				}
			}
			w->n = m;
		}
	}
	EXPECT(tok_n_vocab(t) == nt, "vocab %lld vs naive %d", (long long)tok_n_vocab(t), nt);
	for (int r = 0; r < nt && r < tok_n_vocab(t); r++) {
		size_t len;
		const uint8_t *p = tok_token_bytes(t, r, &len);
		mismatches += len != (size_t)tl[r] || memcmp(p, tb[r], len) != 0;
	}
	EXPECT(mismatches == 0, "%d tokens differ from the naive trainer", mismatches);
	free(nv.w);
	tok_free(splitter);
	tok_free(t);
	free(text);
}

TEST_CASE(train_compression)
{
	size_t n;
	char *text = training_text(&n);
	double prev = 1e9;
	struct tok_ids ids = {0};
	struct tok_tokenizer *first = NULL;
	const int64_t sizes[] = {256, 300, 512, 1024, 2048};
	for (int i = 0; i < 5; i++) {
		struct tok_train_opts o = {.vocab_size = sizes[i]};
		struct tok_tokenizer *t;
		EXPECT(tok_train(&t, &o, text, n) == 0, "train %lld", (long long)sizes[i]);
		ids.n = 0;
		tok_encode(t, text, n, &ids);
		double per = (double)ids.n / (double)n;
		printf("  vocab %5lld: %.3f bytes/token\n", (long long)sizes[i], 1.0 / per);
		EXPECT(per < prev, "tokens per byte must fall with the vocabulary: %g then %g",
		       prev, per);
		EXPECT(roundtrip(t, text, n, false), "round trip of the training text");
		prev = per;
		/* the first 256 ranks are the bytes in order; training is deterministic */
		size_t len;
		const uint8_t *p = tok_token_bytes(t, 200, &len);
		EXPECT(len == 1 && p[0] == 200, "rank 200 is byte 200");
		if (i == 3) {
			struct tok_tokenizer *again;
			tok_train(&again, &o, text, n);
			bool same = tok_n_vocab(again) == tok_n_vocab(t);
			for (int64_t r = 0; same && r < tok_n_vocab(t); r++) {
				size_t l1, l2;
				const uint8_t *a = tok_token_bytes(t, (int32_t)r, &l1);
				const uint8_t *b = tok_token_bytes(again, (int32_t)r, &l2);
				same = l1 == l2 && !memcmp(a, b, l1);
			}
			EXPECT(same, "training twice gives the same vocabulary");
			tok_free(again);
		}
		if (i == 0)
			first = t;
		else
			tok_free(t);
	}
	EXPECT(first && tok_n_vocab(first) == 256, "vocab 256 is the bytes alone");
	tok_free(first);
	/* a tiny corpus cannot fill a big vocabulary: fewer tokens and a warning, no failure */
	struct tok_train_opts o = {.vocab_size = 5000};
	struct tok_tokenizer *t;
	EXPECT(tok_train(&t, &o, "abcabcabc abc", 13) == 0 && tok_n_vocab(t) < 300, "tiny corpus");
	tok_free(t);
	tok_ids_free(&ids);
	free(text);
}

int main(void)
{
	RUN(split_pattern);
	RUN(roundtrip_random_bytes);
	RUN(roundtrip_invalid_utf8);
	RUN(long_inputs);
	RUN(bpe_matches_reference);
	RUN(special_tokens);
	RUN(loader_errors);
	RUN(save_load);
	RUN(hf_tokenizer_json);
	RUN(train_matches_naive);
	RUN(train_compression);
	return test_summary();
}
