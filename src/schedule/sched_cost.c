/* schedule/sched_cost: FLOPs and bytes per node, calibration, and the two-resource timeline. */
#include "schedule/sched_cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/timer.h"
#include "comm/comm.h"
#include "kernels/kernels.h"

/* ---------------------------------------------------------------- model side */

int64_t sched_cost_activation_bytes(const struct llama_config *c, int64_t B, int64_t T,
                                    enum model_ac ac, int64_t e)
{
	int64_t N = B * T, C = c->dim, H = c->n_heads, D = c->head_dim, HD = H * D;
	int64_t KVD = c->n_kv_heads * D, F = c->ffn_hidden, V = c->vocab_size, L = c->n_layers;
	/* one block's saved tensors, by name */
	int64_t x = N * C, rstd = N, q = N * HD, k = N * KVD, v = N * KVD, att = N * HD;
	int64_t lse = N * H, xmid = N * C, h = N * F;
	int64_t per_block, shared = 0, scratch_extra = 0;
	switch (ac) {
	case MODEL_AC_FULL: /* keep the block input; everything else once, recomputed */
		per_block = x;
		shared = 2 * rstd + q + k + v + att + lse + xmid + 2 * h;
		break;
	case MODEL_AC_SELECTIVE: /* keep wq, wv, w1 matmul and attention outputs */
		per_block = x + q + v + att + lse + h;
		shared = 2 * rstd + k + xmid + h;
		break;
	case MODEL_AC_FFN: /* w1, w3 outputs recomputed into backward scratch */
		per_block = x + 2 * rstd + q + k + v + att + lse + xmid;
		scratch_extra = 2 * h;
		break;
	default:
		per_block = x + 2 * rstd + q + k + v + att + lse + xmid + 2 * h;
	}
	int64_t ce_chunk = (4 << 20) / (4 * V);
	ce_chunk = ce_chunk < 1 ? 1 : (ce_chunk > N ? N : ce_chunk);
	int64_t head = N * C + N + N * C + T * D; /* x_final, rstd_f, xn_final, rope tables */
	int64_t scratch = 3 * N * C + 3 * h + 2 * q + 2 * k + ce_chunk * V + scratch_extra;
	int64_t tokens = 2 * N * 4; /* tokens + targets, int32 */
	return tokens + e * (L * per_block + shared + head + scratch);
}

void sched_units_from_table(const struct param_table *t, int64_t dp_shard, struct sched_unit *out)
{
	for (int u = 0; u < t->n_units; u++)
		out[u] = (struct sched_unit){.full_numel = t->unit_begin[u + 1] - t->unit_begin[u],
		                             .is_block = u > 0 && u < t->n_units - 1};
	for (int i = 0; i < t->count; i++) {
		const struct param_entry *p = &t->p[i];
		int64_t rows = p->shape[0], cols = p->numel / rows;
		out[p->unit].shard_numel += (rows + dp_shard - 1) / dp_shard * cols;
	}
}

void sched_cost_init(struct sched_cost_model *cm, const struct llama_config *c, int64_t B,
                     int64_t T, const struct sched *s, int64_t dp_shard, bool bf16_gather,
                     enum model_ac ac, int64_t act_elem_bytes)
{
	memset(cm, 0, sizeof(*cm));
	int U = s->n_units;
	cm->n_units = U;
	double **arr[] = {&cm->fwd_mm,   &cm->fwd_attn, &cm->bwd_mm,
	                  &cm->bwd_attn, &cm->rec_mm,   &cm->rec_attn};
	for (size_t i = 0; i < sizeof(arr) / sizeof(arr[0]); i++)
		*arr[i] = xcalloc((size_t)U, sizeof(double));
	double N = (double)(B * T), C = (double)c->dim, H = (double)c->n_heads;
	double D = (double)c->head_dim, HD = H * D, KVD = (double)c->n_kv_heads * D;
	double F = (double)c->ffn_hidden, V = (double)c->vocab_size;
	double mm = 2.0 * N * (C * HD + 2.0 * C * KVD + HD * C + 3.0 * C * F);
	double attn = 2.0 * (double)B * H * (double)T * (double)T * D; /* causal: half of 4BHT^2D */
	for (int u = 1; u < U - 1; u++) {
		cm->fwd_mm[u] = mm;
		cm->fwd_attn[u] = attn;
		cm->bwd_mm[u] = 2.0 * mm + (ac == MODEL_AC_FFN ? 4.0 * N * C * F : 0.0);
		cm->bwd_attn[u] = 2.5 * attn; /* scores recomputed tile by tile, then 4 products */
		if (ac == MODEL_AC_FULL) {
			cm->rec_mm[u] = mm;
			cm->rec_attn[u] = attn;
		} else if (ac == MODEL_AC_SELECTIVE) {
			cm->rec_mm[u] = 2.0 * N * (C * KVD + HD * C + C * F); /* wk, wo, w3 */
		}
	}
	cm->fwd_mm[U - 1] = 6.0 * N * C * V; /* logits, their input and weight gradients, fused */
	cm->dp_shard = dp_shard;
	cm->ag_elem_bytes = bf16_gather ? 2 : 4;
	cm->act_elem_bytes = act_elem_bytes;
	int64_t shard = 0;
	for (int u = 0; u < U; u++)
		shard += s->units[u].shard_numel;
	cm->params_bytes = cm->grads_bytes = shard * 4;
	cm->optim_bytes = 2 * shard * 4;
	cm->act_bytes = sched_cost_activation_bytes(c, B, T, ac, act_elem_bytes);
	cm->full_elem_bytes = 4;
	cm->mem_bytes_s = 10e9;
	cm->overlap = true;
}

