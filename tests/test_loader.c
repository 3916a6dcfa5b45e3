/* test_loader: the shard reader and the resumable, rank-count-independent data loader.
 *
 * Every case writes fresh random shard folders (testutil's seed) under a temporary folder and
 * simulates data-parallel ranks in one process: rank r of R is its own loader.
 *   - any (ranks x micro-batches x batch) split of a global batch reads the same samples in
 *     the same global order, and each row is the right window of the token stream;
 *   - stop after k steps on 4 ranks, save the state (through JSON), resume on 2 ranks (also
 *     with another global batch size): together they read what one uninterrupted rank reads;
 *   - reruns are identical, other seeds shuffle differently, the order is a permutation per
 *     epoch and every epoch reshuffles;
 *   - malformed shards and folders are errors naming the file and the problem;
 *   - prefetching returns exactly the batches of synchronous reading;
 *   - the validation split is in order, once, padded; windows ignore shard boundaries.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "data/loader.h"
#include "data/shards.h"
#include "testutil.h"

#define IGNORE (-100)

static char root[256]; /* the temporary folder of this run */
static int folders;    /* datasets made so far, for unique names */

/* ---------------------------------------------------------------- fixtures */

static int64_t rand_below(int64_t n)
{
	return (int64_t)test_uniform(0, (double)n);
}

/* A fresh folder under root. */
static char *new_folder(char *buf, size_t len)
{
	snprintf(buf, len, "%s/d%03d", root, folders++);
	CHECK(mkdir(buf, 0755) == 0, "mkdir %s", buf);
	return buf;
}

/* Write stream[0..n) as shards <split>_000000.bin ... of the given sizes (sum = n), each with
 * a random width (2 when vocab <= 65536). */
static void write_split(const char *dir, const char *split, const int32_t *stream,
                        const int64_t *sizes, int shards, int64_t vocab)
{
	char path[512];
	for (int i = 0; i < shards; i++) {
		snprintf(path, sizeof(path), "%s/%s_%06d.bin", dir, split, i);
		int width = vocab <= 65536 && test_uniform(0, 1) < 0.5 ? 2 : 4;
		CHECK(shard_write(path, stream, sizes[i], width) == CT_OK, "write %s", path);
		stream += sizes[i];
	}
}

struct dataset {
	char dir[440];
	int32_t *stream; /* the train split's tokens, concatenated */
	int64_t n, vocab;
};

/* A folder with a train split of `shards` random-sized shards (one of them possibly empty)
 * and a small val split. */
static void make_dataset(struct dataset *d, int shards, int64_t min_tokens, int64_t max_tokens,
                         int64_t vocab)
{
	new_folder(d->dir, sizeof(d->dir));
	d->vocab = vocab;
	int64_t sizes[64];
	CHECK(shards <= 64, "too many shards");
	d->n = 0;
	for (int i = 0; i < shards; i++) {
		sizes[i] = min_tokens + rand_below(max_tokens - min_tokens + 1);
		d->n += sizes[i];
	}
	d->stream = xcalloc((size_t)d->n, sizeof(int32_t));
	for (int64_t i = 0; i < d->n; i++)
		d->stream[i] = (int32_t)rand_below(vocab);
	write_split(d->dir, "train", d->stream, sizes, shards, vocab);
	int64_t vsizes[2] = {40 + rand_below(30), 40 + rand_below(30)};
	int32_t *val = xcalloc((size_t)(vsizes[0] + vsizes[1]), sizeof(int32_t));
	for (int64_t i = 0; i < vsizes[0] + vsizes[1]; i++)
		val[i] = (int32_t)rand_below(vocab);
	write_split(d->dir, "val", val, vsizes, 2, vocab);
	free(val);
}

static void free_dataset(struct dataset *d)
{
	free(d->stream);
}

static struct loader_config base_config(const struct dataset *d, int64_t T, uint64_t seed)
{
	return (struct loader_config){.folder = d->dir,
	                              .split = "train",
	                              .vocab = d->vocab,
	                              .seq_len = T,
	                              .batch = 1,
	                              .micro_batches = 1,
	                              .rank = 0,
	                              .ranks = 1,
	                              .seed = seed,
	                              .ignore_index = IGNORE};
}

/* One data-parallel layout of a global batch. */
struct layout {
	int ranks;
	int64_t micro_batches, batch;
	bool prefetch;
};

static int64_t layout_global(const struct layout *l)
{
	return l->ranks * l->micro_batches * l->batch;
}

/* Run all ranks of layout l for `steps` steps (after restoring `from` when given) and write
 * the rows in global order: out + k * 2T holds the k-th position read (T inputs, T targets).
 * *end is the state afterwards, which every rank must agree on. */
