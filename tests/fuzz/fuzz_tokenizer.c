/* tests/fuzz/fuzz_tokenizer: libFuzzer harness for data/tokenizer (not part of the CMake build).
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Isrc tests/fuzz/fuzz_tokenizer.c \
 *         src/data/tokenizer*.c src/base/log.c -lpcre2-8 -lcjson -lm -o /tmp/fuzz_tokenizer
 *   mkdir -p /tmp/fuzz_tokenizer_corpus
 *   /tmp/fuzz_tokenizer -max_total_time=120 -close_fd_mask=2 /tmp/fuzz_tokenizer_corpus
 *
 * (-close_fd_mask=2 silences the loaders' error messages; crash reports still show.)
 *
 * The first byte picks what the rest is:
 *   0: a rank file for tok_load_ranks_mem (header lines included);
 *   1: a Hugging Face tokenizer.json for tok_load_hf_mem;
 *   2: extra tokens, '\n'-separated, appended to the 256 single bytes: a random vocabulary;
 *   3: text for a fixed tokenizer trained at start-up.
 * Whatever loads must encode the input itself (and a fixed sample) so that decode gives it back
 * exactly, with and without special-token parsing; plain encode never yields a special id; and
 * the fast merge agrees with its reference twin on every piece. Loaded custom patterns are not
 * run (a hostile pattern may be slow by design); the Llama 3 and GPT-2 ones are.
 */
#include "data/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

static const char sample[] = "Hello world! don't 12345 \xe4\xbd\xa0\xe5\xa5\xbd  \n\n\t<|eot_id|> "
                             "\xf0\x9f\x98\x80 \xff\xc3( x";

static void fail(const char *what)
{
	fprintf(stderr, "fuzz_tokenizer: %s\n", what);
	abort();
}

struct piece_check {
	struct tok_tokenizer *t;
	struct tok_ids a, b;
};

static int check_piece(void *ctx, const uint8_t *p, size_t n)
{
	struct piece_check *c = ctx;
	if (n > 512)
		return 0;
	c->a.n = c->b.n = 0;
	tok_bpe(c->t, p, n, &c->a);
	tok_bpe_ref(c->t, p, n, &c->b);
	if (c->a.n != c->b.n || memcmp(c->a.v, c->b.v, (size_t)c->a.n * sizeof(int32_t)) != 0)
		fail("tok_bpe differs from tok_bpe_ref");
	return 0;
}

static void roundtrip(struct tok_tokenizer *t, const uint8_t *text, size_t n)
{
	struct tok_ids ids = {0};
	struct tok_bytes out = {0};
	for (int specials = 0; specials < 2; specials++) {
		ids.n = 0;
		out.n = 0;
		int rc = specials ? tok_encode_with_specials(t, text, n, &ids)
		                  : tok_encode(t, text, n, &ids);
		if (rc)
			fail("encode failed");
		for (int64_t i = 0; !specials && i < ids.n; i++)
			if (ids.v[i] < 0 || ids.v[i] >= tok_n_vocab(t))
				fail("plain encode produced an id outside the regular vocabulary");
		if (tok_decode(t, ids.v, ids.n, &out) || out.n != n ||
		    (n && memcmp(out.v, text, n)))
			fail("decode(encode(x)) != x");
	}
	struct piece_check c = {.t = t};
	if (tok_split(t, text, n, check_piece, &c))
		fail("split failed");
	tok_ids_free(&c.a);
	tok_ids_free(&c.b);
	tok_ids_free(&ids);
	tok_bytes_free(&out);
}

static void exercise(struct tok_tokenizer *t, const uint8_t *data, size_t n)
{
	const char *pat = tok_pattern(t);
	if (strcmp(pat, TOK_PATTERN_LLAMA3) != 0 && strcmp(pat, TOK_PATTERN_GPT2) != 0)
		return;
	roundtrip(t, data, n);
	roundtrip(t, (const uint8_t *)sample, sizeof(sample) - 1);
}

static struct tok_tokenizer *trained;

static void train_once(void)
{
	static const char text[] =
	    "the quick brown fox jumps over the lazy dog; the dog doesn't care. 1234567 "
	    "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c aaaa bbbb    \n\n\t\t the the the "
	    "tokenizer tokenizers tokenized token tokens  <|end_of_text|> \xc3\xa9t\xc3\xa9 ";
	char big[sizeof(text) * 40];
	size_t n = 0;
	for (int i = 0; i < 40; i++) {
		memcpy(big + n, text, sizeof(text) - 1);
		n += sizeof(text) - 1;
	}
	struct tok_train_opts o = {.vocab_size = 400};
	CHECK(tok_train(&trained, &o, big, n) == 0, "training the fuzz tokenizer");
}

/* 256 single bytes + the '\n'-separated pieces of data (non-empty, <= 24 bytes, unique). */
static struct tok_tokenizer *random_vocab(const uint8_t *data, size_t n)
{
	enum { MAX_EXTRA = 256 };
	static uint8_t bytes[256];
	const uint8_t *toks[256 + MAX_EXTRA];
	size_t lens[256 + MAX_EXTRA];
	int m = 0;
	for (int b = 0; b < 256; b++) {
		bytes[b] = (uint8_t)b;
		toks[m] = bytes + b;
		lens[m++] = 1;
	}
	size_t i = 0;
	while (i < n && m < 256 + MAX_EXTRA) {
		const uint8_t *nl = memchr(data + i, '\n', n - i);
		size_t e = nl ? (size_t)(nl - data) : n, L = e - i;
		bool dup = L < 2 || L > 24;
		for (int k = 256; k < m && !dup; k++)
			dup = lens[k] == L && memcmp(toks[k], data + i, L) == 0;
		if (!dup) {
			toks[m] = data + i;
			lens[m++] = L;
		}
		i = e + 1;
	}
	struct tok_tokenizer *t = NULL;
	static const char *const specials[] = {"<|eot_id|>", "<|a|>", "x"};
	if (tok_build(&t, toks, lens, m, NULL, specials, 3, "fuzz vocabulary"))
		fail("tok_build rejected a valid vocabulary");
	return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	if (!trained)
		train_once();
	const uint8_t *rest = data + 1;
	size_t n = size - 1;
	struct tok_tokenizer *t = NULL;
	switch (data[0] % 4) {
	case 0:
		if (tok_load_ranks_mem(&t, rest, n, "fuzz.tiktoken") == 0)
			exercise(t, rest, n);
		break;
	case 1:
		if (tok_load_hf_mem(&t, (const char *)rest, n, "fuzz.json") == 0)
			exercise(t, rest, n);
		break;
	case 2:
		t = random_vocab(rest, n);
		exercise(t, rest, n);
		break;
	default:
		roundtrip(trained, rest, n);
		break;
	}
	tok_free(t);
	return 0;
}
