#include "data/shards.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"

/* Tokens are read with memcpy into host integers: the reader assumes a little-endian host,
 * like every platform ctitan targets. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "shard reader: little-endian host");

/* Below this many tokens the validation scan stays on one thread. */
#define SHARD_SCAN_PARALLEL_MIN (1 << 22)

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

static void wr_u64(unsigned char *p, uint64_t v)
{
	wr_u32(p, (uint32_t)v);
	wr_u32(p + 4, (uint32_t)(v >> 32));
}

static uint32_t token_at(const unsigned char *data, int width, int64_t i)
{
	if (width == 2) {
		uint16_t v;
		memcpy(&v, data + 2 * i, 2);
		return v;
	}
	uint32_t v;
	memcpy(&v, data + 4 * i, 4);
	return v;
}

/* The largest token id in data[0..count); a pass the compiler vectorises, on all OpenMP
 * threads for large shards. */
static uint32_t shard_max_token(const unsigned char *data, int width, int64_t count)
{
	uint32_t m = 0;
	if (width == 2) {
#pragma omp parallel for reduction(max : m) schedule(static) if (count >= SHARD_SCAN_PARALLEL_MIN)
		for (int64_t i = 0; i < count; i++) {
			uint16_t v;
			memcpy(&v, data + 2 * i, 2);
			m = v > m ? v : m;
		}
	} else {
#pragma omp parallel for reduction(max : m) schedule(static) if (count >= SHARD_SCAN_PARALLEL_MIN)
		for (int64_t i = 0; i < count; i++) {
			uint32_t v;
			memcpy(&v, data + 4 * i, 4);
			m = v > m ? v : m;
		}
	}
	return m;
}

static int shard_check_tokens(const struct shard *s, const char *name, int64_t vocab)
{
	uint64_t limit =
	    vocab > 0 && vocab < ((int64_t)1 << 31) ? (uint64_t)vocab : (uint64_t)1 << 31;
	if (shard_max_token(s->data, s->width, s->count) < limit)
		return CT_OK;
	for (int64_t i = 0; i < s->count; i++) {
		uint32_t t = token_at(s->data, s->width, i);
		if (t < limit)
			continue;
		if (vocab > 0)
			LOG_ERROR(
			    "%s: token %u at position %lld is outside the vocabulary (%lld ids)",
			    name, t, (long long)i, (long long)vocab);
		else
			LOG_ERROR("%s: token %u at position %lld does not fit in int32", name, t,
			          (long long)i);
		break;
	}
	return CT_ERR_RUNTIME;
}

int shard_view(struct shard *s, const void *base, size_t bytes, const char *name, int64_t vocab)
{
	memset(s, 0, sizeof(*s));
	const unsigned char *p = base;
	if (bytes < SHARD_HEADER_BYTES) {
		LOG_ERROR("%s: truncated header: %zu bytes, a token shard starts with a %d-byte "
		          "header",
		          name, bytes, SHARD_HEADER_BYTES);
		return CT_ERR_RUNTIME;
	}
	if (memcmp(p, SHARD_MAGIC, 8) != 0) {
		LOG_ERROR("%s: bad magic: not a ctitan token shard (expected \"%s\")", name,
		          SHARD_MAGIC);
		return CT_ERR_RUNTIME;
	}
	uint32_t version = rd_u32(p + 8), width = rd_u32(p + 12);
	uint64_t count = rd_u64(p + 16);
	if (version != SHARD_VERSION) {
		LOG_ERROR("%s: shard version %u, this build reads version %u", name, version,
		          SHARD_VERSION);
		return CT_ERR_RUNTIME;
	}
	if (width != 2 && width != 4) {
		LOG_ERROR("%s: bad token width: %u bytes per token (2 or 4 expected)", name, width);
		return CT_ERR_RUNTIME;
	}
	uint64_t body = bytes - SHARD_HEADER_BYTES;
	if (count > body / width) {
		LOG_ERROR("%s: truncated: header says %llu tokens of %u bytes but only %llu bytes "
		          "follow the header",
		          name, (unsigned long long)count, width, (unsigned long long)body);
		return CT_ERR_RUNTIME;
	}
	if (count * width != body) {
		LOG_ERROR("%s: count mismatch: header says %llu tokens of %u bytes but %llu bytes "
		          "follow the header",
		          name, (unsigned long long)count, width, (unsigned long long)body);
		return CT_ERR_RUNTIME;
	}
	s->data = p + SHARD_HEADER_BYTES;
	s->width = (int)width;
	s->count = (int64_t)count;
	int rc = shard_check_tokens(s, name, vocab);
	if (rc) {
		memset(s, 0, sizeof(*s));
		return rc;
	}
	s->path = xstrdup(name);
	return CT_OK;
}