static void run_layout(const struct loader_config *base, const struct layout *l, int64_t steps,
                       const struct loader_state *from, int32_t *out, struct loader_state *end)
{
	int64_t T = base->seq_len, A = l->micro_batches, B = l->batch, R = l->ranks;
	int64_t G = layout_global(l);
	struct loader *ld[8];
	for (int r = 0; r < R; r++) {
		struct loader_config c = *base;
		c.rank = r;
		c.ranks = (int)R;
		c.micro_batches = A;
		c.batch = B;
		c.prefetch = l->prefetch;
		CHECK(loader_open(&ld[r], &c) == CT_OK, "loader_open rank %d", r);
		if (from)
			CHECK(loader_restore(ld[r], from) == CT_OK, "restore rank %d", r);
	}
	int32_t *tok = xcalloc((size_t)(A * B * T), sizeof(int32_t));
	int32_t *tgt = xcalloc((size_t)(A * B * T), sizeof(int32_t));
	for (int64_t s = 0; s < steps; s++) {
		for (int r = 0; r < R; r++) {
			loader_next(ld[r], tok, tgt);
			for (int64_t a = 0; a < A; a++)
				for (int64_t b = 0; b < B; b++) {
					int64_t k = s * G + (a * R + r) * B + b;
					int64_t row = (a * B + b) * T;
					memcpy(out + k * 2 * T, tok + row, (size_t)T * 4);
					memcpy(out + k * 2 * T + T, tgt + row, (size_t)T * 4);
				}
		}
	}
	loader_state(ld[0], end);
	for (int r = 0; r < R; r++) {
		struct loader_state st;
		loader_state(ld[r], &st);
		EXPECT(memcmp(&st, end, sizeof(st)) == 0, "rank %d ends in another state", r);
		loader_close(ld[r]);
	}
	free(tok);
	free(tgt);
}

/* Rows [0, count) of out (global positions first..) are the windows of the samples the order
 * assigns to those positions. */
static int check_windows(const struct dataset *d, const struct loader_config *base, int64_t first,
                         int64_t count, const int32_t *out)
{
	struct loader *ld;
	CHECK(loader_open(&ld, base) == CT_OK, "loader_open");
	int64_t T = base->seq_len, bad = 0;
	for (int64_t k = 0; k < count; k++) {
		int64_t i = loader_sample_at(ld, first + k);
		const int32_t *row = out + k * 2 * T;
		bad += i < 0 || memcmp(row, d->stream + i * T, (size_t)T * 4) != 0 ||
		       memcmp(row + T, d->stream + i * T + 1, (size_t)T * 4) != 0;
	}
	loader_close(ld);
	return (int)bad;
}

/* ---------------------------------------------------------------- stderr capture */

static int capture_fd = -1, saved_stderr = -1;
static char captured[8192];

static void capture_begin(void)
{
	char path[300];
	snprintf(path, sizeof(path), "%s/stderr.txt", root);
	fflush(stderr);
	saved_stderr = dup(2);
	capture_fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	CHECK(capture_fd >= 0 && saved_stderr >= 0, "capture stderr");
	dup2(capture_fd, 2);
}

static const char *capture_end(void)
{
	fflush(stderr);
	dup2(saved_stderr, 2);
	close(saved_stderr);
	ssize_t n = pread(capture_fd, captured, sizeof(captured) - 1, 0);
	captured[n > 0 ? n : 0] = 0;
	close(capture_fd);
	return captured;
}

/* ---------------------------------------------------------------- cases */

/* (1) Every layout of a 12-sample global batch reads the same rows in the same global order
 * (so the same multiset per step), across two epoch boundaries; rows are the right windows. */
TEST_CASE(any_rank_count_reads_the_same_samples)
{
	struct dataset d;
	make_dataset(&d, 5, 40, 400, 50000);
	int64_t T = 7;
	struct loader_config base = base_config(&d, T, test_seed());
	const struct layout layouts[] = {
	    {1, 4, 3, false}, {1, 1, 12, true}, {2, 2, 3, true}, {2, 1, 6, false},
	    {3, 2, 2, true},  {3, 1, 4, false}, {4, 1, 3, true}, {4, 3, 1, false},
	};
	int64_t S = (d.n - 1) / T, G = 12, steps = 2 * ((S + G - 1) / G) + 1;
	size_t bytes = (size_t)(steps * G * 2 * T) * sizeof(int32_t);
	int32_t *ref = malloc(bytes), *got = malloc(bytes);
	struct loader_state st_ref, st;
	run_layout(&base, &layouts[0], steps, NULL, ref, &st_ref);
	EXPECT(check_windows(&d, &base, 0, steps * G, ref) == 0, "rows are not their windows");
	EXPECT(st_ref.epoch == steps * G / S && st_ref.position == steps * G % S,
	       "state after %lld steps: epoch %lld position %lld", (long long)steps,
	       (long long)st_ref.epoch, (long long)st_ref.position);
	for (size_t i = 1; i < sizeof(layouts) / sizeof(layouts[0]); i++) {
		const struct layout *l = &layouts[i];
		memset(got, 0xff, bytes);
		run_layout(&base, l, steps, NULL, got, &st);
		EXPECT(memcmp(got, ref, bytes) == 0,
		       "%d ranks x %lld micro-batches x %lld rows read other samples than 1 rank",
		       l->ranks, (long long)l->micro_batches, (long long)l->batch);
		EXPECT(memcmp(&st, &st_ref, sizeof(st)) == 0, "layout %zu ends in another state",
		       i);
	}
	free(ref);
	free(got);
	free_dataset(&d);
}

