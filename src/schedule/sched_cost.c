/* schedule/sched_cost: work per node and term, and the two-resource timeline (calibration of
 * the rates: sched_calib.c). */
#include "schedule/sched_cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kernels/mm_engine.h"

/* ---------------------------------------------------------------- model side */

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

void sched_cost_init(struct sched_cost_model *cm, const struct model_config *c,
                     const struct model_cost_shape *sh, const struct sched *s, int64_t dp_shard,
                     bool bf16_gather)
{
	memset(cm, 0, sizeof(*cm));
	int U = s->n_units;
	cm->n_units = U;
	for (int k = 0; k < SCHED_WORK_COUNT; k++)
		for (int t = 0; t < SCHED_TERM_COUNT; t++)
			cm->work[k][t] = xcalloc((size_t)U, sizeof(double));
	for (int u = 0; u < U; u++) {
		model_cost_work w;
		model_cost_unit_work(c, sh, u, w);
		for (int k = 0; k < SCHED_WORK_COUNT; k++)
			for (int t = 0; t < SCHED_TERM_COUNT; t++)
				cm->work[k][t][u] = w[k][t];
	}
	if (sh->ep > 1 || sh->tp > 1) { /* (tp: a family's in-pass all-reduces) */
		cm->inner = xcalloc((size_t)U * SCHED_WORK_COUNT, sizeof(*cm->inner));
		for (int u = 0; u < U; u++)
			for (int k = 0; k < SCHED_WORK_COUNT; k++)
				model_cost_unit_inner(c, sh, u, (enum model_pass)k,
				                      &cm->inner[u * SCHED_WORK_COUNT + k]);
	}
	cm->dp_shard = dp_shard;
	cm->ag_elem_bytes = bf16_gather ? 2 : 4;
	cm->act_elem_bytes = sh->elem_bytes;
	int64_t shard = 0;
	for (int u = 0; u < U; u++)
		shard += s->units[u].shard_numel;
	cm->params_bytes = cm->grads_bytes = shard * 4;
	cm->optim_bytes = 2 * shard * 4;
	cm->act_bytes = model_cost_activation_bytes(c, sh);
	cm->full_elem_bytes = 4;
	cm->full_twin_bytes = mm_engine_dtype() == MM_BF16 ? 2 : 0;
	cm->mem_bytes_s = 10e9;
	cm->overlap = true;
}

void sched_cost_free(struct sched_cost_model *cm)
{
	for (int k = 0; k < SCHED_WORK_COUNT; k++)
		for (int t = 0; t < SCHED_TERM_COUNT; t++)
			free(cm->work[k][t]);
	free(cm->inner);
	memset(cm, 0, sizeof(*cm));
}

double sched_cost_node_s(const struct sched_cost_model *cm, enum sched_work k, int unit,
                         double terms[SCHED_TERM_COUNT])
{
	double sum = 0;
	for (int t = 0; t < SCHED_TERM_COUNT; t++) {
		double r = cm->rate[k][t];
		if (r <= 0)
			r = t == SCHED_TERM_ATTN                            ? cm->attn_flops
			    : t == SCHED_TERM_ELEM || t == SCHED_TERM_EMBED ? cm->mem_bytes_s
			                                                    : cm->matmul_flops;
		double x = cm->work[k][t][unit] > 0 ? cm->work[k][t][unit] / r : 0.0;
		if (terms)
			terms[t] = x;
		sum += x;
	}
	return sum;
}

double sched_cost_tp_s(const struct sched_cost_model *cm, enum sched_work work,
                       const struct model_coll_desc *c, double *comm_s)
{
	if (comm_s)
		*comm_s = 0.0;
	if (cm->tp_bytes_s <= 0 || c->when == MODEL_COLL_IF_NOT_FUSED || c->group < 2)
		return 0.0; /* a training step fuses the loss gradient into the forward */
	double t = cm->tp_latency_s + (double)c->bytes / cm->tp_bytes_s;
	if (comm_s)
		*comm_s = t;
	if (!c->ring)
		return t;
	/* ring: the first of group steps is exposed; the matmul beside it covers the rest */
	double r = cm->rate[work][SCHED_TERM_MATMUL] > 0 ? cm->rate[work][SCHED_TERM_MATMUL]
	                                                 : cm->matmul_flops;
	double first = t / (double)c->group, rest = t - first;
	double mm = r > 0 ? c->ring_flops / r : 0.0;
	return first + (rest > mm ? rest - mm : 0.0);
}

