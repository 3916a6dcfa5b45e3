/* io/tb_events: varints, CRC32C against published vectors and a bitwise reference, the
 * Event encoding against hand-assembled bytes and a small decoder, and a written file read
 * back record by record. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/file.h"
#include "io/tb_events.h"
#include "testutil.h"

/* The reference: CRC32C bit by bit (reflected polynomial 0x82F63B78). */
static uint32_t ref_crc32c(const uint8_t *p, size_t n)
{
	uint32_t c = 0xFFFFFFFFu;
	for (size_t i = 0; i < n; i++) {
		c ^= p[i];
		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
	}
	return ~c;
}

static uint32_t ref_mask(uint32_t c)
{
	return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static uint64_t rd_varint(const uint8_t *p, size_t n, size_t *at)
{
	uint64_t v = 0;
	for (int s = 0; *at < n && s < 70; s += 7) {
		uint8_t b = p[(*at)++];
		v |= (uint64_t)(b & 0x7f) << s;
		if (!(b & 0x80))
			return v;
	}
	return UINT64_MAX; /* truncated */
}

static uint64_t rd_le(const uint8_t *p, int bytes)
{
	uint64_t v = 0;
	for (int i = 0; i < bytes; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

TEST_CASE(varints)
{
	static const struct {
		uint64_t v;
		uint8_t b[10];
		size_t n;
	} known[] = {{0, {0x00}, 1},
	             {1, {0x01}, 1},
	             {127, {0x7f}, 1},
	             {128, {0x80, 0x01}, 2},
	             {300, {0xac, 0x02}, 2},
	             {16384, {0x80, 0x80, 0x01}, 3},
	             {UINT64_MAX, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, 10}};
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
		uint8_t out[10];
		size_t n = tb_put_varint(out, known[i].v);
		EXPECT(n == known[i].n && memcmp(out, known[i].b, n) == 0,
		       "varint %llu: %zu bytes", (unsigned long long)known[i].v, n);
	}
	for (int i = 0; i < 1000; i++) { /* random values of every magnitude round-trip */
		int bits = 1 + (int)test_uniform(0, 64);
		uint64_t v = (uint64_t)test_uniform(0, 4294967296.0) << 32 |
		             (uint64_t)test_uniform(0, 4294967296.0);
		v = bits == 64 ? v : v & ((1ull << bits) - 1);
		uint8_t out[10];
		size_t n = tb_put_varint(out, v), at = 0;
		EXPECT(rd_varint(out, n, &at) == v && at == n, "varint %llu does not round-trip",
		       (unsigned long long)v);
	}
}

TEST_CASE(crc32c_vectors)
{
	EXPECT(tb_crc32c("123456789", 9) == 0xE3069283u, "crc32c(\"123456789\") = %08x",
	       tb_crc32c("123456789", 9));
	EXPECT(tb_crc32c("", 0) == 0, "crc32c of nothing = %08x", tb_crc32c("", 0));
	uint8_t zeros[32] = {0}, ones[32], inc[32];
	memset(ones, 0xff, sizeof(ones));
	for (int i = 0; i < 32; i++)
		inc[i] = (uint8_t)i;
	/* RFC 3720 (iSCSI) appendix B.4 */
	EXPECT(tb_crc32c(zeros, 32) == 0x8A9136AAu, "32 zeros: %08x", tb_crc32c(zeros, 32));
	EXPECT(tb_crc32c(ones, 32) == 0x62A8AB43u, "32 ones: %08x", tb_crc32c(ones, 32));
	EXPECT(tb_crc32c(inc, 32) == 0x46DD794Eu, "0..31: %08x", tb_crc32c(inc, 32));
	EXPECT(tb_crc_mask(0) == 0xa282ead8u, "mask(0) = %08x", tb_crc_mask(0));
	for (int i = 0; i < 200; i++) { /* random lengths (SIMD paths and tails) and bytes */
		size_t n = (size_t)test_uniform(0, 3000);
		uint8_t *b = malloc(n + 1);
		for (size_t k = 0; k < n; k++)
			b[k] = (uint8_t)test_uniform(0, 256);
		uint32_t got = tb_crc32c(b, n), want = ref_crc32c(b, n);
		EXPECT(got == want, "%zu random bytes: %08x, reference %08x", n, got, want);
		EXPECT(tb_crc_mask(got) == ref_mask(want), "mask of %08x", want);
		free(b);
	}
}

TEST_CASE(event_bytes)
{
	/* wall_time 1.0, step 3, tag "a", simple_value 1.0, assembled by hand */
	static const uint8_t want[] = {0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, /* 1: double */
	                               0x10, 0x03,                          /* 2: step */
	                               0x2a, 0x0a,                          /* 5: Summary */
	                               0x0a, 0x08,                          /* 1: Value */
	                               0x0a, 0x01, 'a',                     /* 1: tag */
	                               0x15, 0, 0, 0x80, 0x3f};             /* 2: float */
	uint8_t out[64];
	size_t n = tb_encode_event(out, sizeof(out), 1.0, 3, "a", 1.0f);
	EXPECT(n == sizeof(want) && memcmp(out, want, n) == 0, "scalar event: %zu bytes", n);
	/* the file_version event: 1, 2 and 3: "brain.Event:2" */
	n = tb_encode_event(out, sizeof(out), 2.5, 0, NULL, 0);
	EXPECT(n == 9 + 2 + 2 + 13 && out[11] == 0x1a && out[12] == 13 &&
	           memcmp(out + 13, "brain.Event:2", 13) == 0,
	       "file_version event: %zu bytes", n);
	/* too small a buffer: the length comes back and nothing is written past cap */
	memset(out, 0xee, sizeof(out));
	n = tb_encode_event(out, 5, 1.0, 3, "a", 1.0f);
	EXPECT(n == sizeof(want) && out[5] == 0xee, "short buffer: %zu", n);
}

/* Decode one scalar Event; false if it is not {1 double, 2 varint, 5 {1 {1 tag, 2 float}}}. */
static bool decode_scalar(const uint8_t *p, size_t n, double *wall, int64_t *step, char *tag,
                          float *v)
{
	size_t at = 0;
	if (n < 9 || p[at++] != 0x09)
		return false;
	uint64_t w = rd_le(p + at, 8);
	memcpy(wall, &w, 8);
	at += 8;
	if (p[at++] != 0x10)
		return false;
	*step = (int64_t)rd_varint(p, n, &at);
	/* Summary, then its one Value, each running to the end of the event */
	for (int level = 0; level < 2; level++) {
		if (at + 2 > n || p[at++] != (level ? 0x0a : 0x2a))
			return false;
		uint64_t len = rd_varint(p, n, &at);
		if (len != n - at)
			return false;
	}
	if (at >= n || p[at++] != 0x0a)
		return false;
	uint64_t tn = rd_varint(p, n, &at);
	if (at + tn + 5 != n)
		return false;
	memcpy(tag, p + at, tn);
	tag[tn] = 0;
	at += tn;
	if (p[at++] != 0x15)
		return false;
	uint32_t b = (uint32_t)rd_le(p + at, 4);
	memcpy(v, &b, 4);
	return true;
}

TEST_CASE(file_round_trip)
{
	char dir[] = "/tmp/test_tb_events.XXXXXX";
	EXPECT(mkdtemp(dir) != NULL, "mkdtemp");
	struct tb_writer *w;
	EXPECT(tb_open(&w, dir) == 0, "tb_open");
	char path[1300];
	snprintf(path, sizeof(path), "%s", tb_path(w));
	EXPECT(strstr(path, "/events.out.tfevents.") != NULL, "file name %s", path);
	enum { N = 40 };
	float vals[N];
	char tags[N][64];
	for (int i = 0; i < N; i++) {
		vals[i] = (float)test_uniform(-1e6, 1e6);
		/* tags of many lengths, some longer than a one-byte varint */
		int len = 1 + (int)test_uniform(0, 60);
		for (int k = 0; k < len; k++)
			tags[i][k] = (char)('a' + (int)test_uniform(0, 26));
		tags[i][len] = 0;
		EXPECT(tb_add_scalar(w, tags[i], vals[i], 100 + i, 1.7e9 + i) == 0, "add %d", i);
	}
	/* flushed per record: readable before the writer closes */
	char *data;
	size_t len;
	EXPECT(io_read_file(path, &data, &len) == 0, "read %s", path);
	size_t at = 0;
	int rec = 0;
	while (at + 12 <= len) {
		const uint8_t *p = (const uint8_t *)data + at;
		uint64_t n = rd_le(p, 8);
		EXPECT(rd_le(p + 8, 4) == ref_mask(ref_crc32c(p, 8)), "record %d: length CRC", rec);
		if (at + 16 + n > len)
			break;
		EXPECT(rd_le(p + 12 + n, 4) == ref_mask(ref_crc32c(p + 12, n)), "record %d: data CRC",
		       rec);
		if (rec == 0) {
			EXPECT(n == 26 && memcmp(p + 12 + 13, "brain.Event:2", 13) == 0,
			       "first record is the file version");
		} else {
			double wall;
			int64_t step;
			char tag[128];
			float v;
			int i = rec - 1;
			bool ok = i < N && decode_scalar(p + 12, n, &wall, &step, tag, &v);
			EXPECT(ok && step == 100 + i && wall == 1.7e9 + i && strcmp(tag, tags[i]) == 0 &&
			           memcmp(&v, &vals[i], 4) == 0,
			       "record %d: scalar", rec);
		}
		at += 16 + n;
		rec++;
	}
	EXPECT(at == len && rec == N + 1, "%d records, %zu of %zu bytes", rec, at, len);
	free(data);
	tb_close(w);
	/* a second writer in the same second gets its own file */
	struct tb_writer *w2;
	EXPECT(tb_open(&w2, dir) == 0 && strcmp(tb_path(w2), path) != 0, "second file");
	unlink(tb_path(w2));
	tb_close(w2);
	unlink(path);
	rmdir(dir);
	/* a folder that is not there: an error, no crash */
	EXPECT(tb_open(&w2, "/nonexistent/tb") != 0 && w2 == NULL, "missing folder");
}

int main(void)
{
	test_seed();
	RUN(varints);
	RUN(crc32c_vectors);
	RUN(event_bytes);
	RUN(file_round_trip);
	return test_summary();
}
