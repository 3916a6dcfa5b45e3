#include "data/tokens.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/rng.h"

static uint32_t rd_u32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd_u64(const unsigned char *p)
{
	return (uint64_t)rd_u32(p) | (uint64_t)rd_u32(p + 4) << 32;
}

static void wr_u32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static int tokens_load_file(struct token_source *s, const char *path, int64_t seq_len)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		LOG_ERROR("training.dataset: cannot open '%s': %s", path, strerror(errno));
		return CT_ERR_USAGE;
	}
	int rc = CT_ERR_RUNTIME;
	unsigned char hdr[TOKENS_HEADER_BYTES];
	unsigned char *raw = NULL;
	if (fread(hdr, 1, sizeof(hdr), f) != sizeof(hdr)) {
		LOG_ERROR("%s: truncated header (%d bytes expected)", path, TOKENS_HEADER_BYTES);
		goto out;
	}
	if (memcmp(hdr, TOKENS_MAGIC, 8) != 0) {
		LOG_ERROR("%s: not a ctitan token file (bad magic)", path);
		goto out;
	}
	uint32_t version = rd_u32(hdr + 8), width = rd_u32(hdr + 12);
	uint64_t count = rd_u64(hdr + 16);
	if (version != TOKENS_VERSION) {
		LOG_ERROR("%s: token file version %u, this build reads version %u", path, version,
			  TOKENS_VERSION);
		goto out;
	}
	if (width != 2 && width != 4) {
		LOG_ERROR("%s: token width %u bytes (2 or 4 expected)", path, width);
		goto out;
	}
	if (fseeko(f, 0, SEEK_END) != 0) {
		LOG_ERROR("%s: cannot seek: %s", path, strerror(errno));
		goto out;
	}
	int64_t size = ftello(f);
	if (count > (uint64_t)INT64_MAX / 4 ||
	    (int64_t)count * width + TOKENS_HEADER_BYTES != size) {
		LOG_ERROR("%s: header says %llu tokens of %u bytes but the file has %lld bytes", path,
			  (unsigned long long)count, width, (long long)size);
		goto out;
	}
	if ((int64_t)count < seq_len + 1) {
		LOG_ERROR("%s: %llu tokens, fewer than one window of seq_len+1 = %lld", path,
			  (unsigned long long)count, (long long)seq_len + 1);
		rc = CT_ERR_USAGE;
		goto out;
	}
	fseeko(f, TOKENS_HEADER_BYTES, SEEK_SET);
	raw = malloc((size_t)count * width);
	CHECK(raw, "out of memory reading %s", path);
	if (fread(raw, width, (size_t)count, f) != count) {
		LOG_ERROR("%s: read failed", path);
		goto out;
	}
	s->tokens = xcalloc((size_t)count, sizeof(int32_t));
	s->count = (int64_t)count;
	for (int64_t i = 0; i < s->count; i++) {
		uint32_t t = width == 2 ? (uint32_t)(raw[2 * i] | raw[2 * i + 1] << 8)
					: rd_u32(raw + 4 * i);
		if ((int64_t)t >= s->vocab) {
			LOG_ERROR("%s: token %u at position %lld is outside the model vocabulary "
				  "(%lld)", path, t, (long long)i, (long long)s->vocab);
			free(s->tokens);
			s->tokens = NULL;
			goto out;
		}
		s->tokens[i] = (int32_t)t;
	}
	rc = CT_OK;
out:
	free(raw);
	fclose(f);
	return rc;
}

int tokens_open(struct token_source *s, const char *dataset, int64_t vocab, uint64_t seed,
		int64_t seq_len)
{
	memset(s, 0, sizeof(*s));
	s->vocab = vocab;
	s->seed = seed;
	snprintf(s->path, sizeof(s->path), "%s", dataset);
	if (strcmp(dataset, "synthetic") == 0) {
		s->synthetic = true;
		return CT_OK;
	}
	return tokens_load_file(s, dataset, seq_len);
}

void tokens_close(struct token_source *s)
{
	free(s->tokens);
	memset(s, 0, sizeof(*s));
}

void tokens_batch(const struct token_source *s, int64_t first_row, int64_t rows, int64_t T,
		  int32_t *inputs, int32_t *targets)
{
	static const uint64_t stream_data = 0x64617461ull; /* "data" */
	for (int64_t r = 0; r < rows; r++) {
		uint64_t row = (uint64_t)(first_row + r);
		int32_t *in = inputs + r * T, *tg = targets + r * T;
		if (s->synthetic) {
			/* T+1 tokens; element j of row drawn at index row*(T+1)+j. */
			uint64_t base = row * (uint64_t)(T + 1);
			int32_t cur = (int32_t)rng_below(s->seed, stream_data, base, (uint64_t)s->vocab);
			for (int64_t j = 0; j < T; j++) {
				uint32_t w[4];
				rng_philox(s->seed, stream_data, base + (uint64_t)j + 1, 1, w);
				int32_t next = (w[0] % 10 != 0)
						       ? (int32_t)((5 * (int64_t)cur + 3) % s->vocab)
						       : (int32_t)(w[1] % (uint32_t)s->vocab);
				in[j] = cur;
				tg[j] = next;
				cur = next;
			}
		} else {
			int64_t start = (int64_t)rng_below(s->seed, stream_data, row,
							   (uint64_t)(s->count - T));
			memcpy(in, s->tokens + start, (size_t)T * sizeof(int32_t));
			memcpy(tg, s->tokens + start + 1, (size_t)T * sizeof(int32_t));
		}
	}
}

int tokens_write(const char *path, const int32_t *tokens, int64_t count, int bytes_per_token)
{
	FILE *f = fopen(path, "wb");
	if (!f) {
		LOG_ERROR("cannot create '%s': %s", path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	unsigned char hdr[TOKENS_HEADER_BYTES];
	memcpy(hdr, TOKENS_MAGIC, 8);
	wr_u32(hdr + 8, TOKENS_VERSION);
	wr_u32(hdr + 12, (uint32_t)bytes_per_token);
	wr_u32(hdr + 16, (uint32_t)count);
	wr_u32(hdr + 20, (uint32_t)((uint64_t)count >> 32));
	int ok = fwrite(hdr, 1, sizeof(hdr), f) == sizeof(hdr);
	for (int64_t i = 0; ok && i < count; i++) {
		unsigned char b[4];
		wr_u32(b, (uint32_t)tokens[i]);
		ok = fwrite(b, 1, (size_t)bytes_per_token, f) == (size_t)bytes_per_token;
	}
	if (fclose(f) != 0 || !ok) {
		LOG_ERROR("write to '%s' failed", path);
		return CT_ERR_RUNTIME;
	}
	return CT_OK;
}