double sched_cost_cp_s(const struct sched_cost_model *cm, enum sched_work work,
                       const struct model_coll_desc *c, double *comm_s)
{
	if (comm_s)
		*comm_s = 0.0;
	if (cm->cp_bytes_s <= 0 || c->group < 2)
		return 0.0;
	double n = c->steps > 0 ? (double)c->steps : 1.0;
	double step = cm->cp_latency_s + (double)c->bytes / n / cm->cp_bytes_s;
	/* the ring backward's dK/dV steps: waited for one by one */
	double back = c->back_bytes > 0 ? (double)c->group * cm->cp_latency_s +
	                                      (double)c->back_bytes / cm->cp_bytes_s
	                                : 0.0;
	if (comm_s)
		*comm_s = n * step + back;
	if (!c->ring)
		return n * step + back;
	double r =
	    cm->rate[work][SCHED_TERM_ATTN] > 0 ? cm->rate[work][SCHED_TERM_ATTN] : cm->attn_flops;
	double hide = r > 0 ? c->ring_flops / r / n : 0.0;
	return n * (step > hide ? step - hide : 0.0) + back;
}

/* A ring node's own compute, which the executor runs inside the node: a CP ring's attention
 * of every shard it holds (ring_flops is that of the steps' shards, cp - 1 of cp) at the
 * attention rate; an async TP ring's fused matmul (ring_flops, all of it) at the matmul rate;
 * 0 for another collective. */
static double ring_inside_s(const struct sched_cost_model *cm, enum sched_work k,
                            const struct model_coll_desc *c)
{
	if (!c->ring)
		return 0.0;
	if (c->role == MODEL_GROUP_TP) {
		if (c->group < 2 || c->when == MODEL_COLL_IF_NOT_FUSED)
			return 0.0;
		double r = cm->rate[k][SCHED_TERM_MATMUL] > 0 ? cm->rate[k][SCHED_TERM_MATMUL]
		                                             : cm->matmul_flops;
		return r > 0 ? c->ring_flops / r : 0.0;
	}
	if (c->role != MODEL_GROUP_CP || c->steps < 1)
		return 0.0;
	double r = cm->rate[k][SCHED_TERM_ATTN] > 0 ? cm->rate[k][SCHED_TERM_ATTN] : cm->attn_flops;
	return r > 0 ? c->ring_flops * (c->steps + 1) / c->steps / r : 0.0;
}

/* A program collective on the cp group: its exposed time, counted into p's cp figures. */
static double prog_cp_s(const struct sched_cost_model *cm, enum sched_work k,
                        const struct model_coll_desc *c, struct sched_prediction *p)
{
	double wire;
	double t = sched_cost_cp_s(cm, k, c, &wire);
	p->cp_s += t;
	p->cp_comm_s += wire;
	p->cp_wire_bytes += c->bytes + c->back_bytes;
	return t;
}

double sched_cost_prog_cp_s(const struct sched *s, const struct sched_cost_model *cm, int u,
                            enum sched_work k)
{
	const enum model_pass mp = k == SCHED_WORK_FWD   ? MODEL_PASS_FWD
	                           : k == SCHED_WORK_BWD ? MODEL_PASS_BWD
	                                                 : MODEL_PASS_REC;
	const struct model_prog *g = &s->units[u].prog[mp];
	double t = 0.0;
	for (int j = 0; j < g->n; j++)
		if (g->c[j].role == MODEL_GROUP_CP)
			t += sched_cost_cp_s(cm, k, &g->c[j], NULL);
	return t;
}

double sched_cost_ep_s(const struct sched_cost_model *cm, const struct model_coll_desc *c)
{
	if (cm->ep_bytes_s <= 0 || c->group < 2)
		return 0.0;
	return cm->ep_latency_s + (double)c->bytes / cm->ep_bytes_s;
}

/* Unit u's in-pass ep collectives: their time in the pass (all of it: blocking calls), the
 * bytes sent and how many. */
