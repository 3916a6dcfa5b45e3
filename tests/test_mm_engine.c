/* tests/test_mm_engine: the matmul engine layer (kernels/mm_engine.h) against a float64
 * reference, for each engine x dtype x transposes x beta, and the OpenBLAS guard's choice.
 *
 * fp32: |C - ref| <= K * 2^-23 * sum_k |a_ik b_kj| + tiny per element (fp32 accumulation).
 * bf16: the reference multiplies the operands rounded to bf16 (round to nearest even) in
 * float64; a bf16 x bf16 product is exact in fp32, so only the fp32 accumulation differs: the
 * same bound. The bf16 result must also differ from the unrounded reference by the size of
 * bf16 rounding (2^-9 relative per operand), which proves the operands were rounded. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/bf16.h"
#include "base/cpu.h"
#include "kernels/mm_engine.h"
#include "testutil.h"

static float rnd_bf16(float x, bool bf)
{
	return bf ? bf16_to_f32(bf16_from_f32(x)) : x;
}

/* Returns max over elements of |C - ref| / bound, and the relative L2 distance of C from the
 * unrounded float64 product. */
static double check_case(enum mm_engine e, enum mm_dtype dt, bool ta, bool tb, int64_t M, int64_t N,
                         int64_t K, float beta, double *dist_unrounded)
{
	bool bf = dt == MM_BF16;
	int64_t lda = ta ? M : K, ldb = tb ? K : N;
	float *A = malloc((size_t)(M * K) * 4), *B = malloc((size_t)(K * N) * 4);
	float *C = malloc((size_t)(M * N) * 4), *C0 = malloc((size_t)(M * N) * 4);
	test_fill_f32(A, M * K, -1, 1);
	test_fill_f32(B, K * N, -1, 1);
	test_fill_f32(C0, M * N, -1, 1);
	memcpy(C, C0, (size_t)(M * N) * 4);
	mm_engine_configure(e, dt);
	mm_gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, N);
	double worst = 0, d2 = 0, r2 = 0;
	for (int64_t i = 0; i < M; i++)
		for (int64_t j = 0; j < N; j++) {
			double s = beta * C0[i * N + j], sa = fabs(s), su = s;
			for (int64_t k = 0; k < K; k++) {
				float a = ta ? A[k * lda + i] : A[i * lda + k];
				float b = tb ? B[j * ldb + k] : B[k * ldb + j];
				double p = (double)rnd_bf16(a, bf) * rnd_bf16(b, bf);
				s += p;
				sa += fabs(p);
				su += (double)a * b;
			}
			double bound = (double)(K + 2) * 0x1p-23 * sa + 1e-30;
			double err = fabs(C[i * N + j] - s) / bound;
			if (err > worst)
				worst = err;
			d2 += (C[i * N + j] - su) * (C[i * N + j] - su);
			r2 += su * su;
		}
	*dist_unrounded = sqrt(d2 / r2);
	free(A), free(B), free(C), free(C0);
	return worst;
}

TEST_CASE(test_engines_against_reference)
{
	static const int64_t shapes[][3] = {
	    {37, 53, 71}, {128, 96, 256}, {1, 300, 64}, {200, 1, 129}};
	for (int e = MM_ENGINE_AUTO; e < MM_ENGINE_COUNT; e++)
		for (int dt = 0; dt < MM_DTYPE_COUNT; dt++)
			for (int t = 0; t < 3; t++) /* NT (forward), NN, TN (backward) */
				for (int s = 0; s < 4; s++)
					for (int b = 0; b < 2; b++) {
						bool ta = t == 2, tb = t == 0;
						double dist,
						    w = check_case((enum mm_engine)e,
						                   (enum mm_dtype)dt, ta, tb,
						                   shapes[s][0], shapes[s][1],
						                   shapes[s][2], (float)b, &dist);
						EXPECT(w <= 1.0,
						       "%s %s %c%c %lldx%lldx%lld beta %d: error "
						       "%.2f x "
						       "the bound",
						       mm_engine_name((enum mm_engine)e),
						       dt ? "bf16" : "fp32", ta ? 'T' : 'N',
						       tb ? 'T' : 'N', (long long)shapes[s][0],
						       (long long)shapes[s][1],
						       (long long)shapes[s][2], b, w);
						/* bf16 rounding moves a random product by ~2^-9
						 * relative; fp32 by ~2^-24 */
						if (dt == MM_BF16)
							EXPECT(
							    dist > 1e-4,
							    "bf16 result %.2e from the unrounded "
							    "product: operands not rounded",
							    dist);
						else
							EXPECT(dist < 1e-5,
							       "fp32 result %.2e from the product",
							       dist);
					}
	mm_engine_configure(MM_ENGINE_AUTO, MM_F32);
}

