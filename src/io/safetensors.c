#define _GNU_SOURCE /* sync_file_range */
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/log.h"
#include "io/file.h"

static const char *const st_dtype_names[] = {"F32", "F64", "I32", "I64", "BF16", "U8"};
static const int st_dtype_sizes[] = {4, 8, 4, 8, 2, 1};
_Static_assert(sizeof(st_dtype_names) / sizeof(st_dtype_names[0]) == ST_DTYPE_COUNT, "names");
_Static_assert(sizeof(st_dtype_sizes) / sizeof(st_dtype_sizes[0]) == ST_DTYPE_COUNT, "sizes");

int st_dtype_size(enum st_dtype d)
{
	return st_dtype_sizes[d];
}

void st_init(struct st_file *f)
{
	memset(f, 0, sizeof(*f));
}

static int64_t st_numel(const struct st_tensor *t)
{
	int64_t n = 1;
	for (int i = 0; i < t->ndim; i++)
		n *= t->shape[i];
	return n;
}

void st_add(struct st_file *f, const char *name, enum st_dtype dtype, int ndim,
            const int64_t *shape, const void *data)
{
	CHECK(ndim >= 0 && ndim <= ST_MAX_DIMS, "safetensors: %d dims for %s", ndim, name);
	if (f->count == f->cap) {
		f->cap = f->cap ? 2 * f->cap : 16;
		f->t = realloc(f->t, (size_t)f->cap * sizeof(*f->t));
		CHECK(f->t, "out of memory");
	}
	struct st_tensor *t = &f->t[f->count++];
	memset(t, 0, sizeof(*t));
	t->name = xstrdup(name);
	t->dtype = dtype;
	t->ndim = ndim;
	for (int i = 0; i < ndim; i++)
		t->shape[i] = shape[i];
	t->data = data;
	t->begin = f->count > 1 ? f->t[f->count - 2].end : 0;
	t->end = t->begin + st_numel(t) * st_dtype_sizes[dtype];
}

void st_add_meta(struct st_file *f, const char *key, const char *value)
{
	f->meta_keys = realloc(f->meta_keys, (size_t)(f->meta_count + 1) * sizeof(char *));
	f->meta_vals = realloc(f->meta_vals, (size_t)(f->meta_count + 1) * sizeof(char *));
	CHECK(f->meta_keys && f->meta_vals, "out of memory");
	f->meta_keys[f->meta_count] = xstrdup(key);
	f->meta_vals[f->meta_count] = xstrdup(value);
	f->meta_count++;
}

int st_write_hashed(const struct st_file *f, const char *path, uint64_t *xxh3, int64_t *bytes)
{
	cJSON *root = cJSON_CreateObject();
	if (f->meta_count) {
		cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
		for (int i = 0; i < f->meta_count; i++)
			cJSON_AddStringToObject(meta, f->meta_keys[i], f->meta_vals[i]);
	}
	for (int i = 0; i < f->count; i++) {
		const struct st_tensor *t = &f->t[i];
		cJSON *o = cJSON_AddObjectToObject(root, t->name);
		cJSON_AddStringToObject(o, "dtype", st_dtype_names[t->dtype]);
		cJSON *shape = cJSON_AddArrayToObject(o, "shape");
		for (int d = 0; d < t->ndim; d++)
			cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
		cJSON *off = cJSON_AddArrayToObject(o, "data_offsets");
		cJSON_AddItemToArray(off, cJSON_CreateNumber((double)t->begin));
		cJSON_AddItemToArray(off, cJSON_CreateNumber((double)t->end));
	}
	char *json = cJSON_PrintUnformatted(root);
	cJSON_Delete(root);
	CHECK(json, "out of memory");
	/* Pad the header with spaces to a multiple of 8 so tensor data is aligned. */
	size_t hlen = strlen(json), padded = (hlen + 7) & ~(size_t)7;
	json = realloc(json, padded + 1);
	CHECK(json, "out of memory");
	int rc = CT_ERR_RUNTIME;
	FILE *out = fopen(path, "wb");
	if (!out) {
		LOG_ERROR("cannot create '%s': %s", path, strerror(errno));
		free(json);
		return rc;
	}
	unsigned char len8[8];
	for (int i = 0; i < 8; i++)
		len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
	for (size_t i = hlen; i < padded; i++)
		json[i] = ' '; /* cJSON's buffer may be shorter: grown below */
	XXH3_state_t *hs = xxh3 ? XXH3_createState() : NULL;
	if (hs)
		XXH3_64bits_reset(hs);
	int ok = fwrite(len8, 1, 8, out) == 8 && fwrite(json, 1, padded, out) == padded;
	if (hs) {
		XXH3_64bits_update(hs, len8, 8);
		XXH3_64bits_update(hs, json, padded);
	}
	int64_t total = 8 + (int64_t)padded;
	/* Start the disk writes as we go (sync_file_range), so the writing thread does the
	 * writeback work rather than the kernel's flusher threads later: a background
	 * checkpoint writer at low priority then pays for its own I/O. */
	int64_t flushed = 0;
	for (int i = 0; ok && i < f->count; i++) {
		size_t n = (size_t)(f->t[i].end - f->t[i].begin);
		ok = fwrite(f->t[i].data, 1, n, out) == n;
		if (hs && n)
			XXH3_64bits_update(hs, f->t[i].data, n);
		total += (int64_t)n;
		if (ok && total - flushed >= ((int64_t)32 << 20)) {
			ok = fflush(out) == 0;
			sync_file_range(fileno(out), flushed, total - flushed,
			                SYNC_FILE_RANGE_WRITE);
			flushed = total;
		}
	}
	if (hs) {
		*xxh3 = XXH3_64bits_digest(hs);
		*bytes = total;
		XXH3_freeState(hs);
	}
	/* durable: checkpoints rename the folder only after every file reached the disk */
	ok = ok && fflush(out) == 0 && fsync(fileno(out)) == 0;
	if (fclose(out) == 0 && ok)
		rc = CT_OK;
	else
		LOG_ERROR("write to '%s' failed: %s", path, strerror(errno));
	free(json);
	return rc;
}

