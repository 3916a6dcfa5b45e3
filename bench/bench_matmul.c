/* bench/bench_matmul: the matmul engines on this CPU, in one run: oneDNN fp32, oneDNN bf16,
 * OpenBLAS fp32 (with the kernel OpenBLAS runs) and oneDNN fp32 on its second implementation
 * (the candidate `auto` also times, named; 0 where oneDNN offers none), at a square size and at
 * the 125M model's linear-layer shapes (forward NT, backward NN and TN). Prints the CPU,
 * oneDNN's ISA and its bf16 implementation (AMX shows up as "brg:avx512_core_amx"), GFLOP/s
 * (best of the repeats) and ratios against OpenBLAS fp32.
 *   build/bench/bench_matmul [n=2048] [repeats=5]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/mem.h"
#include "base/timer.h"
#include "kernels/mm_engine.h"

struct shape {
	const char *name;
	bool ta, tb;
	int64_t M, N, K;
};

static double rate(enum mm_engine e, enum mm_dtype dt, const struct shape *s, float *A, float *B,
                   float *C, int reps)
{
	mm_engine_configure(e, dt);
	int64_t lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
	double best = 1e30;
	for (int r = 0; r <= reps; r++) { /* the first call builds the primitive: not timed */
		double t = timer_now();
		mm_gemm(s->ta, s->tb, s->M, s->N, s->K, A, lda, B, ldb, 0.0f, C, s->N);
		t = timer_now() - t;
		if (r > 0 && t < best)
			best = t;
	}
	return 2.0 * (double)s->M * (double)s->N * (double)s->K / best / 1e9;
}

/* fp32 on oneDNN's second implementation (what `auto` also times; mm_onednn.c), 0 when
 * oneDNN offers none here; its name into name. */
static double rate_second(const struct shape *s, float *A, float *B, float *C, int reps, char *name,
                          size_t len)
{
	int64_t lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
	double best = 1e30;
	snprintf(name, len, "none");
	for (int r = 0; r <= reps; r++) {
		double t = timer_now();
		if (mm_onednn_gemm(MM_F32, 1, s->ta, s->tb, s->M, s->N, s->K, A, lda, B, ldb, 0.0f,
		                   C, s->N) != 0)
			return 0;
		t = timer_now() - t;
		if (r > 0 && t < best)
			best = t;
	}
	snprintf(name, len, "%s", mm_onednn_last_impl());
	return 2.0 * (double)s->M * (double)s->N * (double)s->K / best / 1e9;
}

int main(int argc, char **argv)
{
	int64_t n = argc > 1 ? atoll(argv[1]) : 2048;
	int reps = argc > 2 ? atoi(argv[2]) : 5;
	/* 125M: dim 768, FFN 2048, 4 x 512 tokens */
	const struct shape shapes[] = {
	    {"square", false, true, n, n, n},
	    {"fwd x.W1^T (N,C)->(N,F)", false, true, 2048, 2048, 768},
	    {"bwd dx = dy.W1 (N,F)->(N,C)", false, false, 2048, 768, 2048},
	    {"bwd dW1 = dy^T.x (F,C)", true, false, 2048, 768, 2048},
	};
	int64_t big = n * n > 2048 * 2048 ? n * n : 2048 * 2048;
	float *A = mem_alloc(MEM_OTHER, (size_t)big * 4),
	      *B = mem_alloc(MEM_OTHER, (size_t)big * 4);
	float *C = mem_alloc(MEM_OTHER, (size_t)big * 4);
	for (int64_t i = 0; i < big; i++) {
		A[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
		B[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
	}
	const struct cpu_info *c = cpu_info();
	char d32[200], d16[200];
	cpu_peak_describe(false, 1 << 20, d32, sizeof(d32));
	cpu_peak_describe(true, 1 << 20, d16, sizeof(d16));
	printf("CPU %s (%s); AVX2 %d AVX-512 %d AVX512-BF16 %d AMX-BF16 %d\n", c->brand, c->vendor,
	       c->avx2, c->avx512, c->avx512_bf16, c->amx_bf16);
	printf("peaks (all cores): %.0f GFLOP/s %s; %.0f GFLOP/s %s\n",
	       cpu_peak_flops(false, 1 << 20) / 1e9, d32, cpu_peak_flops(true, 1 << 20) / 1e9, d16);
	/* run one bf16 matmul first so the bf16 implementation name is known */
	rate(MM_ENGINE_ONEDNN, MM_BF16, &shapes[1], A, B, C, 0);
	printf("oneDNN ISA %s, bf16 implementation %s; OpenBLAS kernel %s\n", mm_onednn_isa(),
	       mm_onednn_bf16_impl(), mm_openblas_core());
	printf("%-30s %14s %14s %14s %9s %9s %16s\n", "shape (M x N x K)", "openblas fp32",
	       "onednn fp32", "onednn bf16", "f32 ratio", "bf16 ratio", "onednn fp32 2nd");
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		const struct shape *s = &shapes[i];
		double ob = rate(MM_ENGINE_OPENBLAS, MM_F32, s, A, B, C, reps);
		double o32 = rate(MM_ENGINE_ONEDNN, MM_F32, s, A, B, C, reps);
		double o16 = rate(MM_ENGINE_ONEDNN, MM_BF16, s, A, B, C, reps);
		char second[48];
		double o2 = rate_second(s, A, B, C, reps, second, sizeof(second));
		printf("%-30s %14.1f %14.1f %14.1f %8.2fx %8.2fx %16.1f   (%lldx%lldx%lld; 2nd: "
		       "%s)\n",
		       s->name, ob, o32, o16, o32 / ob, o16 / ob, o2, (long long)s->M,
		       (long long)s->N, (long long)s->K, second);
	}
	mem_free(MEM_OTHER, A, (size_t)big * 4);
	mem_free(MEM_OTHER, B, (size_t)big * 4);
	mem_free(MEM_OTHER, C, (size_t)big * 4);
	return 0;
}
