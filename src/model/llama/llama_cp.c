/* Llama under context parallelism: the one-rank model on this rank's T/cp tokens of each
 * sequence, whose attention reaches the other ranks' keys and values.
 *
 * The sequence of T tokens is cut into cp shards of Tl = T/cp tokens, rank r holding tokens
 * order[r*Tl .. (r+1)*Tl) (head-tail load balancing or contiguous, chosen above the model).
 * Everything but attention is token-local: embedding, norms, matmuls, FFN and the loss run on
 * the shard as on one rank (or as tensor parallelism runs them on its N = B x Tl tokens: the
 * attention core then holds this TP rank's heads, and the cp group is the ranks of the same
 * TP rank, so K/V of the same heads meet). RoPE rotates each token by its global position (the rope tables'
 * rows are those positions' angles). Attention is the position-aware kernel
 * (kernels/attention_pos.c): query i sees key j iff order-position of j <= that of i.
 *
 * Two ways to reach the remote keys, both through the model's collective interface
 * (model/model_group.h, run by parallel/tp_coll over the mesh's cp group), each transfer
 * an item of the block's programs (llama_block.c), so a schedule node of its own (CP_*):
 *   allgather (Llama 3's choice): one all-gather of this shard's K and V, attention of the
 *     local queries against all T keys; the backward gathers them again, computes dK, dV of
 *     all T keys and reduce-scatters them back onto their shards.
 *   alltoall (ring attention): cp steps; at step i the rank holds the K/V shard of rank
 *     r - i, sends it to r + 1 while attending to it, and merges the partial output with the
 *     online-softmax statistics (attention_merge, fp32). The backward sends each K/V shard
 *     round the ring again together with the dK/dV accumulated for it, each rank adding its
 *     queries' share with the merged out and lse; after cp steps a shard's gradient is home.
 */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "kernels/attention_bf16.h"
#include "kernels/kernels.h"
#include "model/llama/llama_impl.h"

struct llama_cp_bufs {
	int64_t *order; /* (T) global position of each held token, rank-major */
	int64_t T;      /* the whole sequence */
	bool ring;
	/* allgather: (B, T, KVD) k then v; ring: 2 slots of [k|v|dk|dv] */
	float *kv;
	/* allgather: (B, T, KVD) dk then dv of all T keys; before them (and in forward) the
	 * rank-major (cp, B, Tl, KVD) staging of the gathered k and v, after them (staged
	 * into kv) the reduce-scatter's scratch */
	float *dkv;
	float *scratch; /* ring: partial out (allgather: none; dkv, consumed by then, is the
	                   reduce-scatter's scratch) */
	float *lse_b;   /* ring: partial lse (B, H, Tl) */
	size_t bytes;
};

static void *cp_alloc(struct llama_cp_bufs *b, int64_t floats)
{
	size_t n = (size_t)floats * sizeof(float);
	b->bytes += n;
	return mem_alloc(MEM_ACTIVATIONS, n);
}

int llama_cp_build(struct llama_model *m, const struct llama_build_opts *opts)
{
	const struct model_group *g = opts->cp;
	CHECK(opts->cp_order, "llama: context parallelism without the token order");
	struct llama_cp_bufs *b = xcalloc(1, sizeof(*b));
	m->cp = g;
	m->cpb = b;
	const int64_t S = g->size, T = m->T * S, D2 = m->cfg.head_dim / 2;
	b->T = T;
	b->ring = opts->cp_ring;
	b->order = xcalloc((size_t)T, sizeof(int64_t));
	memcpy(b->order, opts->cp_order, (size_t)T * sizeof(int64_t));
	/* RoPE at the global positions of this rank's tokens */
	float *cs = xcalloc((size_t)(T * D2), sizeof(float)), *sn = xcalloc((size_t)(T * D2), 4);
	llama_rope_tables(&m->cfg, T, cs, sn);
	const int64_t *mine = b->order + (int64_t)g->rank * m->T;
	for (int64_t t = 0; t < m->T; t++) {
		CHECK(mine[t] >= 0 && mine[t] < T, "llama: token position %lld outside [0, %lld)",
		      (long long)mine[t], (long long)T);
		memcpy(m->rope_cos + t * D2, cs + mine[t] * D2, (size_t)D2 * sizeof(float));
		memcpy(m->rope_sin + t * D2, sn + mine[t] * D2, (size_t)D2 * sizeof(float));
	}
	free(cs);
	free(sn);
	const struct llama_dims d = llama_dims_of(m);
	const int64_t blk = d.B * d.T * d.KVD; /* one shard's K (or V) */
	if (b->ring) {
		b->kv = cp_alloc(b, 2 * 4 * blk);
		b->scratch = cp_alloc(b, d.B * d.T * d.HD);
		b->lse_b = cp_alloc(b, d.B * d.H * d.T);
	} else {
		b->kv = cp_alloc(b, 2 * S * blk);
		b->dkv = cp_alloc(b, 2 * S * blk);
	}
	return CT_OK;
}