/* A bf16 twin is what the oneDNN bf16 path reads: with a twin that deliberately holds 2 x the
 * rounded weight, B's strided sub-block gives 2 x the product; removed, the product again.
 * (A twin never holds other values in the product: FSDP fills it with the weight rounded.) */
TEST_CASE(test_bf16_twin)
{
	mm_engine_configure(MM_ENGINE_ONEDNN, MM_BF16);
	if (strncmp(mm_onednn_bf16_impl(), "none", 4) == 0) {
		fprintf(stderr, "  oneDNN runs no bf16 matmul here (%s): twins unused, skipped\n",
		        mm_onednn_isa());
		mm_engine_configure(MM_ENGINE_AUTO, MM_F32);
		return;
	}
	int64_t M = 9, N = 7, K = 11, ldw = 16, rows = 20; /* B: rows 3.. of a (20, 16) buffer */
	float *A = malloc((size_t)(M * K) * 4), *W = malloc((size_t)(rows * ldw) * 4);
	uint16_t *W16 = malloc((size_t)(rows * ldw) * 2);
	float *C1 = calloc((size_t)(M * N), 4), *C2 = calloc((size_t)(M * N), 4),
	      *C3 = calloc((size_t)(M * N), 4);
	test_fill_f32(A, M * K, -1, 1);
	test_fill_f32(W, rows * ldw, -1, 1);
	for (int64_t i = 0; i < rows * ldw; i++)
		W16[i] = bf16_from_f32(2.0f * bf16_to_f32(bf16_from_f32(W[i])));
	const float *B = W + 3 * ldw + 2; /* (K, N) with leading dimension ldw */
	mm_gemm(false, false, M, N, K, A, K, B, ldw, 0.0f, C1, N);
	mm_bf16_twin_add(W, W16, rows * ldw);
	mm_gemm(false, false, M, N, K, A, K, B, ldw, 0.0f, C2, N);
	mm_bf16_twin_remove(W);
	mm_gemm(false, false, M, N, K, A, K, B, ldw, 0.0f, C3, N);
	int bad = 0;
	for (int64_t i = 0; i < M * N; i++)
		bad += C2[i] != 2.0f * C1[i] || C3[i] != C1[i];
	EXPECT(bad == 0, "%d of %lld elements: the twin was not read, or still read after removal",
	       bad, (long long)(M * N));
	free(A), free(W), free(W16), free(C1), free(C2), free(C3);
	mm_engine_configure(MM_ENGINE_AUTO, MM_F32);
}

/* A held operand (mm_bf16_hold) is rounded once and read by every product until released:
 * bitwise the product of the unheld operand, as A and as a transposed A (the dW product);
 * changing x while held (against the contract, to see which copy is read) leaves the products
 * on the held values; after release they follow x again. A hold inside a held range is not
 * taken (returns false), so releasing it cannot drop the outer one; fp32 takes no hold. */
