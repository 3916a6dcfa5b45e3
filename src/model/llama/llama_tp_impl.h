/* model/llama_tp_impl: what the tensor-parallel programs (llama_tp.c) share with their
 * collectives (llama_tp_comm.c): the buffers, sequence-parallel all-gather and
 * reduce-scatter, and async TP's ring steps. Not a public interface. */
#ifndef CT_MODEL_LLAMA_TP_IMPL_H
#define CT_MODEL_LLAMA_TP_IMPL_H

#include "model/llama/llama_impl.h"

struct llama_tp_bufs {
	float *xg;         /* (Np, C) gathered norm output */
	float *part;       /* (Np, C) partial sums to reduce-scatter / gathered gradient */
	float *rs_scratch; /* 2 * Ns * C */
	float *rs_out;     /* (Ns, C) */
	float *dnorm;      /* (tp, C): a norm weight's gradient from every rank */
	float *stat;       /* 3 * ce_rows: row max, sum of exponentials, target logit */
	float *ring;       /* async: 3 * Ns * C (two partial sums in flight, one received) */
	size_t bytes;
	/* between a program's ops: the head's loss sum and valid targets, the backward's loss
	 * scale, and whether the loss gradient still needs its reduce-scatter in backward */
	double loss, dscale;
	int64_t valid;
	bool rs_pending;
	/* async TP: ring steps instead of the block's all-gathers and reduce-scatters */
	bool async;
};

void llama_tp_add_rows(float *out, const float *a, const float *b, int64_t n);
/* full(Np, C) = the token shards of every rank, in rank order. */
void llama_tp_gather(struct llama_model *m, const float *shard, float *full);
/* out(Ns, C) = this rank's token rows of the sum over ranks of part(Np, C) (its padding rows
 * N..Np are zeroed first). */
void llama_tp_reduce_scatter(struct llama_model *m, float *part, float *out);
/* Async TP (llama_tp_comm.c explains the ring steps): fn(m, ctx, r0, n, out) computes rows
 * [r0, r0 + n) of the matmul beside the collective. */
typedef void (*llama_tp_ring_fn)(struct llama_model *m, const void *ctx, int64_t r0, int64_t n,
                                 float *out);
void llama_tp_ring_gather(struct llama_model *m, const float *shard, float *full,
                          llama_tp_ring_fn fn, const void *ctx);
void llama_tp_ring_reduce_scatter(struct llama_model *m, float *out, llama_tp_ring_fn fn,
                                  const void *ctx);

#endif
