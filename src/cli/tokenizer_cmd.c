/* cli/tokenizer_cmd: train a byte-level BPE tokenizer, encode and decode with one. */
#include "cli/tokenizer_cmd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/timer.h"
#include "data/tokenizer.h"

static void usage(FILE *f)
{
	fprintf(
	    f, "usage: ctitan tokenizer <command> [options]\n\n"
	       "commands:\n"
	       "  train --vocab-size N --input FILE... --out PATH\n"
	       "        [--min-count N] [--pattern llama3|gpt2|REGEX] [--special-tokens A,B,...]\n"
	       "      train a byte-level BPE vocabulary of N ids in all, special tokens\n"
	       "      included, so model.vocab_size = N fits it: N - S regular tokens (256\n"
	       "      bytes + merges) learnt on the files ('-' is stdin), then the S special\n"
	       "      tokens (default <|begin_of_text|>,<|end_of_text|>; '' for none); writes a\n"
	       "      tiktoken rank file with a ctitan header (docs/tokenizer.md)\n"
	       "  encode --tokenizer PATH [--input FILE] [--output FILE] [--specials]\n"
	       "         [--stats] [--quiet] [--repeat N]\n"
	       "      print the token ids of the input (default stdin), one per line;\n"
	       "      --specials parses special token names; --stats prints bytes, tokens and\n"
	       "      encode speed to stderr (best of --repeat runs); --quiet prints no ids\n"
	       "  decode --tokenizer PATH [--input FILE] [--output FILE]\n"
	       "      read whitespace-separated ids, write their bytes\n"
	       "  info --tokenizer PATH\n"
	       "      vocabulary size, special tokens and pattern\n\n"
	       "PATH is a tiktoken rank file (Llama 3's tokenizer.model, cl100k_base.tiktoken, or\n"
	       "one written by train) or a Hugging Face tokenizer.json (byte-level BPE).\n"
	       "exit codes: 0 success, 1 runtime failure, 2 bad usage\n");
}

struct opts {
	const char *tokenizer, *input, *output, *out, *pattern, *specials;
	const char **inputs;
	int n_inputs;
	long long vocab_size, min_count, repeat;
	bool with_specials, stats, quiet;
};

static bool parse_ll(const char *s, long long *v)
{
	char *end;
	errno = 0;
	*v = strtoll(s, &end, 10);
	return errno == 0 && end != s && *end == 0;
}

/* --key value or --key=value; --input may take several values (train). */
static int parse_opts(const char *cmd, int argc, char **argv, struct opts *o)
{
	o->inputs = xcalloc((size_t)argc + 1, sizeof(*o->inputs));
	o->repeat = 1;
	for (int i = 0; i < argc; i++) {
		char key[64];
		const char *a = argv[i], *val = NULL, *eq = strchr(a, '=');
		if (strncmp(a, "--", 2) != 0) {
			fprintf(stderr, "ctitan tokenizer %s: unexpected argument '%s'\n", cmd, a);
			return CT_ERR_USAGE;
		}
		size_t klen = eq ? (size_t)(eq - a) : strlen(a);
		if (klen >= sizeof(key))
			klen = sizeof(key) - 1;
		memcpy(key, a, klen);
		key[klen] = 0;
		bool flag = !strcmp(key, "--specials") || !strcmp(key, "--stats") ||
		            !strcmp(key, "--quiet");
		if (flag) {
			if (eq) {
				fprintf(stderr, "ctitan tokenizer %s: %s takes no value\n", cmd,
				        key);
				return CT_ERR_USAGE;
			}
			o->with_specials |= !strcmp(key, "--specials");
			o->stats |= !strcmp(key, "--stats");
			o->quiet |= !strcmp(key, "--quiet");
			continue;
		}
		if (eq)
			val = eq + 1;
		else if (i + 1 < argc)
			val = argv[++i];
		if (!val) {
			fprintf(stderr, "ctitan tokenizer %s: %s needs a value\n", cmd, key);
			return CT_ERR_USAGE;
		}
		bool ok = true;
		if (!strcmp(key, "--tokenizer"))
			o->tokenizer = val;
		else if (!strcmp(key, "--output"))
			o->output = val;
		else if (!strcmp(key, "--out"))
			o->out = val;
		else if (!strcmp(key, "--pattern"))
			o->pattern = val;
		else if (!strcmp(key, "--special-tokens"))
			o->specials = val;
		else if (!strcmp(key, "--vocab-size"))
			ok = parse_ll(val, &o->vocab_size);
		else if (!strcmp(key, "--min-count"))
			ok = parse_ll(val, &o->min_count) && o->min_count >= 1;
		else if (!strcmp(key, "--repeat"))
			ok = parse_ll(val, &o->repeat) && o->repeat >= 1;
		else if (!strcmp(key, "--input")) {
			o->input = val;
			o->inputs[o->n_inputs++] = val;
			while (!eq && i + 1 < argc && (strncmp(argv[i + 1], "--", 2) != 0))
				o->inputs[o->n_inputs++] = argv[++i];
		} else {
			fprintf(stderr, "ctitan tokenizer %s: unknown option %s (see --help)\n",
			        cmd, key);
			return CT_ERR_USAGE;
		}
		if (!ok) {
			fprintf(stderr, "ctitan tokenizer %s: bad value for %s: '%s'\n", cmd, key,
			        val);
			return CT_ERR_USAGE;
		}
	}
	return CT_OK;
}

