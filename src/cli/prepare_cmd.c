/* ctitan prepare --tokenizer PATH --input SOURCES... --out DIR
 *                [--doc-separator STR] [--text-field NAME] [--skip-bad-lines]
 *                [--mix-stop first|all] [--val-fraction F] [--shard-tokens N]
 *
 * Inputs are text or JSON-lines files, plain, gzip or zstd (data/corpus.h says which name is
 * which), folders (walked, sorted by name) and "-" (stdin). Without weights every input is read
 * in order as one corpus. With a weight on every input ("PATH:W"), each input is a source and
 * the output draws documents from them so that source i holds the share W_i / sum(W) of the
 * output's tokens (data/corpus.h, corpus_mix_pick), until the first source runs out
 * (--mix-stop first, the default: nothing is repeated) or, with --mix-stop all, repeating the
 * sources that run out until every one has been read through once.
 *
 * Each document becomes <|begin_of_text|> tokens <|end_of_text|>. Every document whose hash
 * (of its index in the output) falls below --val-fraction goes to the validation split.
 * Shards of at most --shard-tokens tokens are written as DIR/train_NNNNNN.bin and
 * DIR/val_NNNNNN.bin (uint16 when the vocabulary fits, else uint32). On failure no shard of
 * this run is left behind. A progress line with rate and ETA is drawn on a terminal; a summary
 * follows, with every source's documents, tokens and share when mixing.
 */
#include "cli/prepare_cmd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/rng.h"
#include "base/timer.h"
#include "data/corpus.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "train/metrics.h"

struct prep_source {
	const char *name; /* the --input item without its weight */
	struct corpus_source *src;
	double weight;
	int64_t docs, tokens, passes;
};

struct prep {
	struct tok_tokenizer *tok;
	const char *out_dir;
	double val_fraction;
	int64_t shard_tokens;
	int width;
	int32_t bos, eos;
	struct shard_writer w[2]; /* 0 train, 1 val */
	bool open[2];
	int64_t shard_no[2], tokens[2], docs[2], bytes_in;
	char **written; /* shards completed by this run, removed if it fails */
	int64_t n_written;
	struct prep_source *srcs;
	int n_srcs;
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
	char *path = xstrdup(p->w[s].path);
	int rc = shard_writer_close(&p->w[s]);
	if (rc) {
		free(path);
		return rc;
	}
	p->written = realloc(p->written, (size_t)(p->n_written + 1) * sizeof(char *));
	CHECK(p->written, "out of memory");
	p->written[p->n_written++] = path;
	return CT_OK;
}

/* After a failure: drop the open shards' temporary files and the shards already written. */
static void prep_discard(struct prep *p)
{
	for (int s = 0; s < 2; s++) {
		if (p->open[s]) {
			p->w[s].failed = 1;
			shard_writer_close(&p->w[s]);
			p->open[s] = false;
		}
	}
	for (int64_t i = 0; i < p->n_written; i++)
		unlink(p->written[i]);
	if (p->n_written > 0)
		LOG_ERROR("prepare: removed the %lld shard(s) this run had written to %s",
		          (long long)p->n_written, p->out_dir);
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
	int64_t done = 0;
	for (int i = 0; i < p->n_srcs; i++)
		done += corpus_source_disk_read(p->srcs[i].src);
	double el = now - p->t0, rate = el > 0 ? (double)p->bytes_in / el : 0;
	double frac = p->total_bytes > 0 ? (double)done / (double)p->total_bytes : 1;
	frac = final || frac > 1 ? 1 : frac;
	double eta = frac > 0 ? el * (1 - frac) / frac : 0;
	int bar = (int)(frac * 30);
	fprintf(stderr, "\r[%-30.*s] %5.1f%%  %.1f MB/s  ETA %4.0fs  %lld tokens", bar,
	        "==============================", 100 * frac, rate / 1e6, eta,
	        (long long)(p->tokens[0] + p->tokens[1]));
	if (final)
		fprintf(stderr, "\n");
}

