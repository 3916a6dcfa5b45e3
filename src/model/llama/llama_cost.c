/* model/llama_cost: Llama's figures for the cost model — work per unit pass and term, the
 * activation bytes by checkpointing mode, and the calibration kernels at the model's shapes.
 * The work counts are what schedule/sched_cost.c divides by the measured rates. */
#include "model/llama/llama_cost.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kernels/attention_bf16.h"
#include "kernels/kernels.h"
#include "model/llama/llama.h"
#include "model/model.h"

/* ---------------------------------------------------------------- work */

/* The work of one block (and the head, embedding) at (B, T), fp32. */
struct llama_block_work {
	double fwd_mm, fwd_attn, fwd_elem, bwd_mm, bwd_attn, bwd_elem, head, embed;
};

static void block_work(const struct llama_config *c, int64_t B, int64_t T,
                       struct llama_block_work *w)
{
	double N = (double)(B * T), C = (double)c->dim, H = (double)c->n_heads;
	double D = (double)c->head_dim, HD = H * D, KVD = (double)c->n_kv_heads * D;
	double F = (double)c->ffn_hidden, V = (double)c->vocab_size, e = 4.0;
	w->fwd_mm = 2.0 * N * (C * HD + 2.0 * C * KVD + HD * C + 3.0 * C * F);
	w->fwd_attn = 2.0 * (double)B * H * (double)T * (double)T * D; /* causal half of 4BHT^2D */
	w->bwd_mm = 2.0 * w->fwd_mm;
	w->bwd_attn = 2.5 * w->fwd_attn; /* scores recomputed tile by tile, then 4 products */
	/* two norms (read x, write xn), RoPE on q and k in place, SwiGLU (read 2, write 1) */
	w->fwd_elem = e * (4.0 * N * C + 2.0 * N * (HD + KVD) + 3.0 * N * F);
	/* norm backward x2 (read dout, x; write dx; dw), both norms and SwiGLU recomputed,
	 * RoPE backward, SwiGLU backward (read 3, write 2) */
	w->bwd_elem = e * (8.0 * N * C + 4.0 * N * C + 2.0 * N * (HD + KVD) + 8.0 * N * F);
	w->head = 6.0 * N * C * V;  /* logits, their input and weight gradients, fused */
	w->embed = e * 5.0 * N * C; /* lookup: read + write; scatter: read dout, update rows */
}

/* ---------------------------------------------------------------- context parallelism */

/* A cp rank's tokens of each sequence. */
static int64_t cp_local_T(const struct model_cost_shape *s)
{
	return s->cp > 1 ? s->T / s->cp : s->T;
}

/* The share of the whole sequence's causal attention the critical path's cp rank computes:
 * head-tail balanced, rank r holds chunks r and 2cp-1-r, so every rank has 1/cp of it;
 * contiguous, the last shard's queries see all keys: rows (cp-1)T/cp..T of the triangle,
 * (2cp - 1) / cp^2 of it. */
double llama_cp_attn_share(const struct model_cost_shape *s)
{
	if (s->cp <= 1)
		return 1.0;
	double cp = (double)s->cp;
	return s->cp_headtail ? 1.0 / cp : (2.0 * cp - 1.0) / (cp * cp);
}

/* A block's work on a cp rank: token-local terms on its T/cp tokens (w at those shapes), the
 * attention of its queries against the keys they see, and llama_cp.c's copies: allgather
 * rearranges the gathered K/V (forward: read + write 2T rows; backward: that, zeroing the
 * dK/dV of all T keys, and restaging them rank-major), the ring copies its K/V into the
 * first slot and merges cp - 1 partial outputs (read out, lse, partial out and lse; write
 * out). Elementwise bytes in fp32, as block_work's. */
