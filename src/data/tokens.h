/* data/tokens: token shard files and the batches the trainer draws from them.
 *
 * Shard format (little-endian), versioned:
 *   bytes 0..7   magic "CTTOKENS"
 *   bytes 8..11  u32 version (1)
 *   bytes 12..15 u32 bytes per token (2 = uint16, 4 = uint32)
 *   bytes 16..23 u64 token count
 *   then count tokens.
 * Every header field and the file size are validated before use, and every token is checked
 * against the model's vocabulary at load.
 *
 * Batches: row r of micro-batch m of step s is the window of T+1 tokens starting at a
 * position drawn from the counter-based RNG keyed by (seed, "data", global row index), so
 * batches do not depend on the number of ranks. The synthetic source produces sequences
 * with a learnable rule (next = (5*cur + 3) mod V with probability 0.9, else uniform).
 */
#ifndef CT_DATA_TOKENS_H
#define CT_DATA_TOKENS_H

#include <stdbool.h>
#include <stdint.h>

#define TOKENS_MAGIC "CTTOKENS"
#define TOKENS_VERSION 1u
#define TOKENS_HEADER_BYTES 24

struct token_source {
	bool synthetic;
	int64_t vocab;
	uint64_t seed;
	int32_t *tokens; /* file tokens widened to int32 */
	int64_t count;
	char path[512];
};

/* "synthetic" or a shard path. Returns CT_ERR_USAGE/CT_ERR_RUNTIME with a message naming the
 * file and the problem. */
int tokens_open(struct token_source *s, const char *dataset, int64_t vocab, uint64_t seed,
		int64_t seq_len);
void tokens_close(struct token_source *s);
/* Fill inputs/targets (rows x T) for global rows first_row .. first_row + rows. */
void tokens_batch(const struct token_source *s, int64_t first_row, int64_t rows, int64_t T,
		  int32_t *inputs, int32_t *targets);
/* Write a shard file (used by tests and tools). */
int tokens_write(const char *path, const int32_t *tokens, int64_t count, int bytes_per_token);

#endif
