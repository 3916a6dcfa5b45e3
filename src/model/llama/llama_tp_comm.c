/* Llama under tensor parallelism: its buffers, the collectives its programs name — the
 * sequence-parallel all-gather and reduce-scatter on the compute path, the norm weights'
 * partial gradients, and async TP's ring steps that hide them behind the matmul beside them —
 * called through the model's collective interface (model/model_group.h), which parallel/
 * tp_coll runs; and the programs' collectives as descriptors for a schedule and the cost
 * model (llama_prog_descs_of). The programs that name them are in llama_block.c and llama_head.c.
 */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "kernels/fp8_linear.h"
#include "kernels/kernels.h"
#include "model/llama/llama_cost.h"
#include "model/llama/llama_impl.h"
#include "model/model_group.h"

void llama_tp_build(struct llama_model *m, const struct llama_build_opts *opts)
{
	int64_t C = m->cfg.dim, Np = m->Np, Ns = m->Ns, S = m->tp->size;
	int64_t n = 2 * Np * C + 2 * Ns * C + Ns * C + S * C + 3 * m->ce_rows;
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
	b->ring = opts->tp_async ? b->stat + 3 * m->ce_rows : NULL;
	b->async = opts->tp_async;
	if (fp8_linear_enabled() && fp8_linear_recipe() == FP8_TENSORWISE)
		b->w8 = mem_alloc(MEM_OTHER, (size_t)((Np + Ns) * C));
	m->tpb = b;
}

void llama_tp_free(struct llama_model *m)
{
	if (!m->tpb)
		return;
	mem_free(MEM_ACTIVATIONS, m->tpb->xg, m->tpb->bytes);
	if (m->tpb->w8)
		mem_free(MEM_OTHER, m->tpb->w8, (size_t)((m->Np + m->Ns) * m->cfg.dim));
	free(m->tpb);
	m->tpb = NULL;
}

/* ---------------------------------------------------------------- collectives */

void llama_tp_add_rows(float *out, const float *a, const float *b, int64_t n)
{
#pragma omp parallel for simd schedule(static)
	for (int64_t i = 0; i < n; i++)
		out[i] = a[i] + b[i];
}

/* full(Np, C) = the token shards of every rank, in rank order. */
void llama_tp_gather(struct llama_model *m, const float *shard, float *full)
{
	m->tp->all_gather(m->tp->ctx, shard, full, m->Ns * m->cfg.dim * (int64_t)sizeof(float),
	                  true);
}

/* out(Ns, C) = this rank's token rows of the sum over ranks of part(Np, C). Rows N..Np of
 * part (padding) are zeroed first. */
void llama_tp_reduce_scatter(struct llama_model *m, float *part, float *out)
{
	int64_t C = m->cfg.dim;
	memset(part + m->N * C, 0, (size_t)((m->Np - m->N) * C) * sizeof(float));
	m->tp->reduce_scatter_f32(m->tp->ctx, part, out, m->Ns * C, m->tpb->rs_scratch);
}

/* the norm output, along the tokens */
bool llama_c_ag_xn(struct llama_model *m, int l)
{
	(void)l;
	llama_tp_gather(m, m->xn, m->tpb->xg);
	return true;
}

/* the residual gradient */
bool llama_c_ag_dres(struct llama_model *m, int l)
{
	(void)l;
	llama_tp_gather(m, m->dres, m->tpb->part);
	return true;
}

/* ---------------------------------------------------------------- fp8 on the wire
 *
 * Under the tensorwise float8 recipe an all-gather whose gathered activation feeds only
 * float8 linears carries fp8 (torchao's float8 tensor parallelism casts before the
 * all-gather): the norm output into wq/wk/wv and into w1/w3 in e4m3, the residual gradient
 * into w2's and wo's backward in e5m2. A rank casts its token shard with the scale of the
 * whole activation (its real rows' amax max-reduced over the group, and under context
 * parallelism over the cp group too: what one rank's linear takes), one byte per value
 * travels instead of four, and every block is decoded into the gathered buffer as value /
 * scale. The linears cast those values again with that tensorwise
 * amax (up to the rounding of the scale), which gives back the same fp8 values: they lie on
 * the grid. The rowwise recipes gather fp32, as torchao: their weight gradient casts the
 * activation again with per-column scales, which fp8-rounded rows would change. */