static double inner_ep_s(const struct sched_cost_model *cm, int u, enum sched_work k,
                         int64_t *bytes, int64_t *n)
{
	double t = 0.0;
	*bytes = *n = 0;
	if (!cm->inner)
		return 0.0;
	const struct model_prog *g = &cm->inner[u * SCHED_WORK_COUNT + k];
	for (int j = 0; j < g->n; j++)
		if (g->c[j].role == MODEL_GROUP_EP) {
			t += sched_cost_ep_s(cm, &g->c[j]);
			*bytes += g->c[j].bytes;
			*n += 1;
		}
	return t;
}

/* Unit u's in-pass tp collectives (a family whose TP collectives run inside its passes,
 * as Hyena's all-reduces, rather than as program nodes): their time, blocking. */
static double inner_tp_s(const struct sched_cost_model *cm, int u, enum sched_work k)
{
	double t = 0.0;
	if (!cm->inner)
		return 0.0;
	const struct model_prog *g = &cm->inner[u * SCHED_WORK_COUNT + k];
	for (int j = 0; j < g->n; j++)
		if (g->c[j].role == MODEL_GROUP_TP)
			t += sched_cost_tp_s(cm, k, &g->c[j], NULL);
	return t;
}

double sched_cost_inner_s(const struct sched_cost_model *cm, int u, enum sched_work k)
{
	int64_t bytes, n;
	return inner_ep_s(cm, u, k, &bytes, &n) + inner_tp_s(cm, u, k);
}

/* A unit pass's compute under cm: a lowered schedule's segment carries its share (the pass
 * over its segments, evenly), an unlowered node the whole pass plus its program's
 * collectives. The in-pass collectives are in the first segment's. */
static double pass_compute_s(const struct sched *s, const struct sched_cost_model *cm,
                             const struct sched_node *n, enum sched_work k, double *tp_s,
                             struct sched_prediction *p)
{
	const struct model_prog *g = sched_node_prog(s, n);
	double dt = sched_cost_node_s(cm, k, n->unit, NULL), inner = 0.0;
	*tp_s = 0.0;
	if (cm->inner && (!s->lowered || n->seg == 0)) {
		int64_t bytes, ne;
		double ep = inner_ep_s(cm, n->unit, k, &bytes, &ne);
		p->ep_s += ep;
		p->ep_comm_s += ep;
		p->ep_wire_bytes += bytes;
		p->n_ep += ne;
		inner += ep;
		*tp_s += inner_tp_s(cm, n->unit, k); /* on the compute thread, as TP nodes */
	}
	if (s->lowered) { /* (a ring's attention or matmul is its node's, not the segments') */
		double rings = 0.0;
		for (int j = 0; j < g->n; j++)
			rings += ring_inside_s(cm, k, &g->c[j]);
		return (dt > rings ? dt - rings : 0.0) / (double)(g->n + 1) + inner;
	}
	for (int j = 0; j < g->n; j++) { /* unlowered: the program's collectives all block */
		const struct model_coll_desc *c = &g->c[j];
		if (c->role == MODEL_GROUP_CP)
			inner += prog_cp_s(cm, k, c, p);
		else
			*tp_s += c->role != MODEL_GROUP_EP     ? sched_cost_tp_s(cm, k, c, NULL)
			         : c->kind == MODEL_COLL_WAIT ? 0.0
			                                      : sched_cost_ep_s(cm, c);
	}
	return dt + inner;
}

