/* schedule/sched_cost_pp: the cost model of a pipeline step — every pipeline rank's node list
 * (sched_build_pp) timed together, each rank's compute thread running its nodes in order and a
 * WAIT on a receive stalling until the matching send, on the neighbour's timeline, has
 * crossed the link. */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/timer.h"
#include "comm/p2p.h"
#include "schedule/sched_cost.h"

/* A stage's units (its bucket on this rank). */
static void stage_units(const struct sched *s, int stage, int *u0, int *u1)
{
	const struct sched_bucket *b = &s->buckets[stage / s->pp_size];
	*u0 = b->unit0;
	*u1 = b->unit0 + b->n_units;
}

double sched_cost_pp_node_s(const struct sched *s, const struct sched_cost_model *cm,
                            const struct sched_node *n)
{
	int u0, u1, L = s->n_units - 2;
	stage_units(s, n->stage, &u0, &u1);
	double t = 0;
	for (int u = u0; u < u1; u++) {
		double terms[SCHED_TERM_COUNT];
		/* with the K/V transfers of context parallelism in the programs of the attention
		 * passes (the backward's in I: the attention core's backward is in the
		 * input-gradient half) */
		double f = sched_cost_node_s(cm, SCHED_WORK_FWD, u, NULL) +
		           sched_cost_inner_s(cm, u, SCHED_WORK_FWD) +
		           sched_cost_prog_cp_s(s, cm, u, SCHED_WORK_FWD);
		double b = sched_cost_node_s(cm, SCHED_WORK_BWD, u, terms) +
		           sched_cost_node_s(cm, SCHED_WORK_REC, u, NULL) +
		           sched_cost_inner_s(cm, u, SCHED_WORK_BWD) +
		           sched_cost_inner_s(cm, u, SCHED_WORK_REC) +
		           sched_cost_prog_cp_s(s, cm, u, SCHED_WORK_BWD) +
		           sched_cost_prog_cp_s(s, cm, u, SCHED_WORK_REC);
		/* the split backward: W is the weight-gradient half of a block's matmuls and the
		 * embedding's scatter; the head computes its weight gradient in I */
		double w = u == 0 ? b : (u > L ? 0.0 : terms[SCHED_TERM_MATMUL] / 2.0);
		switch (n->kind) {
		case SCHED_PP_F: t += f; break;
		case SCHED_PP_B: t += b; break;
		case SCHED_PP_I: t += b - w; break;
		case SCHED_PP_W: t += w; break;
		default: break;
		}
	}
	return t;
}

/* Seconds of a non-compute node on one rank (the sends and receives are posted at no cost;
 * their time is the link's, priced at the WAIT). */
static double other_node_s(const struct sched *s, const struct sched_cost_model *cm,
                           const struct sched_node *n)
{
	double mem = cm->mem_bytes_s, N = (double)cm->dp_shard, shard_total = 0;
	for (int b = 0; b < s->n_buckets; b++)
		shard_total += (double)sched_bucket_shard(s, b);
	double S = n->bucket >= 0 ? (double)sched_bucket_shard(s, n->bucket) : 0.0;
	double full = n->bucket >= 0 ? (double)sched_bucket_full(s, n->bucket) : 0.0;
	switch (n->kind) {
	case SCHED_ALL_GATHER: /* blocking, then the copy-out into the stage's full buffer */
		return (N > 1 ? cm->ag_latency_s +
		                    (N - 1) * S * (double)cm->ag_elem_bytes / cm->ag_bytes_s
		              : 0.0) +
		       (N * S * (double)cm->ag_elem_bytes + full * 4.0) / mem;
	case SCHED_REDUCE_SCATTER: /* the rank-major copy-in, blocking, then nothing to add */
		return 2.0 * N * S * 4.0 / mem +
		       (N > 1 ? cm->rs_latency_s + (N - 1) * S * 4.0 / cm->rs_bytes_s : 0.0);
	case SCHED_CLIP:
		return shard_total * 4.0 / mem + 3.0 * cm->ag_latency_s;
	case SCHED_OPTIM:
		return shard_total * SCHED_OPTIM_BYTES /
		       (cm->optim_bytes_s > 0 ? cm->optim_bytes_s : mem);
	default:
		return 0.0;
	}
}

