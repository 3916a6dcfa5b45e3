/* schedule/sched_calib: measure the cost model's rates on this machine, at the model's shapes.
 *
 * Each term of each compute node kind is timed by running the kernels a unit of the model
 * runs, in the same sequence and at the same shapes (batch x sequence tokens, capped for
 * time; the rate then scales by FLOPs or bytes): the family's calibration parts
 * (model/model_cost.h: for Llama a block's forward matmuls, attention and elementwise
 * kernels; its backward's; the fused output projection + cross-entropy; the embedding), then
 * AdamW and a large copy — each once per round over 5 rounds, median. The rate of a term is
 * its work (the family's FLOP and byte counts) over the measured time, so the prediction at
 * these shapes reproduces the measurement. Matmuls go through matmul_forward/backward, so the
 * rates follow whatever engine those dispatch to. Collectives: all-gather and reduce-scatter
 * timed on the stream at 5 sizes (median of 3), latency + bytes / bandwidth fitted by least
 * squares, for the wall time and for the CPU time of the thread that ran them; with a
 * progress thread, the share of that CPU time compute loses when the two run together. Every
 * figure is the median over ranks, so every rank picks the same schedule. */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/timer.h"
#include "comm/comm.h"
#include "comm/p2p.h"
#include "kernels/kernels.h"
#include "schedule/sched_cost.h"

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

/* What calibration times: the family's parts at the model's shapes, then AdamW and a copy over
 * `big` (4 x optim_n floats). */
struct cal {
	struct model_cost_calib m;
	int64_t optim_n;
	float *big;
};

enum { CAL_OPTIM, CAL_COPY, CAL_OWN }; /* the parts after the family's */
#define CAL_PARTS_MAX (MODEL_COST_PARTS_MAX + CAL_OWN)

static int cal_parts(const struct cal *c)
{
	return c->m.n_parts + CAL_OWN;
}

/* Run part p once: the family's, or AdamW / the copy. */
static void cal_run(struct cal *c, int p)
{
	int64_t optim_n = c->optim_n;
	if (p < c->m.n_parts) {
		c->m.run(c->m.impl, p);
		return;
	}
	switch (p - c->m.n_parts) {
	case CAL_OPTIM: /* over buffers as large as the shards (to 4 x 16 MiB): not in cache */
		adamw_update(c->big, c->big + optim_n, c->big + 2 * optim_n, c->big + 3 * optim_n,
		             optim_n, 1e-4, 0.9, 0.95, 1e-8, 0.1, 1, 1.0);
		break;
	case CAL_COPY:
		memcpy(c->big, c->big + 2 * optim_n, (size_t)(2 * optim_n) * sizeof(float));
		break;
	default:
		break;
	}
}

#define CAL_ROUNDS 5

/* Every part once per round, round-robin, after a warm-up round; each part's median over the
 * rounds: the typical time as a step sees it, with load that changes during calibration
 * spread over all parts alike. */
static void cal_time_all(struct cal *c, double *out)
{
	double t[CAL_PARTS_MAX][CAL_ROUNDS];
	int n = cal_parts(c);
	for (int r = -1; r < CAL_ROUNDS; r++)
		for (int p = 0; p < n; p++) {
			double t0 = timer_now();
			cal_run(c, p);
			if (r >= 0)
				t[p][r] = timer_now() - t0;
		}
	for (int p = 0; p < n; p++)
		out[p] = median(t[p], CAL_ROUNDS);
}

/* Ranks sharing cores (host_load > 1: 4 ranks of one thread on 2 cores) time the compute parts
 * one rank at a time, in rank order (a token passed along `world`; the others sleep in the
 * wait), and scale the times by the load: the rate of a rank while the whole host computes.
 * Timed all at once, each short part ran either between the scheduler's time slices (at the
 * unshared rate) or across them, and the median over ranks landed anywhere between the two:
 * a pipeline step's prediction scattered from 0.51 to 0.92 s against a steady 1.0 s. */
#define CAL_TURN_TAG 0x7ca1
static void cal_time_turns(struct cal *c, double *out, const struct comm_group *world, double load)
{
	int r = world->rank;
	char token = 0;
	if (r > 0) {
		struct comm_p2p q = {0};
		comm_p2p_irecv(world, r - 1, CAL_TURN_TAG, &token, 1, &q);
		comm_p2p_wait(&q, 600.0, "cost model calibration: waiting for the previous rank's turn");
	}
	cal_time_all(c, out);
	if (r + 1 < world->size) {
		struct comm_p2p q = {0};
		comm_p2p_isend(world, r + 1, CAL_TURN_TAG, &token, 1, &q);
		comm_p2p_wait(&q, 600.0, "cost model calibration: passing the turn on");
	}
	for (int p = 0; p < cal_parts(c); p++)
		out[p] *= load;
}

