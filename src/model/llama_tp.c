/* Llama under tensor parallelism: Megatron's column/row-parallel blocks with sequence
 * parallelism and a vocabulary-parallel loss, on the same table and activations as llama.c
 * (the table is the rank's slice, see llama_table_build_tp).
 *
 * Sequence parallelism: the residual stream (x, xmid, x_final and their gradients) of rank r
 * is tokens [r*Ns, (r+1)*Ns) of the micro-batch's N = B*T (padded to Np = Ns*tp with zero
 * rows), so RMSNorms and residual adds run on 1/tp of the tokens. Before attention and the
 * FFN the norm output is all-gathered along the tokens; the row-parallel wo and w2 produce
 * partial sums that are reduce-scattered back onto the token shards. Backward mirrors it:
 * all-gather the residual gradient, reduce-scatter the input gradient of the
 * column-parallel matmuls. No all-reduce touches an activation; the replicated norm weights'
 * gradients (partial over token shards) are summed over the group in rank order, so every
 * rank keeps bitwise identical norm weights.
 *
 * Vocabulary parallelism: the embedding rows [v0, v0+Vs) live on one rank; each rank embeds
 * the tokens it owns (zeros elsewhere) and the reduce-scatter that follows both sums and
 * shards them. The output projection is split the same way and the cross-entropy is computed
 * on vocabulary-sharded logits in chunks of rows: per-row max (all-reduce max), sum of
 * exponentials and target logit (all-reduce sum); the (N, V) logits never exist anywhere.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/timer.h"
#include "comm/comm.h"
#include "comm/p2p.h"
#include "kernels/kernels.h"
#include "model/llama_impl.h"

struct llama_tp_bufs {
	float *xg;         /* (Np, C) gathered norm output */
	float *part;       /* (Np, C) partial sums to reduce-scatter / gathered gradient */
	float *rs_scratch; /* 2 * Ns * C */
	float *rs_out;     /* (Ns, C) */
	float *dnorm;      /* (tp, C): a norm weight's gradient from every rank */
	float *stat;       /* 3 * ce_chunk: row max, sum of exponentials, target logit */
	float *ring;       /* async: 3 * Ns * C (two partial sums in flight, one received) */
	size_t bytes;
	double comm_s; /* time in TP collectives (all on the compute path: exposed) */
	/* async TP: ring steps instead of the block's all-gathers and reduce-scatters */
	bool async;
	double sim_bytes_per_s, sim_latency_s; /* simulated link (0: off) */
	double timeout_s;
};

double llama_tp_comm_seconds(const struct llama_model *m)
{
	return m->tpb ? m->tpb->comm_s : 0.0;
}

void llama_tp_build(struct llama_model *m, const struct llama_build_opts *opts)
{
	int64_t C = m->cfg.dim, Np = m->Np, Ns = m->Ns, S = m->tp->size;
	int64_t n = 2 * Np * C + 2 * Ns * C + Ns * C + S * C + 3 * m->ce_chunk;
	if (opts->tp_async)
		n += 3 * Ns * C;
	struct llama_tp_bufs *b = xcalloc(1, sizeof(*b));
	b->bytes = (size_t)n * sizeof(float);
	float *p = mem_alloc(MEM_ACTIVATIONS, b->bytes);
	memset(p, 0, b->bytes);
	b->xg = p;
	b->part = b->xg + Np * C;
	b->rs_scratch = b->part + Np * C;
	b->rs_out = b->rs_scratch + 2 * Ns * C;
	b->dnorm = b->rs_out + Ns * C;
	b->stat = b->dnorm + S * C;
	b->ring = opts->tp_async ? b->stat + 3 * m->ce_chunk : NULL;
	b->async = opts->tp_async;
	b->sim_bytes_per_s = opts->tp_sim_gbps > 0 ? opts->tp_sim_gbps * 1e9 / 8.0 : 0.0;
	b->sim_latency_s = b->sim_bytes_per_s > 0 ? opts->tp_sim_latency_us * 1e-6 : 0.0;
	b->timeout_s = opts->tp_timeout_s;
	m->tpb = b;
}

void llama_tp_free(struct llama_model *m)
{
	if (!m->tpb)
		return;
	mem_free(MEM_ACTIVATIONS, m->tpb->xg, m->tpb->bytes);
	free(m->tpb);
	m->tpb = NULL;
}

/* ---------------------------------------------------------------- collectives */

static void add_rows(float *out, const float *a, const float *b, int64_t n)
{
#pragma omp parallel for simd schedule(static)
	for (int64_t i = 0; i < n; i++)
		out[i] = a[i] + b[i];
}

/* Sleep until timer_now() reaches `until` (a simulated transfer's arrival). */
static void wait_until(double until)
{
	double left = until - timer_now();
	if (left > 0) {
		struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
		nanosleep(&ts, NULL);
	}
	while (timer_now() < until)
		;
}

/* A simulated link (comm.simulate_*): a TP collective that moved `wire` bytes in `hops`
 * ring steps lasts at least hops x latency + wire / bandwidth from t0 (spent waiting). */