static void cp_block_work(const struct llama_config *c, const struct model_cost_shape *s,
                          struct llama_block_work *w)
{
	if (s->cp <= 1)
		return;
	double B = (double)s->B, T = (double)s->T, Tl = (double)cp_local_T(s), cp = (double)s->cp;
	double H = (double)c->n_heads, D = (double)c->head_dim, KVD = (double)c->n_kv_heads * D;
	w->fwd_attn = 2.0 * B * H * T * T * D * llama_cp_attn_share(s);
	w->bwd_attn = 2.5 * w->fwd_attn;
	double kv = 2.0 * B * T * KVD * 4.0; /* K and V of the whole sequence */
	if (s->cp_ring) {
		double merge = (cp - 1.0) * 4.0 * (3.0 * B * Tl * H * D + 3.0 * B * H * Tl);
		w->fwd_elem += 2.0 * kv / cp + merge;
		w->bwd_elem += 2.0 * kv / cp + kv / cp + 2.0 * kv / cp;
	} else {
		w->fwd_elem += 2.0 * kv;
		w->bwd_elem += 2.0 * kv + kv + 2.0 * kv;
	}
}

/* Units: 0 the embedding, 1..L the blocks, L + 1 the final norm + output (+ loss). A TP rank
 * computes its slice of the shapes (its heads, FFN columns and vocabulary piece); a cp rank
 * its T/cp tokens (cp_block_work). */
static void llama_unit_work(const struct model_config *mc, const struct model_cost_shape *s, int u,
                            model_cost_work wk)
{
	const struct llama_config c = llama_config_tp_slice(llama_cfg(mc), s->tp);
	const int L = (int)c.n_layers;
	struct llama_block_work w;
	block_work(&c, s->B, cp_local_T(s), &w);
	cp_block_work(&c, s, &w);
	double N = (double)(s->B * cp_local_T(s)), C = (double)c.dim, F = (double)c.ffn_hidden;
	double KVD = (double)c.n_kv_heads * (double)c.head_dim;
	double HD = (double)c.n_heads * (double)c.head_dim;
	double es = (double)s->elem_bytes / 4.0; /* elementwise traffic scales with the dtype */
	double *fw = wk[MODEL_PASS_FWD], *bw = wk[MODEL_PASS_BWD], *rc = wk[MODEL_PASS_REC];
	if (u == 0) {
		fw[MODEL_COST_EMBED] = es * 4.0 * 2.0 * N * C;
		bw[MODEL_COST_EMBED] = es * 4.0 * 3.0 * N * C;
		return;
	}
	if (u == L + 1) {
		fw[MODEL_COST_HEAD] = w.head;
		bw[MODEL_COST_ELEM] = es * 4.0 * 4.0 * N * C; /* final norm backward */
		return;
	}
	const enum model_ac ac = model_ac_block(s->ac, s->ac_every, u - 1); /* block u - 1's */
	fw[MODEL_COST_MATMUL] = w.fwd_mm;
	fw[MODEL_COST_ATTN] = w.fwd_attn;
	fw[MODEL_COST_ELEM] = es * w.fwd_elem;
	bw[MODEL_COST_MATMUL] = w.bwd_mm + (ac == MODEL_AC_FFN ? 4.0 * N * C * F : 0.0);
	bw[MODEL_COST_ATTN] = w.bwd_attn;
	bw[MODEL_COST_ELEM] = es * w.bwd_elem;
	if (ac == MODEL_AC_FULL) {
		rc[MODEL_COST_MATMUL] = w.fwd_mm;
		rc[MODEL_COST_ATTN] = w.fwd_attn;
		rc[MODEL_COST_ELEM] = es * w.fwd_elem;
	} else if (ac == MODEL_AC_SELECTIVE) {
		rc[MODEL_COST_MATMUL] = 2.0 * N * (C * KVD + HD * C + C * F); /* wk, wo, w3 */
		rc[MODEL_COST_ELEM] = es * 4.0 * (4.0 * N * C + 2.0 * N * KVD);
	}
}

/* One block's saved tensors under its own mode ac (never MODEL_AC_LAYER), in elements: what
 * it keeps, what the blocks that re-derive share, and backward scratch on top. */