bool llama_tp_fp8_wire(const struct llama_model *m, const float *const *ws, int n)
{
	if (!m->tp || !m->tpb->w8)
		return false;
	for (int i = 0; i < n; i++)
		if (!fp8_linear_is(ws[i]))
			return false;
	return true;
}

static int64_t block_rows(const struct llama_model *m, int64_t blk, int64_t *r0);

int64_t llama_tp_held_rows(const struct llama_model *m)
{
	int64_t r0, n = block_rows(m, m->tp->rank, &r0);
	return n > 0 ? n : 0;
}

/* The wire of a gather of shard: the scale of the whole activation (see above). */
static struct llama_tp_wire wire_of(struct llama_model *m, const float *shard, enum fp8_fmt fmt)
{
	int64_t h = llama_tp_held_rows(m);
	float a = h > 0 ? fp8_amax(shard, h * m->cfg.dim) : 0.0f;
	m->tp->all_reduce_max_f32(m->tp->ctx, &a, 1);
	if (m->cp && m->cp->size > 1) /* the linears' amax (kernels/fp8_linear.h, fp8_slice) */
		m->cp->all_reduce_max_f32(m->cp->ctx, &a, 1);
	return (struct llama_tp_wire){.fmt = fmt, .scale = fp8_scale_from_amax(a, fmt, false)};
}

static void wire_decode(const struct llama_tp_wire *w, float *out, const uint8_t *q, int64_t n)
{
	fp8_dequantize(out, q, n, 1.0f / w->scale, w->fmt);
}

/* As llama_tp_gather, the shard travelling as fp8 under wire. */
static void gather_fp8(struct llama_model *m, const float *shard, float *full,
                       const struct llama_tp_wire *w)
{
	int64_t blk = m->Ns * m->cfg.dim;
	uint8_t *mine = m->tpb->w8 + m->Np * m->cfg.dim, *all = m->tpb->w8;
	fp8_quantize(mine, shard, blk, w->scale, w->fmt);
	m->tp->all_gather(m->tp->ctx, mine, all, blk, true);
	wire_decode(w, full, all, m->Np * m->cfg.dim);
}

static bool ag_block(struct llama_model *m, int l, const float *shard, float *full, int which)
{
	const struct llama_block_ptrs w = llama_block_ptrs_of(m, m->unit_w, l);
	const float *attn[] = {w.wq, w.wk, w.wv}, *ffn[] = {w.w1, w.w3}, *w2[] = {w.w2},
	            *wo[] = {w.wo};
	const float *const *ws[] = {attn, ffn, w2, wo};
	const int n[] = {3, 2, 1, 1};
	if (!llama_tp_fp8_wire(m, ws[which], n[which])) {
		llama_tp_gather(m, shard, full);
		return true;
	}
	const struct llama_tp_wire wire = wire_of(m, shard, which < 2 ? FP8_E4M3 : FP8_E5M2);
	gather_fp8(m, shard, full, &wire);
	return true;
}

bool llama_c_ag_xn_attn(struct llama_model *m, int l)
{
	return ag_block(m, l, m->xn, m->tpb->xg, 0);
}

bool llama_c_ag_xn_ffn(struct llama_model *m, int l)
{
	return ag_block(m, l, m->xn, m->tpb->xg, 1);
}

bool llama_c_ag_dres_w2(struct llama_model *m, int l)
{
	return ag_block(m, l, m->dres, m->tpb->part, 2);
}

bool llama_c_ag_dres_wo(struct llama_model *m, int l)
{
	return ag_block(m, l, m->dres, m->tpb->part, 3);
}

/* row-parallel partial sums */
bool llama_c_rs_part(struct llama_model *m, int l)
{
	(void)l;
	llama_tp_reduce_scatter(m, m->tpb->part, m->tpb->rs_out);
	return true;
}