static void sim_stretch(const struct llama_tp_bufs *b, double t0, int64_t wire, int64_t hops)
{
	if (b->sim_bytes_per_s <= 0)
		return;
	wait_until(t0 + (double)hops * b->sim_latency_s + (double)wire / b->sim_bytes_per_s);
}

/* full(Np, C) = the token shards of every rank, in rank order. */
static void sp_gather(struct llama_model *m, const float *shard, float *full)
{
	int64_t bytes = m->Ns * m->cfg.dim * (int64_t)sizeof(float), S = m->tp->size;
	double t0 = timer_now();
	comm_all_gather(m->tp, shard, full, bytes);
	sim_stretch(m->tpb, t0, (S - 1) * bytes, S - 1);
	m->tpb->comm_s += timer_now() - t0;
}

/* out(Ns, C) = this rank's token rows of the sum over ranks of part(Np, C). Rows N..Np of
 * part (padding) are zeroed first. */
static void sp_reduce_scatter(struct llama_model *m, float *part, float *out)
{
	int64_t C = m->cfg.dim;
	memset(part + m->N * C, 0, (size_t)((m->Np - m->N) * C) * sizeof(float));
	int64_t S = m->tp->size;
	double t0 = timer_now();
	comm_reduce_scatter_f32(m->tp, part, out, m->Ns * C, m->tpb->rs_scratch);
	sim_stretch(m->tpb, t0, (S - 1) * m->Ns * C * (int64_t)sizeof(float), S - 1);
	m->tpb->comm_s += timer_now() - t0;
}

/* ---------------------------------------------------------------- async TP: ring steps
 *
 * All-gather + matmul: S steps; in step k rank r holds token block (r - k) mod S of the
 * gathered buffer, sends it to rank r + 1 and receives block (r - k - 1) from rank r - 1
 * while it multiplies the block it has. Matmul + reduce-scatter: in step k rank r computes its
 * partial sum of block (r - k - 1) mod S while the running sum of that block travels from
 * rank r - 1; it adds the two and passes the sum on; after S steps it holds the sum of its
 * own block. Only the time spent waiting for a transfer is TP communication on the compute
 * path (exposed); with a simulated link a transfer arrives no earlier than latency +
 * bytes / bandwidth after it was posted. */

/* Rows [r0, r0 + n) of the micro-batch's N tokens that token block `blk` covers (n <= 0:
 * only padding). */
static int64_t block_rows(const struct llama_model *m, int64_t blk, int64_t *r0)
{
	*r0 = blk * m->Ns;
	int64_t n = m->N - *r0;
	return n < m->Ns ? n : m->Ns;
}

typedef void (*ring_fn)(struct llama_model *m, const void *ctx, int64_t r0, int64_t n,
                        float *out);

static void ring_wait(struct llama_model *m, struct comm_p2p *req, double arrive,
                      const char *what)
{
	double t0 = timer_now();
	comm_p2p_wait(req, m->tpb->timeout_s, what);
	if (arrive > 0)
		wait_until(arrive);
	m->tpb->comm_s += timer_now() - t0;
}

static double ring_arrival(const struct llama_model *m, int64_t bytes)
{
	const struct llama_tp_bufs *b = m->tpb;
	return b->sim_bytes_per_s > 0
	           ? timer_now() + b->sim_latency_s + (double)bytes / b->sim_bytes_per_s
	           : 0.0;
}

#define RING_TAG 0x5470 /* the TP group's point-to-point tags: RING_TAG + step */

/* full(Np, C) = every rank's shard (as sp_gather); fn(m, ctx, r0, n, NULL) runs on each
 * block of real rows as soon as it is here. */
static void ring_gather(struct llama_model *m, const float *shard, float *full, ring_fn fn,
                        const void *ctx)
{
	int64_t C = m->cfg.dim, S = m->tp->size, R = m->tp->rank, blk = m->Ns * C;
	int64_t bytes = blk * (int64_t)sizeof(float);
	int right = (int)((R + 1) % S), left = (int)((R + S - 1) % S);
	memcpy(full + R * blk, shard, (size_t)bytes);
	for (int64_t k = 0; k < S; k++) {
		int64_t have = (R - k + S) % S, next = (R - k - 1 + S) % S, r0;
		struct comm_p2p sreq = {0}, rreq = {0};
		double arrive = 0.0;
		if (k < S - 1) {
			comm_p2p_irecv(m->tp, left, RING_TAG + (int)k, full + next * blk, bytes, &rreq);
			comm_p2p_isend(m->tp, right, RING_TAG + (int)k, full + have * blk, bytes,
			               &sreq);
			arrive = ring_arrival(m, bytes);
		}
		int64_t n = block_rows(m, have, &r0);
		if (fn && n > 0)
			fn(m, ctx, r0, n, NULL);
		if (k < S - 1) {
			ring_wait(m, &rreq, arrive, "async TP all-gather (receive)");
			ring_wait(m, &sreq, 0.0, "async TP all-gather (send)");
		}
	}
}

/* out(Ns, C) = this rank's block of the sum over ranks of the partial sums that
 * fn(m, ctx, r0, n, dst) writes for rows [r0, r0 + n) into dst (n x C, zeroed first). */
