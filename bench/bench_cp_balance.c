/* bench/bench_cp_balance: context parallelism's load balance (issue 28). For a causal sequence
 * of T tokens split over cp ranks by the load balancer (parallel/cp.c: headtail, TorchTitan's
 * _HeadTailLoadBalancer, or none: contiguous shards), each rank's attention — its T/cp queries
 * at their global positions against the whole gathered K/V, forward then backward, the
 * kernels llama_cp.c runs with context_parallel_rotate_method = allgather — is timed ALONE, one
 * rank after another in this one process (best of --reps), so ranks sharing cores cannot blur
 * the comparison. Prints per row the slowest rank's time over the mean (the balance ratio:
 * 1.00 is perfect), the slowest and fastest rank, and the CPU, threads and kernel ISA. Per
 * length it also times the one-rank causal kernel (kernels/attention.c) over the whole
 * sequence, and per row prints the ranks' summed time over it: the position-aware kernel's
 * cost for the same causal work (1.00: none; every rank computes its share, so with perfect
 * balance and no overhead cp ranks in parallel take 1/cp of that one-rank time).
 * Shapes: the debug model's attention (16 heads of 16, as many K/V heads), batch 1.
 *   build/bench/bench_cp_balance [--seq 8192,16384] [--cp 2,4] [--reps 3] [--heads 16]
 *                                [--kv-heads 16] [--head-dim 16]
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/log.h"
#include "base/rng.h"
#include "base/timer.h"
#include "kernels/kernels.h"
#include "parallel/cp.h"

static int parse_list(const char *s, int64_t *out, int max)
{
	int n = 0;
	const char *p = s;
	while (*p && n < max) {
		char *end;
		long long v = strtoll(p, &end, 10);
		if (end == p || v <= 0) {
			fprintf(stderr, "bench_cp_balance: bad list '%s'\n", s);
			exit(2);
		}
		out[n++] = v;
		p = *end == ',' ? end + 1 : end;
	}
	return n;
}

static float *rand_buf(uint64_t stream, int64_t n)
{
	float *x = malloc((size_t)n * sizeof(float));
	CHECK(x, "bench_cp_balance: out of memory");
	rng_fill_normal(x, n, 0, 28, stream, 0.0, 1.0);
	return x;
}

/* One rank's attention forward + backward: queries at qpos (Tl), keys 0..T-1. */
static double time_rank(const int64_t *qpos, const int64_t *kpos, int64_t Tl, int64_t T,
                        int64_t H, int64_t KV, int64_t D, int reps, const float *q,
                        const float *k, const float *v, const float *dout)
{
	float *out = malloc((size_t)(Tl * H * D) * 4), *lse = malloc((size_t)(H * Tl) * 4);
	float *dq = calloc((size_t)(Tl * H * D), 4), *dk = calloc((size_t)(T * KV * D), 4);
	float *dv = calloc((size_t)(T * KV * D), 4);
	CHECK(out && lse && dq && dk && dv, "bench_cp_balance: out of memory");
	double best = 1e30;
	for (int r = 0; r < reps; r++) {
		double t0 = timer_now();
		attention_pos_forward_f32(out, lse, q, qpos, k, v, kpos, 1, Tl, T, H, KV, D);
		attention_pos_backward_f32(dq, dk, dv, dout, out, lse, q, qpos, k, v, kpos, 1, Tl, T,
		                           H, KV, D);
		double t = timer_now() - t0;
		best = t < best ? t : best;
	}
	free(out), free(lse), free(dq), free(dk), free(dv);
	return best;
}

/* The one-rank causal kernel over all T tokens, forward + backward (best of reps). */
static double time_causal(int64_t T, int64_t H, int64_t KV, int64_t D, int reps)
{
	float *q = rand_buf(5, T * H * D), *dout = rand_buf(6, T * H * D);
	float *k = rand_buf(7, T * KV * D), *v = rand_buf(8, T * KV * D);
	float *out = malloc((size_t)(T * H * D) * 4), *lse = malloc((size_t)(H * T) * 4);
	float *dq = calloc((size_t)(T * H * D), 4), *dk = calloc((size_t)(T * KV * D), 4);
	float *dv = calloc((size_t)(T * KV * D), 4);
	CHECK(out && lse && dq && dk && dv, "bench_cp_balance: out of memory");
	double best = 1e30;
	for (int r = 0; r < reps; r++) {
		double t0 = timer_now();
		attention_forward_f32(out, lse, q, k, v, 1, T, H, KV, D);
		attention_backward_f32(dq, dk, dv, dout, out, lse, q, k, v, 1, T, H, KV, D);
		double t = timer_now() - t0;
		best = t < best ? t : best;
	}
	free(q), free(dout), free(k), free(v), free(out), free(lse), free(dq), free(dk), free(dv);
	return best;
}

