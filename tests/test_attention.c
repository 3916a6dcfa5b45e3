/* Tests of the causal grouped-query attention kernel (src/kernels/attention.c):
 *   - forward (f64) against a naive reference twin that builds each full softmax row;
 *   - backward (f64) against central finite differences of L = sum(out * G);
 *   - f32 against f64 on the same inputs; accumulation; determinism across runs and threads.
 * Shapes include T not a multiple of the 64-row tile, GQA, MQA and MHA, head dims on and off
 * the register-tiled path (multiples of the SIMD width or not).
 *
 *   test_attention           run the tests
 *   test_attention --bench [a|b|c]   print forward/backward GFLOP/s (fp32, and bf16 where the
 *                            CPU has AVX512-BF16) for the shapes that matter: (a) the debug
 *                            model, (b) a GQA layer at head dim 32, (c) the 125M model's layer
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "kernels/attention_bf16.h"
#include "kernels/kernels.h"
#include "testutil.h"

#ifdef _OPENMP
#include <omp.h>
#endif

struct shape {
	int64_t B, T, H, KV, D;
};

static int64_t q_numel(struct shape s)
{
	return s.B * s.T * s.H * s.D;
}
static int64_t kv_numel(struct shape s)
{
	return s.B * s.T * s.KV * s.D;
}
static int64_t lse_numel(struct shape s)
{
	return s.B * s.H * s.T;
}

/* Inputs and outputs of one problem, in double; f32 copies made on demand. */
struct problem {
	struct shape s;
	double *q, *k, *v, *out, *lse, *g; /* g: upstream gradient dL/dout */
	double *dq, *dk, *dv;
};

static void *xmalloc_test(size_t bytes)
{
	void *p = calloc(1, bytes);
	if (!p) {
		fprintf(stderr, "out of memory\n");
		abort();
	}
	return p;
}

static double *dalloc(int64_t n)
{
	return xmalloc_test((size_t)n * sizeof(double));
}
static float *falloc(int64_t n)
{
	return xmalloc_test((size_t)n * sizeof(float));
}

static struct problem problem_make(struct shape s)
{
	struct problem p = {.s = s};
	p.q = dalloc(q_numel(s)), p.out = dalloc(q_numel(s)), p.g = dalloc(q_numel(s));
	p.dq = dalloc(q_numel(s));
	p.k = dalloc(kv_numel(s)), p.v = dalloc(kv_numel(s));
	p.dk = dalloc(kv_numel(s)), p.dv = dalloc(kv_numel(s));
	p.lse = dalloc(lse_numel(s));
	test_fill(p.q, q_numel(s), -1.5, 1.5);
	test_fill(p.k, kv_numel(s), -1.5, 1.5);
	test_fill(p.v, kv_numel(s), -1, 1);
	test_fill(p.g, q_numel(s), -1, 1);
	return p;
}

static void problem_free(struct problem *p)
{
	free(p->q), free(p->k), free(p->v), free(p->out), free(p->lse), free(p->g);
	free(p->dq), free(p->dk), free(p->dv);
}

static void forward_f64(struct problem *p)
{
	struct shape s = p->s;
	attention_forward_f64(p->out, p->lse, p->q, p->k, p->v, s.B, s.T, s.H, s.KV, s.D);
}

/* dq, dk, dv = 0, then the kernel's backward with dout = g. */
static void backward_f64(struct problem *p)
{
	struct shape s = p->s;
	memset(p->dq, 0, (size_t)q_numel(s) * sizeof(double));
	memset(p->dk, 0, (size_t)kv_numel(s) * sizeof(double));
	memset(p->dv, 0, (size_t)kv_numel(s) * sizeof(double));
	attention_backward_f64(p->dq, p->dk, p->dv, p->g, p->out, p->lse, p->q, p->k, p->v, s.B,
	                       s.T, s.H, s.KV, s.D);
}

static void set_threads(int n)
{
#ifdef _OPENMP
	omp_set_num_threads(n);
#else
	(void)n;
#endif
}

static int max_threads(void)
{
#ifdef _OPENMP
	return omp_get_max_threads();
#else
	return 1;
#endif
}