static void ring_reduce_scatter(struct llama_model *m, float *out, ring_fn fn, const void *ctx)
{
	int64_t C = m->cfg.dim, S = m->tp->size, R = m->tp->rank, blk = m->Ns * C;
	int64_t bytes = blk * (int64_t)sizeof(float);
	int right = (int)((R + 1) % S), left = (int)((R + S - 1) % S);
	float *buf[2] = {m->tpb->ring, m->tpb->ring + blk}, *rin = m->tpb->ring + 2 * blk;
	struct comm_p2p sreq[2] = {{0}, {0}}, rreq = {0};
	double arrive = 0.0;
	for (int64_t k = 0; k < S; k++) {
		int64_t b = (R - k - 1 + S) % S, r0;
		float *acc = k == S - 1 ? out : buf[k & 1];
		if (k >= 2)
			ring_wait(m, &sreq[k & 1], 0.0, "async TP reduce-scatter (send)");
		memset(acc, 0, (size_t)bytes);
		int64_t n = block_rows(m, b, &r0);
		if (n > 0)
			fn(m, ctx, r0, n, acc);
		if (k > 0) {
			ring_wait(m, &rreq, arrive, "async TP reduce-scatter (receive)");
			add_rows(acc, acc, rin, blk);
		}
		if (k < S - 1) {
			comm_p2p_irecv(m->tp, left, RING_TAG + (int)k, rin, bytes, &rreq);
			comm_p2p_isend(m->tp, right, RING_TAG + (int)k, acc, bytes, &sreq[k & 1]);
			arrive = ring_arrival(m, bytes);
		}
	}
	for (int i = 0; i < 2; i++)
		ring_wait(m, &sreq[i], 0.0, "async TP reduce-scatter (send)");
}

/* RMSNorm backward on the token shard; the weight's gradient is partial over the shards, so
 * it is summed over the group in rank order (identical on every rank) before accumulating. */
static void tp_norm_backward(struct llama_model *m, float *dx, float *dw, const float *dout,
                             const float *x, const float *w, const float *rstd)
{
	int64_t C = m->cfg.dim, S = m->tp->size;
	float *mine = m->tpb->rs_scratch; /* free between collectives */
	memset(mine, 0, (size_t)C * sizeof(float));
	rmsnorm_backward_f32(dx, mine, dout, x, w, rstd, m->Ns, C);
	double t0 = timer_now();
	comm_all_gather(m->tp, mine, m->tpb->dnorm, C * (int64_t)sizeof(float));
	m->tpb->comm_s += timer_now() - t0;
	for (int64_t r = 0; r < S; r++)
		for (int64_t j = 0; j < C; j++)
			dw[j] += m->tpb->dnorm[r * C + j];
}

/* ---------------------------------------------------------------- embedding */

static void tp_embedding_forward(struct llama_model *m)
{
	const struct param_entry *p = &m->table.p[PARAM_TOK_EMB];
	const float *emb = llama_tensor_at(m, m->unit_w, PARAM_TOK_EMB);
	int64_t C = m->cfg.dim, v0 = p->tp_start, vn = p->tp_valid;
	float *part = m->tpb->part;
	memset(part, 0, (size_t)(m->N * C) * sizeof(float));
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < m->N; i++) {
		int64_t t = (int64_t)m->tokens[i] - v0;
		if (t >= 0 && t < vn)
			memcpy(part + i * C, emb + t * C, (size_t)C * sizeof(float));
	}
	sp_reduce_scatter(m, part, m->cfg.n_layers > 0 ? m->acts[0].x : m->x_final);
}

static void tp_embedding_backward(struct llama_model *m)
{
	const struct param_entry *p = &m->table.p[PARAM_TOK_EMB];
	float *demb = llama_tensor_at(m, m->unit_dw, PARAM_TOK_EMB);
	int64_t C = m->cfg.dim, v0 = p->tp_start, vn = p->tp_valid;
	float *g = m->tpb->part;
	sp_gather(m, m->dres, g);
	for (int64_t i = 0; i < m->N; i++) { /* serial: a fixed summation order per row */
		int64_t t = (int64_t)m->tokens[i] - v0;
		if (t < 0 || t >= vn)
			continue;
		float *d = demb + t * C;
		const float *s = g + i * C;
		for (int64_t j = 0; j < C; j++)
			d[j] += s[j];
	}
}

/* ---------------------------------------------------------------- blocks */

struct tp_dims {
	int64_t B, T, N, Ns, C, D, H, KV, HD, KVD, F;
};

static struct tp_dims tp_dims(const struct llama_model *m)
{
	const struct llama_config *c = &m->cfg;
	int64_t S = m->tp->size;
	struct tp_dims d = {.B = m->B, .T = m->T, .N = m->N, .Ns = m->Ns, .C = c->dim,
	                    .D = c->head_dim, .H = c->n_heads / S, .KV = c->n_kv_heads / S,
	                    .F = c->ffn_hidden / S};
	d.HD = d.H * d.D;
	d.KVD = d.KV * d.D;
	return d;
}

