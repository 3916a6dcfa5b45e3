/* tests/fuzz/fuzz_shards: libFuzzer harness for data/shards and data/loader (not part of the
 * CMake build).
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Wno-unknown-pragmas -Isrc \
 *         tests/fuzz/fuzz_shards.c src/data/shards.c src/data/loader.c src/base/log.c \
 *         src/base/mem.c src/base/rng.c -lcjson -lm -lpthread -o /tmp/fuzz_shards
 *   mkdir -p /tmp/fuzz_shards_corpus
 *   /tmp/fuzz_shards -max_total_time=120 -close_fd_mask=2 /tmp/fuzz_shards_corpus
 *
 * (-close_fd_mask=2 silences the readers' error messages; crash reports still show.)
 *
 * The first byte picks what the rest is:
 *   % 3 == 0: one shard image for shard_view, with a vocabulary from the second byte. When
 *     it is accepted, the header must describe the image exactly and every token read back
 *     must lie below the vocabulary.
 *   % 3 == 1: up to three shard files (split at length bytes) in a temporary folder, opened
 *     as a dataset by loader_open with a seq_len, layout, split and prefetch taken from the
 *     input. When it opens, every row of a few steps must be a window of the token stream
 *     (or val padding), prefetch must agree with synchronous reading, and the state must
 *     survive JSON and restore.
 *   % 3 == 2: a JSON document for loader_state_from_json; what parses must print and parse
 *     back to the same state.
 */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "data/loader.h"
#include "data/shards.h"

#define FUZZ_ASSERT(cond)                                                                          \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stdout, "fuzz_shards: property failed: %s (line %d)\n", #cond,     \
			        __LINE__);                                                         \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

static char fuzz_dir[64];

static void fuzz_view(const uint8_t *data, size_t size)
{
	if (size < 1)
		return;
	int64_t vocab = data[0] == 0 ? 0 : (int64_t)data[0] * 97; /* 0: only the int32 check */
	const uint8_t *img = data + 1;
	size_t bytes = size - 1;
	struct shard s;
	if (shard_view(&s, img, bytes, "fuzz.bin", vocab) != CT_OK)
		return;
	FUZZ_ASSERT(s.width == 2 || s.width == 4);
	FUZZ_ASSERT((size_t)s.count * (size_t)s.width + SHARD_HEADER_BYTES == bytes);
	FUZZ_ASSERT(memcmp(img, SHARD_MAGIC, 8) == 0);
	int32_t buf[64];
	for (int64_t i = 0; i < s.count; i += 64) {
		int64_t n = s.count - i < 64 ? s.count - i : 64;
		shard_read(&s, i, n, buf);
		for (int64_t k = 0; k < n; k++)
			FUZZ_ASSERT(buf[k] >= 0 && (vocab <= 0 || buf[k] < vocab));
	}
	shard_close(&s);
}

static void fuzz_clear_dir(void)
{
	char path[128];
	for (int i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "%s/train_%d.bin", fuzz_dir, i);
		unlink(path);
		snprintf(path, sizeof(path), "%s/val_%d.bin", fuzz_dir, i);
		unlink(path);
	}
}

/* Every row of the step starting at `first` on this rank is the right window or padding. */
static void fuzz_check_rows(struct loader *ld, const struct loader_config *c,
                            const struct shard_set *set, int64_t first, const int32_t *tok,
                            const int32_t *tgt, int32_t *win)
{
	int64_t T = c->seq_len;
	for (int64_t a = 0; a < c->micro_batches; a++)
		for (int64_t b = 0; b < c->batch; b++) {
			int64_t p = first + (a * c->ranks + c->rank) * c->batch + b;
			int64_t i = loader_sample_at(ld, p), row = (a * c->batch + b) * T;
			if (i < 0) {
				for (int64_t t = 0; t < T; t++)
					FUZZ_ASSERT(tok[row + t] == 0 && tgt[row + t] == -100);
				continue;
			}
			FUZZ_ASSERT(i < loader_samples(ld));
			shard_set_read(set, i * T, T + 1, win);
			FUZZ_ASSERT(memcmp(tok + row, win, (size_t)T * 4) == 0);
			FUZZ_ASSERT(memcmp(tgt + row, win + 1, (size_t)T * 4) == 0);
		}
}