/* (2) Stop after k steps on 4 ranks, save (through JSON), resume on 2 ranks; then resume
 * again with another global batch size: the union is one uninterrupted rank's run. */
TEST_CASE(resume_on_another_rank_count)
{
	struct dataset d;
	make_dataset(&d, 4, 100, 300, 30000);
	int64_t T = 5;
	struct loader_config base = base_config(&d, T, test_seed() + 7);
	int64_t S = (d.n - 1) / T, G = 12, total_steps = 2 * ((S + G - 1) / G) + 2;
	int64_t k = 1 + rand_below(total_steps - 2);
	const struct layout one = {1, 1, 12, false}, four = {4, 1, 3, true}, two = {2, 2, 3, true},
	                    two8 = {2, 1, 4, false};
	size_t row = (size_t)(2 * T);
	int64_t extra = 5; /* steps of 8 samples after the second cut */
	int64_t total = total_steps * G + extra * 8;
	int32_t *ref = malloc((size_t)((total_steps + extra) * G) * row * 4);
	int32_t *got = malloc((size_t)total * row * 4);
	struct loader_state st_ref, st_k, st_back, st_end, st_unused;
	run_layout(&base, &one, total_steps + extra, NULL, ref, &st_ref);

	run_layout(&base, &four, k, NULL, got, &st_k);
	EXPECT(st_k.epoch * S + st_k.position == k * G, "state after %lld steps", (long long)k);
	cJSON *j = loader_state_to_json(&st_k);
	char *text = cJSON_PrintUnformatted(j);
	cJSON_Delete(j);
	cJSON *parsed = cJSON_Parse(text);
	EXPECT(loader_state_from_json(&st_back, parsed, "test") == CT_OK, "parse %s", text);
	EXPECT(memcmp(&st_back, &st_k, sizeof(st_k)) == 0, "JSON round trip changed %s", text);
	cJSON_Delete(parsed);
	cJSON_free(text);
	run_layout(&base, &two, total_steps - k, &st_back, got + k * G * row, &st_end);
	run_layout(&base, &two8, extra, &st_end, got + total_steps * G * row, &st_unused);
	EXPECT(memcmp(got, ref, (size_t)total * row * 4) == 0,
	       "4 ranks for %lld steps then 2 ranks (then G=8) differ from one rank", (long long)k);
	EXPECT(st_unused.epoch * S + st_unused.position == total, "final state");
	free(ref);
	free(got);
	free_dataset(&d);
}

/* Restoring a state from another stream is a usage error naming the difference; a damaged
 * JSON state is a runtime error naming the field. */
TEST_CASE(restore_rejects_foreign_state)
{
	struct dataset d;
	make_dataset(&d, 2, 100, 200, 1000);
	struct loader_config base = base_config(&d, 4, 11);
	struct loader *ld;
	CHECK(loader_open(&ld, &base) == CT_OK, "open");
	struct loader_state good, st;
	loader_state(ld, &good);
	struct {
		const char *what, *expect;
		int64_t dseq, dsamples, depoch, dposition;
		uint64_t dseed;
		int rc;
	} cases[] = {
	    {"seq_len", "seq_len", 1, 0, 0, 0, 0, CT_ERR_USAGE},
	    {"samples", "dataset changed", 0, 1, 0, 0, 0, CT_ERR_USAGE},
	    {"seed", "seed", 0, 0, 0, 0, 1, CT_ERR_USAGE},
	    {"position", "out of range", 0, 0, 0, good.samples, 0, CT_ERR_RUNTIME},
	    {"epoch", "out of range", 0, 0, -1, 0, 0, CT_ERR_RUNTIME},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		st = good;
		st.seq_len += cases[i].dseq;
		st.samples += cases[i].dsamples;
		st.epoch += cases[i].depoch;
		st.position += cases[i].dposition;
		st.seed += cases[i].dseed;
		capture_begin();
		int rc = loader_restore(ld, &st);
		const char *err = capture_end();
		EXPECT(rc == cases[i].rc && strstr(err, cases[i].expect),
		       "restore with another %s: rc %d, message '%s'", cases[i].what, rc, err);
	}
	const char *bad_json[] = {
	    "[1]",
	    "{\"seq_len\":4,\"samples\":5,\"epoch\":0,\"position\":0}",
	    "{\"seed\":\"12x\",\"seq_len\":4,\"samples\":5,\"epoch\":0,\"position\":0}",
	    ("{\"seed\":\"99999999999999999999\",\"seq_len\":4,\"samples\":5,\"epoch\":0,"
	     "\"position\":0}"),
	    "{\"seed\":\"1\",\"seq_len\":4.5,\"samples\":5,\"epoch\":0,\"position\":0}",
	    "{\"seed\":\"1\",\"seq_len\":4,\"samples\":5,\"epoch\":-1,\"position\":0}",
	    "{\"seed\":\"1\",\"seq_len\":4,\"samples\":5,\"epoch\":0}",
	    "{\"seed\":1,\"seq_len\":4,\"samples\":5,\"epoch\":0,\"position\":0}",
	};
	for (size_t i = 0; i < sizeof(bad_json) / sizeof(bad_json[0]); i++) {
		cJSON *j = cJSON_Parse(bad_json[i]);
		capture_begin();
		int rc = loader_state_from_json(&st, j, "ckpt/trainer.json: data");
		const char *err = capture_end();
		EXPECT(rc == CT_ERR_RUNTIME && strstr(err, "ckpt/trainer.json"),
		       "state JSON %s: rc %d, message '%s'", bad_json[i], rc, err);
		cJSON_Delete(j);
	}
	loader_close(ld);
	free_dataset(&d);
}

