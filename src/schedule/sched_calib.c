/* schedule/sched_calib: measure the cost model's rates on this machine, at the model's shapes.
 *
 * Each term of each compute node kind is timed by running the kernels a Llama unit runs, in
 * the same sequence and at the same shapes (batch x sequence tokens, capped for time; the
 * rate then scales by FLOPs or bytes): a block's forward matmuls, attention and elementwise
 * kernels; its backward's; the fused output projection + cross-entropy; the embedding; AdamW;
 * a large copy — each once per round over 5 rounds, median. The rate of a term is its work
 * (sched_cost_init's FLOP and byte counts) over the measured time, so the prediction at these
 * shapes reproduces the measurement. Matmuls go through matmul_forward/backward, so the rates
 * follow whatever engine those dispatch to. Collectives: all-gather and reduce-scatter timed on the
 * stream at 5 sizes (median of 3), latency + bytes / bandwidth fitted by least squares, for the
 * wall time and for the CPU time of the thread that ran them; with a progress thread, the share
 * of that CPU time compute loses when the two run together. Every figure is the median over
 * ranks, so every rank picks the same schedule. */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/timer.h"
#include "comm/comm.h"
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

/* The buffers of one block at (Bc, T) and the head, filled with small values. */
struct cal {
	int64_t B, T, N, C, H, KV, D, HD, KVD, F, V, chunk;
	float *x, *xn, *q, *k, *v, *att, *lse, *h1, *h3, *gate, *out, *rstd, *cos, *sin;
	float *dq, *dk, *dv, *dx, *dxn, *dh1, *dh3, *dres;
	float *wq, *wk, *wv, *wo, *w1, *w2, *w3, *wout, *nw, *dw, *scratch;
	int32_t *tok;
	float *all, *big; /* big: 4 x optim_n floats for AdamW and the copy */
};

static void cal_alloc(struct cal *c, const struct llama_config *lc, int64_t B, int64_t T)
{
	memset(c, 0, sizeof(*c));
	c->T = T > 1024 ? 1024 : T;
	c->B = B;
	while (c->B > 1 && c->B * c->T > 2048)
		c->B--;
	c->N = c->B * c->T, c->C = lc->dim, c->H = lc->n_heads, c->KV = lc->n_kv_heads;
	c->D = lc->head_dim, c->HD = c->H * c->D, c->KVD = c->KV * c->D, c->F = lc->ffn_hidden;
	c->V = lc->vocab_size;
	c->chunk = llama_ce_rows(c->V, c->N);
	int64_t N = c->N, C = c->C, F = c->F, HD = c->HD, KVD = c->KVD, V = c->V;
	struct {
		float **p;
		int64_t n;
	} parts[] = {{&c->x, N * C},
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
	int64_t total = 0;
	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
		total += parts[i].n;
	c->all = malloc((size_t)total * sizeof(float));
	c->tok = malloc((size_t)N * sizeof(int32_t));
	CHECK(c->all && c->tok, "out of memory (cost model calibration, %lld floats)",
	      (long long)total);
	for (int64_t i = 0; i < total; i++)
		c->all[i] = (float)((i * 7919) % 1000) * 1e-4f - 0.05f;
	for (int64_t i = 0; i < N; i++)
		c->tok[i] = (int32_t)((i * 104729) % V);
	float *at = c->all;
	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
		*parts[i].p = at;
		at += parts[i].n;
	}
}

enum cal_part {
	CAL_FWD_MM,
	CAL_FWD_ATTN,
	CAL_FWD_ELEM,
	CAL_BWD_MM,
	CAL_BWD_ATTN,
	CAL_BWD_ELEM,
	CAL_HEAD,
	CAL_EMBED,
	CAL_OPTIM,
	CAL_COPY,
	CAL_PARTS
};

