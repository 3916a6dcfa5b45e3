/* data/shards: token shard files, and the split of a dataset folder that they make up.
 *
 * Shard format (little-endian, versioned; docs/token_shards.md):
 *   bytes 0..7    magic "CTTOKENS"
 *   bytes 8..11   u32 version (1)
 *   bytes 12..15  u32 bytes per token (2 = uint16, 4 = uint32)
 *   bytes 16..23  u64 token count
 *   then count tokens; the file size is exactly 24 + count * width.
 *
 * A dataset is a folder; split "train" is the files train_*.bin in it, "val" the files
 * val_*.bin, each split ordered by file name (byte order: zero-pad the numbers) and read as
 * one token stream, the concatenation of its shards.
 *
 * Reading: every shard is memory-mapped read-only and validated in full when it is opened:
 * magic, version, width, file size against the count, and every token id against the
 * vocabulary (one sequential pass over the tokens, which also warms the page cache). After a
 * successful open, reads cannot fail. Errors name the file and the problem: CT_ERR_USAGE for a
 * missing folder or a split without shards (a configuration mistake), CT_ERR_RUNTIME for a
 * file that cannot be read or is malformed.
 *
 * Writing: shard_writer streams tokens into "<path>.tmp" and renames it to path only when
 * closed successfully, so an interrupted `ctitan prepare` never leaves a shard that looks
 * complete.
 *
 * Ownership: a shard owns its path string and its mapping (none for a view over caller
 * memory); a shard_set owns its shards.
 */
#ifndef CT_DATA_SHARDS_H
#define CT_DATA_SHARDS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SHARD_MAGIC        "CTTOKENS"
#define SHARD_VERSION      1u
#define SHARD_HEADER_BYTES 24

struct shard {
	char *path;               /* name used in messages */
	const unsigned char *map; /* the whole file when memory-mapped, else NULL */
	size_t map_bytes;
	const unsigned char *data; /* first token */
	int width;                 /* bytes per token: 2 or 4 */
	int64_t count;             /* tokens */
};

/* Validate a shard image of `bytes` bytes at `base` (not copied: it must outlive s). Token ids
 * must be < vocab; vocab <= 0 checks only that they fit in int32. `name` is used in messages.
 * Returns CT_OK or CT_ERR_RUNTIME with a message naming `name`. */
int shard_view(struct shard *s, const void *base, size_t bytes, const char *name, int64_t vocab);
/* mmap and validate the file at path (as shard_view). */
int shard_open(struct shard *s, const char *path, int64_t vocab);
void shard_close(struct shard *s);
/* out[0..n) = tokens first..first+n of the shard, widened to int32. Range is the caller's. */
void shard_read(const struct shard *s, int64_t first, int64_t n, int32_t *out);

struct shard_set {
	char *folder, *split;
	int64_t n;            /* shards */
	struct shard *shards; /* n, ordered by file name */
	int64_t *start;       /* n + 1: shard i holds stream tokens start[i] .. start[i+1] */
	int64_t tokens;       /* start[n]: tokens in the split */
};

/* Open every "<split>_*.bin" file in folder, sorted by name (strcmp). */
int shard_set_open(struct shard_set *set, const char *folder, const char *split, int64_t vocab);
void shard_set_close(struct shard_set *set);
/* out[0..n) = tokens first..first+n of the split's stream, across shard boundaries. */
void shard_set_read(const struct shard_set *set, int64_t first, int64_t n, int32_t *out);

struct shard_writer {
	FILE *f;
	char *path, *tmp_path;
	int width;
	int64_t count;
	int failed; /* an append failed: close removes the temporary file */
};

/* Start "<path>.tmp". width 2 or 4 (CT_ERR_USAGE otherwise). On failure nothing is left to
 * close; on success the writer must be closed by shard_writer_close. */
int shard_writer_open(struct shard_writer *w, const char *path, int width);
/* Append n tokens; each must fit the width (0 <= t < 2^16 or < 2^31): CT_ERR_USAGE names the
 * file, the token and its position otherwise. */
int shard_writer_append(struct shard_writer *w, const int32_t *tokens, int64_t n);
/* Write the count into the header, fsync, rename to path. Always releases w; on any earlier
 * or present failure the temporary file is removed and an error returned. */
int shard_writer_close(struct shard_writer *w);
/* One-call writer: a shard holding tokens[0..n). */
int shard_write(const char *path, const int32_t *tokens, int64_t n, int width);

#endif