static void block_elems(const struct llama_config *c, int64_t N, enum model_ac ac,
                        int64_t *per_block, int64_t *shared, int64_t *scratch_extra)
{
	int64_t C = c->dim, H = c->n_heads, D = c->head_dim, HD = H * D;
	int64_t KVD = c->n_kv_heads * D, F = c->ffn_hidden;
	/* one block's saved tensors, by name */
	int64_t x = N * C, rstd = N, q = N * HD, k = N * KVD, v = N * KVD, att = N * HD;
	int64_t lse = N * H, xmid = N * C, h = N * F;
	*shared = *scratch_extra = 0;
	switch (ac) {
	case MODEL_AC_FULL: /* keep the block input; everything else once, recomputed */
		*per_block = x;
		*shared = 2 * rstd + q + k + v + att + lse + xmid + 2 * h;
		break;
	case MODEL_AC_SELECTIVE: /* keep wq, wv, w1 matmul and attention outputs */
		*per_block = x + q + v + att + lse + h;
		*shared = 2 * rstd + k + xmid + h;
		break;
	case MODEL_AC_FFN: /* w1, w3 outputs recomputed into backward scratch */
		*per_block = x + 2 * rstd + q + k + v + att + lse + xmid;
		*scratch_extra = 2 * h;
		break;
	default:
		*per_block = x + 2 * rstd + q + k + v + att + lse + xmid + 2 * h;
	}
}

/* What llama_build_ex allocates for these shapes under `ac` (saved activations plus backward
 * scratch), e bytes per element. The shared set is the largest any block needs: blocks of
 * one model re-derive either nothing, the selective set or everything (per-layer: FULL and
 * NONE), each a subset of the next. */
static int64_t activation_bytes(const struct llama_config *c, int64_t B, int64_t T,
                                enum model_ac ac, int every, int64_t e)
{
	int64_t N = B * T, C = c->dim, H = c->n_heads, D = c->head_dim, HD = H * D;
	int64_t KVD = c->n_kv_heads * D, F = c->ffn_hidden, V = c->vocab_size, L = c->n_layers;
	int64_t q = N * HD, k = N * KVD, h = N * F;
	int64_t blocks = 0, shared = 0, scratch_extra = 0;
	for (int64_t l = 0; l < L; l++) {
		int64_t pb, sh, se;
		block_elems(c, N, model_ac_block(ac, every, (int)l), &pb, &sh, &se);
		blocks += pb;
		shared = sh > shared ? sh : shared;
		scratch_extra = se > scratch_extra ? se : scratch_extra;
	}
	int64_t ce_rows = llama_ce_rows(V, N);
	int64_t head = N * C + N + N * C + T * D; /* x_final, rstd_f, xn_final, rope tables */
	int64_t scratch = 3 * N * C + 3 * h + 2 * q + 2 * k + ce_rows * V + scratch_extra;
	int64_t tokens = 2 * N * 4; /* tokens + targets, int32 */
	return tokens + e * (blocks + shared + head + scratch);
}

/* Under tensor parallelism (sequence parallelism: the residual stream is sharded too) a rank
 * holds about 1/tp of the whole model's activations. */
static int64_t llama_activation_bytes(const struct model_config *mc,
                                      const struct model_cost_shape *s)
{
	int64_t a = activation_bytes(llama_cfg(mc), s->B, cp_local_T(s), s->ac, s->ac_every,
	                             s->elem_bytes);
	return (s->tp > 1 ? a / s->tp : a) + llama_cp_buf_bytes(mc, s);
}

/* llama_cp_build's buffers (blk: one shard's K of this TP rank's heads): allgather, the
 * gathered K/V and the dK/dV of all keys (their rank-major staging, then the reduce-scatter's
 * scratch); the ring, two slots of [K|V|dK|dV], a partial output and its lse. */
int64_t llama_cp_buf_bytes(const struct model_config *mc, const struct model_cost_shape *s)
{
	if (s->cp <= 1)
		return 0;
	const struct llama_config c = llama_config_tp_slice(llama_cfg(mc), s->tp);
	int64_t Tl = cp_local_T(s), KVD = c.n_kv_heads * c.head_dim, blk = s->B * Tl * KVD;
	int64_t floats = s->cp_ring
	                     ? 8 * blk + s->B * Tl * c.n_heads * c.head_dim + s->B * c.n_heads * Tl
	                     : 4 * s->cp * blk;
	return floats * s->elem_bytes;
}

/* One K/V transfer of a block's pass p over the cp group (llama_cp.c's program items), what
 * this rank sends:
 *   allgather: the gather of K and V, (cp - 1) shards each, in forward (and a full
 *     recompute) and again in backward; backward reduce-scatters dK and dV (kind);
 *   ring: forward (and a full recompute) passes K/V on cp - 1 times, each step beside the
 *     attention of the shard held; backward passes K/V on cp - 1 times beside the gradient
 *     of the shard held, and the shard's dK/dV on after it, cp times (the last brings it
 *     home), each waited for (back_bytes). */