/* One document into the split its hash picks; *emitted = its tokens (0 for empty text). */
static int prep_document(struct prep *p, const char *text, size_t len, int64_t *emitted)
{
	*emitted = 0;
	if (len == 0)
		return CT_OK;
	int64_t doc = p->docs[0] + p->docs[1];
	int s = rng_uniform(0x70726570ull, 1, (uint64_t)doc) < p->val_fraction ? 1 : 0;
	int64_t before = p->tokens[s];
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
	*emitted = p->tokens[s] - before;
	prep_progress(p, false);
	return rc;
}

/* Documents from the sources, interleaved by weight (one source: in order), until the first
 * source runs out (!repeat) or until each has been read through once (repeat). */
static int prep_run(struct prep *p, bool repeat)
{
	int n = p->n_srcs, finished = 0;
	double *w = xcalloc((size_t)n, sizeof(double));
	int64_t *tok = xcalloc((size_t)n, sizeof(int64_t));
	for (int i = 0; i < n; i++)
		w[i] = p->srcs[i].weight;
	struct corpus_mix mix = {.n = n, .weight = w, .tokens = tok};
	int rc = CT_OK;
	while (!rc) {
		int i = corpus_mix_pick(&mix);
		struct prep_source *ps = &p->srcs[i];
		const char *text;
		size_t len;
		bool end;
		if ((rc = corpus_source_next(ps->src, &text, &len, &end)))
			break;
		if (end) {
			if (n > 1 && ps->tokens == 0) {
				LOG_ERROR(
				    "prepare: --input %s holds no text: nothing to mix from it",
				    ps->name);
				rc = CT_ERR_USAGE;
				break;
			}
			if (ps->passes++ == 0)
				finished++;
			if (!repeat || finished == n)
				break;
			rc = corpus_source_rewind(ps->src);
			continue;
		}
		int64_t k;
		rc = prep_document(p, text, len, &k);
		ps->tokens += k;
		tok[i] += k;
		ps->docs += len > 0;
	}
	free(w);
	free(tok);
	return rc;
}

static void prep_summary(const struct prep *p, bool mixed)
{
	int64_t tokens = p->tokens[0] + p->tokens[1];
	printf("prepared %s: %lld documents (%lld val), %lld tokens (train %lld, val %lld), "
	       "%.3f bytes/token, %d-byte tokens, vocabulary %lld\n",
	       p->out_dir, (long long)(p->docs[0] + p->docs[1]), (long long)p->docs[1],
	       (long long)tokens, (long long)p->tokens[0], (long long)p->tokens[1],
	       tokens ? (double)p->bytes_in / (double)tokens : 0.0, p->width,
	       (long long)tok_n_ids(p->tok));
	double wsum = 0;
	for (int i = 0; i < p->n_srcs; i++)
		wsum += p->srcs[i].weight;
	for (int i = 0; i < p->n_srcs; i++) {
		const struct prep_source *ps = &p->srcs[i];
		if (mixed)
			printf("  source %d %s: weight %.4f, %lld documents, %lld tokens (%.4f of "
			       "the output), %lld complete pass(es)\n",
			       i + 1, ps->name, ps->weight / wsum, (long long)ps->docs,
			       (long long)ps->tokens,
			       tokens ? (double)ps->tokens / (double)tokens : 0.0,
			       (long long)ps->passes);
		const char *file, *why;
		int64_t line, bad = corpus_source_bad(ps->src, &file, &line, &why);
		if (bad > 0)
			LOG_WARN(
			    "prepare: skipped %lld malformed line(s) in %s (first: %s:%lld: %s)",
			    (long long)bad, mixed ? ps->name : "the inputs", file, (long long)line,
			    why);
	}
}

