/* ctitan prepare --tokenizer PATH --input FILES_OR_DIRS... --out DIR
 *                [--doc-separator STR] [--val-fraction F] [--shard-tokens N]
 *
 * Every input file (folders are walked, sorted by name; "-" is stdin) is split into documents
 * at --doc-separator (default: the whole file is one document); each document becomes
 * <|begin_of_text|> tokens <|end_of_text|>. Every document whose hash falls below
 * --val-fraction goes to the validation split. Shards of at most --shard-tokens tokens are
 * written as DIR/train_NNNNNN.bin and DIR/val_NNNNNN.bin (uint16 when the vocabulary fits,
 * else uint32). A progress line with rate and ETA is drawn on a terminal; a summary follows.
 */
#include "cli/prepare_cmd.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/rng.h"
#include "base/timer.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "train/metrics.h"

struct prep {
	struct tok_tokenizer *tok;
	const char *out_dir, *sep;
	double val_fraction;
	int64_t shard_tokens;
	int width;
	int32_t bos, eos;
	struct shard_writer w[2]; /* 0 train, 1 val */
	bool open[2];
	int64_t shard_no[2], tokens[2], docs[2], bytes_in;
	int64_t total_bytes;
	double t0, last_draw;
	bool tty;
	struct tok_ids ids;
};

static const char *const split_names[2] = {"train", "val"};

static int prep_flush_shard(struct prep *p, int s)
{
	if (!p->open[s])
		return CT_OK;
	p->open[s] = false;
	return shard_writer_close(&p->w[s]);
}

static int prep_emit(struct prep *p, int s, const int32_t *ids, int64_t n)
{
	while (n > 0) {
		if (!p->open[s]) {
			char path[1100];
			snprintf(path, sizeof(path), "%s/%s_%06lld.bin", p->out_dir, split_names[s],
			         (long long)p->shard_no[s]++);
			int rc = shard_writer_open(&p->w[s], path, p->width);
			if (rc)
				return rc;
			p->open[s] = true;
		}
		int64_t room = p->shard_tokens - p->w[s].count, k = n < room ? n : room;
		int rc = shard_writer_append(&p->w[s], ids, k);
		if (rc)
			return rc;
		p->tokens[s] += k;
		ids += k;
		n -= k;
		if (p->w[s].count >= p->shard_tokens && (rc = prep_flush_shard(p, s)))
			return rc;
	}
	return CT_OK;
}

static void prep_progress(struct prep *p, bool final)
{
	double now = timer_now();
	if (!p->tty || (!final && now - p->last_draw < 0.2))
		return;
	p->last_draw = now;
	double el = now - p->t0, rate = el > 0 ? (double)p->bytes_in / el : 0;
	double frac = p->total_bytes > 0 ? (double)p->bytes_in / (double)p->total_bytes : 1;
	double eta = rate > 0 ? (double)(p->total_bytes - p->bytes_in) / rate : 0;
	int bar = (int)(frac * 30);
	fprintf(stderr, "\r[%-30.*s] %5.1f%%  %.1f MB/s  ETA %4.0fs  %lld tokens", bar,
	        "==============================", 100 * frac, rate / 1e6, eta,
	        (long long)(p->tokens[0] + p->tokens[1]));
	if (final)
		fprintf(stderr, "\n");
}

static int prep_document(struct prep *p, const char *text, size_t len)
{
	if (len == 0)
		return CT_OK;
	int64_t doc = p->docs[0] + p->docs[1];
	int s = rng_uniform(0x70726570ull, 1, (uint64_t)doc) < p->val_fraction ? 1 : 0;
	p->ids.n = 0;
	int32_t bos = p->bos, eos = p->eos;
	int rc = CT_OK;
	if (bos >= 0)
		rc = prep_emit(p, s, &bos, 1);
	if (!rc)
		rc = tok_encode(p->tok, text, len, &p->ids);
	if (!rc)
		rc = prep_emit(p, s, p->ids.v, p->ids.n);
	if (!rc && eos >= 0)
		rc = prep_emit(p, s, &eos, 1);
	p->docs[s]++;
	p->bytes_in += (int64_t)len;
	prep_progress(p, false);
	return rc;
}