/* Index of a transfer: (direction, sending stage, micro-batch). */
static int xfer_key(int S, int M, bool backward, int stage, int micro)
{
	return ((backward ? 1 : 0) * S + stage) * M + micro;
}

/* One timing of the pipeline: compute node i of rank r takes its modelled seconds times
 * stretch[r][i]; its start and end land in t0[r][i], t1[r][i]. */
static void simulate(const struct sched *ranks, const struct sched_cost_model *cm,
                     const struct sched_pp_link *link, double *const *stretch, double **t0,
                     double **t1, struct sched_pp_prediction *out)
{
	memset(out, 0, sizeof(*out));
	int p = ranks[0].pp_size, S = ranks[0].n_stages, M = ranks[0].n_micro;
	double xfer = link->latency_s + (link->bytes_s > 0 ? (double)link->bytes / link->bytes_s : 0);
	double *sent = xcalloc((size_t)(2 * S * M), sizeof(double)); /* arrival times */
	bool *has = xcalloc((size_t)(2 * S * M), sizeof(bool));
	double *t = xcalloc((size_t)p, sizeof(double)), *busy = xcalloc((size_t)p, sizeof(double));
	double *first = xcalloc((size_t)p, sizeof(double)), *last = xcalloc((size_t)p, sizeof(double));
	double *link_free = xcalloc((size_t)p, sizeof(double));
	int *at = xcalloc((size_t)p, sizeof(int));
	bool *begun = xcalloc((size_t)p, sizeof(bool));
	for (int r = 0; r < p; r++) { /* zero the stage's full gradients */
		double full = 0;
		for (int b = 0; b < ranks[r].n_buckets; b++)
			full += (double)sched_bucket_full(&ranks[r], b);
		t[r] = full * 4.0 / cm->mem_bytes_s;
	}
	for (;;) {
		bool moved = false, all_clip = true;
		for (int r = 0; r < p; r++) {
			const struct sched *s = &ranks[r];
			for (; at[r] < s->n_nodes; at[r]++) {
				const struct sched_node *n = &s->nodes[at[r]];
				bool pp_node = sched_kind_pp(n->kind) ||
				               (n->kind == SCHED_WAIT && sched_kind_pp(n->wait_kind));
				bool bwd = n->phase == SCHED_PH_BWD;
				if (n->kind == SCHED_CLIP)
					break; /* every rank's norm: all meet there */
				if (pp_node && !begun[r]) {
					begun[r] = true;
					first[r] = t[r];
				}
				t0[r][at[r]] = t[r];
				if (n->kind == SCHED_WAIT && n->wait_kind == SCHED_PP_RECV) {
					int k = xfer_key(S, M, bwd, bwd ? n->stage + 1 : n->stage - 1,
					                 n->micro);
					if (!has[k])
						break; /* the sender has not got there yet */
					if (sent[k] > t[r]) {
						out->wait_s += sent[k] - t[r];
						t[r] = sent[k];
					}
					t0[r][at[r]] = t[r];
				} else if (n->kind == SCHED_WAIT && n->wait_kind == SCHED_PP_SEND) {
					int k = xfer_key(S, M, bwd, n->stage, n->micro);
					t[r] = sent[k] > t[r] ? sent[k] : t[r];
					t0[r][at[r]] = t[r];
				} else if (n->kind == SCHED_PP_SEND) {
					int k = xfer_key(S, M, bwd, n->stage, n->micro);
					double start = t[r] > link_free[r] ? t[r] : link_free[r];
					sent[k] = start + xfer;
					link_free[r] = link->serial ? sent[k] : 0.0;
					has[k] = true;
				} else if (sched_kind_pp_compute(n->kind)) {
					double dt = sched_cost_pp_node_s(s, cm, n) * stretch[r][at[r]];
					busy[r] += dt;
					t[r] += dt;
				} else {
					double dt = other_node_s(s, cm, n);
					if (n->kind == SCHED_ALL_GATHER || n->kind == SCHED_REDUCE_SCATTER)
						out->fsdp_s = r == 0 ? out->fsdp_s + dt : out->fsdp_s;
					t[r] += dt;
				}
				t1[r][at[r]] = sched_kind_pp_compute(n->kind) ? t[r] : t0[r][at[r]];
				if (pp_node)
					last[r] = t[r];
				moved = true;
			}
			all_clip &= at[r] < s->n_nodes && s->nodes[at[r]].kind == SCHED_CLIP;
		}
		if (all_clip) { /* the norm's all-reduce: every rank leaves at the latest arrival */
			double tc = 0;
			for (int r = 0; r < p; r++)
				tc = t[r] > tc ? t[r] : tc;
			for (int r = 0; r < p; r++) {
				const struct sched *s = &ranks[r];
				t[r] = tc;
				for (; at[r] < s->n_nodes; at[r]++) {
					t0[r][at[r]] = t1[r][at[r]] = t[r];
					t[r] += other_node_s(s, cm, &s->nodes[at[r]]);
				}
			}
			break;
		}
		CHECK(moved, "cost model: the pipeline schedule deadlocks");
	}
	for (int r = 0; r < p; r++) {
		out->step_s = t[r] > out->step_s ? t[r] : out->step_s;
		double span = last[r] - first[r];
		double idle = span > 0 ? 1.0 - busy[r] / span : 0.0;
		out->bubble = idle > out->bubble ? idle : out->bubble;
		out->pipeline_s = span > out->pipeline_s ? span : out->pipeline_s;
		out->compute_s = busy[r] > out->compute_s ? busy[r] : out->compute_s;
	}
	free(sent), free(has), free(t), free(busy), free(first), free(last), free(link_free);
	free(at), free(begun);
}