/* h = x + RS(wo(attn(rope(wq AG(xn)), ...))),  xn = rmsnorm(x) on the token shard;
 * out = h + RS(w2(silu(w1 AG(hn)) * w3 AG(hn))). */
static void tp_block_forward(struct llama_model *m, int l)
{
	const struct llama_config *c = &m->cfg;
	const struct llama_block_ptrs w = llama_block_ptrs_of(m, m->unit_w, l);
	struct llama_block_acts *a = &m->acts[l];
	struct llama_tp_bufs *b = m->tpb;
	const struct tp_dims d = tp_dims(m);
	float *out = llama_block_output(m, l);

	rmsnorm_forward_f32(m->xn, a->rstd1, a->x, w.attn_norm, d.Ns, d.C, c->norm_eps);
	sp_gather(m, m->xn, b->xg);
	matmul_forward_f32(a->q, b->xg, w.wq, d.N, d.C, d.HD, 0);
	matmul_forward_f32(a->k, b->xg, w.wk, d.N, d.C, d.KVD, 0);
	matmul_forward_f32(a->v, b->xg, w.wv, d.N, d.C, d.KVD, 0);
	rope_forward_f32(a->q, m->rope_cos, m->rope_sin, d.B, d.T, d.H, d.D);
	rope_forward_f32(a->k, m->rope_cos, m->rope_sin, d.B, d.T, d.KV, d.D);
	attention_forward_f32(a->att, a->lse, a->q, a->k, a->v, d.B, d.T, d.H, d.KV, d.D);
	matmul_forward_f32(b->part, a->att, w.wo, d.N, d.HD, d.C, 0);
	sp_reduce_scatter(m, b->part, b->rs_out);
	add_rows(a->xmid, a->x, b->rs_out, d.Ns * d.C);

	rmsnorm_forward_f32(m->xn, a->rstd2, a->xmid, w.ffn_norm, d.Ns, d.C, c->norm_eps);
	sp_gather(m, m->xn, b->xg);
	float *h1 = m->recompute_ffn ? m->h1s : a->h1, *h3 = m->recompute_ffn ? m->h3s : a->h3;
	matmul_forward_f32(h1, b->xg, w.w1, d.N, d.C, d.F, 0);
	matmul_forward_f32(h3, b->xg, w.w3, d.N, d.C, d.F, 0);
	swiglu_forward_f32(m->gate, h1, h3, d.N * d.F);
	matmul_forward_f32(b->part, m->gate, w.w2, d.N, d.F, d.C, 0);
	sp_reduce_scatter(m, b->part, b->rs_out);
	add_rows(out, a->xmid, b->rs_out, d.Ns * d.C);
}

/* Mirrors tp_block_forward. On entry m->dres = dL/d(out) on the token shard; on exit
 * dL/d(x). */
static void tp_block_backward(struct llama_model *m, int l)
{
	const struct llama_config *c = &m->cfg;
	const struct llama_block_ptrs w = llama_block_ptrs_of(m, m->unit_w, l);
	const struct llama_block_ptrs dw = llama_block_ptrs_of(m, m->unit_dw, l);
	struct llama_block_acts *a = &m->acts[l];
	struct llama_tp_bufs *b = m->tpb;
	const struct tp_dims d = tp_dims(m);
	size_t npc = (size_t)(m->Np * d.C) * sizeof(float);

	/* feed-forward */
	sp_gather(m, m->dres, b->part); /* dL/d(w2 output), all tokens */
	rmsnorm_forward_f32(m->xn, a->rstd2, a->xmid, w.ffn_norm, d.Ns, d.C, c->norm_eps);
	sp_gather(m, m->xn, b->xg);
	const float *h1 = a->h1, *h3 = a->h3;
	if (m->recompute_ffn) { /* activation_checkpoint.mode = ffn: the up-projections again */
		matmul_forward_f32(m->h1s, b->xg, w.w1, d.N, d.C, d.F, 0);
		matmul_forward_f32(m->h3s, b->xg, w.w3, d.N, d.C, d.F, 0);
		h1 = m->h1s;
		h3 = m->h3s;
	}
	swiglu_forward_f32(m->gate, h1, h3, d.N * d.F);
	matmul_backward_f32(NULL, dw.w2, b->part, m->gate, w.w2, d.N, d.F, d.C);
	/* first writes overwrite (beta 0): no zeroing pass */
	matmul_backward_set_f32(m->gate, NULL, b->part, NULL, w.w2, d.N, d.F, d.C); /* d(gate) */
	swiglu_backward_f32(m->dh1, m->dh3, m->gate, h1, h3, d.N * d.F);
	matmul_backward_set_f32(b->part, dw.w1, m->dh1, b->xg, w.w1, d.N, d.C, d.F);
	matmul_backward_f32(b->part, dw.w3, m->dh3, b->xg, w.w3, d.N, d.C, d.F);
	sp_reduce_scatter(m, b->part, b->rs_out);
	tp_norm_backward(m, m->dres, dw.ffn_norm, b->rs_out, a->xmid, w.ffn_norm, a->rstd2);

	/* attention */
	sp_gather(m, m->dres, b->part);
	matmul_backward_set_f32(m->datt, dw.wo, b->part, a->att, w.wo, d.N, d.HD, d.C);
	llama_attention_backward(m, a, d.B, d.T, d.H, d.KV, d.D);
	rmsnorm_forward_f32(m->xn, a->rstd1, a->x, w.attn_norm, d.Ns, d.C, c->norm_eps);
	sp_gather(m, m->xn, b->xg);
	memset(b->part, 0, npc);
	matmul_backward_f32(b->part, dw.wq, m->dq, b->xg, w.wq, d.N, d.C, d.HD);
	matmul_backward_f32(b->part, dw.wk, m->dk, b->xg, w.wk, d.N, d.C, d.KVD);
	matmul_backward_f32(b->part, dw.wv, m->dv, b->xg, w.wv, d.N, d.C, d.KVD);
	sp_reduce_scatter(m, b->part, b->rs_out);
	tp_norm_backward(m, m->dres, dw.attn_norm, b->rs_out, a->x, w.attn_norm, a->rstd1);
}