TEST_CASE(test_bf16_hold)
{
	mm_engine_configure(MM_ENGINE_ONEDNN, MM_F32);
	float probe = 1;
	EXPECT(!mm_bf16_hold(&probe, 1), "fp32 compute took a hold");
	mm_engine_configure(MM_ENGINE_ONEDNN, MM_BF16);
	if (strncmp(mm_onednn_bf16_impl(), "none", 4) == 0) {
		fprintf(stderr, "  oneDNN runs no bf16 matmul here (%s): holds unused, skipped\n",
		        mm_onednn_isa());
		mm_engine_configure(MM_ENGINE_AUTO, MM_F32);
		return;
	}
	int64_t M = 33, N = 17, K = 24;
	float *X = malloc((size_t)(M * K) * 4), *X0 = malloc((size_t)(M * K) * 4);
	float *W = malloc((size_t)(M * N) * 4), *C[6]; /* (K, N) and (M, N) views, M > K */
	for (int i = 0; i < 6; i++)
		C[i] = calloc((size_t)(M > K ? M : K) * (size_t)N * 4, 1);
	test_fill_f32(X, M * K, -1, 1);
	test_fill_f32(W, M * N, -1, 1);
	memcpy(X0, X, (size_t)(M * K) * 4);
	/* C = X W (M x N) and C = X^T Y (K x N) with Y = the first M rows of W viewed (M, N) */
	mm_gemm(false, false, M, N, K, X, K, W, N, 0.0f, C[0], N);
	mm_gemm(true, false, K, N, M, X, K, W, N, 0.0f, C[1], N);
	int64_t held0, per0, held1, per1;
	mm_bf16_round_totals(&held0, &per0);
	EXPECT(mm_bf16_hold(X, M * K), "bf16 compute on oneDNN took no hold");
	EXPECT(!mm_bf16_hold(X + K, K), "a hold inside a held range was taken");
	mm_gemm(false, false, M, N, K, X, K, W, N, 0.0f, C[2], N);
	for (int64_t i = 0; i < M * K; i++)
		X[i] *= 2;
	mm_gemm(true, false, K, N, M, X, K, W, N, 0.0f, C[3], N);
	mm_bf16_round_totals(&held1, &per1);
	mm_bf16_release(X);
	mm_gemm(false, false, M, N, K, X, K, W, N, 0.0f, C[4], N);
	EXPECT(held1 - held0 == M * K && per1 - per0 == (K + M) * N,
	       "rounded %lld held and %lld per call, expected %lld and %lld (W's views, X never)",
	       (long long)(held1 - held0), (long long)(per1 - per0), (long long)(M * K),
	       (long long)((K + M) * N));
	int bad = 0;
	for (int64_t i = 0; i < M * N; i++)
		bad += C[2][i] != C[0][i] || C[4][i] != 2.0f * C[0][i];
	for (int64_t i = 0; i < K * N; i++)
		bad += C[3][i] != C[1][i];
	EXPECT(bad == 0, "%d elements: a held product differs from the unheld one, or the hold "
	       "was not read, or still read after release", bad);
	free(X), free(X0), free(W);
	for (int i = 0; i < 6; i++)
		free(C[i]);
	mm_engine_configure(MM_ENGINE_AUTO, MM_F32);
}

/* max over C's elements of |C - ref| / bound, ref = beta C0 + op(A) op(B) in float64 (op(X) =
 * X^T when tX; row-major, leading dimensions lda, ldb, ldc for C and C0) and bound the fp32
 * accumulation bound (K + 2) 2^-23 sum |terms|. */
static double worst_vs_f64(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A,
                           int64_t lda, const float *B, int64_t ldb, int beta, const float *C0,
                           const float *C, int64_t ldc)
{
	double worst = 0;
	for (int64_t i = 0; i < M; i++)
		for (int64_t j = 0; j < N; j++) {
			double r = beta * (double)C0[i * ldc + j], sa = fabs(r);
			for (int64_t k = 0; k < K; k++) {
				double p = (double)(ta ? A[k * lda + i] : A[i * lda + k]) *
				           (tb ? B[j * ldb + k] : B[k * ldb + j]);
				r += p, sa += fabs(p);
			}
			double e = fabs(C[i * ldc + j] - r) / ((double)(K + 2) * 0x1p-23 * sa);
			worst = e > worst ? e : worst;
		}
	return worst;
}

/* auto on a transposed copy of B (CT_MATMUL_FORCE_BT=1 makes auto take it wherever it applies):
 * NN and TN products with a strided B (leading dimension N + 5), beta 0 and 1, against the
 * float64 product with the fp32 bound; the shapes are new to the engine, so they are tuned
 * (and the copy taken) here. */