/* Seconds in [a, b) during which rank r computes (its compute nodes' intervals). */
static double busy_in(const struct sched *s, const double *t0, const double *t1, double a,
                      double b)
{
	double sum = 0;
	for (int i = 0; i < s->n_nodes; i++) {
		if (!sched_kind_pp_compute(s->nodes[i].kind))
			continue;
		double lo = t0[i] > a ? t0[i] : a, hi = t1[i] < b ? t1[i] : b;
		sum += hi > lo ? hi - lo : 0.0;
	}
	return sum;
}

void sched_predict_pp(const struct sched *ranks, const struct sched_cost_model *cm,
                      const struct sched_pp_link *link, struct sched_pp_prediction *out)
{
	int p = ranks[0].pp_size;
	double **stretch = xcalloc((size_t)p, sizeof(double *));
	double **t0 = xcalloc((size_t)p, sizeof(double *)), **t1 = xcalloc((size_t)p, sizeof(double *));
	for (int r = 0; r < p; r++) {
		size_t n = (size_t)(ranks[r].n_nodes > 0 ? ranks[r].n_nodes : 1);
		stretch[r] = xcalloc(n, sizeof(double));
		t0[r] = xcalloc(n, sizeof(double));
		t1[r] = xcalloc(n, sizeof(double));
		for (size_t i = 0; i < n; i++)
			stretch[r][i] = 1.0;
	}
	simulate(ranks, cm, link, stretch, t0, t1, out);
	/* Ranks sharing cores (host_load > 1: more ranks x threads than cores, as 4 ranks on 2
	 * cores): the compute rates were calibrated with every rank computing, so a node runs at
	 * that rate only while the whole host computes; while part of it waits (the pipeline's
	 * bubbles) the others get its cores. Each compute node is stretched by the host's load
	 * over its interval relative to the calibration's (the ranks of the other pipelines do
	 * what this one does), the timing repeated to a fixed point (damped, 8 rounds). */
	double L = link->host_load;
	for (int it = 0; L > 1.0 && it < 8; it++) {
		for (int r = 0; r < p; r++)
			for (int i = 0; i < ranks[r].n_nodes; i++) {
				if (!sched_kind_pp_compute(ranks[r].nodes[i].kind) ||
				    t1[r][i] <= t0[r][i])
					continue;
				double a = t0[r][i], b = t1[r][i], frac = 0;
				for (int q = 0; q < p; q++)
					frac += busy_in(&ranks[q], t0[q], t1[q], a, b);
				frac /= (double)p * (b - a); /* the share of the host computing */
				double load = L * frac, want = (load > 1.0 ? load : 1.0) / L;
				stretch[r][i] = 0.5 * (stretch[r][i] + want);
			}
		simulate(ranks, cm, link, stretch, t0, t1, out);
	}
	for (int r = 0; r < p; r++)
		free(stretch[r]), free(t0[r]), free(t1[r]);
	free(stretch), free(t0), free(t1);
}