int st_write(const struct st_file *f, const char *path)
{
	return st_write_hashed(f, path, NULL, NULL);
}

/* One header entry. Every number is checked before use: shapes are non-negative integers
 * whose product cannot overflow, and the byte range is exactly the shape's size, inside the
 * data section. */
static int st_parse_tensor(struct st_file *f, const cJSON *o, const char *path, int64_t data_len)
{
	const char *name = o->string;
	const cJSON *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype");
	const cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape");
	const cJSON *off = cJSON_GetObjectItemCaseSensitive(o, "data_offsets");
	if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(off) ||
	    cJSON_GetArraySize(off) != 2 || cJSON_GetArraySize(shape) > ST_MAX_DIMS ||
	    !cJSON_IsNumber(cJSON_GetArrayItem(off, 0)) ||
	    !cJSON_IsNumber(cJSON_GetArrayItem(off, 1))) {
		LOG_ERROR("%s: tensor '%s' has a malformed entry", path, name);
		return CT_ERR_RUNTIME;
	}
	int dtype = -1;
	for (int i = 0; i < ST_DTYPE_COUNT; i++)
		if (strcmp(dt->valuestring, st_dtype_names[i]) == 0)
			dtype = i;
	if (dtype < 0) {
		LOG_ERROR("%s: tensor '%s' has unsupported dtype '%s'", path, name,
		          dt->valuestring);
		return CT_ERR_RUNTIME;
	}
	int64_t shp[ST_MAX_DIMS], bytes = st_dtype_sizes[dtype];
	int nd = 0;
	const cJSON *it;
	cJSON_ArrayForEach (it, shape) {
		double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
		if (v < 0 || v > 1e15 || v != (double)(int64_t)v ||
		    (v > 0 && (double)bytes * v > (double)data_len)) {
			LOG_ERROR("%s: tensor '%s' has a bad shape", path, name);
			return CT_ERR_RUNTIME;
		}
		shp[nd++] = (int64_t)v;
		bytes *= shp[nd - 1]; /* <= data_len: cannot overflow */
	}
	double b = cJSON_GetArrayItem(off, 0)->valuedouble,
	       e = cJSON_GetArrayItem(off, 1)->valuedouble;
	if (!(b >= 0 && e >= b && e <= (double)data_len) || b != (double)(int64_t)b ||
	    e != (double)(int64_t)e || (int64_t)e - (int64_t)b != bytes) {
		LOG_ERROR(
		    "%s: tensor '%s' byte range [%.0f, %.0f) does not match its shape or lies "
		    "outside the file",
		    path, name, b, e);
		return CT_ERR_RUNTIME;
	}
	st_add(f, name, (enum st_dtype)dtype, nd, shp, NULL);
	struct st_tensor *t = &f->t[f->count - 1];
	t->begin = (int64_t)b;
	t->end = (int64_t)e;
	t->data = (const char *)f->blob + f->data_offset + t->begin;
	return CT_OK;
}