/* Reference twin: for each (b, h, t) the full row of scores s_j = q_t.k_j / sqrt(D), j <= t,
 * its softmax, and out_t = sum_j softmax_j v_j. */
static void attention_forward_ref(double *out, double *lse, const double *q, const double *k,
                                  const double *v, struct shape s)
{
	double *row = dalloc(s.T);
	double scale = 1.0 / sqrt((double)s.D);
	for (int64_t b = 0; b < s.B; b++)
		for (int64_t h = 0; h < s.H; h++)
			for (int64_t t = 0; t < s.T; t++) {
				int64_t g = h / (s.H / s.KV);
				const double *qt = q + ((b * s.T + t) * s.H + h) * s.D;
				double mx = -INFINITY, sum = 0;
				for (int64_t j = 0; j <= t; j++) {
					const double *kj = k + ((b * s.T + j) * s.KV + g) * s.D;
					double dot = 0;
					for (int64_t d = 0; d < s.D; d++)
						dot += qt[d] * kj[d];
					row[j] = scale * dot;
					mx = fmax(mx, row[j]);
				}
				for (int64_t j = 0; j <= t; j++)
					sum += exp(row[j] - mx);
				lse[(b * s.H + h) * s.T + t] = mx + log(sum);
				double *ot = out + ((b * s.T + t) * s.H + h) * s.D;
				for (int64_t d = 0; d < s.D; d++)
					ot[d] = 0;
				for (int64_t j = 0; j <= t; j++) {
					const double *vj = v + ((b * s.T + j) * s.KV + g) * s.D;
					double pj = exp(row[j] - mx) / sum;
					for (int64_t d = 0; d < s.D; d++)
						ot[d] += pj * vj[d];
				}
			}
	free(row);
}

static const struct shape test_shapes[] = {
    {2, 37, 4, 2, 8},   /* GQA, one partial tile */
    {1, 70, 2, 2, 8},   /* MHA, a full and a partial tile */
    {2, 1, 3, 1, 16},   /* single token, MQA */
    {1, 64, 2, 1, 16},  /* exactly one tile */
    {1, 130, 2, 1, 6},  /* three tiles, D not a multiple of the SIMD width */
    {2, 200, 6, 2, 32}, /* four tiles, GQA group of 3 */
};
enum {
	N_TEST_SHAPES = sizeof(test_shapes) / sizeof(test_shapes[0]),
	N_FD_SHAPES = N_TEST_SHAPES - 1, /* finite differences: all but the largest */
};

TEST_CASE(forward_matches_reference)
{
	for (int c = 0; c < N_TEST_SHAPES; c++) {
		struct shape s = test_shapes[c];
		struct problem p = problem_make(s);
		double *out_ref = dalloc(q_numel(s)), *lse_ref = dalloc(lse_numel(s));
		forward_f64(&p);
		attention_forward_ref(out_ref, lse_ref, p.q, p.k, p.v, s);
		double e_out = rel_err_f64(p.out, out_ref, q_numel(s));
		double e_lse = rel_err_f64(p.lse, lse_ref, lse_numel(s));
		EXPECT(e_out < 1e-12, "T=%lld H=%lld KV=%lld D=%lld: out rel err %.3g",
		       (long long)s.T, (long long)s.H, (long long)s.KV, (long long)s.D, e_out);
		EXPECT(e_lse < 1e-12, "T=%lld H=%lld KV=%lld D=%lld: lse rel err %.3g",
		       (long long)s.T, (long long)s.H, (long long)s.KV, (long long)s.D, e_lse);
		free(out_ref), free(lse_ref);
		problem_free(&p);
	}
}

/* Norm-wise relative error ||a-b|| / ||b||; where the reference is (near) zero, as dq and dk
 * are for a single token (out = v whatever q and k), the RMS of a instead. */
static double grad_err(const double *a, const double *b, int64_t n)
{
	double nb = 0, na = 0;
	for (int64_t i = 0; i < n; i++)
		nb += b[i] * b[i], na += a[i] * a[i];
	if (sqrt(nb) < 1e-9 * sqrt((double)n))
		return sqrt(na / (double)n);
	return rel_err_f64(a, b, n);
}