/* ---------------------------------------------------------------- async TP blocks */

/* The block's operands, for the ring callbacks. */
struct ring_ctx {
	const struct llama_block_ptrs *w, *dw;
	struct llama_block_acts *a;
	struct tp_dims d;
	float *h1, *h3; /* the up-projections: saved, or scratch under ffn checkpointing */
};

/* rows of q, k, v from the gathered norm output */
static void rf_qkv(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct ring_ctx *c = ctx;
	const float *x = m->tpb->xg + r0 * c->d.C;
	(void)out;
	matmul_forward_f32(c->a->q + r0 * c->d.HD, x, c->w->wq, n, c->d.C, c->d.HD, 0);
	matmul_forward_f32(c->a->k + r0 * c->d.KVD, x, c->w->wk, n, c->d.C, c->d.KVD, 0);
	matmul_forward_f32(c->a->v + r0 * c->d.KVD, x, c->w->wv, n, c->d.C, c->d.KVD, 0);
}

static void rf_w13(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct ring_ctx *c = ctx;
	const float *x = m->tpb->xg + r0 * c->d.C;
	(void)out;
	matmul_forward_f32(c->h1 + r0 * c->d.F, x, c->w->w1, n, c->d.C, c->d.F, 0);
	matmul_forward_f32(c->h3 + r0 * c->d.F, x, c->w->w3, n, c->d.C, c->d.F, 0);
}

static void rf_wo(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct ring_ctx *c = ctx;
	(void)m;
	matmul_forward_f32(out, c->a->att + r0 * c->d.HD, c->w->wo, n, c->d.HD, c->d.C, 0);
}

static void rf_w2(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct ring_ctx *c = ctx;
	matmul_forward_f32(out, m->gate + r0 * c->d.F, c->w->w2, n, c->d.F, c->d.C, 0);
}

static void tp_block_forward_async(struct llama_model *m, int l)
{
	const struct llama_config *cf = &m->cfg;
	const struct llama_block_ptrs w = llama_block_ptrs_of(m, m->unit_w, l);
	struct llama_block_acts *a = &m->acts[l];
	struct llama_tp_bufs *b = m->tpb;
	const struct ring_ctx c = {.w = &w,
	                           .a = a,
	                           .d = tp_dims(m),
	                           .h1 = m->recompute_ffn ? m->h1s : a->h1,
	                           .h3 = m->recompute_ffn ? m->h3s : a->h3};
	const struct tp_dims d = c.d;
	float *out = llama_block_output(m, l);

	rmsnorm_forward_f32(m->xn, a->rstd1, a->x, w.attn_norm, d.Ns, d.C, cf->norm_eps);
	ring_gather(m, m->xn, b->xg, rf_qkv, &c);
	rope_forward_f32(a->q, m->rope_cos, m->rope_sin, d.B, d.T, d.H, d.D);
	rope_forward_f32(a->k, m->rope_cos, m->rope_sin, d.B, d.T, d.KV, d.D);
	attention_forward_f32(a->att, a->lse, a->q, a->k, a->v, d.B, d.T, d.H, d.KV, d.D);
	ring_reduce_scatter(m, b->rs_out, rf_wo, &c);
	add_rows(a->xmid, a->x, b->rs_out, d.Ns * d.C);

	rmsnorm_forward_f32(m->xn, a->rstd2, a->xmid, w.ffn_norm, d.Ns, d.C, cf->norm_eps);
	ring_gather(m, m->xn, b->xg, rf_w13, &c);
	swiglu_forward_f32(m->gate, c.h1, c.h3, d.N * d.F);
	ring_reduce_scatter(m, b->rs_out, rf_w2, &c);
	add_rows(out, a->xmid, b->rs_out, d.Ns * d.C);
}

/* the gathered output gradient (in tpb->part) through w2: dW2 from the saved gate rows, then
 * those rows become d(gate) */