static int st_cmp_begin(const void *a, const void *b)
{
	const struct st_tensor *x = *(const struct st_tensor *const *)a,
	                       *y = *(const struct st_tensor *const *)b;
	return (x->begin > y->begin) - (x->begin < y->begin);
}

/* No two tensors may share bytes, and no two may share a name. */
static int st_check_layout(const struct st_file *f, const char *path)
{
	const struct st_tensor **by = malloc(((size_t)f->count + 1) * sizeof(*by));
	CHECK(by, "out of memory");
	for (int i = 0; i < f->count; i++)
		by[i] = &f->t[i];
	qsort(by, (size_t)f->count, sizeof(*by), st_cmp_begin);
	int rc = CT_OK;
	for (int i = 1; i < f->count && !rc; i++)
		if (by[i]->begin < by[i - 1]->end) {
			LOG_ERROR("%s: tensors '%s' and '%s' overlap", path, by[i - 1]->name,
			          by[i]->name);
			rc = CT_ERR_RUNTIME;
		}
	free(by);
	return rc;
}

int st_parse(struct st_file *f, void *blob, int64_t size, const char *path)
{
	st_init(f);
	f->blob = blob;
	int rc = CT_ERR_RUNTIME;
	cJSON *root = NULL;
	if (size < 8) {
		LOG_ERROR("%s: truncated (%lld bytes)", path, (long long)size);
		goto out;
	}
	const unsigned char *p = blob;
	uint64_t hlen = 0;
	for (int i = 0; i < 8; i++)
		hlen |= (uint64_t)p[i] << (8 * i);
	if (hlen > (uint64_t)size - 8) {
		LOG_ERROR("%s: header length %llu exceeds the file (%lld bytes): truncated?", path,
		          (unsigned long long)hlen, (long long)size);
		goto out;
	}
	f->data_offset = 8 + (int64_t)hlen;
	root = cJSON_ParseWithLength((const char *)p + 8, (size_t)hlen);
	if (!cJSON_IsObject(root)) {
		LOG_ERROR("%s: header is not valid JSON", path);
		goto out;
	}
	const cJSON *o;
	cJSON_ArrayForEach (o, root) {
		if (strcmp(o->string, "__metadata__") == 0) {
			if (!cJSON_IsObject(o)) {
				LOG_ERROR("%s: __metadata__ is not an object", path);
				goto out;
			}
			const cJSON *kv;
			cJSON_ArrayForEach (kv, o)
				if (cJSON_IsString(kv))
					st_add_meta(f, kv->string, kv->valuestring);
			continue;
		}
		if (st_find(f, o->string)) {
			LOG_ERROR("%s: tensor '%s' appears twice", path, o->string);
			goto out;
		}
		if (st_parse_tensor(f, o, path, size - f->data_offset))
			goto out;
	}
	rc = st_check_layout(f, path);
out:
	cJSON_Delete(root);
	if (rc)
		st_free(f);
	return rc;
}

int st_read(struct st_file *f, const char *path)
{
	st_init(f);
	char *blob;
	size_t size;
	if (io_read_file(path, &blob, &size)) {
		LOG_ERROR("cannot open '%s': %s", path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	return st_parse(f, blob, (int64_t)size, path);
}

const struct st_tensor *st_find(const struct st_file *f, const char *name)
{
	for (int i = 0; i < f->count; i++)
		if (strcmp(f->t[i].name, name) == 0)
			return &f->t[i];
	return NULL;
}

const char *st_meta(const struct st_file *f, const char *key)
{
	for (int i = 0; i < f->meta_count; i++)
		if (strcmp(f->meta_keys[i], key) == 0)
			return f->meta_vals[i];
	return NULL;
}

void st_free(struct st_file *f)
{
	for (int i = 0; i < f->count; i++)
		free(f->t[i].name);
	for (int i = 0; i < f->meta_count; i++) {
		free(f->meta_keys[i]);
		free(f->meta_vals[i]);
	}
	free(f->t);
	free(f->meta_keys);
	free(f->meta_vals);
	free(f->blob);
	memset(f, 0, sizeof(*f));
}