/* L = sum(out * g), summed in a fixed order. */
static double loss_f64(struct problem *p)
{
	forward_f64(p);
	double L = 0;
	for (int64_t i = 0; i < q_numel(p->s); i++)
		L += p->out[i] * p->g[i];
	return L;
}

/* Central differences of L w.r.t. every element of x (q, k or v of p), into fd. */
static void loss_grad_fd(struct problem *p, double *x, int64_t n, double *fd)
{
	const double h = 1e-5;
	for (int64_t i = 0; i < n; i++) {
		double x0 = x[i];
		x[i] = x0 + h;
		double lp = loss_f64(p);
		x[i] = x0 - h;
		double lm = loss_f64(p);
		x[i] = x0;
		fd[i] = (lp - lm) / (2 * h);
	}
}

TEST_CASE(backward_matches_finite_differences)
{
	/* 2 forwards per input element, each too small to share out between threads (a
	 * parallel region costs more than the work on a busy machine) */
	int nt = max_threads();
	set_threads(1);
	for (int c = 0; c < N_FD_SHAPES; c++) {
		struct shape s = test_shapes[c];
		struct problem p = problem_make(s);
		forward_f64(&p);
		backward_f64(&p);
		double *fd = dalloc(q_numel(s));
		struct {
			const char *name;
			double *x, *grad;
			int64_t n;
		} wrt[] = {{"dq", p.q, p.dq, q_numel(s)},
		           {"dk", p.k, p.dk, kv_numel(s)},
		           {"dv", p.v, p.dv, kv_numel(s)}};
		for (int w = 0; w < 3; w++) {
			loss_grad_fd(&p, wrt[w].x, wrt[w].n, fd);
			double e = grad_err(wrt[w].grad, fd, wrt[w].n);
			EXPECT(e < 1e-6, "T=%lld H=%lld KV=%lld D=%lld: %s rel err %.3g vs FD",
			       (long long)s.T, (long long)s.H, (long long)s.KV, (long long)s.D,
			       wrt[w].name, e);
		}
		free(fd);
		problem_free(&p);
	}
	set_threads(nt);
}

static float *to_f32(const double *x, int64_t n)
{
	float *y = falloc(n);
	for (int64_t i = 0; i < n; i++)
		y[i] = (float)x[i];
	return y;
}

static double *to_f64(const float *x, int64_t n)
{
	double *y = dalloc(n);
	for (int64_t i = 0; i < n; i++)
		y[i] = x[i];
	return y;
}

/* f32 buffers of one problem. */
struct problem32 {
	struct shape s;
	float *q, *k, *v, *out, *lse, *g, *dq, *dk, *dv;
};

static struct problem32 problem32_from(const struct problem *p)
{
	struct shape s = p->s;
	struct problem32 f = {.s = s};
	f.q = to_f32(p->q, q_numel(s)), f.k = to_f32(p->k, kv_numel(s));
	f.v = to_f32(p->v, kv_numel(s)), f.g = to_f32(p->g, q_numel(s));
	f.out = falloc(q_numel(s)), f.lse = falloc(lse_numel(s)), f.dq = falloc(q_numel(s));
	f.dk = falloc(kv_numel(s)), f.dv = falloc(kv_numel(s));
	return f;
}

static void problem32_free(struct problem32 *f)
{
	free(f->q), free(f->k), free(f->v), free(f->out), free(f->lse), free(f->g);
	free(f->dq), free(f->dk), free(f->dv);
}

static void run_f32(struct problem32 *f)
{
	struct shape s = f->s;
	attention_forward_f32(f->out, f->lse, f->q, f->k, f->v, s.B, s.T, s.H, s.KV, s.D);
	memset(f->dq, 0, (size_t)q_numel(s) * sizeof(float));
	memset(f->dk, 0, (size_t)kv_numel(s) * sizeof(float));
	memset(f->dv, 0, (size_t)kv_numel(s) * sizeof(float));
	attention_backward_f32(f->dq, f->dk, f->dv, f->g, f->out, f->lse, f->q, f->k, f->v, s.B,
	                       s.T, s.H, s.KV, s.D);
}