#define CAL_SIZES 5

/* Median of 3 after a warm-up, like the compute parts: the typical time, skew between ranks
 * included (a step sees it too); *cpu: the median CPU seconds of the thread that ran it. */
static double time_op(struct comm_stream *st, struct comm_op *op, double *cpu)
{
	double t[3], c[3];
	comm_stream_wait(st, comm_stream_enqueue(st, op));
	for (int r = 0; r < 3; r++) {
		double t0 = timer_now(), o0, o1;
		int64_t tk = comm_stream_enqueue(st, op);
		comm_stream_wait(st, tk);
		t[r] = timer_now() - t0;
		comm_stream_op_times(st, tk, &o0, &o1, &c[r]);
	}
	*cpu = median(c, 3);
	return median(t, 3);
}

/* The share of the comm thread's CPU time that compute loses: the family's busy part (a
 * block's forward matmuls), repeated to fill at least 60 ms, alone and then with the largest
 * all-gather running back to back beside them (as many as fill about half that window), in 3
 * interleaved pairs (so load changes hit both alike); the slowdown over the CPU seconds the
 * comm thread spent in the collectives that ran inside the window, median of the pairs. */
static double measure_interference(struct cal *c, struct comm_stream *stream,
                                   const struct comm_group *group, struct comm_op *ag, double ag_s)
{
	double t0 = timer_now();
	int reps = 0;
	do {
		cal_run(c, c->m.busy_part);
		reps++;
	} while (timer_now() - t0 < 0.06 && reps < 1000);
	double window = timer_now() - t0;
	int n_ops = ag_s > 0 ? (int)(0.5 * window / ag_s) : 1;
	n_ops = n_ops < 1 ? 1 : n_ops > 64 ? 64 : n_ops;
	float agree[2] = {(float)reps, (float)n_ops}; /* every rank runs as many collectives */
	comm_all_reduce_max_f32(group, agree, 2);
	reps = (int)agree[0], n_ops = (int)agree[1];
	double frac[3];
	int64_t tk[64];
	for (int r = 0; r < 3; r++) {
		comm_barrier(group);
		t0 = timer_now();
		for (int i = 0; i < reps; i++)
			cal_run(c, c->m.busy_part);
		double alone = timer_now() - t0;
		comm_barrier(group);
		t0 = timer_now();
		for (int i = 0; i < n_ops; i++)
			tk[i] = comm_stream_enqueue(stream, ag);
		for (int i = 0; i < reps; i++)
			cal_run(c, c->m.busy_part);
		double t1 = timer_now(), cpu = 0;
		comm_stream_sync(stream);
		for (int i = 0; i < n_ops; i++) {
			double o0, o1, oc;
			comm_stream_op_times(stream, tk[i], &o0, &o1, &oc);
			double ov = (o1 < t1 ? o1 : t1) - (o0 > t0 ? o0 : t0);
			if (ov > 0 && o1 > o0)
				cpu += oc * ov / (o1 - o0); /* its CPU inside the window, evenly */
		}
		frac[r] = cpu > 1e-4 ? ((t1 - t0) - alone) / cpu : 0.0;
	}
	return median(frac, 3);
}

/* vals[0..n) = the median over the ranks of `world` of each rank's vals (collective). */
static void median_over_ranks(const struct comm_group *world, double *vals, int n)
{
	int W = world->size;
	double *all = calloc((size_t)(n * W), sizeof(double)),
	       *col = calloc((size_t)W, sizeof(double));
	CHECK(all && col, "out of memory");
	comm_all_gather(world, vals, all, n * (int64_t)sizeof(double));
	for (int k = 0; k < n; k++) {
		for (int r = 0; r < W; r++)
			col[r] = all[r * n + k];
		vals[k] = median(col, W);
	}
	free(all), free(col);
}

/* Indices into the measurement vector shared across ranks (every rank's family has as many
 * parts). */
enum { V_PARTS = 0, V_COMM = CAL_PARTS_MAX, V_INTERF = CAL_PARTS_MAX + 6 * CAL_SIZES, V_COUNT };