int shard_open(struct shard *s, const char *path, int64_t vocab)
{
	memset(s, 0, sizeof(*s));
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		LOG_ERROR("%s: cannot open: %s", path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	struct stat st;
	if (fstat(fd, &st) != 0) {
		LOG_ERROR("%s: cannot stat: %s", path, strerror(errno));
		close(fd);
		return CT_ERR_RUNTIME;
	}
	if (!S_ISREG(st.st_mode)) {
		LOG_ERROR("%s: not a regular file", path);
		close(fd);
		return CT_ERR_RUNTIME;
	}
	size_t bytes = (size_t)st.st_size;
	if (bytes == 0) { /* mmap cannot map nothing; the view names the problem */
		close(fd);
		return shard_view(s, "", 0, path, vocab);
	}
	void *map = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
	int err = errno;
	close(fd); /* the mapping keeps the file */
	if (map == MAP_FAILED) {
		LOG_ERROR("%s: cannot mmap %zu bytes: %s", path, bytes, strerror(err));
		return CT_ERR_RUNTIME;
	}
	int rc = shard_view(s, map, bytes, path, vocab);
	if (rc) {
		munmap(map, bytes);
		return rc;
	}
	s->map = map;
	s->map_bytes = bytes;
	return CT_OK;
}

void shard_close(struct shard *s)
{
	if (s->map)
		munmap((void *)s->map, s->map_bytes);
	free(s->path);
	memset(s, 0, sizeof(*s));
}

void shard_read(const struct shard *s, int64_t first, int64_t n, int32_t *out)
{
	const unsigned char *p = s->data + first * s->width;
	if (s->width == 4) { /* validated < 2^31: the uint32 bits are the int32 value */
		memcpy(out, p, (size_t)n * sizeof(int32_t));
		return;
	}
	for (int64_t i = 0; i < n; i++) {
		uint16_t v;
		memcpy(&v, p + 2 * i, 2);
		out[i] = v;
	}
}

/* ---------------------------------------------------------------- a split of a folder */

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool is_split_file(const char *name, const char *split)
{
	size_t n = strlen(name), k = strlen(split);
	return n >= k + 1 + 4 && strncmp(name, split, k) == 0 && name[k] == '_' &&
	       strcmp(name + n - 4, ".bin") == 0;
}

/* The sorted names of folder's "<split>_*.bin" files; *out_n of them. */
static int list_split(const char *folder, const char *split, char ***out, int64_t *out_n)
{
	DIR *d = opendir(folder);
	if (!d) {
		LOG_ERROR("dataset folder '%s': %s", folder, strerror(errno));
		return CT_ERR_USAGE;
	}
	char **names = NULL;
	int64_t n = 0, cap = 0;
	struct dirent *e;
	errno = 0;
	while ((e = readdir(d))) {
		if (!is_split_file(e->d_name, split))
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			names = realloc(names, (size_t)cap * sizeof(*names));
			CHECK(names, "out of memory listing %s", folder);
		}
		names[n++] = xstrdup(e->d_name);
	}
	int err = errno;
	closedir(d);
	if (err) {
		LOG_ERROR("dataset folder '%s': cannot list: %s", folder, strerror(err));
		for (int64_t i = 0; i < n; i++)
			free(names[i]);
		free(names);
		return CT_ERR_RUNTIME;
	}
	if (n)
		qsort(names, (size_t)n, sizeof(*names), name_cmp);
	*out = names;
	*out_n = n;
	return CT_OK;
}