static int prep_text(struct prep *p, const char *text, size_t len)
{
	if (!p->sep || !*p->sep)
		return prep_document(p, text, len);
	size_t sl = strlen(p->sep), start = 0;
	for (size_t i = 0; i + sl <= len;) {
		if (memcmp(text + i, p->sep, sl) == 0) {
			int rc = prep_document(p, text + start, i - start);
			if (rc)
				return rc;
			i += sl;
			start = i;
		} else {
			i++;
		}
	}
	return prep_document(p, text + start, len - start);
}

static int read_all(FILE *f, const char *name, char **out, size_t *len)
{
	size_t cap = 1 << 20, n = 0, got;
	char *buf = malloc(cap);
	CHECK(buf, "out of memory");
	while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
		n += got;
		if (n == cap) {
			cap *= 2;
			buf = realloc(buf, cap);
			CHECK(buf, "out of memory reading %s", name);
		}
	}
	if (ferror(f)) {
		LOG_ERROR("prepare: read error on '%s'", name);
		free(buf);
		return CT_ERR_RUNTIME;
	}
	*out = buf;
	*len = n;
	return CT_OK;
}

static int prep_file(struct prep *p, const char *path)
{
	FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
	if (!f) {
		LOG_ERROR("prepare: cannot open '%s': %s", path, strerror(errno));
		return CT_ERR_USAGE;
	}
	char *text;
	size_t len;
	int rc = read_all(f, path, &text, &len);
	if (f != stdin)
		fclose(f);
	if (rc)
		return rc;
	rc = prep_text(p, text, len);
	free(text);
	return rc;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A file, or every regular file under a folder (sorted, recursively). */
static int prep_path(struct prep *p, const char *path, bool count_only)
{
	struct stat st;
	if (strcmp(path, "-") == 0)
		return count_only ? CT_OK : prep_file(p, path);
	if (stat(path, &st) != 0) {
		LOG_ERROR("prepare: cannot open '%s': %s", path, strerror(errno));
		return CT_ERR_USAGE;
	}
	if (!S_ISDIR(st.st_mode)) {
		if (count_only) {
			p->total_bytes += st.st_size;
			return CT_OK;
		}
		return prep_file(p, path);
	}
	DIR *d = opendir(path);
	if (!d) {
		LOG_ERROR("prepare: cannot read folder '%s': %s", path, strerror(errno));
		return CT_ERR_USAGE;
	}
	char **names = NULL;
	size_t n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		names = realloc(names, (n + 1) * sizeof(char *));
		CHECK(names, "out of memory");
		size_t l = strlen(path) + strlen(e->d_name) + 2;
		names[n] = malloc(l);
		CHECK(names[n], "out of memory");
		snprintf(names[n++], l, "%s/%s", path, e->d_name);
	}
	closedir(d);
	qsort(names, n, sizeof(char *), cmp_str);
	int rc = CT_OK;
	for (size_t i = 0; i < n; i++) {
		if (!rc)
			rc = prep_path(p, names[i], count_only);
		free(names[i]);
	}
	free(names);
	return rc;
}

static void prep_usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: ctitan prepare --tokenizer PATH --input FILES_OR_DIRS... --out DIR\n"
	    "                      [--doc-separator STR] [--val-fraction F] [--shard-tokens N]\n\n"
	    "Tokenizes text into token shards for training (training.dataset_path = DIR).\n"
	    "  --input          files, folders (walked, sorted) or - for stdin\n"
	    "  --doc-separator  split files into documents at this string, e.g. '\\n\\n'\n"
	    "                   (escapes \\n and \\t are understood); default: one per file\n"
	    "  --val-fraction   fraction of documents for the val split (default 0.01)\n"
	    "  --shard-tokens   tokens per shard file (default 100000000)\n");
}