static enum sched_work work_of(enum model_pass p)
{
	return p == MODEL_PASS_FWD   ? SCHED_WORK_FWD
	       : p == MODEL_PASS_BWD ? SCHED_WORK_BWD
	                             : SCHED_WORK_REC;
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

/* CPU seconds the comm thread spends on one collective of `wire` bytes. */
static double coll_cpu_s(const struct sched_cost_model *cm, bool ag, double wire)
{
	double lat = ag ? cm->ag_cpu_latency_s : cm->rs_cpu_latency_s,
	       rate = ag ? cm->ag_cpu_bytes_s : cm->rs_cpu_bytes_s;
	return rate > 0 ? lat + wire / rate : 0.0;
}

/* The comm thread's CPU that compute owes (overlap): cumulative seconds charged at issue
 * (interference x the collective's CPU) and repaid, in FIFO order as the stream runs them. */
struct debt {
	double issued, paid;
};

/* Compute of dt seconds repays at up to half its speed (two threads sharing a core): returns
 * the wall time it takes. */
static double repay(struct debt *d, double dt)
{
	double owed = d->issued - d->paid, pay = owed < dt ? owed : dt;
	d->paid += pay;
	return dt + pay;
}

/* The compute a TP or CP ring node runs on the compute thread (its fused matmul or attention):
 * counted as compute, and its wall time with what it repays of the comm thread's CPU debt. */
static double ring_compute_wall(const struct sched_cost_model *cm, enum sched_work k,
                                const struct model_coll_desc *c, struct sched_prediction *p,
                                struct debt *debt)
{
	double in = ring_inside_s(cm, k, c);
	p->compute_s += in;
	double wall = repay(debt, in);
	p->comm_cpu_paid_s += wall - in;
	return wall;
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
	int64_t max_recv = 0; /* a bucket's gathered elements: N x shard, or its groups' (ep) */
	for (int b = 0; b < Bk; b++) {
		int64_t f = sched_bucket_full(s, b), sh = sched_bucket_shard(s, b), r = N * sh;
		const struct sched_bucket *bk = &s->buckets[b];
		if (s->units[bk->unit0].peer_numel > 0) {
			r = 0;
			for (int u = bk->unit0; u < bk->unit0 + bk->n_units; u++)
				r += s->units[u].peer_numel + s->units[u].shard_numel;
		}
		max_full = f > max_full ? f : max_full;
		max_shard = sh > max_shard ? sh : max_shard;
		max_recv = r > max_recv ? r : max_recv;
		shard_total += sh;
	}
	struct pool_count pw = {0}, pg = {0}, agr = {0}, rss = {0};
	double mem = cm->mem_bytes_s, esz = (double)cm->ag_elem_bytes;
	int64_t ag_bytes = 0; /* exact wire bytes per rank of each all-gather (below) */
	double t = (double)shard_total * 4.0 / mem, cf = 0; /* zero the gradient shards */
	double ep_end = 0; /* the posted ep all-to-all's arrival */
	struct debt debt = {0, 0};
	double *ag_need = xcalloc((size_t)Bk, sizeof(double)),
	       *rs_need = xcalloc((size_t)Bk, sizeof(double)); /* debt.issued through the op */
	for (int i = 0; i < s->n_nodes; i++) {
		const struct sched_node *n = &s->nodes[i];
		double t0 = t;
		int b = n->bucket;
		double S = b >= 0 ? (double)sched_bucket_shard(s, b) : 0.0;
		double full = b >= 0 ? (double)sched_bucket_full(s, b) : 0.0;
		bool no_comm =
		    cm->single && (n->kind == SCHED_ALL_GATHER || n->kind == SCHED_REDUCE_SCATTER ||
		                   n->kind == SCHED_WAIT);
		switch (no_comm ? SCHED_KIND_COUNT : n->kind) {
		case SCHED_ALL_GATHER:
		case SCHED_REDUCE_SCATTER: {
			bool ag = n->kind == SCHED_ALL_GATHER;
			/* copy-in: a bf16 cast of the shard, or the rank-major gradient layout */
			t += ag ? (esz < 4 ? S * 6.0 / mem : 0.0) : 2.0 * (double)N * S * 4.0 / mem;
			double ag_b = S * esz;
			const struct sched_bucket *bk = &s->buckets[b];
			if (ag && cm->ag_unit_esz) {
				ag_b = 0;
				for (int u = bk->unit0; u < bk->unit0 + bk->n_units; u++)
					ag_b +=
					    (double)s->units[u].shard_numel * cm->ag_unit_esz[u];
			}
			if (ag)
				ag_bytes += (int64_t)ag_b;
			double wire = (double)(N - 1) * (ag ? ag_b : S * 4.0);
			if (s->units[bk->unit0].peer_numel > 0) { /* groups of their own (ep) */
				wire = 0;
				for (int u = bk->unit0; u < bk->unit0 + bk->n_units; u++) {
					double e = !ag                ? 4.0
					           : cm->ag_unit_esz ? cm->ag_unit_esz[u]
					                             : esz;
					wire += (double)s->units[u].peer_numel * e;
				}
			}
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
			} else if (N > 1) {
				double cpu = coll_cpu_s(cm, ag, wire);
				p->comm_cpu_s += cpu;
				debt.issued += cm->interference * cpu;
				(ag ? ag_need : rs_need)[b] = debt.issued;
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
			if (end > t) { /* the stall: the comm thread has the core */
				p->exposed_s += end - t;
				double owed = debt.issued - debt.paid;
				debt.paid += owed < end - t ? owed : end - t;
				t = end;
			}
			double need = ag ? ag_need[b] : rs_need[b];
			if (need > debt.paid) { /* its CPU (and its elders') not yet taken from
			                           compute: the collective finishes that much later */
				p->exposed_s += need - debt.paid;
				p->comm_cpu_paid_s += need - debt.paid;
				t += need - debt.paid;
				debt.paid = need;
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
		case SCHED_TP_ALL_GATHER:
		case SCHED_TP_REDUCE_SCATTER: { /* blocking, on the compute thread: an async TP
		                                   ring's fused matmul, and what of its steps the
		                                   matmul did not hide */
			const struct model_coll_desc *c = &sched_node_prog(s, n)->c[n->seg];
			double dt = sched_cost_tp_s(cm, work_of(n->pass), c, NULL);
			p->tp_s += dt;
			double wall = ring_compute_wall(cm, work_of(n->pass), c, p, &debt);
			t += wall + dt;
			break;
		}
		case SCHED_CP_ALL_GATHER:
		case SCHED_CP_REDUCE_SCATTER:
		case SCHED_CP_RING: { /* on the compute thread: the ring's attention, and what of
		                         its steps the attention did not hide */
			const struct model_coll_desc *c = &sched_node_prog(s, n)->c[n->seg];
			double wall = ring_compute_wall(cm, work_of(n->pass), c, p, &debt);
			t += wall + prog_cp_s(cm, work_of(n->pass), c, p);
			break;
		}
		case SCHED_EP_ALL_TO_ALL: { /* posted: on a stream of its own (not behind the FSDP
			                               collectives), its wait exposes what the segment
			                               between did not hide */
			const struct model_coll_desc *c = &sched_node_prog(s, n)->c[n->seg];
			double dt = sched_cost_ep_s(cm, c);
			p->ep_comm_s += dt;
			p->ep_wire_bytes += c->bytes;
			p->n_ep++;
			if (c->post) {
				ep_end = t + dt;
			} else {
				p->ep_s += dt;
				t += dt; /* blocking, on the compute thread */
			}
			break;
		}
		case SCHED_EP_WAIT:
			if (ep_end > t) {
				p->ep_s += ep_end - t;
				t = ep_end;
			}
			break;
		case SCHED_FWD:
		case SCHED_BWD:
		case SCHED_RECOMPUTE: {
			int u = n->unit;
			double tp;
			double dt = pass_compute_s(s, cm, n, work_of(sched_node_pass(n)), &tp, p);
			p->compute_s += dt;
			p->tp_s += tp;
			double wall = repay(&debt, dt);
			p->comm_cpu_paid_s += wall - dt;
			t += wall + tp;
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
			t += (double)shard_total * SCHED_OPTIM_BYTES /
			     (cm->optim_bytes_s > 0 ? cm->optim_bytes_s : mem);
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
	p->ag_wire_bytes = ag_bytes;
	p->full_params_bytes = pw.peak * (int64_t)(max_full * (fe + (double)cm->full_twin_bytes));
	p->full_grads_bytes = pg.peak * (int64_t)(max_full * fe);
	p->comm_bytes = agr.peak * max_recv * cm->ag_elem_bytes +
	                (cm->ag_elem_bytes < 4 ? agr.peak * max_shard * 2 : 0) +
	                rss.peak * (max_recv * 4 + 2 * max_shard * 4);
	p->peak_bytes = cm->params_bytes + cm->grads_bytes + cm->optim_bytes + cm->act_bytes +
	                cm->other_bytes + p->full_params_bytes + p->full_grads_bytes +
	                p->comm_bytes;
	free(ag_end), free(rs_end), free(grads), free(ag_need), free(rs_need);
}