static void rb_w2(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct ring_ctx *c = ctx;
	const float *g = m->tpb->part + r0 * c->d.C;
	float *gate = m->gate + r0 * c->d.F;
	(void)out;
	matmul_backward_f32(NULL, c->dw->w2, g, gate, c->w->w2, n, c->d.F, c->d.C);
	memset(gate, 0, (size_t)(n * c->d.F) * sizeof(float));
	matmul_backward_f32(gate, NULL, g, NULL, c->w->w2, n, c->d.F, c->d.C);
}

static void rb_wo(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct ring_ctx *c = ctx;
	const float *g = m->tpb->part + r0 * c->d.C;
	(void)out;
	matmul_backward_f32(m->datt + r0 * c->d.HD, c->dw->wo, g, c->a->att + r0 * c->d.HD,
	                    c->w->wo, n, c->d.HD, c->d.C);
}

/* weight gradients of w1, w3 from the gathered norm output */
static void rb_dw13(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct ring_ctx *c = ctx;
	const float *x = m->tpb->xg + r0 * c->d.C;
	(void)out;
	matmul_backward_f32(NULL, c->dw->w1, m->dh1 + r0 * c->d.F, x, c->w->w1, n, c->d.C, c->d.F);
	matmul_backward_f32(NULL, c->dw->w3, m->dh3 + r0 * c->d.F, x, c->w->w3, n, c->d.C, c->d.F);
}

static void rb_dx13(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct ring_ctx *c = ctx;
	matmul_backward_f32(out, NULL, m->dh1 + r0 * c->d.F, NULL, c->w->w1, n, c->d.C, c->d.F);
	matmul_backward_f32(out, NULL, m->dh3 + r0 * c->d.F, NULL, c->w->w3, n, c->d.C, c->d.F);
}

static void rb_dwqkv(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct ring_ctx *c = ctx;
	const struct tp_dims *d = &c->d;
	const float *x = m->tpb->xg + r0 * d->C;
	(void)out;
	matmul_backward_f32(NULL, c->dw->wq, m->dq + r0 * d->HD, x, c->w->wq, n, d->C, d->HD);
	matmul_backward_f32(NULL, c->dw->wk, m->dk + r0 * d->KVD, x, c->w->wk, n, d->C, d->KVD);
	matmul_backward_f32(NULL, c->dw->wv, m->dv + r0 * d->KVD, x, c->w->wv, n, d->C, d->KVD);
}

static void rb_dxqkv(struct llama_model *m, const void *ctx, int64_t r0, int64_t n, float *out)
{
	const struct ring_ctx *c = ctx;
	const struct tp_dims *d = &c->d;
	matmul_backward_f32(out, NULL, m->dq + r0 * d->HD, NULL, c->w->wq, n, d->C, d->HD);
	matmul_backward_f32(out, NULL, m->dk + r0 * d->KVD, NULL, c->w->wk, n, d->C, d->KVD);
	matmul_backward_f32(out, NULL, m->dv + r0 * d->KVD, NULL, c->w->wv, n, d->C, d->KVD);
}

/* Mirrors tp_block_backward with the same ring steps as the forward. */
static void tp_block_backward_async(struct llama_model *m, int l)
{
	const struct llama_config *cf = &m->cfg;
	const struct llama_block_ptrs w = llama_block_ptrs_of(m, m->unit_w, l);
	const struct llama_block_ptrs dw = llama_block_ptrs_of(m, m->unit_dw, l);
	struct llama_block_acts *a = &m->acts[l];
	struct llama_tp_bufs *b = m->tpb;
	const struct ring_ctx c = {.w = &w,
	                           .dw = &dw,
	                           .a = a,
	                           .d = tp_dims(m),
	                           .h1 = m->recompute_ffn ? m->h1s : a->h1,
	                           .h3 = m->recompute_ffn ? m->h3s : a->h3};
	const struct tp_dims d = c.d;

	/* feed-forward (ffn checkpointing: the norm output is gathered first, recomputing the
	 * up-projections on the way, and then serves the weight gradients as it is) */
	if (m->recompute_ffn) {
		rmsnorm_forward_f32(m->xn, a->rstd2, a->xmid, w.ffn_norm, d.Ns, d.C, cf->norm_eps);
		ring_gather(m, m->xn, b->xg, rf_w13, &c);
	}
	swiglu_forward_f32(m->gate, c.h1, c.h3, d.N * d.F);
	ring_gather(m, m->dres, b->part, rb_w2, &c);
	swiglu_backward_f32(m->dh1, m->dh3, m->gate, c.h1, c.h3, d.N * d.F); /* overwrites */
	if (m->recompute_ffn) {
		rb_dw13(m, &c, 0, d.N, NULL);
	} else {
		rmsnorm_forward_f32(m->xn, a->rstd2, a->xmid, w.ffn_norm, d.Ns, d.C, cf->norm_eps);
		ring_gather(m, m->xn, b->xg, rb_dw13, &c);
	}
	ring_reduce_scatter(m, b->rs_out, rb_dx13, &c);
	tp_norm_backward(m, m->dres, dw.ffn_norm, b->rs_out, a->xmid, w.ffn_norm, a->rstd2);

	/* attention */
	memset(m->datt, 0, (size_t)(d.N * d.HD) * sizeof(float));
	ring_gather(m, m->dres, b->part, rb_wo, &c);
	llama_attention_backward(m, a, d.B, d.T, d.H, d.KV, d.D);
	rmsnorm_forward_f32(m->xn, a->rstd1, a->x, w.attn_norm, d.Ns, d.C, cf->norm_eps);
	ring_gather(m, m->xn, b->xg, rb_dwqkv, &c);
	ring_reduce_scatter(m, b->rs_out, rb_dxqkv, &c);
	tp_norm_backward(m, m->dres, dw.attn_norm, b->rs_out, a->x, w.attn_norm, a->rstd1);
}