/* (3) Reruns read identical batches; another seed shuffles differently; the order is no
 * identity. */
TEST_CASE(deterministic_and_seeded)
{
	struct dataset d;
	make_dataset(&d, 3, 200, 400, 5000);
	int64_t T = 6;
	struct loader_config base = base_config(&d, T, test_seed() ^ 0x5eed);
	const struct layout l = {2, 2, 2, true};
	int64_t steps = 10, G = layout_global(&l);
	size_t bytes = (size_t)(steps * G * 2 * T) * 4;
	int32_t *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes);
	struct loader_state st;
	run_layout(&base, &l, steps, NULL, a, &st);
	run_layout(&base, &l, steps, NULL, b, &st);
	EXPECT(memcmp(a, b, bytes) == 0, "a rerun read other batches");
	struct loader_config other = base;
	other.seed = base.seed + 1;
	run_layout(&other, &l, steps, NULL, c, &st);
	EXPECT(memcmp(a, c, bytes) != 0, "seeds %llu and %llu read the same batches",
	       (unsigned long long)base.seed, (unsigned long long)other.seed);
	struct loader *ld;
	CHECK(loader_open(&ld, &base) == CT_OK, "open");
	int64_t S = loader_samples(ld), fixed = 0;
	for (int64_t p = 0; p < S; p++)
		fixed += loader_sample_at(ld, p) == p;
	EXPECT(fixed < S / 4, "%lld of %lld samples stay in place: not shuffled", (long long)fixed,
	       (long long)S);
	loader_close(ld);
	free(a);
	free(b);
	free(c);
	free_dataset(&d);
}

/* (4) Each epoch is a permutation of all samples, each epoch another one; the state counts
 * epochs; batches straddling the boundary continue into the next epoch's order. */
TEST_CASE(epoch_rollover_reshuffles)
{
	struct dataset d;
	make_dataset(&d, 3, 60, 200, 2000);
	int64_t T = 3;
	struct loader_config base = base_config(&d, T, test_seed());
	base.batch = 5;
	struct loader *ld;
	CHECK(loader_open(&ld, &base) == CT_OK, "open");
	int64_t S = loader_samples(ld), epochs = 4;
	EXPECT(S == (d.n - 1) / T, "S = %lld, expected %lld", (long long)S,
	       (long long)((d.n - 1) / T));
	int64_t *order = xcalloc((size_t)(epochs * S), sizeof(int64_t));
	char *seen = xcalloc((size_t)S, 1);
	for (int64_t e = 0; e < epochs; e++) {
		memset(seen, 0, (size_t)S);
		int64_t dup = 0;
		for (int64_t p = 0; p < S; p++) {
			int64_t i = loader_sample_at(ld, e * S + p);
			order[e * S + p] = i;
			dup += i < 0 || i >= S || seen[i]++;
		}
		EXPECT(dup == 0, "epoch %lld is not a permutation of %lld samples", (long long)e,
		       (long long)S);
		if (e > 0)
			EXPECT(memcmp(order + e * S, order + (e - 1) * S, (size_t)S * 8) != 0,
			       "epoch %lld repeats the order of epoch %lld", (long long)e,
			       (long long)e - 1);
	}
	int32_t tok[5 * 3], tgt[5 * 3];
	int64_t steps = epochs * S / 5, bad = 0;
	for (int64_t s = 0; s < steps; s++) {
		loader_next(ld, tok, tgt);
		for (int64_t b = 0; b < 5; b++) {
			int64_t i = order[s * 5 + b];
			bad += memcmp(tok + b * T, d.stream + i * T, (size_t)T * 4) != 0 ||
			       memcmp(tgt + b * T, d.stream + i * T + 1, (size_t)T * 4) != 0;
		}
	}
	EXPECT(bad == 0, "%lld rows differ from the epochs' orders", (long long)bad);
	struct loader_state st;
	loader_state(ld, &st);
	EXPECT(st.epoch == steps * 5 / S && st.position == steps * 5 % S,
	       "after %lld steps of 5: epoch %lld position %lld (S = %lld)", (long long)steps,
	       (long long)st.epoch, (long long)st.position, (long long)S);
	free(order);
	free(seen);
	loader_close(ld);
	free_dataset(&d);
}