TEST_CASE(test_transposed_b)
{
	setenv("CT_MATMUL_FORCE_BT", "1", 1);
	mm_engine_configure(MM_ENGINE_AUTO, MM_F32);
	int before = mm_engine_bt_shapes();
	static const int64_t shapes[][3] = {{41, 67, 45}, {33, 35, 97}};
	for (int si = 0; si < 2; si++)
		for (int ta = 0; ta < 2; ta++)
			for (int beta = 0; beta < 2; beta++) {
				int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
				int64_t lda = ta ? M : K, ldb = N + 5;
				float *A = malloc((size_t)(M * K) * 4),
				      *B = malloc((size_t)(K * ldb) * 4);
				float *C = malloc((size_t)(M * N) * 4),
				      *C0 = malloc((size_t)(M * N) * 4);
				test_fill_f32(A, M * K, -1, 1);
				test_fill_f32(B, K * ldb, -1, 1);
				test_fill_f32(C0, M * N, -1, 1);
				memcpy(C, C0, (size_t)(M * N) * 4);
				mm_gemm(ta, false, M, N, K, A, lda, B, ldb, (float)beta, C, N);
				double worst = worst_vs_f64(ta, false, M, N, K, A, lda, B, ldb,
				                            beta, C0, C, N);
				EXPECT(worst <= 1.0,
				       "%cN %lldx%lldx%lld beta %d on B transposed: error %.2f x "
				       "the bound",
				       ta ? 'T' : 'N', (long long)M, (long long)N, (long long)K,
				       beta, worst);
				free(A), free(B), free(C), free(C0);
			}
	/* auto keys shapes by beta too: 2 sizes x 2 transposes x 2 betas */
	EXPECT(mm_engine_bt_shapes() - before == 8, "%d shapes ran on a transposed B, expected 8",
	       mm_engine_bt_shapes() - before);
	unsetenv("CT_MATMUL_FORCE_BT");
}

/* oneDNN's second implementation (kernels/mm_onednn.c): it is another implementation than
 * the first (by oneDNN's name), even once a primitive of the first exists (oneDNN 2.6's
 * iterator then lists the first twice); and auto forced onto it (CT_MATMUL_FORCE_IMPL=1) gives
 * the float64 product within the fp32 bound for NT, NN and TN products, beta 0 and 1, on
 * every shape where oneDNN offers a second implementation. A CPU where oneDNN offers one
 * implementation only checks the fallback. */