int shard_set_open(struct shard_set *set, const char *folder, const char *split, int64_t vocab)
{
	memset(set, 0, sizeof(*set));
	if (!split[0] || strchr(split, '/')) {
		LOG_ERROR("dataset split '%s': expected a name such as train or val", split);
		return CT_ERR_USAGE;
	}
	char **names;
	int64_t n;
	int rc = list_split(folder, split, &names, &n);
	if (rc)
		return rc;
	if (n == 0) {
		LOG_ERROR("dataset folder '%s' has no %s shards (%s_*.bin)", folder, split, split);
		free(names);
		return CT_ERR_USAGE;
	}
	set->folder = xstrdup(folder);
	set->split = xstrdup(split);
	set->shards = xcalloc((size_t)n, sizeof(*set->shards));
	set->start = xcalloc((size_t)n + 1, sizeof(*set->start));
	for (int64_t i = 0; i < n && rc == CT_OK; i++) {
		size_t len = strlen(folder) + strlen(names[i]) + 2;
		char *path = xcalloc(len, 1);
		snprintf(path, len, "%s/%s", folder, names[i]);
		rc = shard_open(&set->shards[i], path, vocab);
		free(path);
		if (rc == CT_OK) {
			set->n = i + 1;
			set->start[i + 1] = set->start[i] + set->shards[i].count;
		}
	}
	for (int64_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	if (rc) {
		shard_set_close(set);
		return rc;
	}
	set->tokens = set->start[n];
	return CT_OK;
}

void shard_set_close(struct shard_set *set)
{
	for (int64_t i = 0; i < set->n; i++)
		shard_close(&set->shards[i]);
	free(set->shards);
	free(set->start);
	free(set->folder);
	free(set->split);
	memset(set, 0, sizeof(*set));
}

void shard_set_read(const struct shard_set *set, int64_t first, int64_t n, int32_t *out)
{
	CHECK(first >= 0 && n >= 0 && first + n <= set->tokens,
	      "read of tokens %lld..%lld outside split %s of %s (%lld tokens)", (long long)first,
	      (long long)(first + n), set->split, set->folder, (long long)set->tokens);
	if (n == 0)
		return;
	int64_t lo = 0, hi = set->n - 1; /* the last shard starting at or before first */
	while (lo < hi) {
		int64_t mid = (lo + hi + 1) / 2;
		if (set->start[mid] <= first)
			lo = mid;
		else
			hi = mid - 1;
	}
	for (int64_t i = lo; n > 0; i++) {
		if (first >= set->start[i + 1])
			continue; /* empty shard */
		int64_t take = set->start[i + 1] - first;
		take = take < n ? take : n;
		shard_read(&set->shards[i], first - set->start[i], take, out);
		out += take;
		first += take;
		n -= take;
	}
}

/* ---------------------------------------------------------------- writing */

static void shard_header(unsigned char *hdr, int width, int64_t count)
{
	memcpy(hdr, SHARD_MAGIC, 8);
	wr_u32(hdr + 8, SHARD_VERSION);
	wr_u32(hdr + 12, (uint32_t)width);
	wr_u64(hdr + 16, (uint64_t)count);
}

int shard_writer_open(struct shard_writer *w, const char *path, int width)
{
	memset(w, 0, sizeof(*w));
	if (width != 2 && width != 4) {
		LOG_ERROR("%s: token width %d bytes (2 or 4 expected)", path, width);
		return CT_ERR_USAGE;
	}
	size_t len = strlen(path) + 5;
	w->tmp_path = xcalloc(len, 1);
	snprintf(w->tmp_path, len, "%s.tmp", path);
	w->f = fopen(w->tmp_path, "wb");
	if (!w->f) {
		LOG_ERROR("%s: cannot create: %s", w->tmp_path, strerror(errno));
		free(w->tmp_path);
		w->tmp_path = NULL;
		return CT_ERR_RUNTIME;
	}
	w->path = xstrdup(path);
	w->width = width;
	unsigned char hdr[SHARD_HEADER_BYTES];
	shard_header(hdr, width, 0); /* the count is written by close */
	if (fwrite(hdr, 1, sizeof(hdr), w->f) != sizeof(hdr)) {
		LOG_ERROR("%s: write failed: %s", w->tmp_path, strerror(errno));
		w->failed = 1;
		shard_writer_close(w);
		return CT_ERR_RUNTIME;
	}
	return CT_OK;
}

int shard_writer_append(struct shard_writer *w, const int32_t *tokens, int64_t n)
{
	if (w->failed)
		return CT_ERR_RUNTIME;
	int64_t limit = w->width == 2 ? (int64_t)1 << 16 : (int64_t)1 << 31;
	unsigned char buf[4096];
	int64_t per = (int64_t)sizeof(buf) / w->width;
	for (int64_t i0 = 0; i0 < n; i0 += per) {
		int64_t m = n - i0 < per ? n - i0 : per;
		for (int64_t i = 0; i < m; i++) {
			int32_t t = tokens[i0 + i];
			if (t < 0 || t >= limit) {
				LOG_ERROR("%s: token %d at position %lld does not fit in %d bytes",
				          w->path, t, (long long)(w->count + i0 + i), w->width);
				w->failed = 1;
				return CT_ERR_USAGE;
			}
			unsigned char b[4];
			wr_u32(b, (uint32_t)t);
			memcpy(buf + i * w->width, b, (size_t)w->width);
		}
		if (fwrite(buf, (size_t)w->width, (size_t)m, w->f) != (size_t)m) {
			LOG_ERROR("%s: write failed: %s", w->tmp_path, strerror(errno));
			w->failed = 1;
			return CT_ERR_RUNTIME;
		}
	}
	w->count += n;
	return CT_OK;
}

int shard_writer_close(struct shard_writer *w)
{
	int rc = w->failed ? CT_ERR_RUNTIME : CT_OK;
	if (w->f && rc == CT_OK) {
		unsigned char hdr[SHARD_HEADER_BYTES];
		shard_header(hdr, w->width, w->count);
		if (fseeko(w->f, 0, SEEK_SET) != 0 ||
		    fwrite(hdr, 1, sizeof(hdr), w->f) != sizeof(hdr) || fflush(w->f) != 0 ||
		    fsync(fileno(w->f)) != 0) {
			LOG_ERROR("%s: write failed: %s", w->tmp_path, strerror(errno));
			rc = CT_ERR_RUNTIME;
		}
	}
	if (w->f && fclose(w->f) != 0 && rc == CT_OK) {
		LOG_ERROR("%s: close failed: %s", w->tmp_path, strerror(errno));
		rc = CT_ERR_RUNTIME;
	}
	if (w->tmp_path) {
		if (rc == CT_OK && rename(w->tmp_path, w->path) != 0) {
			LOG_ERROR("%s: cannot rename to %s: %s", w->tmp_path, w->path,
			          strerror(errno));
			rc = CT_ERR_RUNTIME;
		}
		if (rc != CT_OK)
			remove(w->tmp_path);
	}
	free(w->path);
	free(w->tmp_path);
	memset(w, 0, sizeof(*w));
	return rc;
}

int shard_write(const char *path, const int32_t *tokens, int64_t n, int width)
{
	struct shard_writer w;
	int rc = shard_writer_open(&w, path, width);
	if (rc)
		return rc;
	rc = shard_writer_append(&w, tokens, n);
	int rc_close = shard_writer_close(&w);
	return rc ? rc : rc_close;
}