void llama_cp_coll(const struct llama_config *full, const struct llama_prog_shape *ps,
                   enum model_pass p, enum model_coll kind, bool ring, struct model_coll_desc *out)
{
	const struct llama_config c = llama_config_tp_slice(full, ps->tp);
	const struct model_cost_shape s = {.B = ps->B,
	                                   .T = ps->T,
	                                   .tp = ps->tp,
	                                   .elem_bytes = ps->elem_bytes,
	                                   .cp = ps->cp,
	                                   .cp_ring = ps->cp_ring,
	                                   .cp_headtail = ps->cp_headtail};
	const int cp = (int)s.cp;
	int64_t blk = s.B * cp_local_T(&s) * c.n_kv_heads * c.head_dim * s.elem_bytes;
	*out = (struct model_coll_desc){.kind = kind,
	                                .bytes = (int64_t)(cp - 1) * 2 * blk,
	                                .group = cp,
	                                .role = MODEL_GROUP_CP,
	                                .steps = 2}; /* K, then V */
	if (!ring)
		return;
	struct llama_block_work w;
	block_work(&c, s.B, cp_local_T(&s), &w);
	cp_block_work(&c, &s, &w);
	out->steps = cp - 1;
	out->ring = true;
	out->ring_flops = (p == MODEL_PASS_BWD ? w.bwd_attn : w.fwd_attn) * (cp - 1) / cp;
	if (p == MODEL_PASS_BWD)
		out->back_bytes = (int64_t)cp * 2 * blk;
}

static double llama_cost_flops(const struct model_config *mc, int64_t seq_len)
{
	struct param_table t;
	CHECK(llama_table_build(&t, llama_cfg(mc)) == CT_OK, "llama: table");
	double f = llama_flops_per_token(llama_cfg(mc), &t, seq_len);
	param_table_free(&t);
	return f;
}

static void llama_cost_prog(const struct model_config *mc, const struct model_cost_shape *s,
                            bool async, int u, enum model_pass p, struct model_prog *out)
{
	const int L = (int)llama_cfg(mc)->n_layers;
	enum model_ac ac = u >= 1 && u <= L ? model_ac_block(s->ac, s->ac_every, u - 1) : s->ac;
	const struct llama_prog_shape ps = {.B = s->B,
	                                    .T = s->T,
	                                    .tp = s->tp,
	                                    .cp = s->cp,
	                                    .elem_bytes = s->elem_bytes,
	                                    .async = async,
	                                    .cp_ring = s->cp_ring,
	                                    .cp_headtail = s->cp_headtail};
	llama_prog_descs_of(llama_cfg(mc), &ps, ac, u, p, out);
}

/* ---------------------------------------------------------------- calibration */

/* The buffers of one block at (B, T) and the head, filled with small values. */
struct cal {
	int64_t B, T, N, C, H, KV, D, HD, KVD, F, V, chunk;
	float *x, *xn, *q, *k, *v, *att, *lse, *h1, *h3, *gate, *out, *rstd, *cos, *sin;
	float *dq, *dk, *dv, *dx, *dxn, *dh1, *dh3, *dres;
	float *wq, *wk, *wv, *wo, *w1, *w2, *w3, *wout, *nw, *dw, *scratch;
	int32_t *tok;
	float *all;
};