/* The shuffle is a permutation for every small S and a large one (Feistel + cycle walk). */
TEST_CASE(shuffle_is_a_bijection)
{
	char dir[300];
	new_folder(dir, sizeof(dir));
	int64_t sizes[] = {1, 2, 3, 4, 5, 7, 15, 16, 17, 63, 64, 65, 100, 257, 30011};
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		int64_t S = sizes[k], n = S + 1; /* T = 1: S = n - 1 samples */
		char sub[340], path[400];
		snprintf(sub, sizeof(sub), "%s/s%zu", dir, k);
		mkdir(sub, 0755);
		snprintf(path, sizeof(path), "%s/train_0.bin", sub);
		int32_t *t = xcalloc((size_t)n, sizeof(int32_t));
		for (int64_t i = 0; i < n; i++)
			t[i] = (int32_t)(i % 60000);
		CHECK(shard_write(path, t, n, 2) == CT_OK, "write");
		free(t);
		struct loader_config c = {.folder = sub,
		                          .split = "train",
		                          .vocab = 60000,
		                          .seq_len = 1,
		                          .batch = 1,
		                          .micro_batches = 1,
		                          .ranks = 1,
		                          .seed = test_seed() + k,
		                          .ignore_index = IGNORE};
		struct loader *ld;
		CHECK(loader_open(&ld, &c) == CT_OK, "open");
		EXPECT(loader_samples(ld) == S, "S %lld", (long long)loader_samples(ld));
		char *seen = xcalloc((size_t)S, 1);
		int64_t bad = 0;
		for (int64_t e = 0; e < 2; e++) {
			memset(seen, 0, (size_t)S);
			for (int64_t p = 0; p < S; p++) {
				int64_t i = loader_sample_at(ld, e * S + p);
				bad += i < 0 || i >= S || seen[i]++;
			}
		}
		EXPECT(bad == 0, "S = %lld: the order is not a permutation", (long long)S);
		free(seen);
		loader_close(ld);
	}
}

