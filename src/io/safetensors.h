/* io/safetensors: read and write the safetensors format (Hugging Face):
 *   u64 little-endian header length H, H bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"key": "string", ...}}, then the raw little-endian tensor bytes.
 * The writer collects tensors (pointers, not copies) and writes them in one pass; the reader
 * validates the header (JSON, dtypes, shapes vs byte ranges, ranges inside the file, no
 * overlaps) before any tensor is used.
 */
#ifndef CT_IO_SAFETENSORS_H
#define CT_IO_SAFETENSORS_H

#include <stdint.h>

enum st_dtype { ST_F32, ST_F64, ST_I32, ST_I64, ST_BF16, ST_U8, ST_DTYPE_COUNT };

#define ST_MAX_DIMS 8

struct st_tensor {
	char *name;
	enum st_dtype dtype;
	int ndim;
	int64_t shape[ST_MAX_DIMS];
	int64_t begin, end; /* byte range in the data section */
	const void *data;   /* writer: caller's bytes; reader: inside the loaded file */
};

struct st_file {
	struct st_tensor *t;
	int count, cap;
	char **meta_keys, **meta_vals;
	int meta_count;
	void *blob; /* reader: the whole file */
	int64_t data_offset;
};

int st_dtype_size(enum st_dtype d);

/* Writer: add tensors and metadata, then write. Names and metadata are copied. */
void st_init(struct st_file *f);
void st_add(struct st_file *f, const char *name, enum st_dtype dtype, int ndim,
            const int64_t *shape, const void *data);
void st_add_meta(struct st_file *f, const char *key, const char *value);
int st_write(const struct st_file *f, const char *path);
/* The same, and the XXH3-64 of every byte written (and their count): a checksum of the file
 * without reading it back. */
int st_write_hashed(const struct st_file *f, const char *path, uint64_t *xxh3, int64_t *bytes);

/* Reader. st_parse takes ownership of blob (malloc'd, size bytes; freed by st_free, also on
 * error); path only names it in messages. */
int st_read(struct st_file *f, const char *path);
int st_parse(struct st_file *f, void *blob, int64_t size, const char *path);
const struct st_tensor *st_find(const struct st_file *f, const char *name);
const char *st_meta(const struct st_file *f, const char *key);

void st_free(struct st_file *f);

#endif