TEST_CASE(test_second_impl)
{
	int64_t M = 48, N = 40, K = 56;
	float *A = malloc((size_t)(M * K) * 4), *B = malloc((size_t)(K * N) * 4),
	      *C = malloc((size_t)(M * N) * 4);
	test_fill_f32(A, M * K, -1, 1);
	test_fill_f32(B, K * N, -1, 1);
	mm_engine_configure(MM_ENGINE_ONEDNN, MM_F32);
	char first[48];
	EXPECT(mm_onednn_gemm(MM_F32, 0, false, false, M, N, K, A, K, B, N, 0.0f, C, N) == 0,
	       "oneDNN runs an fp32 matmul");
	snprintf(first, sizeof(first), "%s", mm_onednn_last_impl());
	bool has_second =
	    mm_onednn_gemm(MM_F32, 1, false, false, M, N, K, A, K, B, N, 0.0f, C, N) == 0;
	if (has_second)
		EXPECT(strcmp(first, mm_onednn_last_impl()) != 0,
		       "oneDNN's second implementation is its first again (%s)", first);
	fprintf(stderr, "  oneDNN implementations here: %s, then %s\n", first,
	        has_second ? mm_onednn_last_impl() : "none");
	free(A), free(B), free(C);

	setenv("CT_MATMUL_FORCE_IMPL", "1", 1);
	mm_engine_configure(MM_ENGINE_AUTO, MM_F32);
	int before = mm_engine_alt_impl_shapes(), offered = 0;
	static const int64_t shapes[][3] = {{43, 69, 47}, {35, 37, 99}};
	for (int si = 0; si < 2; si++)
		for (int t = 0; t < 3; t++) /* NT, NN, TN */
			for (int beta = 0; beta < 2; beta++) {
				bool ta = t == 2, tb = t == 0;
				int64_t m = shapes[si][0] + t, n = shapes[si][1], k = shapes[si][2];
				/* dense operands: given a strided one, oneDNN 2.6 takes gemm:jit
				 * first and offers no second */
				int64_t lda = ta ? m : k, ldb = tb ? k : n, ldc = n;
				float *a = malloc((size_t)((ta ? k : m) * lda) * 4),
				      *b = malloc((size_t)((tb ? n : k) * ldb) * 4);
				float *c = malloc((size_t)(m * ldc) * 4),
				      *c0 = malloc((size_t)(m * ldc) * 4);
				test_fill_f32(a, (ta ? k : m) * lda, -1, 1);
				test_fill_f32(b, (tb ? n : k) * ldb, -1, 1);
				test_fill_f32(c0, m * ldc, -1, 1);
				/* does oneDNN offer a second implementation here, at this beta? */
				memcpy(c, c0, (size_t)(m * ldc) * 4);
				offered += mm_onednn_gemm(MM_F32, 1, ta, tb, m, n, k, a, lda, b,
				                          ldb, (float)beta, c, ldc) == 0;
				memcpy(c, c0, (size_t)(m * ldc) * 4);
				mm_gemm(ta, tb, m, n, k, a, lda, b, ldb, (float)beta, c, ldc);
				double worst =
				    worst_vs_f64(ta, tb, m, n, k, a, lda, b, ldb, beta, c0, c, ldc);
				EXPECT(worst <= 1.0,
				       "%c%c %lldx%lldx%lld beta %d on oneDNN's second "
				       "implementation: error %.2f x the bound",
				       ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)m, (long long)n,
				       (long long)k, beta, worst);
				free(a), free(b), free(c), free(c0);
			}
	int alt = mm_engine_alt_impl_shapes() - before;
	/* a shape is tuned once per beta: beta 0 and 1 of a product are two shapes */
	EXPECT(alt == offered, "%d shapes ran on oneDNN's second implementation, %d offer one", alt,
	       offered);
	EXPECT(!has_second || offered > 0,
	       "oneDNN offered a second implementation at %lldx%lldx%lld "
	       "but at none of the test's shapes",
	       (long long)M, (long long)N, (long long)K);
	fprintf(stderr, "  %d of 12 shapes ran on oneDNN's second implementation\n", alt);
	unsetenv("CT_MATMUL_FORCE_IMPL");
	mm_engine_configure(MM_ENGINE_AUTO, MM_F32);
}

/* Ragged products (an expert's token count changing from call to call, mm_engine_ragged):
 * run on oneDNN's run-time-size primitive (OpenBLAS when forced), within the same bound, for
 * every engine and dtype, with and without accumulation, leading dimensions changing with the
 * size; M varies in NT and NN, K in TN (dW); one family each, and no size tracked by auto. */
TEST_CASE(test_ragged)
{
	for (int e = MM_ENGINE_AUTO; e < MM_ENGINE_COUNT; e++)
		for (int dt = 0; dt < MM_DTYPE_COUNT; dt++) {
			const int64_t N = 40 + 8 * (2 * e + dt), K = 48; /* a fresh family each */
			const int before = mm_engine_ragged_families();
			double worst = 0, dist;
			for (int i = 0; i < 10; i++) {
				const int64_t m = 17 + 29 * i;
				const float beta = (float)(i % 2);
				mm_engine_ragged(true);
				double w[3] = {
				    check_case(e, dt, false, true, m, N, K, beta, &dist),
				    check_case(e, dt, false, false, m, N, K, beta, &dist),
				    check_case(e, dt, true, false, 64, N, m, beta, &dist)};
				mm_engine_ragged(false);
				for (int j = 0; j < 3; j++)
					worst = w[j] > worst ? w[j] : worst;
			}
			EXPECT(worst <= 1.0, "%s %s ragged: error %.2f x the bound",
			       mm_engine_name((enum mm_engine)e), dt ? "bf16" : "fp32", worst);
			EXPECT(mm_engine_ragged_families() == before + 3,
			       "%s %s: %d ragged families, 3 expected",
			       mm_engine_name((enum mm_engine)e), dt ? "bf16" : "fp32",
			       mm_engine_ragged_families() - before);
		}
	mm_engine_configure(MM_ENGINE_AUTO, MM_F32);
}

