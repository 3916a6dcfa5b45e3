/* SwiGLU gate (Shazeer 2020): out = silu(a) * b, with a = x W1^T, b = x W3^T. */
#include "kernels/kreal.h"

void KFN(swiglu_forward)(real *out, const real *a, const real *b, int64_t n)
{
#pragma omp parallel for simd schedule(static)
	for (int64_t i = 0; i < n; i++) {
		real sig = (real)1 / ((real)1 + KEXP(-a[i]));
		out[i] = a[i] * sig * b[i];
	}
}

/* silu'(a) = sig * (1 + a * (1 - sig)) */
void KFN(swiglu_backward)(real *da, real *db, const real *dout, const real *a, const real *b,
                          int64_t n)
{
#pragma omp parallel for simd schedule(static)
	for (int64_t i = 0; i < n; i++) {
		real sig = (real)1 / ((real)1 + KEXP(-a[i]));
		real silu = a[i] * sig;
		da[i] = dout[i] * b[i] * sig * ((real)1 + a[i] * ((real)1 - sig));
		db[i] = dout[i] * silu;
	}
}