static void fuzz_loader(const uint8_t *data, size_t size)
{
	if (size < 4)
		return;
	uint8_t knobs = data[0], layout = data[1], seq = data[2];
	data += 3;
	size -= 3;
	bool val = knobs & 1;
	const char *split = val ? "val" : "train";
	fuzz_clear_dir();
	/* Pieces: [len byte][len * 8 bytes] ... up to three files, the last takes the rest. */
	for (int i = 0; i < 3 && size > 0; i++) {
		size_t len = i == 2 ? size - 1 : (size_t)data[0] * 8;
		data++;
		size--;
		len = len < size ? len : size;
		char path[128];
		snprintf(path, sizeof(path), "%s/%s_%d.bin", fuzz_dir, split, i);
		FILE *f = fopen(path, "wb");
		if (!f)
			return;
		fwrite(data, 1, len, f);
		fclose(f);
		data += len;
		size -= len;
	}
	int64_t v = knobs >> 1 & 7;
	struct loader_config c = {
	    .folder = fuzz_dir,
	    .split = split,
	    .vocab = v ? 300 * v : 70000,
	    .seq_len = 1 + seq % 16,
	    .batch = 1 + layout % 3,
	    .micro_batches = 1 + (layout >> 2) % 2,
	    .ranks = 1 + (layout >> 3) % 3,
	    .seed = knobs,
	    .ignore_index = -100,
	    .prefetch = knobs & 0x80,
	};
	c.rank = (int)((layout >> 5) % c.ranks);
	struct loader *ld;
	if (loader_open(&ld, &c) != CT_OK)
		return;
	struct shard_set set;
	FUZZ_ASSERT(shard_set_open(&set, fuzz_dir, split, c.vocab) == CT_OK);
	int64_t n = c.micro_batches * c.batch * c.seq_len;
	int32_t *tok = calloc((size_t)n * 2 + (size_t)c.seq_len + 1, sizeof(int32_t));
	int32_t *tgt = tok + n, *win = tok + 2 * n;
	int64_t G = c.micro_batches * c.batch * c.ranks;
	struct loader_state st, back;
	for (int64_t s = 0; s < 4; s++) {
		loader_state(ld, &st);
		FUZZ_ASSERT(st.epoch * st.samples + st.position == s * G);
		loader_next(ld, tok, tgt);
		fuzz_check_rows(ld, &c, &set, s * G, tok, tgt, win);
	}
	cJSON *j = loader_state_to_json(&st);
	FUZZ_ASSERT(loader_state_from_json(&back, j, "fuzz") == CT_OK);
	FUZZ_ASSERT(memcmp(&st, &back, sizeof(st)) == 0);
	cJSON_Delete(j);
	FUZZ_ASSERT(loader_restore(ld, &back) == CT_OK);
	loader_next(ld, tok, tgt);
	fuzz_check_rows(ld, &c, &set, 3 * G, tok, tgt, win);
	free(tok);
	shard_set_close(&set);
	loader_close(ld);
}

static void fuzz_state_json(const uint8_t *data, size_t size)
{
	cJSON *j = cJSON_ParseWithLength((const char *)data, size);
	struct loader_state st, back;
	if (j && loader_state_from_json(&st, j, "fuzz") == CT_OK) {
		cJSON *k = loader_state_to_json(&st);
		FUZZ_ASSERT(loader_state_from_json(&back, k, "fuzz") == CT_OK);
		FUZZ_ASSERT(memcmp(&st, &back, sizeof(st)) == 0);
		cJSON_Delete(k);
	}
	cJSON_Delete(j);
}

static void fuzz_remove_dir(void)
{
	fuzz_clear_dir();
	rmdir(fuzz_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!fuzz_dir[0]) {
		snprintf(fuzz_dir, sizeof(fuzz_dir), "/tmp/fuzz_shards_%d", (int)getpid());
		mkdir(fuzz_dir, 0755);
		atexit(fuzz_remove_dir);
		log_set_level(LOG_ERROR);
	}
	if (size < 1)
		return 0;
	switch (data[0] % 3) {
	case 0:
		fuzz_view(data + 1, size - 1);
		break;
	case 1:
		fuzz_loader(data + 1, size - 1);
		break;
	default:
		fuzz_state_json(data + 1, size - 1);
		break;
	}
	return 0;
}