void sched_cost_calibrate(struct sched_cost_model *cm, const struct model_config *mc,
                          const struct model_cost_shape *sh, struct comm_stream *stream,
                          const struct comm_group *group, const struct comm_group *world,
                          bool overlap, bool turns)
{
	/* the model's shapes, capped for time: sequences up to 1024, up to 2048 tokens */
	struct model_cost_shape cs = *sh;
	const int64_t cp = sh->cp > 1 ? sh->cp : 1, Tl = sh->T / cp; /* a cp rank's tokens */
	cs.T = Tl > 1024 ? 1024 : Tl;
	while (cs.B > 1 && cs.B * cs.T > 2048)
		cs.B--;
	cs.T *= cp;
	cs.elem_bytes = 4; /* the kernels compute in fp32 */
	struct cal c;
	model_cost_calib_init(&c.m, mc, &cs);
	/* AdamW and copies over the shards' size (at least 4 Mi floats per array, out of cache;
	 * at most 4 x 16 MiB) */
	int64_t optim_n = cm->params_bytes / 4;
	optim_n = optim_n < (int64_t)1 << 20   ? (int64_t)1 << 20
	          : optim_n > (int64_t)1 << 22 ? (int64_t)1 << 22
	                                       : optim_n;
	c.optim_n = optim_n;
	c.big = malloc((size_t)(4 * optim_n) * sizeof(float));
	CHECK(c.big, "out of memory (cost model calibration)");
	for (int64_t i = 0; i < 4 * optim_n; i++)
		c.big[i] = (float)(i % 1000) * 1e-4f + 0.01f;
	double vals[V_COUNT];
	memset(vals, 0, sizeof(vals));
	double load = comm_host_load();
	if (turns && load > 1.0)
		cal_time_turns(&c, vals + V_PARTS, world, load);
	else
		cal_time_all(&c, vals + V_PARTS);

	/* collectives on the stream (the simulated link applies), bytes per rank */
	static const int64_t sizes[CAL_SIZES] = {64 << 10, 512 << 10, 2 << 20, 8 << 20, 16 << 20};
	int64_t n = group->size, big = sizes[CAL_SIZES - 1];
	char *send = calloc((size_t)big, 1), *recv = calloc((size_t)(n * big), 1);
	float *scr = calloc((size_t)(3 * big), 1);
	CHECK(send && recv && scr, "out of memory");
	for (int i = 0; i < CAL_SIZES && n > 1; i++) {
		struct comm_op ag = {.kind = COMM_ALL_GATHER,
		                     .group = group,
		                     .send = send,
		                     .recv = recv,
		                     .count = sizes[i],
		                     .scratch = NULL,
		                     .what = "calibration all-gather"};
		int64_t cnt = sizes[i] / 4 / n;
		struct comm_op rs = {.kind = COMM_REDUCE_SCATTER,
		                     .group = group,
		                     .send = recv,
		                     .recv = scr,
		                     .count = cnt,
		                     .scratch = scr + cnt,
		                     .what = "calibration reduce-scatter"};
		double *v = vals + V_COMM + 6 * i;
		v[0] = (double)comm_op_wire_bytes(&ag);
		v[1] = time_op(stream, &ag, &v[2]);
		v[3] = (double)comm_op_wire_bytes(&rs);
		v[4] = time_op(stream, &rs, &v[5]);
	}
	if (n > 1 && overlap) {
		struct comm_op ag = {.kind = COMM_ALL_GATHER,
		                     .group = group,
		                     .send = send,
		                     .recv = recv,
		                     .count = big,
		                     .scratch = NULL,
		                     .what = "calibration all-gather beside compute"};
		vals[V_INTERF] = measure_interference(&c, stream, group, &ag,
		                                      vals[V_COMM + 6 * (CAL_SIZES - 1) + 1]);
	}
	free(send), free(recv), free(scr);
	free(c.big);

	median_over_ranks(world, vals, V_COUNT); /* every rank holds the same model */

	/* rates: each part's work (the family's count for these shapes) over its measured time;
	 * a pass without a part of a term takes the forward's rate */
	const double *t = vals + V_PARTS;
	for (int p = 0; p < c.m.n_parts; p++) {
		const struct model_cost_part *q = &c.m.part[p];
		for (int k = 0; k < SCHED_WORK_COUNT; k++)
			if (q->pass == MODEL_PASS_COUNT || (int)q->pass == k)
				cm->rate[k][q->term] = q->work / t[p];
	}
	for (int k = 0; k < SCHED_WORK_COUNT; k++)
		for (int x = 0; x < SCHED_TERM_COUNT; x++)
			if (cm->rate[k][x] == 0)
				cm->rate[k][x] = cm->rate[SCHED_WORK_FWD][x];
	int own = c.m.n_parts; /* AdamW and the copy follow the family's parts */
	model_cost_calib_free(&c.m);
	cm->optim_bytes_s = SCHED_OPTIM_BYTES * (double)optim_n / t[own + CAL_OPTIM];
	cm->mem_bytes_s = 2.0 * (double)(2 * optim_n) * 4.0 / t[own + CAL_COPY];
	cm->matmul_flops = cm->rate[SCHED_WORK_FWD][SCHED_TERM_MATMUL];
	cm->attn_flops = cm->rate[SCHED_WORK_FWD][SCHED_TERM_ATTN];
	/* at most the whole of the comm thread's time taken from compute */
	cm->interference = vals[V_INTERF] < 0 ? 0 : (vals[V_INTERF] > 1 ? 1 : vals[V_INTERF]);
	if (n > 1) { /* per kind: wall time and the comm thread's CPU, lines over the sizes */
		double *lat[4] = {&cm->ag_latency_s, &cm->ag_cpu_latency_s, &cm->rs_latency_s,
		                  &cm->rs_cpu_latency_s},
		       *rate[4] = {&cm->ag_bytes_s, &cm->ag_cpu_bytes_s, &cm->rs_bytes_s,
		                   &cm->rs_cpu_bytes_s};
		for (int k = 0; k < 4; k++) {
			double xb[CAL_SIZES], ty[CAL_SIZES];
			for (int i = 0; i < CAL_SIZES; i++) {
				const double *v = vals + V_COMM + 6 * i + (k / 2) * 3;
				xb[i] = v[0], ty[i] = v[1 + k % 2];
			}
			fit_line(xb, ty, CAL_SIZES, lat[k], rate[k]);
		}
	} else {
		cm->ag_latency_s = cm->rs_latency_s = 0;
		cm->ag_bytes_s = cm->rs_bytes_s = 1e30;
	}
}