/* (5) Malformed shards and folders: each a clear error naming the file and the problem. */
TEST_CASE(malformed_shards_are_named)
{
	struct {
		const char *name, *expect;
		int rc;
	} cases[] = {
	    {"wrong magic", "bad magic", CT_ERR_RUNTIME},
	    {"truncated header", "truncated header", CT_ERR_RUNTIME},
	    {"empty file", "truncated header", CT_ERR_RUNTIME},
	    {"truncated body", "truncated", CT_ERR_RUNTIME},
	    {"bad width", "bad token width", CT_ERR_RUNTIME},
	    {"count mismatch", "count mismatch", CT_ERR_RUNTIME},
	    {"bad version", "version 2", CT_ERR_RUNTIME},
	    {"token >= vocab", "outside the vocabulary", CT_ERR_RUNTIME},
	    {"token >= 2^31", "outside the vocabulary", CT_ERR_RUNTIME},
	    {"folder as shard", "not a regular file", CT_ERR_RUNTIME},
	};
	int64_t vocab = 1000, n = 64;
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		char dir[300], good[400], bad[400];
		new_folder(dir, sizeof(dir));
		snprintf(good, sizeof(good), "%s/train_000.bin", dir);
		snprintf(bad, sizeof(bad), "%s/train_001.bin", dir);
		int32_t t[64];
		for (int64_t i = 0; i < n; i++)
			t[i] = (int32_t)rand_below(vocab);
		CHECK(shard_write(good, t, n, 2) == CT_OK, "write");
		int width = k == 8 ? 4 : 2;
		int64_t pos = rand_below(n);
		if (k == 7)
			t[pos] = (int32_t)(vocab + rand_below(100));
		CHECK(shard_write(bad, t, n, width) == CT_OK, "write");
		FILE *f = fopen(bad, "r+b");
		unsigned char b4[4];
		switch (k) {
		case 0:
			fwrite("CTTOKENZ", 1, 8, f);
			break;
		case 1:
			CHECK(ftruncate(fileno(f), 10) == 0, "truncate");
			break;
		case 2:
			CHECK(ftruncate(fileno(f), 0) == 0, "truncate");
			break;
		case 3:
			CHECK(ftruncate(fileno(f), SHARD_HEADER_BYTES + 2 * n - 3) == 0, "trunc");
			break;
		case 4:
			fseek(f, 12, SEEK_SET);
			fwrite("\003\000\000\000", 1, 4, f);
			break;
		case 5:
			fseek(f, 16, SEEK_SET);
			fputc((int)n - 1, f);
			break;
		case 6:
			fseek(f, 8, SEEK_SET);
			fwrite("\002\000\000\000", 1, 4, f);
			break;
		case 8: /* token 2^31 + 5 in a 4-byte shard */
			b4[0] = 5, b4[1] = 0, b4[2] = 0, b4[3] = 0x80;
			fseek(f, SHARD_HEADER_BYTES + 4 * pos, SEEK_SET);
			fwrite(b4, 1, 4, f);
			break;
		default:
			break;
		}
		fclose(f);
		if (k == 9) {
			remove(bad);
			mkdir(bad, 0755);
		}
		struct dataset d = {.vocab = vocab};
		snprintf(d.dir, sizeof(d.dir), "%s", dir);
		struct loader_config c = base_config(&d, 4, 1);
		static char sentinel;
		struct loader *ld = (struct loader *)(void *)&sentinel;
		capture_begin();
		int rc = loader_open(&ld, &c);
		const char *err = capture_end();
		EXPECT(rc == cases[k].rc && ld == NULL && strstr(err, bad) &&
		           strstr(err, cases[k].expect),
		       "%s: rc %d, message '%s'", cases[k].name, rc, err);
		if (k == 7) {
			char at[64];
			snprintf(at, sizeof(at), "position %lld", (long long)pos);
			EXPECT(strstr(err, at), "%s: the message does not say '%s'", cases[k].name,
			       at);
		}
	}
	/* Folders: missing, empty, no shards of the split, too few tokens, not a folder. */
	char dir[300], path[400];
	struct dataset d = {.vocab = vocab};
	struct loader_config c = base_config(&d, 4, 1);
	struct loader *ld;
	snprintf(d.dir, sizeof(d.dir), "%s/missing", root);
	capture_begin();
	int rc = loader_open(&ld, &c);
	const char *err = capture_end();
	EXPECT(rc == CT_ERR_USAGE && strstr(err, d.dir) && strstr(err, "No such file"),
	       "missing folder: rc %d, '%s'", rc, err);

	snprintf(d.dir, sizeof(d.dir), "%s", new_folder(dir, sizeof(dir)));
	snprintf(path, sizeof(path), "%s/notes.txt", dir);
	fclose(fopen(path, "w"));
	capture_begin();
	rc = loader_open(&ld, &c);
	err = capture_end();
	EXPECT(rc == CT_ERR_USAGE && strstr(err, d.dir) && strstr(err, "no train shards"),
	       "empty folder: rc %d, '%s'", rc, err);

	snprintf(path, sizeof(path), "%s/train_0.bin", dir);
	int32_t few[4] = {1, 2, 3, 4};
	CHECK(shard_write(path, few, 4, 2) == CT_OK, "write");
	capture_begin();
	rc = loader_open(&ld, &c);
	err = capture_end();
	EXPECT(rc == CT_ERR_USAGE && strstr(err, "fewer than one sample"),
	       "4 tokens at seq_len 4: rc %d, '%s'", rc, err);
	c.split = "val";
	capture_begin();
	rc = loader_open(&ld, &c);
	err = capture_end();
	EXPECT(rc == CT_ERR_USAGE && strstr(err, "no val shards"), "no val split: rc %d, '%s'", rc,
	       err);

	snprintf(d.dir, sizeof(d.dir), "%s", path);
	c.split = "train";
	capture_begin();
	rc = loader_open(&ld, &c);
	err = capture_end();
	EXPECT(rc == CT_ERR_USAGE && strstr(err, path) && strstr(err, "Not a directory"),
	       "a file as the folder: rc %d, '%s'", rc, err);

	/* Configuration errors name the problem. */
	snprintf(d.dir, sizeof(d.dir), "%s", dir);
	c.ignore_index = 3;
	capture_begin();
	rc = loader_open(&ld, &c);
	err = capture_end();
	EXPECT(rc == CT_ERR_USAGE && strstr(err, "ignore_index"), "ignore_index: rc %d, '%s'", rc,
	       err);
	c.ignore_index = IGNORE;
	c.rank = 2;
	c.ranks = 2;
	capture_begin();
	rc = loader_open(&ld, &c);
	err = capture_end();
	EXPECT(rc == CT_ERR_USAGE && strstr(err, "rank"), "rank 2 of 2: rc %d, '%s'", rc, err);
}

/* (6) Prefetching returns exactly the batches of synchronous reading, also across restores
 * and rewinds issued while the reader works ahead. */
