#include "data/loader.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/rng.h"
#include "data/shards.h"

#define FEISTEL_ROUNDS 6

struct loader {
	struct loader_config cfg; /* folder and split point at the copies below */
	char *folder, *split;
	struct shard_set set;
	bool shuffle;    /* train: a new permutation per epoch; else in order, once */
	int64_t samples; /* S */
	int64_t global;  /* G: positions per step, all ranks */
	int64_t rows;    /* micro_batches x batch rows on this rank */
	int feistel_half;
	uint64_t feistel_mask, shuffle_stream;
	int64_t pos; /* global position of the step the next loader_next returns */

	/* Prefetch: the worker fills buf with the step at `want` whenever buf holds another. */
	bool threaded;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv; /* broadcast on every change of want, buf_pos, filling, stop */
	int32_t *buf_tokens, *buf_targets;
	int64_t want;    /* the step the consumer needs next; -1 none */
	int64_t buf_pos; /* the step held in buf; -1 none */
	bool filling, stop;
};

/* ---------------------------------------------------------------- the global order */

/* A bijection of [0, 4^half): Feistel rounds keyed by (seed, epoch), round function Philox. */
static uint64_t feistel(const struct loader *ld, uint64_t epoch, uint64_t x)
{
	uint64_t l = x >> ld->feistel_half, r = x & ld->feistel_mask;
	for (uint32_t k = 0; k < FEISTEL_ROUNDS; k++) {
		uint32_t w[4];
		rng_philox(ld->cfg.seed, ld->shuffle_stream + epoch, r, k, w);
		uint64_t f = ((uint64_t)w[0] | (uint64_t)w[1] << 32) & ld->feistel_mask;
		uint64_t t = l ^ f;
		l = r;
		r = t;
	}
	return l << ld->feistel_half | r;
}

/* perm_epoch(p): walk the Feistel cycle through p until it lands in [0, S). The domain is
 * under 4 S, so the expected walk is under 4 steps; it ends because the cycle holds p. */
static int64_t permute(const struct loader *ld, int64_t epoch, int64_t p)
{
	uint64_t x = (uint64_t)p;
	do
		x = feistel(ld, (uint64_t)epoch, x);
	while (x >= (uint64_t)ld->samples);
	return (int64_t)x;
}

int64_t loader_sample_at(const struct loader *ld, int64_t position)
{
	CHECK(position >= 0, "negative data position %lld", (long long)position);
	if (!ld->shuffle)
		return position < ld->samples ? position : -1;
	return permute(ld, position / ld->samples, position % ld->samples);
}

/* The step starting at global position first: this rank's rows, as in the header's Layout. */
static void loader_fill(const struct loader *ld, int64_t first, int32_t *tokens, int32_t *targets)
{
	const struct loader_config *c = &ld->cfg;
	int64_t T = c->seq_len, B = c->batch;
	for (int64_t a = 0; a < c->micro_batches; a++) {
		for (int64_t b = 0; b < B; b++) {
			int64_t p = first + (a * c->ranks + c->rank) * B + b;
			int64_t i = loader_sample_at(ld, p);
			int32_t *in = tokens + (a * B + b) * T, *tg = targets + (a * B + b) * T;
			if (i < 0) {
				memset(in, 0, (size_t)T * sizeof(int32_t));
				for (int64_t t = 0; t < T; t++)
					tg[t] = c->ignore_index;
				continue;
			}
			shard_set_read(&ld->set, i * T, T, in);
			shard_set_read(&ld->set, i * T + 1, T, tg);
		}
	}
}

/* ---------------------------------------------------------------- prefetch */

static void *loader_worker(void *arg)
{
	struct loader *ld = arg;
	pthread_mutex_lock(&ld->mu);
	for (;;) {
		while (!ld->stop && (ld->want < 0 || ld->buf_pos == ld->want))
			pthread_cond_wait(&ld->cv, &ld->mu);
		if (ld->stop)
			break;
		int64_t pos = ld->want;
		ld->filling = true;
		ld->buf_pos = -1;
		pthread_mutex_unlock(&ld->mu);
		loader_fill(ld, pos, ld->buf_tokens, ld->buf_targets);
		pthread_mutex_lock(&ld->mu);
		ld->filling = false;
		ld->buf_pos = pos;
		pthread_cond_broadcast(&ld->cv);
	}
	pthread_mutex_unlock(&ld->mu);
	return NULL;
}