/* auto's choices kept across runs: a file written on this CPU is taken (a shape it lists runs as
 * listed, untimed: here oneDNN's second implementation, counted by mm_engine_alt_impl_shapes
 * without any product run), written back with the shape; another CPU's file and malformed ones
 * are not taken. */
TEST_CASE(test_choices_file)
{
	mm_engine_configure(MM_ENGINE_AUTO, MM_F32);
	char path[] = "/tmp/ct_mm_choices_XXXXXX";
	int fd = mkstemp(path);
	EXPECT(fd >= 0, "mkstemp");
	FILE *f = fdopen(fd, "w+");
	EXPECT(mm_engine_choices_write(f) >= 0, "write");
	rewind(f);
	char head[64], cpu[512];
	EXPECT(fgets(head, sizeof(head), f) && fgets(cpu, sizeof(cpu), f), "header");
	fclose(f);
	const int alt0 = mm_engine_alt_impl_shapes();
	/* this CPU's header with one new shape: NT 333 x 77 x 55, oneDNN, second implementation */
	f = fopen(path, "w");
	fprintf(f, "%s%s333 77 55 0 1 0 0 %d 0 1\n", head, cpu, (int)MM_ENGINE_ONEDNN);
	fclose(f);
	f = fopen(path, "r");
	EXPECT(mm_engine_choices_read(f) == 1, "this CPU's file: 1 shape taken");
	fclose(f);
	EXPECT(mm_engine_alt_impl_shapes() == alt0 + 1, "the taken shape runs oneDNN's second "
	                                                "implementation (%d -> %d)",
	       alt0, mm_engine_alt_impl_shapes());
	f = fopen(path, "w+");
	mm_engine_choices_write(f);
	rewind(f);
	char line[256];
	bool listed = false;
	while (fgets(line, sizeof(line), f))
		listed = listed || strncmp(line, "333 77 55 0 1 0 0", 17) == 0;
	fclose(f);
	EXPECT(listed, "the taken shape is written back");
	f = fopen(path, "w");
	fprintf(f, "%scpu another CPU\n334 77 55 0 1 0 0 %d 0 1\n", head, (int)MM_ENGINE_ONEDNN);
	fclose(f);
	f = fopen(path, "r");
	EXPECT(mm_engine_choices_read(f) == 0, "another CPU's file: nothing taken");
	fclose(f);
	f = fopen(path, "w");
	fprintf(f, "%s%s335 77 55 0 1 0 0 7 0 1\n", head, cpu);
	fclose(f);
	f = fopen(path, "r");
	EXPECT(mm_engine_choices_read(f) == -1, "an unknown engine: malformed");
	fclose(f);
	/* an older ctitan's file (v1: shapes keyed without beta, 9 fields) is not taken */
	f = fopen(path, "w");
	fprintf(f, "ctitan matmul choices v1\n%s336 77 55 0 1 0 %d 0 1\n", cpu,
	        (int)MM_ENGINE_ONEDNN);
	fclose(f);
	f = fopen(path, "r");
	EXPECT(mm_engine_choices_read(f) == 0, "a v1 file: nothing taken");
	fclose(f);
	EXPECT(mm_engine_alt_impl_shapes() == alt0 + 1, "nothing taken from the other files");
	unlink(path);
}

/* auto keys a shape by whether it accumulates too (beta 0 or not), and times it with that beta:
 * oneDNN's brgemm runs beta = 1 as a sum post-op, slower than its jit sgemm there, so the two
 * may choose differently. The same product at beta 0 and beta 1 is two shapes in the choices
 * file (the seventh number, after the sizes, transposes and dtype: 0, 1), both products right. */