/* Whole file (or stdin for NULL / "-") into memory. */
static int slurp(const char *path, struct tok_bytes *b)
{
	bool std = !path || !strcmp(path, "-");
	FILE *f = std ? stdin : fopen(path, "rb");
	if (!f) {
		LOG_ERROR("%s: cannot open: %s", path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	char buf[1 << 16];
	size_t k;
	while ((k = fread(buf, 1, sizeof(buf), f)) > 0) {
		if (b->n + k > b->cap) {
			size_t cap = b->cap ? b->cap : sizeof(buf);
			while (cap < b->n + k)
				cap *= 2;
			b->v = realloc(b->v, cap);
			CHECK(b->v, "out of memory");
			b->cap = cap;
		}
		memcpy(b->v + b->n, buf, k);
		b->n += k;
	}
	int err = ferror(f);
	if (!std)
		fclose(f);
	if (err) {
		LOG_ERROR("%s: read error", std ? "<stdin>" : path);
		return CT_ERR_RUNTIME;
	}
	return CT_OK;
}

static FILE *open_output(const char *path)
{
	if (!path || !strcmp(path, "-"))
		return stdout;
	FILE *f = fopen(path, "wb");
	if (!f)
		LOG_ERROR("%s: cannot create: %s", path, strerror(errno));
	return f;
}

static int close_output(FILE *f, const char *path)
{
	bool ok = fflush(f) == 0 && !ferror(f);
	if (f != stdout)
		ok &= fclose(f) == 0;
	if (!ok) {
		LOG_ERROR("%s: write failed", path ? path : "<stdout>");
		return CT_ERR_RUNTIME;
	}
	return CT_OK;
}

static int need(const char *cmd, const char *what, bool have)
{
	if (!have)
		fprintf(stderr, "ctitan tokenizer %s: missing %s (see ctitan tokenizer --help)\n",
		        cmd, what);
	return have ? CT_OK : CT_ERR_USAGE;
}

/* "A,B,C" -> names (split in place); "" -> none. */
static int split_specials(char *s, const char **names)
{
	int n = 0;
	if (!*s)
		return 0;
	for (char *p = s;; p++) {
		char *c = strchr(p, ',');
		names[n++] = p;
		if (!c)
			break;
		*c = 0;
		p = c;
	}
	return n;
}

static int cmd_train(struct opts *o)
{
	int rc = need("train", "--vocab-size", o->vocab_size > 0);
	if (!rc)
		rc = need("train", "--input", o->n_inputs > 0);
	if (!rc)
		rc = need("train", "--out", o->out != NULL);
	if (rc)
		return rc;
	char *spec = o->specials ? xstrdup(o->specials) : NULL;
	const char **names = spec ? xcalloc(strlen(spec) + 2, sizeof(*names)) : NULL;
	int n_special = spec ? split_specials(spec, names) : 2; /* tok_train's default pair */
	if (o->vocab_size - n_special < 256) {
		LOG_ERROR("tokenizer train: --vocab-size %lld counts the %d special tokens too: it "
		          "must be at least %d (256 bytes + the specials)",
		          o->vocab_size, n_special, 256 + n_special);
		free(names);
		free(spec);
		return CT_ERR_USAGE;
	}
	struct tok_train_opts to = {
	    .vocab_size = o->vocab_size - n_special,
	    .min_count = o->min_count,
	    .pattern = !o->pattern || !strcmp(o->pattern, "llama3") ? TOK_PATTERN_LLAMA3
	               : !strcmp(o->pattern, "gpt2")                ? TOK_PATTERN_GPT2
	                                                            : o->pattern,
	    .specials = names,
	    .n_special = spec ? n_special : 0,
	    .progress = true,
	};
	struct tok_trainer *tr = NULL;
	struct tok_tokenizer *t = NULL;
	struct tok_bytes text = {0};
	double t0 = timer_now();
	rc = tok_trainer_new(&tr, &to);
	for (int i = 0; !rc && i < o->n_inputs; i++) {
		text.n = 0;
		rc = slurp(o->inputs[i], &text);
		if (!rc)
			rc = tok_trainer_add(tr, text.v, text.n);
	}
	double t1 = timer_now();
	if (!rc)
		rc = tok_trainer_finish(tr, &t);
	double t2 = timer_now();
	if (!rc)
		rc = tok_save(t, o->out);
	if (!rc)
		LOG_INFO("trained %lld tokens (+%d special) in %.2f s (pre-split and count %.2f s, "
		         "merges %.2f s); wrote %s",
		         (long long)tok_n_vocab(t), tok_n_special(t), t2 - t0, t1 - t0, t2 - t1,
		         o->out);
	tok_free(t);
	tok_trainer_free(tr);
	tok_bytes_free(&text);
	free(names);
	free(spec);
	return rc;
}

static int write_ids(FILE *f, const struct tok_ids *ids)
{
	char buf[1 << 16];
	size_t o = 0;
	for (int64_t i = 0; i < ids->n; i++) {
		if (o + 16 > sizeof(buf)) {
			fwrite(buf, 1, o, f);
			o = 0;
		}
		o += (size_t)snprintf(buf + o, sizeof(buf) - o, "%d\n", (int)ids->v[i]);
	}
	fwrite(buf, 1, o, f);
	return CT_OK;
}

static int cmd_encode(struct opts *o)
{
	int rc = need("encode", "--tokenizer", o->tokenizer != NULL);
	if (rc)
		return rc;
	struct tok_tokenizer *t = NULL;
	struct tok_bytes text = {0};
	struct tok_ids ids = {0};
	rc = tok_load(&t, o->tokenizer);
	if (!rc)
		rc = slurp(o->input, &text);
	double best = 1e30;
	for (long long r = 0; !rc && r < o->repeat; r++) {
		ids.n = 0;
		double t0 = timer_now();
		rc = o->with_specials ? tok_encode_with_specials(t, text.v, text.n, &ids)
		                      : tok_encode(t, text.v, text.n, &ids);
		double dt = timer_now() - t0;
		best = dt < best ? dt : best;
	}
	if (!rc && o->stats)
		fprintf(
		    stderr,
		    "encode: %zu bytes -> %lld tokens (%.4f bytes/token) in %.4f s: %.2f MB/s\n",
		    text.n, (long long)ids.n, ids.n ? (double)text.n / (double)ids.n : 0.0, best,
		    best > 0 ? (double)text.n / best / 1e6 : 0.0);
	if (!rc && !o->quiet) {
		FILE *f = open_output(o->output);
		rc = f ? write_ids(f, &ids) : CT_ERR_RUNTIME;
		if (f)
			rc = rc ? rc : close_output(f, o->output);
	}
	tok_ids_free(&ids);
	tok_bytes_free(&text);
	tok_free(t);
	return rc;
}

static int parse_ids(const struct tok_bytes *text, const char *name, struct tok_ids *ids)
{
	size_t i = 0, n = text->n;
	const uint8_t *s = text->v;
	while (i < n) {
		while (i < n &&
		       (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r' || s[i] == ','))
			i++;
		if (i == n)
			break;
		long long v = 0;
		size_t start = i;
		while (i < n && s[i] >= '0' && s[i] <= '9' && v <= INT32_MAX)
			v = v * 10 + (s[i++] - '0');
		if (i == start || v > INT32_MAX ||
		    (i < n && !(s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r' ||
		                s[i] == ','))) {
			LOG_ERROR("%s: byte %zu: expected a token id (a non-negative integer)",
			          name, start);
			return CT_ERR_RUNTIME;
		}
		if (ids->n == ids->cap) {
			ids->cap = ids->cap ? 2 * ids->cap : 4096;
			ids->v = realloc(ids->v, (size_t)ids->cap * sizeof(*ids->v));
			CHECK(ids->v, "out of memory");
		}
		ids->v[ids->n++] = (int32_t)v;
	}
	return CT_OK;
}

static int cmd_decode(struct opts *o)
{
	int rc = need("decode", "--tokenizer", o->tokenizer != NULL);
	if (rc)
		return rc;
	struct tok_tokenizer *t = NULL;
	struct tok_bytes text = {0}, out = {0};
	struct tok_ids ids = {0};
	rc = tok_load(&t, o->tokenizer);
	if (!rc)
		rc = slurp(o->input, &text);
	if (!rc)
		rc = parse_ids(&text, o->input ? o->input : "<stdin>", &ids);
	if (!rc)
		rc = tok_decode(t, ids.v, ids.n, &out);
	if (!rc) {
		FILE *f = open_output(o->output);
		rc = f ? CT_OK : CT_ERR_RUNTIME;
		if (f) {
			fwrite(out.v, 1, out.n, f);
			rc = close_output(f, o->output);
		}
	}
	tok_ids_free(&ids);
	tok_bytes_free(&text);
	tok_bytes_free(&out);
	tok_free(t);
	return rc;
}

static int cmd_info(struct opts *o)
{
	int rc = need("info", "--tokenizer", o->tokenizer != NULL);
	if (rc)
		return rc;
	struct tok_tokenizer *t = NULL;
	rc = tok_load(&t, o->tokenizer);
	if (rc)
		return rc;
	printf("tokenizer: %s\nregular tokens: %lld\nspecial tokens: %d\nids: 0..%lld\n"
	       "pattern: %s\n",
	       o->tokenizer, (long long)tok_n_vocab(t), tok_n_special(t),
	       (long long)tok_n_ids(t) - 1, tok_pattern(t));
	for (int i = 0; i < tok_n_special(t); i++) {
		const char *name;
		int32_t id = tok_special_at(t, i, &name);
		printf("  %d %s\n", (int)id, name);
	}
	tok_free(t);
	return CT_OK;
}

int cmd_tokenizer(int argc, char **argv)
{
	for (int i = 0; i < argc; i++)
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		}
	if (argc < 1) {
		usage(stderr);
		return 2;
	}
	const char *cmd = argv[0];
	int (*fn)(struct opts *) = !strcmp(cmd, "train")    ? cmd_train
	                           : !strcmp(cmd, "encode") ? cmd_encode
	                           : !strcmp(cmd, "decode") ? cmd_decode
	                           : !strcmp(cmd, "info")   ? cmd_info
	                                                    : NULL;
	if (!fn) {
		fprintf(stderr, "ctitan tokenizer: unknown command '%s'\n\n", cmd);
		usage(stderr);
		return 2;
	}
	struct opts o;
	memset(&o, 0, sizeof(o));
	int rc = parse_opts(cmd, argc - 1, argv + 1, &o);
	if (!rc)
		rc = fn(&o);
	free(o.inputs);
	return ct_exit_code(rc);
}