void llama_cp_free(struct llama_model *m)
{
	struct llama_cp_bufs *b = m->cpb;
	if (!b)
		return;
	const struct llama_dims d = llama_dims_of(m);
	const int64_t S = m->cp->size, blk = d.B * d.T * d.KVD;
	if (b->ring) {
		mem_free(MEM_ACTIVATIONS, b->kv, (size_t)(2 * 4 * blk) * sizeof(float));
		mem_free(MEM_ACTIVATIONS, b->scratch, (size_t)(d.B * d.T * d.HD) * sizeof(float));
		mem_free(MEM_ACTIVATIONS, b->lse_b, (size_t)(d.B * d.H * d.T) * sizeof(float));
	} else {
		mem_free(MEM_ACTIVATIONS, b->kv, (size_t)(2 * S * blk) * sizeof(float));
		mem_free(MEM_ACTIVATIONS, b->dkv, (size_t)(2 * S * blk) * sizeof(float));
	}
	free(b->order);
	free(b);
	m->cpb = NULL;
}

int64_t llama_cp_bytes(const struct llama_model *m)
{
	return m->cpb ? (int64_t)m->cpb->bytes : 0;
}

/* ---------------------------------------------------------------- allgather */

/* full(B, S*Tl, W) <- gath(S, B, Tl, W): rank r's shard becomes sequence rows r*Tl.. */
static void from_rank_major(float *full, const float *gath, int64_t S, int64_t B, int64_t Tl,
                            int64_t W)
{
	for (int64_t r = 0; r < S; r++)
		for (int64_t b = 0; b < B; b++)
			memcpy(full + (b * S * Tl + r * Tl) * W, gath + ((r * B + b) * Tl) * W,
			       (size_t)(Tl * W) * sizeof(float));
}

static void to_rank_major(float *gath, const float *full, int64_t S, int64_t B, int64_t Tl,
                          int64_t W)
{
	for (int64_t r = 0; r < S; r++)
		for (int64_t b = 0; b < B; b++)
			memcpy(gath + ((r * B + b) * Tl) * W, full + (b * S * Tl + r * Tl) * W,
			       (size_t)(Tl * W) * sizeof(float));
}

/* kv <- every rank's k then v, as (B, T, KVD) each */
static void gather_kv(struct llama_model *m, const float *k, const float *v)
{
	struct llama_cp_bufs *b = m->cpb;
	const struct llama_dims d = llama_dims_of(m);
	const int64_t S = m->cp->size, blk = d.B * d.T * d.KVD;
	const int64_t bytes = blk * (int64_t)sizeof(float);
	m->cp->all_gather(m->cp->ctx, k, b->dkv, bytes, true);
	from_rank_major(b->kv, b->dkv, S, d.B, d.T, d.KVD);
	m->cp->all_gather(m->cp->ctx, v, b->dkv, bytes, true);
	from_rank_major(b->kv + S * blk, b->dkv, S, d.B, d.T, d.KVD);
}

/* ---------------------------------------------------------------- ring */

/* ring step of `floats` floats of block `from` into block `to` of the two ring slots */
static void ring_step(struct llama_model *m, const float *from, float *to, int64_t floats, int step,
                      const char *what)
{
	m->cp->ring_post(m->cp->ctx, from, to, floats * (int64_t)sizeof(float), step, what);
}

/* ---------------------------------------------------------------- program items */

bool llama_cp_ring_form(const struct llama_model *m)
{
	return m->cpb && m->cpb->ring;
}

bool llama_cp_headtail(const struct llama_model *m)
{
	if (!m->cpb)
		return false;
	for (int64_t t = 0; t < m->cpb->T; t++)
		if (m->cpb->order[t] != t)
			return true;
	return false;
}

bool llama_cp_c_gather(struct llama_model *m, int l)
{
	gather_kv(m, m->acts[l].k, m->acts[l].v);
	return true;
}

void llama_cp_attention_forward(struct llama_model *m, struct llama_block_acts *a)
{
	struct llama_cp_bufs *b = m->cpb;
	const struct llama_dims d = llama_dims_of(m);
	const int64_t S = m->cp->size, Tl = d.T, *qpos = b->order + (int64_t)m->cp->rank * Tl;
	attention_mixed_pos_forward(a->att, a->lse, a->q, qpos, b->kv, b->kv + S * d.B * Tl * d.KVD,
	                            b->order, d.B, Tl, b->T, d.H, d.KV, d.D);
}