TEST_CASE(test_beta_keyed_shapes)
{
	double dist; /* check_case configures auto, fp32 */
	EXPECT(check_case(MM_ENGINE_AUTO, MM_F32, false, true, 61, 43, 37, 0.0f, &dist) <= 1.0,
	       "beta 0 product");
	EXPECT(check_case(MM_ENGINE_AUTO, MM_F32, false, true, 61, 43, 37, 1.0f, &dist) <= 1.0,
	       "beta 1 product");
	FILE *f = tmpfile();
	EXPECT(f && mm_engine_choices_write(f) > 0, "write");
	rewind(f);
	char line[256];
	bool b0 = false, b1 = false;
	while (fgets(line, sizeof(line), f)) {
		b0 = b0 || strncmp(line, "61 43 37 0 1 0 0 ", 17) == 0;
		b1 = b1 || strncmp(line, "61 43 37 0 1 0 1 ", 17) == 0;
	}
	fclose(f);
	EXPECT(b0 && b1, "NT 61 x 43 x 37 listed at beta 0 (%d) and at beta 1 (%d)", b0, b1);
}

TEST_CASE(test_parse)
{
	enum mm_engine e;
	EXPECT(mm_engine_parse("onednn", &e) == 0 && e == MM_ENGINE_ONEDNN, "onednn");
	EXPECT(mm_engine_parse("openblas", &e) == 0 && e == MM_ENGINE_OPENBLAS, "openblas");
	EXPECT(mm_engine_parse("auto", &e) == 0 && e == MM_ENGINE_AUTO, "auto");
	EXPECT(mm_engine_parse("mkl", &e) != 0, "mkl is no engine");
}

TEST_CASE(test_openblas_guard_choice)
{
	struct cpu_info c;
	memset(&c, 0, sizeof(c));
	strcpy(c.vendor, "GenuineIntel");
	c.avx2 = c.fma = c.avx512 = c.avx512_bf16 = c.amx_bf16 = true;
	const char *w = mm_openblas_wanted_core(&c, "Prescott");
	EXPECT(w && strcmp(w, "Cooperlake") == 0, "Xeon with AMX + Prescott -> %s", w ? w : "-");
	c.avx512_bf16 = c.amx_bf16 = false;
	w = mm_openblas_wanted_core(&c, "Nehalem");
	EXPECT(w && strcmp(w, "SkylakeX") == 0, "AVX-512 + Nehalem -> %s", w ? w : "-");
	EXPECT(mm_openblas_wanted_core(&c, "SkylakeX") == NULL, "SkylakeX stands");
	EXPECT(mm_openblas_wanted_core(&c, "Haswell") == NULL, "an AVX2 kernel stands");
	strcpy(c.vendor, "AuthenticAMD");
	c.avx512 = false;
	w = mm_openblas_wanted_core(&c, "Prescott");
	EXPECT(w && strcmp(w, "Zen") == 0, "Zen 3 + Prescott -> %s", w ? w : "-");
	c.avx2 = c.fma = false;
	EXPECT(mm_openblas_wanted_core(&c, "Prescott") == NULL, "SSE-only CPU: Prescott stands");
	/* and on this machine the kernel OpenBLAS runs is not below what the CPU allows, unless
	 * the user chose it with OPENBLAS_CORETYPE */
	const char *user = getenv("OPENBLAS_CORETYPE");
	if (!user || !*user)
		EXPECT(mm_openblas_wanted_core(cpu_info(), mm_openblas_core()) == NULL,
		       "OpenBLAS runs the generic '%s' kernel: the guard did not act",
		       mm_openblas_core());
}

int main(void)
{
	test_seed();
	unsetenv("CT_MATMUL_ENGINE"); /* this test configures each engine itself */
	RUN(test_parse);
	RUN(test_openblas_guard_choice);
	RUN(test_engines_against_reference);
	RUN(test_bf16_twin);
	RUN(test_bf16_hold);
	RUN(test_transposed_b);
	RUN(test_second_impl);
	RUN(test_ragged);
	RUN(test_choices_file);
	RUN(test_beta_keyed_shapes);
	return test_summary();
}