static void cal_alloc(struct cal *c, const struct llama_config *lc, int64_t B, int64_t T)
{
	memset(c, 0, sizeof(*c));
	c->T = T;
	c->B = B;
	c->N = c->B * c->T, c->C = lc->dim, c->H = lc->n_heads, c->KV = lc->n_kv_heads;
	c->D = lc->head_dim, c->HD = c->H * c->D, c->KVD = c->KV * c->D, c->F = lc->ffn_hidden;
	c->V = lc->vocab_size;
	c->chunk = llama_ce_rows(c->V, c->N);
	int64_t N = c->N, C = c->C, F = c->F, HD = c->HD, KVD = c->KVD, V = c->V;
	const struct model_cost_view parts[] = {{&c->x, N * C},
	             {&c->xn, N * C},
	             {&c->q, N * HD},
	             {&c->k, N * KVD},
	             {&c->v, N * KVD},
	             {&c->att, N * HD},
	             {&c->lse, N * c->H},
	             {&c->h1, N * F},
	             {&c->h3, N * F},
	             {&c->gate, N * F},
	             {&c->out, N * C},
	             {&c->rstd, N},
	             {&c->cos, c->T * c->D},
	             {&c->sin, c->T * c->D},
	             {&c->dq, N * HD},
	             {&c->dk, N * KVD},
	             {&c->dv, N * KVD},
	             {&c->dx, N * C},
	             {&c->dxn, N * C},
	             {&c->dh1, N * F},
	             {&c->dh3, N * F},
	             {&c->dres, N * C},
	             {&c->wq, HD * C},
	             {&c->wk, KVD * C},
	             {&c->wv, KVD * C},
	             {&c->wo, C * HD},
	             {&c->w1, F * C},
	             {&c->w2, C * F},
	             {&c->w3, F * C},
	             {&c->wout, V * C},
	             {&c->nw, C},
	             {&c->dw, (V > F ? V : F) * C},
	             {&c->scratch, c->chunk * V}};
	c->all = model_cost_cal_buffers(parts, sizeof(parts) / sizeof(parts[0]), &c->tok, N, V);
}

/* The parts, in the order they are timed. */
enum cal_part {
	CAL_FWD_MM,
	CAL_FWD_ATTN,
	CAL_FWD_ELEM,
	CAL_BWD_MM,
	CAL_BWD_ATTN,
	CAL_BWD_ELEM,
	CAL_HEAD,
	CAL_EMBED,
	CAL_PARTS
};
_Static_assert(CAL_PARTS <= MODEL_COST_PARTS_MAX, "calibration parts");

/* Run one part of a unit's work once, the kernels a Llama unit runs, in its order. */
static void cal_run(void *impl, int part)
{
	struct cal *c = impl;
	int64_t B = c->B, T = c->T, N = c->N, C = c->C, H = c->H, KV = c->KV, D = c->D;
	int64_t HD = c->HD, KVD = c->KVD, F = c->F, V = c->V;
	int64_t nv;
	switch ((enum cal_part)part) {
	case CAL_FWD_MM:
		matmul_forward_f32(c->q, c->xn, c->wq, N, C, HD, 0);
		matmul_forward_f32(c->k, c->xn, c->wk, N, C, KVD, 0);
		matmul_forward_f32(c->v, c->xn, c->wv, N, C, KVD, 0);
		matmul_forward_f32(c->out, c->att, c->wo, N, HD, C, 1);
		matmul_forward_f32(c->h1, c->xn, c->w1, N, C, F, 0);
		matmul_forward_f32(c->h3, c->xn, c->w3, N, C, F, 0);
		matmul_forward_f32(c->out, c->gate, c->w2, N, F, C, 1);
		break;
	case CAL_FWD_ATTN:
		attention_mixed_forward(c->att, c->lse, c->q, c->k, c->v, B, T, H, KV, D);
		break;
	case CAL_FWD_ELEM:
		rmsnorm_forward_f32(c->xn, c->rstd, c->x, c->nw, N, C, 1e-5);
		rope_forward_f32(c->q, c->cos, c->sin, B, T, H, D);
		rope_forward_f32(c->k, c->cos, c->sin, B, T, KV, D);
		rmsnorm_forward_f32(c->xn, c->rstd, c->out, c->nw, N, C, 1e-5);
		swiglu_forward_f32(c->gate, c->h1, c->h3, N * F);
		break;
	case CAL_BWD_MM:
		matmul_backward_f32(NULL, c->dw, c->dres, c->gate, c->w2, N, F, C);
		matmul_backward_f32(c->gate, NULL, c->dres, NULL, c->w2, N, F, C);
		matmul_backward_f32(c->dxn, c->dw, c->dh1, c->xn, c->w1, N, C, F);
		matmul_backward_f32(c->dxn, c->dw, c->dh3, c->xn, c->w3, N, C, F);
		matmul_backward_f32(c->dq, c->dw, c->dres, c->att, c->wo, N, HD, C);
		matmul_backward_f32(c->dxn, c->dw, c->dq, c->xn, c->wq, N, C, HD);
		matmul_backward_f32(c->dxn, c->dw, c->dk, c->xn, c->wk, N, C, KVD);
		matmul_backward_f32(c->dxn, c->dw, c->dv, c->xn, c->wv, N, C, KVD);
		break;
	case CAL_BWD_ATTN:
		attention_mixed_backward(c->dq, c->dk, c->dv, c->att, c->att, c->lse, c->q, c->k,
		                       c->v, B, T, H, KV, D);
		break;
	case CAL_BWD_ELEM:
		rmsnorm_forward_f32(c->xn, c->rstd, c->out, c->nw, N, C, 1e-5);
		swiglu_forward_f32(c->gate, c->h1, c->h3, N * F);
		swiglu_backward_f32(c->dh1, c->dh3, c->gate, c->h1, c->h3, N * F);
		rmsnorm_backward_f32(c->dres, c->dw, c->dxn, c->out, c->nw, c->rstd, N, C);
		rope_backward_f32(c->dq, c->cos, c->sin, B, T, H, D);
		rope_backward_f32(c->dk, c->cos, c->sin, B, T, KV, D);
		rmsnorm_forward_f32(c->xn, c->rstd, c->x, c->nw, N, C, 1e-5);
		rmsnorm_backward_f32(c->dres, c->dw, c->dxn, c->x, c->nw, c->rstd, N, C);
		break;
	case CAL_HEAD:
		rmsnorm_forward_f32(c->xn, c->rstd, c->x, c->nw, N, C, 1e-5);
		cross_entropy_fused_f32(c->dx, c->dw, c->xn, c->wout, c->tok, N, C, V, -100, 1e-3,
		                        c->scratch, c->chunk, &nv);
		break;
	case CAL_EMBED:
		embedding_forward_f32(c->x, c->tok, c->wout, N, C);
		embedding_backward_f32(c->dw, c->dres, c->tok, N, C);
		break;
	default:
		break;
	}
}