/* ---------------------------------------------------------------- the link, measured */

/* One-way time of `bytes` between pipeline neighbours 2k and 2k + 1: half a round trip, the
 * median of 9. Ranks without a partner (an odd last one) only join the median. */
static double one_way_s(const struct comm_group *pp, int64_t bytes, char *buf)
{
	int r = pp->rank, peer = r ^ 1;
	if (peer >= pp->size)
		return -1.0;
	double v[9];
	for (int it = -2; it < 9; it++) { /* two warm-up trips */
		struct comm_p2p a = {0}, b = {0};
		double t0 = timer_now();
		if (r % 2 == 0) {
			comm_p2p_isend(pp, peer, 7, buf, bytes, &a);
			comm_p2p_wait(&a, 60.0, "pipeline link calibration send");
			comm_p2p_irecv(pp, peer, 8, buf, bytes, &b);
			comm_p2p_wait(&b, 60.0, "pipeline link calibration receive");
		} else {
			comm_p2p_irecv(pp, peer, 7, buf, bytes, &b);
			comm_p2p_wait(&b, 60.0, "pipeline link calibration receive");
			comm_p2p_isend(pp, peer, 8, buf, bytes, &a);
			comm_p2p_wait(&a, 60.0, "pipeline link calibration send");
		}
		if (it >= 0)
			v[it] = (timer_now() - t0) / 2.0;
	}
	for (int i = 1; i < 9; i++) /* insertion sort: the median */
		for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
			double x = v[j];
			v[j] = v[j - 1], v[j - 1] = x;
		}
	return v[4];
}

void sched_cost_calibrate_pp_link(struct sched_pp_link *link, const struct comm_group *pp,
                                  const struct comm_group *world, int64_t bytes, double sim_gbps,
                                  double sim_latency_us)
{
	link->bytes = bytes;
	if (sim_gbps > 0) { /* the simulated link the transfers are stretched to (parallel/pp) */
		link->latency_s = sim_latency_us * 1e-6;
		link->bytes_s = sim_gbps * 1e9 / 8.0;
		link->serial = true;
		return;
	}
	char *buf = xcalloc((size_t)bytes, 1);
	double v[2] = {one_way_s(pp, 8, buf), one_way_s(pp, bytes, buf)};
	free(buf);
	/* the mean over the ranks that measured (every pair, every pipeline group) */
	double sum[3] = {v[0] >= 0 ? v[0] : 0, v[1] >= 0 ? v[1] : 0, v[0] >= 0 ? 1 : 0};
	comm_all_reduce_f64(world, sum, 3);
	double lat = sum[2] > 0 ? sum[0] / sum[2] : 0, big = sum[2] > 0 ? sum[1] / sum[2] : 0;
	link->latency_s = lat;
	link->bytes_s = big > lat ? (double)(bytes - 8) / (big - lat) : 0.0;
	link->serial = false;
}