/* A norm weight's gradient is partial over the token shards: every rank's, in rank order
 * (llama_norm_backward left this rank's in tpb->rs_scratch, free between collectives). */
bool llama_c_ag_dnorm(struct llama_model *m, int l)
{
	(void)l;
	m->tp->all_gather(m->tp->ctx, m->tpb->rs_scratch, m->tpb->dnorm,
	                  m->cfg.dim * (int64_t)sizeof(float), false);
	return true;
}

/* ---------------------------------------------------------------- norm weights' gradients */

void llama_norm_backward(struct llama_model *m, float *dw, float *dx, const float *dout,
                         const float *x, const float *w, const float *rstd)
{
	if (!m->tp) {
		rmsnorm_backward_f32(dx, dw, dout, x, w, rstd, m->N, m->cfg.dim);
		return;
	}
	float *mine = m->tpb->rs_scratch;
	memset(mine, 0, (size_t)m->cfg.dim * sizeof(float));
	rmsnorm_backward_f32(dx, mine, dout, x, w, rstd, m->Ns, m->cfg.dim);
}

/* Sum the gathered partial gradients in rank order (identical on every rank) into dw. */
void llama_norm_sum(struct llama_model *m, float *dw)
{
	if (!m->tp)
		return;
	int64_t C = m->cfg.dim, S = m->tp->size;
	for (int64_t r = 0; r < S; r++)
		for (int64_t j = 0; j < C; j++)
			dw[j] += m->tpb->dnorm[r * C + j];
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

/* full(Np, C) = every rank's shard (as sp_gather); fn(m, ctx, r0, n, NULL) runs on each
 * block of real rows as soon as it is here. With a wire the blocks travel as fp8 in tpb->w8
 * and each is decoded into full when it is here. */
void llama_tp_ring_gather(struct llama_model *m, const float *shard, float *full,
                          llama_tp_ring_fn fn, const void *ctx, const struct llama_tp_wire *wire)
{
	int64_t C = m->cfg.dim, S = m->tp->size, R = m->tp->rank, blk = m->Ns * C;
	int64_t bytes = blk * (int64_t)(wire ? 1 : sizeof(float));
	uint8_t *w8 = wire ? m->tpb->w8 : NULL;
	if (wire)
		fp8_quantize(w8 + R * blk, shard, blk, wire->scale, wire->fmt);
	else
		memcpy(full + R * blk, shard, (size_t)bytes);
	for (int64_t k = 0; k < S; k++) {
		int64_t have = (R - k + S) % S, next = (R - k - 1 + S) % S, r0;
		if (k < S - 1) {
			const void *send = wire ? (const void *)(w8 + have * blk)
			                        : (const void *)(full + have * blk);
			void *recv = wire ? (void *)(w8 + next * blk) : (void *)(full + next * blk);
			m->tp->ring_post(m->tp->ctx, send, recv, bytes, (int)k,
			                 "async TP all-gather ring step");
		}
		if (wire)
			wire_decode(wire, full + have * blk, w8 + have * blk, blk);
		int64_t n = block_rows(m, have, &r0);
		if (fn && n > 0)
			fn(m, ctx, r0, n, NULL);
		if (k < S - 1)
			m->tp->ring_wait(m->tp->ctx, "async TP all-gather ring step");
	}
}

/* out(Ns, C) = this rank's block of the sum over ranks of the partial sums that
 * fn(m, ctx, r0, n, dst) writes for rows [r0, r0 + n) into dst (n x C, zeroed first). Two
 * sum buffers alternate: one travels while the next is computed. */
void llama_tp_ring_reduce_scatter(struct llama_model *m, float *out, llama_tp_ring_fn fn,
                                  const void *ctx)
{
	int64_t C = m->cfg.dim, S = m->tp->size, R = m->tp->rank, blk = m->Ns * C;
	int64_t bytes = blk * (int64_t)sizeof(float);
	float *buf[2] = {m->tpb->ring, m->tpb->ring + blk}, *rin = m->tpb->ring + 2 * blk;
	for (int64_t k = 0; k < S; k++) {
		int64_t b = (R - k - 1 + S) % S, r0;
		float *acc = k == S - 1 ? out : buf[k & 1];
		memset(acc, 0, (size_t)bytes);
		int64_t n = block_rows(m, b, &r0);
		if (n > 0)
			fn(m, ctx, r0, n, acc);
		if (k > 0) {
			m->tp->ring_wait(m->tp->ctx, "async TP reduce-scatter ring step");
			llama_tp_add_rows(acc, acc, rin, blk);
		}
		if (k < S - 1)
			m->tp->ring_post(m->tp->ctx, acc, rin, bytes, (int)k,
			                 "async TP reduce-scatter ring step");
	}
}

/* ---------------------------------------------------------------- descriptors */

/* FLOPs of the matmul a ring hides behind, on one rank (its heads and FFN columns), for N
 * tokens: 2 x rows x in x out. A backward ring carries both gradient matmuls of w2 and wo
 * (the input gradient and the weight gradient, block by block) and one of the others'. */
static double ring_flops(const struct llama_config *c, int S, int64_t N, enum model_pass p,
                         enum llama_ring_mm mm)
{
	double N2 = 2.0 * (double)N, C = (double)c->dim, D = (double)c->head_dim;
	double HD = (double)(c->n_heads / S) * D, KVD = (double)(c->n_kv_heads / S) * D;
	double F = (double)(c->ffn_hidden / S), both = p == MODEL_PASS_BWD ? 2.0 : 1.0;
	switch (mm) {
	case LLAMA_MM_QKV:
		return N2 * C * (HD + 2 * KVD);
	case LLAMA_MM_WO:
		return both * N2 * HD * C;
	case LLAMA_MM_W13:
		return N2 * C * 2 * F;
	case LLAMA_MM_W2:
		return both * N2 * F * C;
	case LLAMA_MM_NONE:
		break;
	}
	return 0.0;
}

void llama_prog_descs_of(const struct llama_config *c, const struct llama_prog_shape *s,
                         enum model_ac ac, int u, enum model_pass p, struct model_prog *out)
{
	const struct llama_layout lay = {
	    .tp = s->tp > 1, .async = s->tp > 1 && s->async, .cp = s->cp > 1, .ring = s->cp_ring};
	struct llama_prog g = llama_prog_of((int)c->n_layers, lay.async, ac, u, p);
	struct llama_eff e;
	llama_prog_eff(g, lay, &e);
	const int tp = (int)s->tp;
	int64_t N = s->B * (s->cp > 1 ? s->T / s->cp : s->T), Ns = (N + tp - 1) / tp;
	memset(out, 0, sizeof(*out));
	for (int k = 1; k < e.n_ops; k += 2) {
		const struct llama_op *o = &g.ops[e.op[k].lo];
		CHECK(out->n < MODEL_PROG_MAX, "program of unit %d: too many collectives", u);
		if (o->role == MODEL_GROUP_CP) {
			llama_cp_coll(c, s, p, o->kind, o->ring, &out->c[out->n++]);
			continue;
		}
		int64_t blk =
		    (o->size == LLAMA_COLL_NORM ? (int64_t)sizeof(float) : Ns * s->elem_bytes) *
		    c->dim;
		out->c[out->n++] = (struct model_coll_desc){
		    .kind = o->kind,
		    .when = o->when,
		    .bytes = (int64_t)(tp - 1) * blk,
		    .group = tp,
		    .ring = o->ring,
		    .ring_flops = o->ring ? ring_flops(c, tp, N, p, o->ring_mm) : 0.0};
	}
}

struct llama_config llama_config_tp_slice(const struct llama_config *c, int64_t tp)
{
	struct llama_config r = *c;
	r.n_heads /= tp;
	r.n_kv_heads /= tp;
	r.ffn_hidden /= tp;
	r.vocab_size = (c->vocab_size + tp - 1) / tp;
	return r;
}