TEST_CASE(f32_matches_f64)
{
	static const struct shape extra[] = {
	    {2, 300, 4, 1, 64}, /* five tiles, MQA, a Llama head dim */
	    {1, 70, 2, 1, ATTN_MAX_HEAD_DIM},
	};
	for (int c = 0; c < N_TEST_SHAPES + 2; c++) {
		struct shape s = c < N_TEST_SHAPES ? test_shapes[c] : extra[c - N_TEST_SHAPES];
		struct problem p = problem_make(s);
		/* both kernels see exactly the same (f32-representable) inputs */
		struct problem32 f = problem32_from(&p);
		double *qd = to_f64(f.q, q_numel(s)), *kd = to_f64(f.k, kv_numel(s));
		double *vd = to_f64(f.v, kv_numel(s)), *gd = to_f64(f.g, q_numel(s));
		free(p.q), free(p.k), free(p.v), free(p.g);
		p.q = qd, p.k = kd, p.v = vd, p.g = gd;
		forward_f64(&p);
		backward_f64(&p);
		run_f32(&f);
		struct {
			const char *name;
			const float *a;
			const double *b;
			int64_t n;
		} cmp[] = {{"out", f.out, p.out, q_numel(s)},
		           {"lse", f.lse, p.lse, lse_numel(s)},
		           {"dq", f.dq, p.dq, q_numel(s)},
		           {"dk", f.dk, p.dk, kv_numel(s)},
		           {"dv", f.dv, p.dv, kv_numel(s)}};
		for (int i = 0; i < 5; i++) {
			double *a = to_f64(cmp[i].a, cmp[i].n);
			double e = grad_err(a, cmp[i].b, cmp[i].n);
			EXPECT(e < 1e-5, "T=%lld H=%lld KV=%lld D=%lld: %s f32 vs f64 rel err %.3g",
			       (long long)s.T, (long long)s.H, (long long)s.KV, (long long)s.D,
			       cmp[i].name, e);
			free(a);
		}
		problem32_free(&f);
		problem_free(&p);
	}
}

TEST_CASE(backward_accumulates)
{
	struct shape s = {2, 100, 4, 2, 16};
	struct problem p = problem_make(s);
	forward_f64(&p);
	backward_f64(&p); /* p.dq, p.dk, p.dv: one call from zero */
	struct {
		const double *once;
		int64_t n;
	} g[] = {{p.dq, q_numel(s)}, {p.dk, kv_numel(s)}, {p.dv, kv_numel(s)}};
	double *acc[3], *want[3];
	for (int i = 0; i < 3; i++) {
		acc[i] = dalloc(g[i].n), want[i] = dalloc(g[i].n);
		test_fill(acc[i], g[i].n, -1, 1); /* start from nonzero gradients */
		for (int64_t j = 0; j < g[i].n; j++)
			want[i][j] = acc[i][j] + 2 * g[i].once[j];
	}
	for (int call = 0; call < 2; call++)
		attention_backward_f64(acc[0], acc[1], acc[2], p.g, p.out, p.lse, p.q, p.k, p.v,
		                       s.B, s.T, s.H, s.KV, s.D);
	for (int i = 0; i < 3; i++) {
		double e = rel_err_f64(acc[i], want[i], g[i].n);
		EXPECT(e < 1e-13, "grad %d: init + 2 calls vs init + 2 * one call: rel err %.3g", i,
		       e);
		free(acc[i]), free(want[i]);
	}
	problem_free(&p);
}

