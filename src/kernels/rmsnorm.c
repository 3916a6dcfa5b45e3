/* RMSNorm (Zhang & Sennrich 2019), as in Llama: y = x * rstd * w, rstd = 1/sqrt(mean(x^2)+eps). */
#include "kernels/kreal.h"

void KFN(rmsnorm_forward)(real *out, real *rstd, const real *x, const real *w, int64_t N, int64_t C,
                          double eps)
{
#pragma omp parallel for schedule(static)
	for (int64_t n = 0; n < N; n++) {
		const real *xn = x + n * C;
		real *yn = out + n * C;
		double ss = 0.0;
		for (int64_t c = 0; c < C; c++)
			ss += (double)xn[c] * xn[c];
		real r = (real)(1.0 / sqrt(ss / (double)C + eps));
		for (int64_t c = 0; c < C; c++)
			yn[c] = xn[c] * r * w[c];
		if (rstd)
			rstd[n] = r;
	}
}

/* With xhat = x*r:  dw += sum_n dy*xhat;  dx = r * (g - xhat * mean(g*xhat)),  g = dy*w.
 * dw is reduced per thread over a fixed token range, then summed in thread order. */
void KFN(rmsnorm_backward)(real *dx, real *dw, const real *dout, const real *x, const real *w,
                           const real *rstd, int64_t N, int64_t C)
{
#pragma omp parallel for schedule(static)
	for (int64_t n = 0; n < N; n++) {
		const real *xn = x + n * C, *dyn = dout + n * C;
		real *dxn = dx + n * C;
		real r = rstd[n];
		double dot = 0.0;
		for (int64_t c = 0; c < C; c++)
			dot += (double)dyn[c] * w[c] * xn[c];
		real m = (real)(dot * r / (double)C); /* mean(g * xhat) */
		for (int64_t c = 0; c < C; c++)
			dxn[c] += r * (dyn[c] * w[c] - xn[c] * r * m);
	}
	/* dw: channels split across threads, tokens summed in order -> deterministic. */
#pragma omp parallel
	{
		int nt = 1, id = 0;
#ifdef _OPENMP
		nt = omp_get_num_threads();
		id = omp_get_thread_num();
#endif
		int64_t c0 = C * id / nt, c1 = C * (id + 1) / nt;
		for (int64_t n = 0; n < N; n++) {
			const real *xn = x + n * C, *dyn = dout + n * C;
			real r = rstd[n];
			for (int64_t c = c0; c < c1; c++)
				dw[c] += dyn[c] * xn[c] * r;
		}
	}
}