static void prep_usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: ctitan prepare --tokenizer PATH --input SOURCE[:WEIGHT]... --out DIR\n"
	    "                      [--doc-separator STR] [--text-field NAME] [--skip-bad-lines]\n"
	    "                      [--mix-stop first|all] [--val-fraction F] [--shard-tokens N]\n\n"
	    "Tokenizes text into token shards for training (training.dataset_path = DIR).\n"
	    "  --input          files, folders (walked, sorted) or - for stdin. By name:\n"
	    "                   *.jsonl, *.jsonl.gz, *.jsonl.zst: JSON lines, one document\n"
	    "                   per line (an object; its text in --text-field); *.gz, *.zst:\n"
	    "                   compressed plain text; anything else: plain text\n"
	    "  SOURCE:WEIGHT    mix sources: with a weight on every input, each input is a\n"
	    "                   source, and source i gives WEIGHT_i / sum(WEIGHT) of the output\n"
	    "                   tokens (<|begin_of_text|> and <|end_of_text|> included; each\n"
	    "                   source within one document of its share for two sources; at\n"
	    "                   most (sources - 1) documents under it in general). The next\n"
	    "                   document always comes from the source furthest below its share:\n"
	    "                   deterministic, no seed. Without weights the inputs are read in\n"
	    "                   order as one corpus\n"
	    "  --mix-stop       first (default): stop when the first source runs out, nothing is\n"
	    "                   repeated; all: sources that run out start again until every\n"
	    "                   source has been read through once\n"
	    "  --doc-separator  split plain text into documents at this string, e.g. '\\n\\n'\n"
	    "                   (escapes \\n and \\t are understood); default: one per file\n"
	    "  --text-field     the JSON field holding a document's text (default text)\n"
	    "  --skip-bad-lines skip malformed JSON lines (not JSON, not an object, no such\n"
	    "                   field, not a string, empty), counted and reported with the\n"
	    "                   first one's file:line; default: the first one is an error (exit "
	    "2)\n"
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

/* "PATH:W" -> path and weight (> 0); a suffix after the last ':' that is not a number is part
 * of the path (*weight = 0). */
static int parse_input(const char *spec, char **path, double *weight)
{
	*weight = 0;
	*path = xstrdup(spec);
	char *colon = strrchr(*path, ':');
	if (!colon || colon == *path || !colon[1])
		return CT_OK;
	char *end;
	double w = strtod(colon + 1, &end);
	if (*end)
		return CT_OK;
	if (!(w > 0) || !isfinite(w)) {
		LOG_ERROR("--input %s: the weight must be a positive number", spec);
		return CT_ERR_USAGE;
	}
	*colon = 0;
	*weight = w;
	return CT_OK;
}

static int prep_open_sources(struct prep *p, char **paths, const double *weights, int n_in,
                             const struct corpus_options *opt, bool *mixed)
{
	int weighted = 0;
	for (int i = 0; i < n_in; i++)
		weighted += weights[i] > 0;
	*mixed = weighted > 0;
	if (weighted > 0 && weighted < n_in) {
		LOG_ERROR("--input: give every input a weight (PATH:W) or none");
		return CT_ERR_USAGE;
	}
	p->n_srcs = *mixed ? n_in : 1;
	p->srcs = xcalloc((size_t)p->n_srcs, sizeof(*p->srcs));
	for (int i = 0; i < p->n_srcs; i++) {
		struct prep_source *ps = &p->srcs[i];
		ps->name = *mixed ? paths[i] : "the inputs";
		ps->weight = *mixed ? weights[i] : 1;
		int rc = corpus_source_open(&ps->src, (const char *const *)paths + (*mixed ? i : 0),
		                            *mixed ? 1 : n_in, opt);
		if (rc)
			return rc;
		if (*mixed && corpus_source_has_stdin(ps->src)) {
			LOG_ERROR("--input -: standard input cannot be a weighted source");
			return CT_ERR_USAGE;
		}
		p->total_bytes += corpus_source_disk_bytes(ps->src);
	}
	return CT_OK;
}