static bool same_bits(const float *a, const float *b, int64_t n)
{
	return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

TEST_CASE(deterministic)
{
	struct shape s = {2, 150, 6, 2, 16};
	struct problem p = problem_make(s);
	struct problem32 f1 = problem32_from(&p), f2 = problem32_from(&p);
	run_f32(&f1);
	run_f32(&f2);
	/* and with one thread: the work split must not change any sum's order */
	int nt = max_threads();
	set_threads(1);
	struct problem32 f3 = problem32_from(&p);
	run_f32(&f3);
	set_threads(nt);
	const struct problem32 *other[] = {&f2, &f3};
	for (int o = 0; o < 2; o++) {
		const struct problem32 *f = other[o];
		bool same = same_bits(f1.out, f->out, q_numel(s)) &&
		            same_bits(f1.lse, f->lse, lse_numel(s)) &&
		            same_bits(f1.dq, f->dq, q_numel(s)) &&
		            same_bits(f1.dk, f->dk, kv_numel(s)) &&
		            same_bits(f1.dv, f->dv, kv_numel(s));
		EXPECT(same, "%s: results differ bitwise",
		       o == 0 ? "two calls" : "1 thread vs default threads");
	}
	problem32_free(&f1), problem32_free(&f2), problem32_free(&f3);
	problem_free(&p);
}

/* ---- benchmark ----------------------------------------------------------------------- */

static void bench_shape(const char *name, struct shape s, bool bf16)
{
	struct problem p = problem_make(s);
	struct problem32 f = problem32_from(&p);
	problem_free(&p);
	/* causal: half of the T x T scores; 2 matmuls of 2*D flops per score forward */
	double flops_fwd = 4.0 * (double)(s.B * s.H) * (double)(s.T * s.T) * (double)s.D / 2;
	double flops_bwd = 2.5 * flops_fwd;
	double t_fwd = 1e30, t_bwd = 1e30;
	for (int rep = 0; rep < 22; rep++) {
		double t0 = timer_now();
		if (bf16)
			attention_bf16_forward(f.out, f.lse, f.q, f.k, f.v, s.B, s.T, s.H, s.KV, s.D);
		else
			attention_forward_f32(f.out, f.lse, f.q, f.k, f.v, s.B, s.T, s.H, s.KV, s.D);
		double t1 = timer_now();
		if (bf16)
			attention_bf16_backward(f.dq, f.dk, f.dv, f.g, f.out, f.lse, f.q, f.k, f.v,
			                        s.B, s.T, s.H, s.KV, s.D);
		else
			attention_backward_f32(f.dq, f.dk, f.dv, f.g, f.out, f.lse, f.q, f.k, f.v,
			                       s.B, s.T, s.H, s.KV, s.D);
		double t2 = timer_now();
		if (rep >= 2) { /* warm-up first */
			t_fwd = fmin(t_fwd, t1 - t0);
			t_bwd = fmin(t_bwd, t2 - t1);
		}
	}
	printf("%-20s %-5s B=%-2lld T=%-4lld H=%-2lld KV=%-2lld D=%-3lld  fwd %7.3f ms %6.1f "
	       "GFLOP/s   bwd %7.3f ms %6.1f GFLOP/s\n",
	       name, bf16 ? "bf16" : "fp32", (long long)s.B, (long long)s.T, (long long)s.H,
	       (long long)s.KV, (long long)s.D, 1e3 * t_fwd, flops_fwd / t_fwd * 1e-9,
	       1e3 * t_bwd, flops_bwd / t_bwd * 1e-9);
	problem32_free(&f);
}

static int bench(const char *only)
{
	const bool bf16 = attention_bf16_usable(16) && attention_bf16_usable(64);
	printf("attention, %d threads, best of 20 (flops: 2*B*H*T^2*D fwd, 2.5x bwd); bf16 "
	       "kernel: %s\n",
	       max_threads(), bf16 ? "AVX512-BF16" : "not on this CPU (no AVX512-BF16)");
	const struct shape shapes[] = {{8, 256, 16, 16, 16}, {4, 512, 24, 8, 32}, {4, 512, 12, 4, 64}};
	const char *names[] = {"(a) debug model", "(b) GQA, D=32", "(c) GQA, D=64 (125M)"};
	for (int i = 0; i < 3; i++)
		for (int b = 0; b <= (int)bf16; b++)
			if (!only || names[i][1] == only[0])
				bench_shape(names[i], shapes[i], b);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--bench") == 0)
		return bench(argc > 2 ? argv[2] : NULL);
	test_seed();
	RUN(forward_matches_reference);
	RUN(backward_matches_finite_differences);
	RUN(f32_matches_f64);
	RUN(backward_accumulates);
	RUN(deterministic);
	return test_summary();
}
