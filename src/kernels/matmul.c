/* Linear layer through BLAS gemm. Weights are (out, in) like torch.nn.Linear. */
#include "kernels/kreal.h"

void KFN(matmul_forward)(real *out, const real *inp, const real *w, int64_t N, int64_t C,
                         int64_t OC, int accumulate)
{
	/* out(N,OC) = inp(N,C) . w(OC,C)^T */
	KGEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)OC, (int)C, 1.0, inp, (int)C, w,
	      (int)C, accumulate ? 1.0 : 0.0, out, (int)OC);
}

void KFN(matmul_backward)(real *dinp, real *dw, const real *dout, const real *inp, const real *w,
                          int64_t N, int64_t C, int64_t OC)
{
	/* dinp(N,C) += dout(N,OC) . w(OC,C) */
	if (dinp)
		KGEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)C, (int)OC, 1.0, dout,
		      (int)OC, w, (int)C, 1.0, dinp, (int)C);
	/* dw(OC,C) += dout(N,OC)^T . inp(N,C) */
	if (dw)
		KGEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OC, (int)C, (int)N, 1.0, dout,
		      (int)OC, inp, (int)C, 1.0, dw, (int)C);
}