static void calibrate_link(double *latency_s, double *bytes_s, const struct comm_group *tp,
                           const struct comm_group *world, double sim_gbps, double sim_latency_us)
{
	if (sim_gbps > 0) { /* the model stretches every TP collective to the simulated link */
		*bytes_s = sim_gbps * 1e9 / 8.0;
		*latency_s = sim_latency_us * 1e-6;
		return;
	}
	/* blocking all-gathers on the group, as the TP nodes run them: best of 3 per size */
	enum { N_SIZES = 4 };
	static const int64_t sizes[N_SIZES] = {16 << 10, 256 << 10, 2 << 20, 8 << 20};
	int64_t n = tp->size;
	double vals[2 * N_SIZES] = {0};
	char *send = calloc((size_t)sizes[N_SIZES - 1], 1),
	     *recv = calloc((size_t)(n * sizes[N_SIZES - 1]), 1);
	CHECK(send && recv, "out of memory");
	for (int i = 0; i < N_SIZES; i++) {
		double best = 1e30;
		for (int r = 0; r < 3; r++) {
			comm_barrier(tp);
			double t0 = timer_now();
			comm_all_gather(tp, send, recv, sizes[i]);
			double dt = timer_now() - t0;
			best = dt < best ? dt : best;
		}
		vals[2 * i] = (double)((n - 1) * sizes[i]);
		vals[2 * i + 1] = best;
	}
	free(send), free(recv);
	median_over_ranks(world, vals, 2 * N_SIZES);
	double xb[N_SIZES], ty[N_SIZES];
	for (int i = 0; i < N_SIZES; i++)
		xb[i] = vals[2 * i], ty[i] = vals[2 * i + 1];
	fit_line(xb, ty, N_SIZES, latency_s, bytes_s);
}

void sched_cost_calibrate_tp(struct sched_cost_model *cm, const struct comm_group *tp,
                             const struct comm_group *world, double sim_gbps, double sim_latency_us)
{
	calibrate_link(&cm->tp_latency_s, &cm->tp_bytes_s, tp, world, sim_gbps, sim_latency_us);
}

void sched_cost_calibrate_cp(struct sched_cost_model *cm, const struct comm_group *cp,
                             const struct comm_group *world, double sim_gbps, double sim_latency_us)
{
	calibrate_link(&cm->cp_latency_s, &cm->cp_bytes_s, cp, world, sim_gbps, sim_latency_us);
}

void sched_cost_calibrate_ep(struct sched_cost_model *cm, const struct comm_group *ep,
                             const struct comm_group *world, double sim_gbps, double sim_latency_us)
{
	calibrate_link(&cm->ep_latency_s, &cm->ep_bytes_s, ep, world, sim_gbps, sim_latency_us);
}