TEST_CASE(prefetch_matches_synchronous)
{
	struct dataset d;
	make_dataset(&d, 6, 100, 500, 40000);
	int64_t T = 9;
	struct loader_config c = base_config(&d, T, test_seed());
	c.ranks = 3;
	c.rank = 1;
	c.micro_batches = 2;
	c.batch = 2;
	struct loader *sync, *pre;
	CHECK(loader_open(&sync, &c) == CT_OK, "open");
	c.prefetch = true;
	CHECK(loader_open(&pre, &c) == CT_OK, "open");
	int64_t n = 2 * 2 * T, steps = 3 * loader_steps_per_epoch(sync), bad = 0;
	int32_t *a = xcalloc((size_t)(4 * n), sizeof(int32_t));
	int32_t *ta = a + n, *b = a + 2 * n, *tb = a + 3 * n;
	struct loader_state mark;
	for (int64_t s = 0; s < steps; s++) {
		if (s == steps / 3) {
			loader_state(sync, &mark);
			struct loader_state m2;
			loader_state(pre, &m2);
			EXPECT(memcmp(&mark, &m2, sizeof(mark)) == 0, "states differ at step %lld",
			       (long long)s);
		}
		if (s == steps / 2) { /* jump back to the mark on both */
			CHECK(loader_restore(sync, &mark) == CT_OK, "restore");
			CHECK(loader_restore(pre, &mark) == CT_OK, "restore");
		}
		if (s == 2 * steps / 3) {
			loader_rewind(sync);
			loader_rewind(pre);
		}
		loader_next(sync, a, ta);
		loader_next(pre, b, tb);
		bad += memcmp(a, b, (size_t)(2 * n) * 4) != 0;
		if (s % 7 == 3) /* let the reader run ahead */
			usleep(200);
	}
	EXPECT(bad == 0, "%lld of %lld prefetched batches differ", (long long)bad,
	       (long long)steps);
	free(a);
	loader_close(sync);
	loader_close(pre);
	free_dataset(&d);
}

/* The val split is read in order, once: steps_per_epoch steps cover every sample exactly
 * once on any rank count, the tail is padding, and a rewind starts the pass over. */
TEST_CASE(val_split_in_order_once)
{
	struct dataset d;
	make_dataset(&d, 1, 50, 60, 3000);
	/* Read the val stream back through the shard reader. */
	struct shard_set set;
	CHECK(shard_set_open(&set, d.dir, "val", d.vocab) == CT_OK, "open val");
	int64_t n = set.tokens, T = 4, S = (n - 1) / T;
	int32_t *val = xcalloc((size_t)n, sizeof(int32_t));
	shard_set_read(&set, 0, n, val);
	shard_set_close(&set);
	struct loader_config c = base_config(&d, T, 1);
	c.split = "val";
	for (int R = 1; R <= 3; R++) {
		const struct layout l = {R, 2, 3, R == 2};
		struct loader *ld;
		c.ranks = R;
		c.micro_batches = 2;
		c.batch = 3;
		CHECK(loader_open(&ld, &c) == CT_OK, "open val");
		int64_t steps = loader_steps_per_epoch(ld), G = layout_global(&l);
		EXPECT(loader_samples(ld) == S && steps == (S + G - 1) / G, "S %lld steps %lld",
		       (long long)loader_samples(ld), (long long)steps);
		loader_close(ld);
		int32_t *rows = xcalloc((size_t)(steps * G * 2 * T), sizeof(int32_t));
		struct loader_state st, st0 = {.seed = 1, .seq_len = T, .samples = S};
		run_layout(&c, &l, steps, NULL, rows, &st);
		int64_t bad = 0;
		for (int64_t p = 0; p < steps * G; p++) {
			const int32_t *r = rows + p * 2 * T;
			if (p < S) {
				bad += memcmp(r, val + p * T, (size_t)T * 4) != 0 ||
				       memcmp(r + T, val + p * T + 1, (size_t)T * 4) != 0;
			} else {
				for (int64_t t = 0; t < T; t++)
					bad += r[t] != 0 || r[T + t] != IGNORE;
			}
		}
		EXPECT(bad == 0, "%d ranks: %lld bad val rows", R, (long long)bad);
		EXPECT(st.epoch == 0 && st.position == steps * G, "val state");
		/* A second pass after rewinding (restore to 0) reads the same. */
		int32_t *again = xcalloc((size_t)(steps * G * 2 * T), sizeof(int32_t));
		run_layout(&c, &l, steps, &st0, again, &st);
		EXPECT(memcmp(again, rows, (size_t)(steps * G * 2 * T) * 4) == 0, "second pass");
		free(again);
		free(rows);
	}
	free(val);
	free_dataset(&d);
}

/* Samples depend on the token stream, not on how it is cut into shards (windows span
 * boundaries; empty shards are skipped). */
TEST_CASE(windows_span_shard_boundaries)
{
	struct dataset d = {.vocab = 65536};
	int64_t T = 8, sizes[7], n = 0;
	for (int i = 0; i < 7; i++) {
		sizes[i] = i == 3 ? 0 : rand_below(3 * T); /* short shards, one empty */
		n += sizes[i];
	}
	sizes[0] += 2 * T; /* at least two samples */
	n += 2 * T;
	d.n = n;
	d.stream = xcalloc((size_t)n, sizeof(int32_t));
	for (int64_t i = 0; i < n; i++)
		d.stream[i] = (int32_t)rand_below(d.vocab);
	char one[300];
	write_split(new_folder(d.dir, sizeof(d.dir)), "train", d.stream, sizes, 7, d.vocab);
	write_split(new_folder(one, sizeof(one)), "train", d.stream, &n, 1, d.vocab);
	struct loader_config a = base_config(&d, T, test_seed()), b = a;
	b.folder = one;
	const struct layout l = {2, 1, 3, false};
	int64_t G = layout_global(&l), steps = 2 * (((n - 1) / T + G - 1) / G) + 1;
	size_t bytes = (size_t)(steps * G * 2 * T) * 4;
	int32_t *x = malloc(bytes), *y = malloc(bytes);
	struct loader_state st;
	run_layout(&a, &l, steps, NULL, x, &st);
	run_layout(&b, &l, steps, NULL, y, &st);
	EXPECT(memcmp(x, y, bytes) == 0, "7 shards and 1 shard of the same stream differ");
	EXPECT(check_windows(&d, &a, 0, steps * G, x) == 0, "rows are not their windows");
	free(x);
	free(y);
	free_dataset(&d);
}