/* Ask the worker for the step at pos (caller holds mu). */
static void loader_want(struct loader *ld, int64_t pos)
{
	if (ld->want != pos) {
		ld->want = pos;
		pthread_cond_broadcast(&ld->cv);
	}
}

static size_t loader_buf_bytes(const struct loader *ld)
{
	return (size_t)(ld->rows * ld->cfg.seq_len) * sizeof(int32_t);
}

static int loader_start_worker(struct loader *ld)
{
	ld->buf_tokens = mem_alloc(MEM_OTHER, loader_buf_bytes(ld));
	ld->buf_targets = mem_alloc(MEM_OTHER, loader_buf_bytes(ld));
	ld->want = ld->pos;
	ld->buf_pos = -1;
	pthread_mutex_init(&ld->mu, NULL);
	pthread_cond_init(&ld->cv, NULL);
	/* Signals go to the training threads, never to the reader: block them all in it. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int err = pthread_create(&ld->thread, NULL, loader_worker, ld);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (err) {
		LOG_ERROR("data loader for %s: cannot start the prefetch thread: %s", ld->folder,
		          strerror(err));
		pthread_cond_destroy(&ld->cv);
		pthread_mutex_destroy(&ld->mu);
		return CT_ERR_RUNTIME;
	}
	ld->threaded = true;
	return CT_OK;
}

static void loader_stop_worker(struct loader *ld)
{
	if (ld->threaded) {
		pthread_mutex_lock(&ld->mu);
		ld->stop = true;
		pthread_cond_broadcast(&ld->cv);
		pthread_mutex_unlock(&ld->mu);
		pthread_join(ld->thread, NULL);
		pthread_cond_destroy(&ld->cv);
		pthread_mutex_destroy(&ld->mu);
		ld->threaded = false;
	}
	if (ld->buf_tokens) {
		mem_free(MEM_OTHER, ld->buf_tokens, loader_buf_bytes(ld));
		mem_free(MEM_OTHER, ld->buf_targets, loader_buf_bytes(ld));
		ld->buf_tokens = ld->buf_targets = NULL;
	}
}

/* ---------------------------------------------------------------- open, next, close */

static int loader_check_config(const struct loader_config *c)
{
	if (!c->folder || !c->folder[0]) {
		LOG_ERROR("data loader: no dataset folder given");
		return CT_ERR_USAGE;
	}
	if (!c->split) {
		LOG_ERROR("data loader for %s: no split given (train or val)", c->folder);
		return CT_ERR_USAGE;
	}
	const char *bad = NULL;
	if (c->vocab < 1)
		bad = "vocab must be >= 1";
	else if (c->seq_len < 1)
		bad = "seq_len must be >= 1";
	else if (c->batch < 1)
		bad = "local batch size must be >= 1";
	else if (c->micro_batches < 1)
		bad = "micro-batches per step must be >= 1";
	else if (c->ranks < 1 || c->rank < 0 || c->rank >= c->ranks)
		bad = "rank must lie in [0, ranks)";
	else if (c->ignore_index >= 0 && c->ignore_index < c->vocab)
		bad = "ignore_index must lie outside [0, vocab)";
	else if (c->batch > INT64_MAX / c->micro_batches / c->ranks / c->seq_len)
		bad = "ranks x micro-batches x batch x seq_len overflows";
	if (bad) {
		LOG_ERROR("data loader for %s: %s (vocab %lld, seq_len %lld, batch %lld, "
		          "micro-batches %lld, rank %d of %d, ignore_index %d)",
		          c->folder, bad, (long long)c->vocab, (long long)c->seq_len,
		          (long long)c->batch, (long long)c->micro_batches, c->rank, c->ranks,
		          c->ignore_index);
		return CT_ERR_USAGE;
	}
	return CT_OK;
}

/* Feistel halves: the smallest 4^half >= S (half >= 1). */
static void loader_init_order(struct loader *ld)
{
	int half = 1;
	while (half < 31 && ((uint64_t)1 << (2 * half)) < (uint64_t)ld->samples)
		half++;
	ld->feistel_half = half;
	ld->feistel_mask = ((uint64_t)1 << half) - 1;
	ld->shuffle_stream = rng_stream_id("data/shuffle");
}

int loader_open(struct loader **out, const struct loader_config *cfg)
{
	*out = NULL;
	int rc = loader_check_config(cfg);
	if (rc)
		return rc;
	struct loader *ld = xcalloc(1, sizeof(*ld));
	ld->cfg = *cfg;
	ld->folder = xstrdup(cfg->folder);
	ld->split = xstrdup(cfg->split);
	ld->cfg.folder = ld->folder;
	ld->cfg.split = ld->split;
	ld->shuffle = strcmp(cfg->split, "train") == 0;
	rc = shard_set_open(&ld->set, ld->folder, ld->split, cfg->vocab);
	if (rc)
		goto out_free;
	int64_t T = cfg->seq_len;
	ld->samples = ld->set.tokens > 0 ? (ld->set.tokens - 1) / T : 0;
	if (ld->samples < 1) {
		LOG_ERROR("dataset folder '%s': split %s has %lld tokens, fewer than one sample of "
		          "seq_len + 1 = %lld tokens",
		          ld->folder, ld->split, (long long)ld->set.tokens, (long long)T + 1);
		rc = CT_ERR_USAGE;
		goto out_free;
	}
	ld->rows = cfg->micro_batches * cfg->batch;
	ld->global = ld->rows * cfg->ranks;
	loader_init_order(ld);
	if (cfg->prefetch) {
		rc = loader_start_worker(ld);
		if (rc)
			goto out_free;
	}
	LOG_INFO("data %s/%s_*.bin: %lld shards, %lld tokens, %lld samples of %lld+1 tokens, "
	         "%lld steps of %lld samples per epoch, %s",
	         ld->folder, ld->split, (long long)ld->set.n, (long long)ld->set.tokens,
	         (long long)ld->samples, (long long)T, (long long)loader_steps_per_epoch(ld),
	         (long long)ld->global, ld->shuffle ? "shuffled per epoch" : "in order");
	*out = ld;
	return CT_OK;
out_free:
	loader_close(ld);
	return rc;
}

void loader_close(struct loader *ld)
{
	if (!ld)
		return;
	loader_stop_worker(ld);
	shard_set_close(&ld->set);
	free(ld->folder);
	free(ld->split);
	free(ld);
}

void loader_next(struct loader *ld, int32_t *tokens, int32_t *targets)
{
	int64_t pos = ld->pos;
	ld->pos += ld->global;
	if (!ld->threaded) {
		loader_fill(ld, pos, tokens, targets);
		return;
	}
	pthread_mutex_lock(&ld->mu);
	loader_want(ld, pos);
	while (ld->filling || ld->buf_pos != pos)
		pthread_cond_wait(&ld->cv, &ld->mu);
	memcpy(tokens, ld->buf_tokens, loader_buf_bytes(ld));
	memcpy(targets, ld->buf_targets, loader_buf_bytes(ld));
	loader_want(ld, ld->pos); /* the next step, read while this one computes */
	pthread_mutex_unlock(&ld->mu);
}

int64_t loader_samples(const struct loader *ld)
{
	return ld->samples;
}

int64_t loader_steps_per_epoch(const struct loader *ld)
{
	return (ld->samples + ld->global - 1) / ld->global;
}

/* ---------------------------------------------------------------- state */

void loader_state(const struct loader *ld, struct loader_state *st)
{
	st->seed = ld->cfg.seed;
	st->seq_len = ld->cfg.seq_len;
	st->samples = ld->samples;
	st->epoch = ld->shuffle ? ld->pos / ld->samples : 0;
	st->position = ld->shuffle ? ld->pos % ld->samples : ld->pos;
}

static void loader_seek(struct loader *ld, int64_t pos)
{
	ld->pos = pos;
	if (ld->threaded) {
		pthread_mutex_lock(&ld->mu);
		loader_want(ld, pos);
		pthread_mutex_unlock(&ld->mu);
	}
}

int loader_restore(struct loader *ld, const struct loader_state *st)
{
	const char *what = "data loader state";
	if (st->seq_len != ld->cfg.seq_len) {
		LOG_ERROR("%s: saved at seq_len %lld, this run uses seq_len %lld", what,
		          (long long)st->seq_len, (long long)ld->cfg.seq_len);
		return CT_ERR_USAGE;
	}
	if (st->samples != ld->samples) {
		LOG_ERROR(
		    "%s: saved for %lld samples per epoch, but split %s of '%s' now has %lld: "
		    "the dataset changed",
		    what, (long long)st->samples, ld->split, ld->folder, (long long)ld->samples);
		return CT_ERR_USAGE;
	}
	if (st->seed != ld->cfg.seed) {
		LOG_ERROR("%s: saved with shuffle seed %" PRIu64 ", this run uses seed %" PRIu64,
		          what, st->seed, ld->cfg.seed);
		return CT_ERR_USAGE;
	}
	bool ok = st->epoch >= 0 && st->position >= 0 &&
	          (ld->shuffle ? st->position < ld->samples &&
	                             st->epoch <= (INT64_MAX - st->position) / ld->samples
	                       : st->epoch == 0);
	if (!ok) {
		LOG_ERROR(
		    "%s: epoch %lld, position %lld is out of range for split %s (%lld samples)",
		    what, (long long)st->epoch, (long long)st->position, ld->split,
		    (long long)ld->samples);
		return CT_ERR_RUNTIME;
	}
	loader_seek(ld, st->epoch * ld->samples + st->position);
	return CT_OK;
}

void loader_rewind(struct loader *ld)
{
	loader_seek(ld, 0);
}

cJSON *loader_state_to_json(const struct loader_state *st)
{
	cJSON *o = cJSON_CreateObject();
	CHECK(o, "out of memory");
	char seed[24];
	snprintf(seed, sizeof(seed), "%" PRIu64, st->seed);
	CHECK(cJSON_AddStringToObject(o, "seed", seed), "out of memory");
	CHECK(cJSON_AddNumberToObject(o, "seq_len", (double)st->seq_len), "out of memory");
	CHECK(cJSON_AddNumberToObject(o, "samples", (double)st->samples), "out of memory");
	CHECK(cJSON_AddNumberToObject(o, "epoch", (double)st->epoch), "out of memory");
	CHECK(cJSON_AddNumberToObject(o, "position", (double)st->position), "out of memory");
	return o;
}

/* A non-negative integer field below 2^53 (exact in a JSON number). */
static int json_count(const cJSON *o, const char *key, const char *where, int64_t *out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	double d = cJSON_IsNumber(v) ? v->valuedouble : -1.0;
	if (!(d >= 0.0 && d < 9007199254740992.0 && d == (double)(int64_t)d)) {
		LOG_ERROR("%s: \"%s\" must be a non-negative integer below 2^53", where, key);
		return CT_ERR_RUNTIME;
	}
	*out = (int64_t)d;
	return CT_OK;
}

int loader_state_from_json(struct loader_state *st, const cJSON *obj, const char *where)
{
	if (!cJSON_IsObject(obj)) {
		LOG_ERROR("%s: the data loader state must be a JSON object", where);
		return CT_ERR_RUNTIME;
	}
	const cJSON *seed = cJSON_GetObjectItemCaseSensitive(obj, "seed");
	const char *s = cJSON_IsString(seed) ? seed->valuestring : NULL;
	char *end = NULL;
	errno = 0;
	unsigned long long v = s && s[0] >= '0' && s[0] <= '9' ? strtoull(s, &end, 10) : 0;
	if (!s || !end || *end || errno) {
		LOG_ERROR("%s: \"seed\" must be a string holding a decimal 64-bit integer", where);
		return CT_ERR_RUNTIME;
	}
	struct loader_state t = {.seed = (uint64_t)v};
	int rc = json_count(obj, "seq_len", where, &t.seq_len);
	if (rc == CT_OK)
		rc = json_count(obj, "samples", where, &t.samples);
	if (rc == CT_OK)
		rc = json_count(obj, "epoch", where, &t.epoch);
	if (rc == CT_OK)
		rc = json_count(obj, "position", where, &t.position);
	if (rc == CT_OK)
		*st = t;
	return rc;
}