int cmd_prepare(int argc, char **argv)
{
	const char *tok_path = NULL, *out = NULL, *mix_stop = NULL;
	char *sep = NULL;
	char **inputs = xcalloc((size_t)argc + 1, sizeof(char *));
	double *weights = xcalloc((size_t)argc + 1, sizeof(double));
	int n_in = 0, rc = CT_OK;
	struct prep p = {.val_fraction = 0.01, .shard_tokens = 100000000};
	struct corpus_options opt = {.text_field = "text"};
	for (int i = 0; i < argc && !rc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			prep_usage(stdout);
			goto out_free;
		}
		bool has = i + 1 < argc;
		if (strcmp(a, "--tokenizer") == 0 && has) {
			tok_path = argv[++i];
		} else if (strcmp(a, "--out") == 0 && has) {
			out = argv[++i];
		} else if (strcmp(a, "--doc-separator") == 0 && has) {
			free(sep);
			sep = unescape(argv[++i]);
		} else if (strcmp(a, "--text-field") == 0 && has) {
			opt.text_field = argv[++i];
		} else if (strcmp(a, "--skip-bad-lines") == 0) {
			opt.skip_bad_lines = true;
		} else if (strcmp(a, "--mix-stop") == 0 && has) {
			mix_stop = argv[++i];
			if (strcmp(mix_stop, "first") != 0 && strcmp(mix_stop, "all") != 0) {
				LOG_ERROR("--mix-stop: expected first or all, not '%s'", mix_stop);
				rc = CT_ERR_USAGE;
			}
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
			while (!rc && i + 1 < argc && (strncmp(argv[i + 1], "--", 2) != 0)) {
				rc = parse_input(argv[++i], &inputs[n_in], &weights[n_in]);
				n_in++;
			}
		} else {
			LOG_ERROR("prepare: unknown or incomplete argument '%s'", a);
			rc = CT_ERR_USAGE;
		}
	}
	if (!rc && (!tok_path || !out || n_in == 0 || !*opt.text_field)) {
		prep_usage(stderr);
		rc = CT_ERR_USAGE;
	}
	p.out_dir = out;
	opt.sep = sep;
	bool mixed = false;
	if (!rc)
		rc = prep_open_sources(&p, inputs, weights, n_in, &opt, &mixed);
	if (!rc && mix_stop && !mixed) {
		LOG_ERROR("--mix-stop: only for weighted inputs (--input PATH:W ...)");
		rc = CT_ERR_USAGE;
	}
	if (!rc)
		rc = tok_load(&p.tok, tok_path);
	if (!rc)
		rc = metrics_mkdirs(out);
	if (!rc) {
		p.width = tok_n_ids(p.tok) <= 65536 ? 2 : 4;
		p.bos = tok_special_id(p.tok, "<|begin_of_text|>");
		p.eos = tok_special_id(p.tok, "<|end_of_text|>");
		p.tty = isatty(STDERR_FILENO);
		p.t0 = timer_now();
		rc = prep_run(&p, mix_stop && strcmp(mix_stop, "all") == 0);
	}
	for (int s = 0; s < 2 && !rc; s++)
		rc = prep_flush_shard(&p, s);
	if (rc && p.out_dir)
		prep_discard(&p);
	if (!rc) {
		prep_progress(&p, true);
		prep_summary(&p, mixed);
	}
	tok_ids_free(&p.ids);
	if (p.tok)
		tok_free(p.tok);
	for (int i = 0; i < p.n_srcs; i++)
		corpus_source_free(p.srcs[i].src);
	free(p.srcs);
	for (int64_t i = 0; i < p.n_written; i++)
		free(p.written[i]);
	free(p.written);
out_free:
	free(sep);
	for (int i = 0; i < n_in; i++)
		free(inputs[i]);
	free(inputs);
	free(weights);
	return ct_exit_code(rc);
}
