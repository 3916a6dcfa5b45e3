/* Linear layer. Weights are (out, in) like torch.nn.Linear. The float build goes through the
 * matmul engine (oneDNN or OpenBLAS, fp32 or bf16 compute: kernels/mm_engine.h), or, for a
 * weight registered as a float8 linear, through the emulated float8 recipe
 * (kernels/fp8_linear.h); the double build, used only by finite-difference tests, calls
 * cblas_dgemm. */
#include "kernels/kreal.h"
#include "kernels/mm_engine.h"

#ifdef KERNELS_F64
static void matmul_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const real *A,
                        int64_t lda, const real *B, int64_t ldb, real beta, real *C, int64_t ldc)
{
	cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
	            (int)M, (int)N, (int)K, 1.0, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}
/* float8 linears exist only in the float build */
static bool matmul_fp8_forward(real *out, const real *inp, const real *w, int64_t N, int64_t C,
                               int64_t OC, int accumulate)
{
	(void)out, (void)inp, (void)w, (void)N, (void)C, (void)OC, (void)accumulate;
	return false;
}
static bool matmul_fp8_backward(real *dinp, real *dw, const real *dout, const real *inp,
                                const real *w, int64_t N, int64_t C, int64_t OC, int acc)
{
	(void)dinp, (void)dw, (void)dout, (void)inp, (void)w, (void)N, (void)C, (void)OC, (void)acc;
	return false;
}
static bool matmul_hold(const real *x, int64_t n)
{
	(void)x, (void)n;
	return false;
}
static void matmul_release(const real *x)
{
	(void)x;
}
#else
#include "kernels/fp8_linear.h"
#define matmul_gemm mm_gemm
static bool matmul_fp8_forward(float *out, const float *inp, const float *w, int64_t N,
                               int64_t C, int64_t OC, int accumulate)
{
	if (!fp8_linear_is(w))
		return false;
	fp8_linear_forward(out, inp, w, N, C, OC, accumulate);
	return true;
}
static bool matmul_fp8_backward(float *dinp, float *dw, const float *dout, const float *inp,
                                const float *w, int64_t N, int64_t C, int64_t OC, int acc)
{
	if (!fp8_linear_is(w))
		return false;
	fp8_linear_backward(dinp, dw, dout, inp, w, N, C, OC, acc);
	return true;
}
#define matmul_hold    mm_bf16_hold
#define matmul_release mm_bf16_release
#endif

void KFN(matmul_forward)(real *out, const real *inp, const real *w, int64_t N, int64_t C,
                         int64_t OC, int accumulate)
{
	/* out(N,OC) = inp(N,C) . w(OC,C)^T */
	if (matmul_fp8_forward(out, inp, w, N, C, OC, accumulate))
		return;
	matmul_gemm(false, true, N, OC, C, inp, C, w, C, accumulate ? 1 : 0, out, OC);
}

/* dinp (+)= dout w with beta = dinp_acc; dw += dout^T inp */
static void matmul_backward_beta(real *dinp, real *dw, const real *dout, const real *inp,
                                 const real *w, int64_t N, int64_t C, int64_t OC, int dinp_acc)
{
	if (matmul_fp8_backward(dinp, dw, dout, inp, w, N, C, OC, dinp_acc))
		return;
	/* bf16 compute: dout feeds both products, rounded once (kernels/mm_engine.h) */
	bool hold = dinp && dw && matmul_hold(dout, N * OC);
	/* dinp(N,C) (+)= dout(N,OC) . w(OC,C) */
	if (dinp)
		matmul_gemm(false, false, N, C, OC, dout, OC, w, C, dinp_acc ? 1 : 0, dinp, C);
	/* dw(OC,C) += dout(N,OC)^T . inp(N,C) */
	if (dw)
		matmul_gemm(true, false, OC, C, N, dout, OC, inp, C, 1, dw, C);
	if (hold)
		matmul_release(dout);
}

void KFN(matmul_backward)(real *dinp, real *dw, const real *dout, const real *inp, const real *w,
                          int64_t N, int64_t C, int64_t OC)
{
	matmul_backward_beta(dinp, dw, dout, inp, w, N, C, OC, 1);
}

void KFN(matmul_backward_set)(real *dinp, real *dw, const real *dout, const real *inp,
                              const real *w, int64_t N, int64_t C, int64_t OC)
{
	matmul_backward_beta(dinp, dw, dout, inp, w, N, C, OC, 0);
}