/* ---------------------------------------------------------------- head: loss parallelism */

/* Cross-entropy of xn_final(N, C) against the vocabulary-sharded output projection, in
 * chunks of rows (scratch holds chunk x Vs logits). Returns the loss sum (identical on every
 * rank of the group). With dx (Np, C) and dw, accumulates d(loss_sum * dscale): dx is this
 * rank's partial sum over its vocabulary piece (reduce-scatter it), dw its rows. */
static double tp_cross_entropy(struct llama_model *m, float *dx, float *dw, double dscale,
                               int64_t *n_valid)
{
	const struct param_entry *p = &m->table.p[PARAM_OUTPUT(m)];
	const float *w = llama_tensor_at(m, m->unit_w, PARAM_OUTPUT(m));
	int64_t C = m->cfg.dim, Vs = p->shape[0], v0 = p->tp_start, vn = p->tp_valid;
	int64_t chunk = m->ce_chunk;
	float *zmax = m->tpb->stat, *sum = zmax + chunk, *ztgt = sum + chunk;
	bool grad = dx || dw;
	double loss_sum = 0.0;
	int64_t valid = 0;
	for (int64_t n0 = 0; n0 < m->N; n0 += chunk) {
		int64_t rows = m->N - n0 < chunk ? m->N - n0 : chunk;
		const float *xc = m->xn_final + n0 * C;
		const int32_t *tg = m->targets + n0;
		float *z = m->ce_scratch;
		matmul_forward_f32(z, xc, w, rows, C, Vs, 0);
#pragma omp parallel for schedule(static)
		for (int64_t r = 0; r < rows; r++) {
			const float *zr = z + r * Vs;
			float mx = -FLT_MAX;
			for (int64_t j = 0; j < vn; j++)
				mx = zr[j] > mx ? zr[j] : mx;
			zmax[r] = mx;
		}
		double t0 = timer_now();
		comm_all_reduce_max_f32(m->tp, zmax, rows);
		m->tpb->comm_s += timer_now() - t0;
#pragma omp parallel for schedule(static)
		for (int64_t r = 0; r < rows; r++) {
			const float *zr = z + r * Vs;
			float s = 0;
			for (int64_t j = 0; j < vn; j++)
				s += expf(zr[j] - zmax[r]);
			sum[r] = s;
			int64_t t = (int64_t)tg[r] - v0;
			ztgt[r] = tg[r] != LLAMA_IGNORE_INDEX && t >= 0 && t < vn ? zr[t] : 0.0f;
		}
		t0 = timer_now();
		comm_all_reduce_f32(m->tp, sum, 2 * chunk); /* sum and ztgt are adjacent */
		m->tpb->comm_s += timer_now() - t0;
		double chunk_loss = 0.0;
		int64_t chunk_valid = 0;
#pragma omp parallel for schedule(static) reduction(+ : chunk_loss, chunk_valid)
		for (int64_t r = 0; r < rows; r++) {
			float *zr = z + r * Vs;
			if (tg[r] == LLAMA_IGNORE_INDEX) {
				if (grad)
					memset(zr, 0, (size_t)Vs * sizeof(float));
				continue;
			}
			float lse = zmax[r] + logf(sum[r]);
			chunk_loss += (double)(lse - ztgt[r]);
			chunk_valid++;
			if (!grad)
				continue;
			float s = (float)dscale;
			for (int64_t j = 0; j < vn; j++)
				zr[j] = expf(zr[j] - lse) * s;
			for (int64_t j = vn; j < Vs; j++)
				zr[j] = 0.0f;
			int64_t t = (int64_t)tg[r] - v0;
			if (t >= 0 && t < vn)
				zr[t] -= s;
		}
		loss_sum += chunk_loss;
		valid += chunk_valid;
		if (grad)
			matmul_backward_f32(dx ? dx + n0 * C : NULL, dw, z, xc, w, rows, C, Vs);
	}
	if (n_valid)
		*n_valid = valid;
	return loss_sum;
}

/* Final norm on the token shard, all-gather, then the fused vocabulary-parallel output and
 * loss (with its gradient when the step's scale is known, reduce-scattered into m->dxn). */