/* Run one part of a unit's work once. */
static void cal_run(struct cal *c, enum cal_part p, int64_t optim_n)
{
	int64_t B = c->B, T = c->T, N = c->N, C = c->C, H = c->H, KV = c->KV, D = c->D;
	int64_t HD = c->HD, KVD = c->KVD, F = c->F, V = c->V;
	int64_t nv;
	switch (p) {
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
		attention_forward_f32(c->att, c->lse, c->q, c->k, c->v, B, T, H, KV, D);
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
		attention_backward_f32(c->dq, c->dk, c->dv, c->att, c->att, c->lse, c->q, c->k,
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
static void cal_time_all(struct cal *c, int64_t optim_n, double *out)
{
	double t[CAL_PARTS][CAL_ROUNDS];
	for (int r = -1; r < CAL_ROUNDS; r++)
		for (int p = 0; p < CAL_PARTS; p++) {
			double t0 = timer_now();
			cal_run(c, (enum cal_part)p, optim_n);
			if (r >= 0)
				t[p][r] = timer_now() - t0;
		}
	for (int p = 0; p < CAL_PARTS; p++)
		out[p] = median(t[p], CAL_ROUNDS);
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

/* The share of the comm thread's CPU time that compute loses: a block's forward matmuls,
 * repeated to fill at least 60 ms, alone and then with the largest all-gather running
 * back to back beside them (as many as fill about half that window), in 3 interleaved pairs
 * (so load changes hit both alike); the slowdown over the CPU seconds the comm thread spent
 * in the collectives that ran inside the window, median of the pairs. */
static double measure_interference(struct cal *c, int64_t optim_n, struct comm_stream *stream,
                                   const struct comm_group *group, struct comm_op *ag,
                                   double ag_s)
{
	double t0 = timer_now();
	int reps = 0;
	do {
		cal_run(c, CAL_FWD_MM, optim_n);
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
			cal_run(c, CAL_FWD_MM, optim_n);
		double alone = timer_now() - t0;
		comm_barrier(group);
		t0 = timer_now();
		for (int i = 0; i < n_ops; i++)
			tk[i] = comm_stream_enqueue(stream, ag);
		for (int i = 0; i < reps; i++)
			cal_run(c, CAL_FWD_MM, optim_n);
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

/* Indices into the measurement vector shared across ranks. */
enum { V_PARTS = 0, V_COMM = CAL_PARTS, V_INTERF = CAL_PARTS + 6 * CAL_SIZES, V_COUNT };

void sched_cost_calibrate(struct sched_cost_model *cm, const struct llama_config *lc, int64_t B,
                          int64_t T, struct comm_stream *stream, const struct comm_group *group,
                          const struct comm_group *world, bool overlap)
{
	struct cal c;
	cal_alloc(&c, lc, B, T);
	/* AdamW and copies over the shards' size (at least 4 Mi floats per array, out of cache;
	 * at most 4 x 16 MiB) */
	int64_t optim_n = cm->params_bytes / 4;
	optim_n = optim_n < (int64_t)1 << 20   ? (int64_t)1 << 20
	          : optim_n > (int64_t)1 << 22 ? (int64_t)1 << 22
	                                       : optim_n;
	c.big = malloc((size_t)(4 * optim_n) * sizeof(float));
	CHECK(c.big, "out of memory (cost model calibration)");
	for (int64_t i = 0; i < 4 * optim_n; i++)
		c.big[i] = (float)(i % 1000) * 1e-4f + 0.01f;
	double vals[V_COUNT];
	memset(vals, 0, sizeof(vals));
	cal_time_all(&c, optim_n, vals + V_PARTS);

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
		vals[V_INTERF] = measure_interference(&c, optim_n, stream, group, &ag,
		                                      vals[V_COMM + 6 * (CAL_SIZES - 1) + 1]);
	}
	free(send), free(recv), free(scr);
	free(c.all), free(c.tok), free(c.big);

	median_over_ranks(world, vals, V_COUNT); /* every rank holds the same model */

	/* rates: the work sched_cost_init counts for these shapes over the measured time */
	struct sched_cost_work w;
	sched_cost_block_work(lc, c.B, c.T, &w);
	const double *t = vals + V_PARTS;
	cm->rate[SCHED_WORK_FWD][SCHED_TERM_MATMUL] = w.fwd_mm / t[CAL_FWD_MM];
	cm->rate[SCHED_WORK_FWD][SCHED_TERM_ATTN] = w.fwd_attn / t[CAL_FWD_ATTN];
	cm->rate[SCHED_WORK_FWD][SCHED_TERM_ELEM] = w.fwd_elem / t[CAL_FWD_ELEM];
	cm->rate[SCHED_WORK_BWD][SCHED_TERM_MATMUL] = w.bwd_mm / t[CAL_BWD_MM];
	cm->rate[SCHED_WORK_BWD][SCHED_TERM_ATTN] = w.bwd_attn / t[CAL_BWD_ATTN];
	cm->rate[SCHED_WORK_BWD][SCHED_TERM_ELEM] = w.bwd_elem / t[CAL_BWD_ELEM];
	for (int k = 0; k < SCHED_TERM_COUNT; k++)
		cm->rate[SCHED_WORK_REC][k] = cm->rate[SCHED_WORK_FWD][k];
	double head = w.head / t[CAL_HEAD], embed = w.embed / t[CAL_EMBED];
	for (int k = 0; k < SCHED_WORK_COUNT; k++) {
		cm->rate[k][SCHED_TERM_HEAD] = head;
		cm->rate[k][SCHED_TERM_EMBED] = embed;
	}
	cm->optim_bytes_s = SCHED_OPTIM_BYTES * (double)optim_n / t[CAL_OPTIM];
	cm->mem_bytes_s = 2.0 * (double)(2 * optim_n) * 4.0 / t[CAL_COPY];
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

void sched_cost_calibrate_tp(struct sched_cost_model *cm, const struct comm_group *tp,
                             const struct comm_group *world, double sim_gbps, double sim_latency_us)
{
	if (sim_gbps > 0) { /* the model stretches every TP collective to the simulated link */
		cm->tp_bytes_s = sim_gbps * 1e9 / 8.0;
		cm->tp_latency_s = sim_latency_us * 1e-6;
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
	fit_line(xb, ty, N_SIZES, &cm->tp_latency_s, &cm->tp_bytes_s);
}