static char *unescape(const char *s)
{
	char *o = xstrdup(s), *q = o;
	for (const char *p = s; *p; p++) {
		if (*p == '\\' && (p[1] == 'n' || p[1] == 't')) {
			*q++ = p[1] == 'n' ? '\n' : '\t';
			p++;
		} else {
			*q++ = *p;
		}
	}
	*q = 0;
	return o;
}

int cmd_prepare(int argc, char **argv)
{
	const char *tok_path = NULL, *out = NULL;
	char *sep = NULL;
	const char **inputs = xcalloc((size_t)argc + 1, sizeof(char *));
	int n_in = 0, rc = CT_OK;
	struct prep p = {.val_fraction = 0.01, .shard_tokens = 100000000};
	for (int i = 0; i < argc && !rc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			prep_usage(stdout);
			free(inputs);
			return 0;
		}
		bool has = i + 1 < argc;
		if (strcmp(a, "--tokenizer") == 0 && has) {
			tok_path = argv[++i];
		} else if (strcmp(a, "--out") == 0 && has) {
			out = argv[++i];
		} else if (strcmp(a, "--doc-separator") == 0 && has) {
			free(sep);
			sep = unescape(argv[++i]);
		} else if (strcmp(a, "--val-fraction") == 0 && has) {
			char *end;
			p.val_fraction = strtod(argv[++i], &end);
			if (*end || p.val_fraction < 0 || p.val_fraction >= 1) {
				LOG_ERROR("--val-fraction: expected a number in [0, 1)");
				rc = CT_ERR_USAGE;
			}
		} else if (strcmp(a, "--shard-tokens") == 0 && has) {
			char *end;
			p.shard_tokens = strtoll(argv[++i], &end, 10);
			if (*end || p.shard_tokens < 1) {
				LOG_ERROR("--shard-tokens: expected a positive integer");
				rc = CT_ERR_USAGE;
			}
		} else if (strcmp(a, "--input") == 0) {
			while (i + 1 < argc && (strncmp(argv[i + 1], "--", 2) != 0))
				inputs[n_in++] = argv[++i];
		} else {
			LOG_ERROR("prepare: unknown or incomplete argument '%s'", a);
			rc = CT_ERR_USAGE;
		}
	}
	if (!rc && (!tok_path || !out || n_in == 0)) {
		prep_usage(stderr);
		rc = CT_ERR_USAGE;
	}
	p.out_dir = out;
	p.sep = sep;
	if (!rc)
		rc = tok_load(&p.tok, tok_path);
	if (!rc)
		rc = metrics_mkdirs(out);
	if (!rc) {
		p.width = tok_n_ids(p.tok) <= 65536 ? 2 : 4;
		p.bos = tok_special_id(p.tok, "<|begin_of_text|>");
		p.eos = tok_special_id(p.tok, "<|end_of_text|>");
		p.tty = isatty(STDERR_FILENO);
		for (int i = 0; i < n_in && !rc; i++)
			rc = prep_path(&p, inputs[i], true);
		p.t0 = timer_now();
		for (int i = 0; i < n_in && !rc; i++)
			rc = prep_path(&p, inputs[i], false);
	}
	for (int s = 0; s < 2; s++) {
		int r2 = prep_flush_shard(&p, s);
		rc = rc ? rc : r2;
	}
	if (!rc) {
		prep_progress(&p, true);
		int64_t tokens = p.tokens[0] + p.tokens[1];
		printf(
		    "prepared %s: %lld documents (%lld val), %lld tokens (train %lld, val %lld), "
		    "%.3f bytes/token, %d-byte tokens, vocabulary %lld\n",
		    out, (long long)(p.docs[0] + p.docs[1]), (long long)p.docs[1],
		    (long long)tokens, (long long)p.tokens[0], (long long)p.tokens[1],
		    tokens ? (double)p.bytes_in / (double)tokens : 0.0, p.width,
		    (long long)tok_n_ids(p.tok));
	}
	tok_ids_free(&p.ids);
	if (p.tok)
		tok_free(p.tok);
	free(sep);
	free(inputs);
	return ct_exit_code(rc);
}