void sched_cost_free(struct sched_cost_model *cm)
{
	free(cm->fwd_mm), free(cm->fwd_attn), free(cm->bwd_mm);
	free(cm->bwd_attn), free(cm->rec_mm), free(cm->rec_attn);
	memset(cm, 0, sizeof(*cm));
}

/* ---------------------------------------------------------------- calibration */

static double median(double *v, int n)
{
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
			double t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Least-squares line time = a + b * bytes; returns latency a (>= 0) and rate 1/b. */
static void fit_line(const double *bytes, const double *t, int n, double *lat, double *rate)
{
	double sx = 0, sy = 0, sxx = 0, sxy = 0;
	for (int i = 0; i < n; i++) {
		sx += bytes[i], sy += t[i], sxx += bytes[i] * bytes[i], sxy += bytes[i] * t[i];
	}
	double den = n * sxx - sx * sx;
	double b = den > 0 ? (n * sxy - sx * sy) / den : 0.0;
	if (b <= 0) /* flat: all latency; bandwidth from the largest size */
		b = t[n - 1] / bytes[n - 1];
	double a = (sy - b * sx) / n;
	*lat = a > 1e-7 ? a : 1e-7;
	*rate = 1.0 / b;
}

#define CAL_SIZES 3

static double time_op(struct comm_stream *st, struct comm_op *op)
{
	double best = 1e30;
	for (int r = 0; r < 3; r++) {
		double t0 = timer_now();
		comm_stream_wait(st, comm_stream_enqueue(st, op));
		double t = timer_now() - t0;
		best = t < best ? t : best;
	}
	return best;
}

void sched_cost_calibrate(struct sched_cost_model *cm, const struct llama_config *c, int64_t B,
                          int64_t T, struct comm_stream *stream, const struct comm_group *group,
                          const struct comm_group *world)
{
	/* compute: sgemm at a block's FFN shape, attention at one sequence, a large copy */
	int64_t N = B * T > 2048 ? 2048 : B * T, C = c->dim, F = c->ffn_hidden;
	int64_t Ta = T > 512 ? 512 : T, H = c->n_heads, KV = c->n_kv_heads, D = c->head_dim;
	size_t fl = sizeof(float);
	int64_t big = N * F > Ta * H * D * 4 ? N * F : Ta * H * D * 4;
	float *a = calloc((size_t)(N * C > big ? N * C : big), fl),
	      *w = calloc((size_t)(F * C), fl);
	float *o = calloc((size_t)big, fl), *lse = calloc((size_t)(H * Ta), fl);
	CHECK(a && w && o && lse, "out of memory");
	for (int64_t i = 0; i < F * C; i++)
		w[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
	for (int64_t i = 0; i < N * C; i++)
		a[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
	double best = 1e30;
	for (int r = 0; r < 3; r++) {
		double t0 = timer_now();
		matmul_forward_f32(o, a, w, N, C, F, 0);
		double t = timer_now() - t0;
		best = t < best ? t : best;
	}
	double vals[3 + 4 * CAL_SIZES];
	vals[0] = 2.0 * (double)N * (double)C * (double)F / best;
	best = 1e30;
	for (int r = 0; r < 2; r++) {
		double t0 = timer_now();
		attention_forward_f32(o, lse, a, a, a, 1, Ta, H, KV, D);
		double t = timer_now() - t0;
		best = t < best ? t : best;
	}
	vals[1] = 2.0 * (double)H * (double)Ta * (double)Ta * (double)D / best;
	best = 1e30;
	for (int r = 0; r < 3; r++) {
		double t0 = timer_now();
		memcpy(o, a, (size_t)(N * C) * fl);
		double t = timer_now() - t0;
		best = t < best ? t : best;
	}
	vals[2] = 2.0 * (double)(N * C) * (double)fl / best; /* read + write */
	free(a), free(w), free(o), free(lse);

	/* collectives on the stream (the simulated link applies), bytes per rank */
	static const int64_t sizes[CAL_SIZES] = {64 << 10, 1 << 20, 8 << 20};
	int64_t n = group->size;
	char *send = calloc((size_t)sizes[CAL_SIZES - 1], 1);
	char *recv = calloc((size_t)(n * sizes[CAL_SIZES - 1]), 1);
	float *scr = calloc((size_t)(3 * sizes[CAL_SIZES - 1]), 1);
	CHECK(send && recv && scr, "out of memory");
	for (int i = 0; i < CAL_SIZES; i++) {
		struct comm_op ag = {COMM_ALL_GATHER,         group, send, recv, sizes[i], NULL,
		                     "calibration all-gather"};
		int64_t cnt = sizes[i] / 4 / n;
		struct comm_op rs = {COMM_REDUCE_SCATTER,         group, recv, scr, cnt, scr + cnt,
		                     "calibration reduce-scatter"};
		vals[3 + 4 * i] = (double)comm_op_wire_bytes(&ag);
		vals[4 + 4 * i] = time_op(stream, &ag);
		vals[5 + 4 * i] = (double)comm_op_wire_bytes(&rs);
		vals[6 + 4 * i] = time_op(stream, &rs);
	}
	free(send), free(recv), free(scr);

	/* every rank: the median over ranks of every measurement */
	int nv = 3 + 4 * CAL_SIZES, W = world->size;
	double *all = calloc((size_t)(nv * W), sizeof(double)),
	       *col = calloc((size_t)W, sizeof(double));
	CHECK(all && col, "out of memory");
	comm_all_gather(world, vals, all, nv * (int64_t)sizeof(double));
	for (int k = 0; k < nv; k++) {
		for (int r = 0; r < W; r++)
			col[r] = all[r * nv + k];
		vals[k] = median(col, W);
	}
	free(all), free(col);
	cm->matmul_flops = vals[0];
	cm->attn_flops = vals[1];
	cm->mem_bytes_s = vals[2];
	double xb[CAL_SIZES], ty[CAL_SIZES];
	if (n > 1) {
		for (int i = 0; i < CAL_SIZES; i++)
			xb[i] = vals[3 + 4 * i], ty[i] = vals[4 + 4 * i];
		fit_line(xb, ty, CAL_SIZES, &cm->ag_latency_s, &cm->ag_bytes_s);
		for (int i = 0; i < CAL_SIZES; i++)
			xb[i] = vals[5 + 4 * i], ty[i] = vals[6 + 4 * i];
		fit_line(xb, ty, CAL_SIZES, &cm->rs_latency_s, &cm->rs_bytes_s);
	} else {
		cm->ag_latency_s = cm->rs_latency_s = 0;
		cm->ag_bytes_s = cm->rs_bytes_s = 1e30;
	}
}

/* ---------------------------------------------------------------- timeline and memory */

struct pool_count {
	int64_t cur, peak;
};

static void take(struct pool_count *p, int64_t k)
{
	p->cur += k;
	if (p->cur > p->peak)
		p->peak = p->cur;
}

void sched_predict(const struct sched *s, const struct sched_cost_model *cm,
                   struct sched_prediction *p, double *node_t)
{
	memset(p, 0, sizeof(*p));
	int Bk = s->n_buckets;
	double *ag_end = xcalloc((size_t)Bk, sizeof(double)),
	       *rs_end = xcalloc((size_t)Bk, sizeof(double));
	bool *grads = xcalloc((size_t)Bk, sizeof(bool));
	int64_t max_full = 0, max_shard = 0, shard_total = 0, N = cm->dp_shard;
	for (int b = 0; b < Bk; b++) {
		int64_t f = sched_bucket_full(s, b), sh = sched_bucket_shard(s, b);
		max_full = f > max_full ? f : max_full;
		max_shard = sh > max_shard ? sh : max_shard;
		shard_total += sh;
	}
	struct pool_count pw = {0}, pg = {0}, agr = {0}, rss = {0};
	double t = 0, cf = 0, mem = cm->mem_bytes_s, esz = (double)cm->ag_elem_bytes;
	for (int i = 0; i < s->n_nodes; i++) {
		const struct sched_node *n = &s->nodes[i];
		double t0 = t;
		int b = n->bucket;
		double S = b >= 0 ? (double)sched_bucket_shard(s, b) : 0.0;
		double full = b >= 0 ? (double)sched_bucket_full(s, b) : 0.0;
		switch (n->kind) {
		case SCHED_ALL_GATHER:
		case SCHED_REDUCE_SCATTER: {
			bool ag = n->kind == SCHED_ALL_GATHER;
			/* copy-in: a bf16 cast of the shard, or the rank-major gradient layout */
			t += ag ? (esz < 4 ? S * 6.0 / mem : 0.0) : 2.0 * (double)N * S * 4.0 / mem;
			double wire = (double)(N - 1) * S * (ag ? esz : 4.0);
			double dur = N > 1 ? (ag ? cm->ag_latency_s + wire / cm->ag_bytes_s
			                         : cm->rs_latency_s + wire / cm->rs_bytes_s)
			                   : 0.0;
			double start = t > cf ? t : cf, end = start + dur;
			cf = end;
			p->comm_s += dur;
			p->n_collectives++;
			if (!cm->overlap) { /* runs at issue: all of it blocks compute */
				p->exposed_s += end - t;
				t = end;
			}
			if (ag) {
				ag_end[b] = end;
				take(&agr, 1);
			} else {
				rs_end[b] = end;
				take(&rss, 1);
				if (grads[b]) {
					grads[b] = false;
					take(&pg, -1);
				}
			}
			break;
		}
		case SCHED_WAIT: {
			bool ag = n->wait_kind == SCHED_ALL_GATHER;
			double end = ag ? ag_end[b] : rs_end[b];
			if (end > t) {
				p->exposed_s += end - t;
				t = end;
			}
			if (ag) { /* copy-out into the full buffer */
				t += ((double)N * S * esz + full * 4.0) / mem;
				take(&agr, -1);
				take(&pw, 1);
			} else {
				t += 3.0 * S * 4.0 / mem;
				take(&rss, -1);
			}
			break;
		}
		case SCHED_FREE:
			take(&pw, -1);
			break;
		case SCHED_FWD:
		case SCHED_BWD:
		case SCHED_RECOMPUTE: {
			int u = n->unit;
			const double *mm = n->kind == SCHED_FWD   ? cm->fwd_mm
			                   : n->kind == SCHED_BWD ? cm->bwd_mm
			                                          : cm->rec_mm;
			const double *at = n->kind == SCHED_FWD   ? cm->fwd_attn
			                   : n->kind == SCHED_BWD ? cm->bwd_attn
			                                          : cm->rec_attn;
			double dt = mm[u] / cm->matmul_flops + at[u] / cm->attn_flops;
			t += dt;
			p->compute_s += dt;
			int gb = sched_bucket_of(s, u);
			if ((n->kind == SCHED_BWD ||
			     (n->kind == SCHED_FWD && u == s->n_units - 1)) &&
			    !grads[gb]) {
				grads[gb] = true;
				take(&pg, 1);
			}
			break;
		}
		case SCHED_CLIP:
			t += (double)shard_total * 4.0 / mem + 2.0 * cm->ag_latency_s;
			break;
		case SCHED_OPTIM:
			t += (double)shard_total * 4.0 * 7.0 / mem;
			break;
		default:
			break;
		}
		if (node_t) {
			node_t[2 * i] = t0;
			node_t[2 * i + 1] = t;
		}
	}
	p->step_s = t;
	double fe = (double)cm->full_elem_bytes;
	p->full_params_bytes = pw.peak * (int64_t)(max_full * fe);
	p->full_grads_bytes = pg.peak * (int64_t)(max_full * fe);
	p->comm_bytes = agr.peak * N * max_shard * cm->ag_elem_bytes +
	                (cm->ag_elem_bytes < 4 ? agr.peak * max_shard * 2 : 0) +
	                rss.peak * (N * max_shard * 4 + 3 * max_shard * 4);
	p->peak_bytes = cm->params_bytes + cm->grads_bytes + cm->optim_bytes + cm->act_bytes +
	                cm->other_bytes + p->full_params_bytes + p->full_grads_bytes +
	                p->comm_bytes;
	free(ag_end), free(rs_end), free(grads);
}