/* The writer: round trip in both widths; a token that does not fit leaves no file. */
TEST_CASE(writer_round_trip_and_refusal)
{
	char dir[300], path[400], tmp[420];
	new_folder(dir, sizeof(dir));
	for (int width = 2; width <= 4; width += 2) {
		int64_t n = 1000 + rand_below(1000), limit = width == 2 ? 65536 : 2000000000;
		int32_t *t = xcalloc((size_t)n, sizeof(int32_t));
		for (int64_t i = 0; i < n; i++)
			t[i] = (int32_t)rand_below(limit);
		t[0] = (int32_t)(limit - 1);
		snprintf(path, sizeof(path), "%s/w%d.bin", dir, width);
		struct shard_writer w;
		CHECK(shard_writer_open(&w, path, width) == CT_OK, "open");
		int64_t half = n / 2;
		CHECK(shard_writer_append(&w, t, half) == CT_OK, "append");
		CHECK(shard_writer_append(&w, t + half, n - half) == CT_OK, "append");
		CHECK(shard_writer_close(&w) == CT_OK, "close");
		struct shard s;
		CHECK(shard_open(&s, path, limit) == CT_OK, "open %s", path);
		int32_t *back = xcalloc((size_t)n, sizeof(int32_t));
		shard_read(&s, 0, n, back);
		EXPECT(s.count == n && s.width == width &&
		           memcmp(back, t, (size_t)n * sizeof(int32_t)) == 0,
		       "width %d: round trip", width);
		shard_close(&s);
		free(back);
		free(t);
	}
	snprintf(path, sizeof(path), "%s/refused.bin", dir);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	int32_t t[3] = {5, 65536, 7};
	capture_begin();
	int rc = shard_write(path, t, 3, 2);
	const char *err = capture_end();
	EXPECT(rc == CT_ERR_USAGE && strstr(err, path) && strstr(err, "position 1"),
	       "token 65536 in 2 bytes: rc %d, '%s'", rc, err);
	EXPECT(access(path, F_OK) != 0 && access(tmp, F_OK) != 0, "a refused shard left a file");
}

/* A shard large enough for the parallel validation scan: accepted when clean, and a bad id
 * near the end is found at its position. */
TEST_CASE(large_shard_scan)
{
	char dir[300], path[400];
	new_folder(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/big.bin", dir);
	int64_t n = (5 << 20) + rand_below(1000), vocab = 50000;
	int32_t *t = xcalloc((size_t)n, sizeof(int32_t));
	for (int64_t i = 0; i < n; i++)
		t[i] = (int32_t)((i * 2654435761u) % (uint64_t)vocab);
	CHECK(shard_write(path, t, n, 2) == CT_OK, "write");
	struct shard s;
	EXPECT(shard_open(&s, path, vocab) == CT_OK && s.count == n, "clean large shard refused");
	shard_close(&s);
	int64_t pos = n - 1 - rand_below(1000);
	t[pos] = (int32_t)vocab;
	CHECK(shard_write(path, t, n, 2) == CT_OK, "write");
	char at[64];
	snprintf(at, sizeof(at), "token %lld at position %lld", (long long)vocab, (long long)pos);
	capture_begin();
	int rc = shard_open(&s, path, vocab);
	const char *err = capture_end();
	EXPECT(rc == CT_ERR_RUNTIME && strstr(err, path) && strstr(err, at),
	       "bad id in a large shard: rc %d, '%s'", rc, err);
	free(t);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

int main(void)
{
	test_seed();
	log_set_level(LOG_WARN);
	const char *base = getenv("TMPDIR");
	snprintf(root, sizeof(root), "%s/ct_loader_XXXXXX", base && base[0] ? base : "/tmp");
	CHECK(mkdtemp(root), "mkdtemp %s", root);
	RUN(any_rank_count_reads_the_same_samples);
	RUN(resume_on_another_rank_count);
	RUN(restore_rejects_foreign_state);
	RUN(deterministic_and_seeded);
	RUN(epoch_rollover_reshuffles);
	RUN(shuffle_is_a_bijection);
	RUN(malformed_shards_are_named);
	RUN(prefetch_matches_synchronous);
	RUN(val_split_in_order_once);
	RUN(windows_span_shard_boundaries);
	RUN(writer_round_trip_and_refusal);
	RUN(large_shard_scan);
	nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	return test_summary();
}