static void cal_free(void *impl)
{
	struct cal *c = impl;
	free(c->all), free(c->tok);
	free(c);
}

/* A TP rank's slice of one block, the head and the embedding at (B, T); each part's work is
 * what llama_unit_work counts for it in fp32 (the embedding part runs lookup and scatter). */
static void llama_calib_init(struct model_cost_calib *cal, const struct model_config *mc,
                             const struct model_cost_shape *s)
{
	const struct llama_config lc = llama_config_tp_slice(llama_cfg(mc), s->tp);
	struct cal *c = xcalloc(1, sizeof(*c));
	cal_alloc(c, &lc, s->B, cp_local_T(s)); /* the kernels at a cp rank's shapes */
	struct llama_block_work w;
	block_work(&lc, s->B, cp_local_T(s), &w);
	const struct model_cost_part parts[CAL_PARTS] = {
	    [CAL_FWD_MM] = {MODEL_PASS_FWD, MODEL_COST_MATMUL, w.fwd_mm},
	    [CAL_FWD_ATTN] = {MODEL_PASS_FWD, MODEL_COST_ATTN, w.fwd_attn},
	    [CAL_FWD_ELEM] = {MODEL_PASS_FWD, MODEL_COST_ELEM, w.fwd_elem},
	    [CAL_BWD_MM] = {MODEL_PASS_BWD, MODEL_COST_MATMUL, w.bwd_mm},
	    [CAL_BWD_ATTN] = {MODEL_PASS_BWD, MODEL_COST_ATTN, w.bwd_attn},
	    [CAL_BWD_ELEM] = {MODEL_PASS_BWD, MODEL_COST_ELEM, w.bwd_elem},
	    [CAL_HEAD] = {MODEL_PASS_COUNT, MODEL_COST_HEAD, w.head},
	    [CAL_EMBED] = {MODEL_PASS_COUNT, MODEL_COST_EMBED, w.embed},
	};
	cal->n_parts = CAL_PARTS;
	memcpy(cal->part, parts, sizeof(parts));
	cal->busy_part = CAL_FWD_MM;
	cal->impl = c;
	cal->run = cal_run;
	cal->free = cal_free;
}

const struct model_cost_ops llama_cost_ops = {
    .unit_work = llama_unit_work,
    .activation_bytes = llama_activation_bytes,
    .flops_per_token = llama_cost_flops,
    .unit_prog = llama_cost_prog,
    .calib_init = llama_calib_init,
};
