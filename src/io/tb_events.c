#include "io/tb_events.h"

#include <errno.h>
#include <isa-l/crc.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"

struct tb_writer {
	FILE *f;
	char path[1200];
	bool failed;
};

/* ---------------------------------------------------------------- encoder */

uint32_t tb_crc32c(const void *p, size_t n)
{
	/* crc32_iscsi keeps the raw register (no final inversion), so it chains over chunks
	 * that fit its int length */
	unsigned int crc = 0xFFFFFFFFu;
	const unsigned char *b = p;
	while (n > 0) {
		int k = n > (size_t)INT_MAX ? INT_MAX : (int)n;
		crc = crc32_iscsi((unsigned char *)b, k, crc);
		b += k;
		n -= (size_t)k;
	}
	return crc ^ 0xFFFFFFFFu;
}

uint32_t tb_crc_mask(uint32_t crc)
{
	return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

size_t tb_put_varint(uint8_t *out, uint64_t v)
{
	size_t n = 0;
	while (v >= 0x80) {
		out[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	out[n++] = (uint8_t)v;
	return n;
}

static size_t varint_len(uint64_t v)
{
	size_t n = 1;
	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

/* A bounded output buffer: writes past cap are counted, not stored. */
struct pb {
	uint8_t *p;
	size_t len, cap;
};

static void pb_bytes(struct pb *b, const void *src, size_t n)
{
	if (n > 0 && b->len + n <= b->cap)
		memcpy(b->p + b->len, src, n);
	b->len += n;
}

static void pb_varint(struct pb *b, uint64_t v)
{
	uint8_t tmp[10];
	pb_bytes(b, tmp, tb_put_varint(tmp, v));
}

/* field key: (number << 3) | wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32) */
static void pb_key(struct pb *b, int field, int wire)
{
	pb_varint(b, (uint64_t)(field << 3 | wire));
}

static void pb_fixed(struct pb *b, uint64_t v, int bytes)
{
	uint8_t tmp[8];
	for (int i = 0; i < bytes; i++)
		tmp[i] = (uint8_t)(v >> (8 * i));
	pb_bytes(b, tmp, (size_t)bytes);
}

size_t tb_encode_event(uint8_t *out, size_t cap, double wall_time, int64_t step, const char *tag,
                       float value)
{
	struct pb b = {out, 0, cap};
	uint64_t wall_bits;
	memcpy(&wall_bits, &wall_time, sizeof(wall_bits));
	pb_key(&b, 1, 1); /* wall_time */
	pb_fixed(&b, wall_bits, 8);
	pb_key(&b, 2, 0); /* step (int64: two's complement as uint64) */
	pb_varint(&b, (uint64_t)step);
	if (!tag) {
		static const char version[] = "brain.Event:2";
		pb_key(&b, 3, 2); /* file_version */
		pb_varint(&b, sizeof(version) - 1);
		pb_bytes(&b, version, sizeof(version) - 1);
		return b.len;
	}
	size_t tag_n = strlen(tag);
	size_t value_n = 1 + varint_len(tag_n) + tag_n + 1 + 4;    /* Value */
	size_t summary_n = 1 + varint_len(value_n) + value_n;       /* Summary */
	uint32_t value_bits;
	memcpy(&value_bits, &value, sizeof(value_bits));
	pb_key(&b, 5, 2); /* Event.summary */
	pb_varint(&b, summary_n);
	pb_key(&b, 1, 2); /* Summary.value */
	pb_varint(&b, value_n);
	pb_key(&b, 1, 2); /* Value.tag */
	pb_varint(&b, tag_n);
	pb_bytes(&b, tag, tag_n);
	pb_key(&b, 2, 5); /* Value.simple_value */
	pb_fixed(&b, value_bits, 4);
	return b.len;
}

void tb_frame_record(uint8_t *out, const uint8_t *data, size_t n)
{
	for (int i = 0; i < 8; i++)
		out[i] = (uint8_t)((uint64_t)n >> (8 * i));
	uint32_t len_crc = tb_crc_mask(tb_crc32c(out, 8));
	for (int i = 0; i < 4; i++)
		out[8 + i] = (uint8_t)(len_crc >> (8 * i));
	memcpy(out + 12, data, n);
	uint32_t data_crc = tb_crc_mask(tb_crc32c(data, n));
	for (int i = 0; i < 4; i++)
		out[12 + n + i] = (uint8_t)(data_crc >> (8 * i));
}

/* ---------------------------------------------------------------- writer */

double tb_wall_time(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int tb_write_event(struct tb_writer *w, double wall_time, int64_t step, const char *tag,
                          float value)
{
	if (w->failed)
		return CT_ERR_RUNTIME;
	size_t n = tb_encode_event(NULL, 0, wall_time, step, tag, value); /* its length */
	uint8_t *data = malloc(n), *rec = malloc(n + 16);
	CHECK(data && rec, "out of memory");
	tb_encode_event(data, n, wall_time, step, tag, value);
	tb_frame_record(rec, data, n);
	free(data);
	bool ok = fwrite(rec, 1, n + 16, w->f) == n + 16 && fflush(w->f) == 0;
	free(rec);
	if (!ok) {
		LOG_ERROR("tensorboard: cannot write '%s': %s", w->path, strerror(errno));
		w->failed = true;
		return CT_ERR_RUNTIME;
	}
	return CT_OK;
}

int tb_open(struct tb_writer **out, const char *dir)
{
	static int n_open; /* a process-wide counter makes names unique within a second */
	*out = NULL;
	struct tb_writer *w = xcalloc(1, sizeof(*w));
	char host[256] = "localhost";
	if (gethostname(host, sizeof(host)) != 0)
		snprintf(host, sizeof(host), "localhost");
	host[sizeof(host) - 1] = 0;
	snprintf(w->path, sizeof(w->path), "%s/events.out.tfevents.%010lld.%s.%d.%d", dir,
	         (long long)time(NULL), host, (int)getpid(), n_open++);
	w->f = fopen(w->path, "wbx");
	if (!w->f) {
		LOG_ERROR("tensorboard: cannot create '%s': %s", w->path, strerror(errno));
		free(w);
		return CT_ERR_RUNTIME;
	}
	int rc = tb_write_event(w, tb_wall_time(), 0, NULL, 0.0f);
	if (rc) {
		tb_close(w);
		return rc;
	}
	*out = w;
	return CT_OK;
}

int tb_add_scalar(struct tb_writer *w, const char *tag, float value, int64_t step,
                  double wall_time)
{
	return tb_write_event(w, wall_time, step, tag, value);
}

const char *tb_path(const struct tb_writer *w)
{
	return w->path;
}

void tb_close(struct tb_writer *w)
{
	if (!w)
		return;
	if (w->f)
		fclose(w->f);
	free(w);
}
