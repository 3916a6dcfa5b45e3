/* model/model_group: the collectives a slice of a model runs inside its units, as an interface
 * the model calls and parallel/ implements (parallel/tp_coll.h) over a communicator.
 *
 * A tensor-parallel Llama block is the one-rank block on a column/row slice of its weights;
 * between its segments it needs the sequence-parallel all-gather and reduce-scatter, the
 * vocabulary-parallel loss its all-reduces, and async TP its ring steps (one block sent to the
 * next rank while the matmul beside it runs). The model names each one — buffers, sizes, the
 * step of a ring — and the implementation runs it: MPI or the comm stream, the simulated
 * link, the watchdog's timeout, the time it took. So model/ never includes comm/. Expert
 * parallelism's all-to-alls go through the same interface over the ep group.
 *
 * Every call is collective over the group's `size` ranks; `rank` is this rank's place in it.
 * At most one ring step is in flight at a time: ring_post, then ring_wait before the next
 * ring_post.
 */
#ifndef CT_MODEL_MODEL_GROUP_H
#define CT_MODEL_MODEL_GROUP_H

#include <stdbool.h>
#include <stdint.h>

struct model_group {
	int size, rank;
	void *ctx;
	/* recv(size x bytes_per_rank) = every rank's send, in rank order; `on_link`: a transfer
	 * of activations that a simulated link stretches (a norm weight's small gradient
	 * gather is not) */
	void (*all_gather)(void *ctx, const void *send, void *recv, int64_t bytes_per_rank,
	                   bool on_link);
	/* recv(count) = this rank's block of the sum over ranks of send(size x count); send and
	 * scratch (count; the model's TP and CP buffers still give 2 x count) are working memory */
	void (*reduce_scatter_f32)(void *ctx, float *send, float *recv, int64_t count,
	                           float *scratch);
	void (*all_reduce_sum_f32)(void *ctx, float *buf, int64_t n);
	void (*all_reduce_max_f32)(void *ctx, float *buf, int64_t n);
	/* Ring step `step` of async TP: send `bytes` of send to rank + 1 and receive as many
	 * from rank - 1 into recv; ring_wait blocks until both are done. */
	void (*ring_post)(void *ctx, const void *send, void *recv, int64_t bytes, int step,
	                  const char *what);
	void (*ring_wait)(void *ctx, const char *what);
	/* Expert parallelism's token dispatch and combine: rank q gets send's block q of
	 * send_bytes[q] bytes; recv gets rank q's block to this rank, recv_bytes[q] long, in rank
	 * order (both buffers contiguous by rank; the sizes are exchanged first, the same way). */
	void (*all_to_all_v)(void *ctx, const void *send, const int64_t *send_bytes, void *recv,
	                     const int64_t *recv_bytes);
	/* The same all-to-all posted: it may travel while the caller computes (the shared
	 * expert beside the dispatch) until all_to_all_v_wait; buffers and both size arrays
	 * stay untouched until then. At most one in flight, and no other call on the group
	 * meanwhile. */
	void (*all_to_all_v_post)(void *ctx, const void *send, const int64_t *send_bytes,
	                          void *recv, const int64_t *recv_bytes, const char *what);
	void (*all_to_all_v_wait)(void *ctx, const char *what);
};

#endif