bool llama_cp_c_ring_forward(struct llama_model *m, int l)
{
	struct llama_block_acts *a = &m->acts[l];
	struct llama_cp_bufs *b = m->cpb;
	const struct llama_dims d = llama_dims_of(m);
	const int S = m->cp->size, r = m->cp->rank;
	const int64_t Tl = d.T, *qpos = b->order + (int64_t)r * Tl;
	const int64_t blk = d.B * Tl * d.KVD, slot = 4 * blk;
	float *cur = b->kv, *next = b->kv + slot;
	memcpy(cur, a->k, (size_t)blk * sizeof(float));
	memcpy(cur + blk, a->v, (size_t)blk * sizeof(float));
	for (int i = 0; i < S; i++) {
		const int src = ((r - i) % S + S) % S;
		if (i + 1 < S) /* the next shard travels while this one is attended to */
			ring_step(m, cur, next, 2 * blk, i, "cp ring: K/V");
		const int64_t *kpos = b->order + (int64_t)src * Tl;
		attention_mixed_pos_forward(i ? b->scratch : a->att, i ? b->lse_b : a->lse, a->q, qpos,
		                          cur, cur + blk, kpos, d.B, Tl, Tl, d.H, d.KV, d.D);
		if (i)
			attention_merge_f32(a->att, a->lse, b->scratch, b->lse_b, d.B, Tl, d.H, d.D);
		if (i + 1 < S) {
			m->cp->ring_wait(m->cp->ctx, "cp ring: K/V");
			float *t = cur;
			cur = next;
			next = t;
		}
	}
	return true;
}

void llama_cp_attention_backward(struct llama_model *m, const struct llama_block_acts *a)
{
	struct llama_cp_bufs *b = m->cpb;
	const struct llama_dims d = llama_dims_of(m);
	const int S = m->cp->size, r = m->cp->rank;
	const int64_t Tl = d.T, *qpos = b->order + (int64_t)r * Tl, blk = d.B * Tl * d.KVD;
	float *dkf = b->dkv, *dvf = b->dkv + S * blk;
	memset(dkf, 0, (size_t)(2 * S * blk) * sizeof(float));
	attention_mixed_pos_backward(m->dq, dkf, dvf, m->datt, a->att, a->lse, a->q, qpos, b->kv,
	                           b->kv + S * blk, b->order, d.B, Tl, b->T, d.H, d.KV, d.D);
	/* every rank's share of each shard's dK / dV, to be summed onto the shard; K and V are
	 * consumed, so their space stages the rank-major send buffers */
	to_rank_major(b->kv, dkf, S, d.B, Tl, d.KVD);
	to_rank_major(b->kv + S * blk, dvf, S, d.B, Tl, d.KVD);
}

bool llama_cp_c_reduce_scatter(struct llama_model *m, int l)
{
	struct llama_cp_bufs *b = m->cpb;
	const struct llama_dims d = llama_dims_of(m);
	const int64_t S = m->cp->size, blk = d.B * d.T * d.KVD;
	(void)l;
	/* dkv was staged into kv (llama_cp_attention_backward): its space is the scratch */
	m->cp->reduce_scatter_f32(m->cp->ctx, b->kv, m->dk, blk, b->dkv);
	m->cp->reduce_scatter_f32(m->cp->ctx, b->kv + S * blk, m->dv, blk, b->dkv);
	return true;
}

bool llama_cp_c_ring_backward(struct llama_model *m, int l)
{
	const struct llama_block_acts *a = &m->acts[l];
	struct llama_cp_bufs *b = m->cpb;
	const struct llama_dims d = llama_dims_of(m);
	const int S = m->cp->size, r = m->cp->rank;
	const int64_t Tl = d.T, *qpos = b->order + (int64_t)r * Tl, blk = d.B * Tl * d.KVD;
	/* each slot: [k | v | dk | dv] of one shard */
	const int64_t slot = 4 * blk;
	float *cur = b->kv, *next = b->kv + slot;
	memcpy(cur, a->k, (size_t)blk * sizeof(float));
	memcpy(cur + blk, a->v, (size_t)blk * sizeof(float));
	memset(cur + 2 * blk, 0, (size_t)(2 * blk) * sizeof(float));
	for (int i = 0; i < S; i++) {
		const int src = ((r - i) % S + S) % S;
		/* the shard's K/V travel on while its gradient is computed here; the gradient
		 * follows (after the last step only the gradient, which then is home) */
		if (i + 1 < S)
			ring_step(m, cur, next, 2 * blk, S + 2 * i, "cp ring: K/V");
		attention_mixed_pos_backward(m->dq, cur + 2 * blk, cur + 3 * blk, m->datt, a->att,
		                           a->lse, a->q, qpos, cur, cur + blk,
		                           b->order + (int64_t)src * Tl, d.B, Tl, Tl, d.H, d.KV, d.D);
		if (i + 1 < S)
			m->cp->ring_wait(m->cp->ctx, "cp ring: K/V");
		ring_step(m, cur + 2 * blk, next + 2 * blk, 2 * blk, S + 2 * i + 1, "cp ring: dK/dV");
		m->cp->ring_wait(m->cp->ctx, "cp ring: dK/dV");
		float *t = cur;
		cur = next;
		next = t;
	}
	memcpy(m->dk, cur + 2 * blk, (size_t)blk * sizeof(float));
	memcpy(m->dv, cur + 3 * blk, (size_t)blk * sizeof(float));
	return true;
}