int main(int argc, char **argv)
{
	int64_t seqs[8] = {8192, 16384}, cps[8] = {2, 4};
	int n_seq = 2, n_cp = 2, reps = 3;
	int64_t H = 16, KV = 16, D = 16;
	for (int i = 1; i < argc; i += 2) { /* --option value */
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!v) {
			fprintf(stderr, "bench_cp_balance: %s needs a value\n", a);
			return 2;
		}
		if (strcmp(a, "--seq") == 0)
			n_seq = parse_list(v, seqs, 8);
		else if (strcmp(a, "--cp") == 0)
			n_cp = parse_list(v, cps, 8);
		else if (strcmp(a, "--reps") == 0)
			reps = atoi(v);
		else if (strcmp(a, "--heads") == 0)
			H = atoll(v);
		else if (strcmp(a, "--kv-heads") == 0)
			KV = atoll(v);
		else if (strcmp(a, "--head-dim") == 0)
			D = atoll(v);
		else {
			fprintf(stderr, "bench_cp_balance: unknown option %s\n", a);
			return 2;
		}
	}
	if (reps < 1 || H % KV) {
		fprintf(stderr, "bench_cp_balance: --reps >= 1 and --heads a multiple of --kv-heads\n");
		return 2;
	}
	const struct cpu_info *ci = cpu_info();
	printf("CPU %s; %d OpenMP threads; attention kernels fp32 (kernels/attention_pos.c, no "
	       "matmul engine), compiled for the CPU's %s\n",
	       ci->brand, omp_get_max_threads(), ci->fp32_isa);
	printf("each rank's attention (its queries x the gathered K/V, forward + backward) timed "
	       "alone, best of %d; H %lld, KV %lld, D %lld, batch 1\n",
	       reps, (long long)H, (long long)KV, (long long)D);
	printf("%8s %4s %9s %10s %10s %10s %8s %10s\n", "seq_len", "cp", "balancer", "slowest s",
	       "fastest s", "mean s", "max/mean", "sum/causal");
	for (int si = 0; si < n_seq; si++) {
		int64_t T = seqs[si];
		float *k = rand_buf(1, T * KV * D), *v = rand_buf(2, T * KV * D);
		int64_t *kpos = malloc((size_t)T * sizeof(int64_t));
		for (int64_t t = 0; t < T; t++)
			kpos[t] = t;
		const double causal = time_causal(T, H, KV, D, reps);
		printf("%8lld %4d %9s %10.4f %10s %10s %8s %10s   (the causal kernel, one rank)\n",
		       (long long)T, 1, "-", causal, "", "", "", "");
		for (int ci2 = 0; ci2 < n_cp; ci2++) {
			int cp = (int)cps[ci2];
			for (int b = 0; b < 2; b++) {
				enum cp_balancer bal = b ? CP_BALANCE_NONE : CP_BALANCE_HEADTAIL;
				if (T % cp_seq_divisor(cp, bal)) {
					printf("%8lld %4d %9s  (seq_len not divisible by %lld: skipped)\n",
					       (long long)T, cp, b ? "none" : "headtail",
					       (long long)cp_seq_divisor(cp, bal));
					continue;
				}
				int64_t Tl = T / cp;
				int64_t *order = malloc((size_t)T * sizeof(int64_t));
				cp_token_order(order, T, cp, bal);
				float *q = rand_buf(3, Tl * H * D), *dout = rand_buf(4, Tl * H * D);
				double tmax = 0, tmin = 1e30, sum = 0;
				for (int r = 0; r < cp; r++) {
					double t = time_rank(order + (int64_t)r * Tl, kpos, Tl, T, H, KV, D,
					                     reps, q, k, v, dout);
					tmax = t > tmax ? t : tmax;
					tmin = t < tmin ? t : tmin;
					sum += t;
				}
				printf("%8lld %4d %9s %10.4f %10.4f %10.4f %8.3f %10.3f\n", (long long)T,
				       cp, b ? "none" : "headtail", tmax, tmin, sum / cp, tmax / (sum / cp),
				       sum / causal);
				fflush(stdout);
				free(order), free(q), free(dout);
			}
		}
		free(k), free(v), free(kpos);
	}
	return 0;
}