static double tp_head_forward(struct llama_model *m, int64_t *n_valid)
{
	const struct llama_config *c = &m->cfg;
	bool grads = m->loss_dscale > 0.0;
	rmsnorm_forward_f32(m->xn, m->rstd_f, m->x_final,
	                    llama_tensor_at(m, m->unit_w, PARAM_NORM(m)), m->Ns, c->dim,
	                    c->norm_eps);
	sp_gather(m, m->xn, m->xn_final);
	if (grads)
		memset(m->tpb->part, 0, (size_t)(m->Np * c->dim) * sizeof(float));
	double loss = tp_cross_entropy(m, grads ? m->tpb->part : NULL,
	                               grads ? llama_tensor_at(m, m->unit_dw, PARAM_OUTPUT(m)) : NULL,
	                               m->loss_dscale, n_valid);
	if (grads)
		sp_reduce_scatter(m, m->tpb->part, m->dxn);
	m->head_grads_ready = grads;
	return loss;
}

static void tp_head_backward(struct llama_model *m, double dscale)
{
	const struct llama_config *c = &m->cfg;
	if (!m->head_grads_ready || m->loss_dscale != dscale) {
		CHECK(!m->head_grads_ready, "loss gradient made with scale %g, asked for %g",
		      m->loss_dscale, dscale);
		memset(m->tpb->part, 0, (size_t)(m->Np * c->dim) * sizeof(float));
		tp_cross_entropy(m, m->tpb->part, llama_tensor_at(m, m->unit_dw, PARAM_OUTPUT(m)),
		                 dscale, NULL);
		sp_reduce_scatter(m, m->tpb->part, m->dxn);
	}
	m->head_grads_ready = false;
	memset(m->dres, 0, (size_t)(m->Ns * c->dim) * sizeof(float));
	tp_norm_backward(m, m->dres, llama_tensor_at(m, m->unit_dw, PARAM_NORM(m)), m->dxn,
	                 m->x_final, llama_tensor_at(m, m->unit_w, PARAM_NORM(m)), m->rstd_f);
}

/* ---------------------------------------------------------------- units */

double llama_tp_unit_forward(struct llama_model *m, int u, int64_t *n_valid)
{
	int L = (int)m->cfg.n_layers;
	if (u == 0) {
		tp_embedding_forward(m);
		return 0.0;
	}
	if (u <= L) {
		if (m->tpb->async)
			tp_block_forward_async(m, u - 1);
		else
			tp_block_forward(m, u - 1);
		return 0.0;
	}
	return tp_head_forward(m, n_valid);
}

/* SELECTIVE under TP: what the per-op policy dropped (k, the residual after attention, h3 and
 * both norms' statistics) from the saved x and attention output, as tp_block_forward makes
 * them: the norm outputs are gathered again and wo's partial sums reduce-scattered again. */
static void tp_block_recompute_selective(struct llama_model *m, int l)
{
	const struct llama_config *c = &m->cfg;
	const struct llama_block_ptrs w = llama_block_ptrs_of(m, m->unit_w, l);
	struct llama_block_acts *a = &m->acts[l];
	struct llama_tp_bufs *b = m->tpb;
	const struct tp_dims d = tp_dims(m);
	rmsnorm_forward_f32(m->xn, a->rstd1, a->x, w.attn_norm, d.Ns, d.C, c->norm_eps);
	sp_gather(m, m->xn, b->xg);
	matmul_forward_f32(a->k, b->xg, w.wk, d.N, d.C, d.KVD, 0);
	rope_forward_f32(a->k, m->rope_cos, m->rope_sin, d.B, d.T, d.KV, d.D);
	matmul_forward_f32(b->part, a->att, w.wo, d.N, d.HD, d.C, 0);
	sp_reduce_scatter(m, b->part, b->rs_out);
	add_rows(a->xmid, a->x, b->rs_out, d.Ns * d.C);
	rmsnorm_forward_f32(m->xn, a->rstd2, a->xmid, w.ffn_norm, d.Ns, d.C, c->norm_eps);
	sp_gather(m, m->xn, b->xg);
	matmul_forward_f32(a->h3, b->xg, w.w3, d.N, d.C, d.F, 0);
}

void llama_tp_unit_recompute(struct llama_model *m, int u)
{
	int L = (int)m->cfg.n_layers;
	if (u == 0) {
		tp_embedding_forward(m);
	} else if (u <= L && m->ac == MODEL_AC_SELECTIVE) {
		tp_block_recompute_selective(m, u - 1);
	} else if (u <= L) {
		if (m->tpb->async)
			tp_block_forward_async(m, u - 1);
		else
			tp_block_forward(m, u - 1);
	} else {
		rmsnorm_forward_f32(m->xn, m->rstd_f, m->x_final,
		                    llama_tensor_at(m, m->unit_w, PARAM_NORM(m)), m->Ns, m->cfg.dim,
		                    m->cfg.norm_eps);
		sp_gather(m, m->xn, m->xn_final);
	}
}

void llama_tp_unit_backward(struct llama_model *m, int u, double dscale)
{
	int L = (int)m->cfg.n_layers;
	if (u == L + 1)
		tp_head_backward(m, dscale);
	else if (u >= 1 && m->tpb->async)
		tp_block_backward_async(m, u - 1);
	else if (u >= 1)
		tp_block_backward(m, u - 1);
	else
		tp_embedding_backward(m);
}
