/* LayerNorm (Ba et al. 2016) with weight and bias, as torch.nn.LayerNorm over the last dim:
 * y = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps) (biased variance). */
#include "kernels/hyena_kernels.h"
#include "kernels/kreal.h"

void KFN(layernorm_forward)(real *out, real *mean, real *rstd, const real *x, const real *w,
                            const real *b, int64_t N, int64_t C, double eps)
{
#pragma omp parallel for schedule(static)
	for (int64_t n = 0; n < N; n++) {
		const real *xn = x + n * C;
		real *yn = out + n * C;
		double s = 0.0, ss = 0.0;
		for (int64_t c = 0; c < C; c++)
			s += xn[c];
		double mu = s / (double)C;
		for (int64_t c = 0; c < C; c++) {
			double d = xn[c] - mu;
			ss += d * d;
		}
		real r = (real)(1.0 / sqrt(ss / (double)C + eps)), m = (real)mu;
		for (int64_t c = 0; c < C; c++)
			yn[c] = (xn[c] - m) * r * w[c] + b[c];
		if (mean)
			mean[n] = m;
		if (rstd)
			rstd[n] = r;
	}
}

/* With xhat = (x - mean) * r and g = dy * w:
 *   dx = r * (g - mean(g) - xhat * mean(g * xhat)),  dw += sum_n dy * xhat,  db += sum_n dy.
 * dw and db: channels split across threads, tokens summed in order (deterministic). */
void KFN(layernorm_backward)(real *dx, real *dw, real *db, const real *dout, const real *x,
                             const real *w, const real *mean, const real *rstd, int64_t N,
                             int64_t C)
{
	if (dx) {
#pragma omp parallel for schedule(static)
		for (int64_t n = 0; n < N; n++) {
			const real *xn = x + n * C, *dyn = dout + n * C;
			real *dxn = dx + n * C;
			real r = rstd[n], m = mean[n];
			double sg = 0.0, sgx = 0.0;
			for (int64_t c = 0; c < C; c++) {
				double g = (double)dyn[c] * w[c];
				sg += g;
				sgx += g * (double)((xn[c] - m) * r);
			}
			real mg = (real)(sg / (double)C), mgx = (real)(sgx / (double)C);
			for (int64_t c = 0; c < C; c++)
				dxn[c] += r * (dyn[c] * w[c] - mg - (xn[c] - m) * r * mgx);
		}
	}
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
			real r = rstd[n], m = mean[n];
			for (int64_t c = c0; c < c1; c++) {
				if (dw)
					dw[c] += dyn[c] * (xn[c] - m) * r;
				if (db)
					db[c] += dyn[c];
			}
		}
	}
}
