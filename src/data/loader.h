/* data/loader: the resumable, rank-count-independent data loader over a folder of token
 * shards (format and folder layout: data/shards.h, docs/token_shards.md).
 *
 * Samples. A split (train_*.bin or val_*.bin, in name order) is one token stream of n tokens.
 * Sample i is the window of T+1 tokens starting at token i*T (T = seq_len): inputs are its
 * first T tokens, targets its last T. The stride is T, so inputs never overlap, and windows
 * run across shard boundaries: samples depend on the token stream, not on how it was cut
 * into files. S = (n - 1) / T samples; the last (n - 1) mod T tokens are not used.
 *
 * Order. Global position P = 0, 1, 2, ... (counted over the whole run, all ranks) maps to
 *   - split "train": epoch e = P / S, sample perm_e(P mod S), where perm_e is a pseudo-random
 *     permutation of [0, S) keyed by (seed, e): a 6-round Feistel network with Philox round
 *     functions (base/rng.h) on the smallest power of four >= S, cycle-walked into [0, S).
 *     Nothing is stored; each epoch is a fresh shuffle in which every sample appears once.
 *   - any other split ("val"): sample P for P < S, in order, once; positions P >= S are
 *     padding rows (tokens 0, targets ignore_index, which the loss skips), so
 *     loader_steps_per_epoch() steps from position 0 cover every sample exactly once.
 *
 * Layout. Step g consumes positions [g*G, (g+1)*G), G = ranks * micro_batches * batch. Row b
 * of micro-batch a on data-parallel rank r is position g*G + (a*ranks + r)*batch + b, the
 * layout the trainer uses for synthetic data: any (ranks x micro-batches x batch) split of the
 * same global batch reads the same samples.
 *
 * State. The loader's whole state is the position of the next step (as epoch + position in
 * the epoch). A checkpoint saved after step k on R ranks restores on R' ranks, with any
 * layout and even another global batch size: the samples before and after the cut together
 * are exactly those of an uninterrupted run.
 *
 * Prefetch. With cfg.prefetch, a background thread builds the next step's batch while the
 * current step computes (double buffering: the loader's buffer and the caller's); loader_next
 * copies it out, and waits only when the reader has fallen behind. A batch is a pure function
 * of (config, position), so prefetching changes timing only.
 *
 * Validation and errors: everything is checked in loader_open (configuration: CT_ERR_USAGE;
 * files, including every token id against vocab: CT_ERR_RUNTIME; messages name the key or
 * file); after a successful open, loader_next cannot fail. The loader needs no MPI: each rank
 * opens its own with its rank and rank count. One thread uses a loader (besides its worker).
 */
#ifndef CT_DATA_LOADER_H
#define CT_DATA_LOADER_H

#include <stdbool.h>
#include <stdint.h>

struct cJSON;
struct loader;

struct loader_config {
	const char *folder; /* dataset folder holding <split>_*.bin shards */
	const char *split;  /* "train": shuffled per epoch; other names ("val"): in order, once */
	int64_t vocab;      /* token ids must be < vocab */
	int64_t seq_len;    /* T */
	int64_t batch;      /* B: rows per micro-batch (training.local_batch_size) */
	int64_t micro_batches; /* A: micro-batches per step on each rank (accumulation) */
	int rank, ranks;       /* data-parallel rank r of R */
	uint64_t seed;         /* shuffle key */
	int32_t ignore_index;  /* targets of padding rows; must lie outside [0, vocab) */
	bool prefetch;         /* build the next batch on a background thread */
};

/* Open the split and start reading the first batch. *out is NULL on failure. */
int loader_open(struct loader **out, const struct loader_config *cfg);
void loader_close(struct loader *ld);

/* The next step's batch for this rank: tokens and targets are micro_batches x batch x seq_len
 * int32 each, micro-batch a at offset a * batch * seq_len (the trainer's batch buffers). */
void loader_next(struct loader *ld, int32_t *tokens, int32_t *targets);

/* Samples per epoch (S) and steps per epoch, ceil(S / G). */
int64_t loader_samples(const struct loader *ld);
int64_t loader_steps_per_epoch(const struct loader *ld);
/* The sample at global position P (see Order); -1 for a padding row. */
int64_t loader_sample_at(const struct loader *ld, int64_t position);

/* Where the loader stands: the next loader_next returns the step starting at global position
 * epoch * samples + position. seed, seq_len and samples identify the stream it belongs to. */
struct loader_state {
	uint64_t seed;
	int64_t seq_len;
	int64_t samples;  /* samples per epoch of the split it was saved from */
	int64_t epoch;    /* always 0 for in-order splits */
	int64_t position; /* position within the epoch (train: < samples) */
};

void loader_state(const struct loader *ld, struct loader_state *st);
/* Continue from st. CT_ERR_USAGE when st belongs to another stream (seed, seq_len or the
 * dataset's sample count differ: each named), CT_ERR_RUNTIME when it is out of range. */
int loader_restore(struct loader *ld, const struct loader_state *st);
/* Back to position 0 (the start of a validation pass). */
void loader_rewind(struct loader *ld);

/* {"seed": "<decimal u64>", "seq_len", "samples", "epoch", "position"}: the seed is a string
 * because JSON numbers hold 53 bits. The caller owns the returned object. */
struct cJSON *loader_state_to_json(const struct loader_state *st);
/* Parse what loader_state_to_json wrote; `where` names the file/key in messages.
 * CT_ERR_RUNTIME on a missing, mistyped or out-of-range field. */
int loader_state_from_json(struct loader_state *st, const struct cJSON *obj, const char *where);

#endif
