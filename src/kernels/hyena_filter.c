/* Hyena's implicit long filter (safari's HyenaFilter): an MLP over positional features with
 * sine activations that share one learnable frequency vector, times a fixed exponential
 * decay window. It depends on parameters only, so a model computes it once per forward (and
 * backpropagates into it once per backward), whatever the batch. */
#include <string.h>

#include "kernels/hyena_kernels.h"
#include "kernels/kreal.h"

void KFN(hyena_filter_features)(real *z, real *window, int64_t L, int64_t l_max, int64_t E,
                                int64_t C)
{
	int64_t bands = (E - 1) / 2;
	double tdiv = l_max > 1 ? (double)(l_max - 1) : 1.0;
	for (int64_t t = 0; t < L; t++) {
		double tn = (double)t / tdiv, wt = 2.0 * M_PI * (double)t / (double)l_max;
		real *zr = z + t * E;
		zr[0] = (real)tn;
		for (int64_t k = 0; k < bands; k++) {
			/* torch.linspace(1e-4, bands - 1, bands) */
			double f = bands > 1 ? 1e-4 + (double)k * ((double)(bands - 1) - 1e-4) /
			                                  (double)(bands - 1)
			                     : 1e-4;
			zr[1 + k] = (real)cos(f * wt);
			zr[1 + bands + k] = (real)-sin(f * wt);
		}
		if (!window)
			continue;
		for (int64_t c = 0; c < C; c++) {
			double lo = log(1e-2) / 1.5, hi = log(1e-2) / 0.3;
			double delta = C > 1 ? lo + (double)c * (hi - lo) / (double)(C - 1) : lo;
			window[t * C + c] = (real)exp(-tn * fabs(delta));
		}
	}
}

void KFN(hyena_filter_forward)(real *h, real *acts, const real *z, const real *window,
                               const real *W0, const real *b0, const real *freq, const real *W1,
                               const real *b1, const real *W2, const real *b2, const real *W3,
                               int64_t L, int64_t E, int64_t F, int64_t C)
{
	real *a1 = acts, *s1 = a1 + L * F, *a2 = s1 + L * F, *s2 = a2 + L * F;
	real *a3 = s2 + L * F, *s3 = a3 + L * F;
	KFN(matmul_forward)(a1, z, W0, L, E, F, 0);
	KFN(bias_forward)(a1, b0, L, F);
	KFN(sin_forward)(s1, a1, freq, L, F);
	KFN(matmul_forward)(a2, s1, W1, L, F, F, 0);
	KFN(bias_forward)(a2, b1, L, F);
	KFN(sin_forward)(s2, a2, freq, L, F);
	KFN(matmul_forward)(a3, s2, W2, L, F, F, 0);
	KFN(bias_forward)(a3, b2, L, F);
	KFN(sin_forward)(s3, a3, freq, L, F);
	KFN(matmul_forward)(h, s3, W3, L, F, C, 0);
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < L * C; i++)
		h[i] *= window[i];
}

void KFN(hyena_filter_backward)(real *dW0, real *db0, real *dfreq, real *dW1, real *db1, real *dW2,
                                real *db2, real *dW3, const real *dh, const real *acts,
                                const real *z, const real *window, const real *freq, const real *W1,
                                const real *W2, const real *W3, int64_t L, int64_t E, int64_t F,
                                int64_t C, real *scratch)
{
	const real *a1 = acts, *s1 = a1 + L * F, *a2 = s1 + L * F, *s2 = a2 + L * F;
	const real *a3 = s2 + L * F, *s3 = a3 + L * F;
	real *dhr = scratch, *ds = dhr + L * C, *da = ds + L * F;
	size_t lf = (size_t)(L * F) * sizeof(real);
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < L * C; i++)
		dhr[i] = dh[i] * window[i];
	/* h = s3 W3^T */
	memset(ds, 0, lf);
	KFN(matmul_backward)(ds, dW3, dhr, s3, W3, L, F, C);
	/* s3 = sin(freq a3), a3 = s2 W2^T + b2 */
	memset(da, 0, lf);
	KFN(sin_backward)(da, dfreq, ds, a3, freq, L, F);
	KFN(bias_backward)(db2, da, L, F);
	memset(ds, 0, lf);
	KFN(matmul_backward)(ds, dW2, da, s2, W2, L, F, F);
	/* s2 = sin(freq a2), a2 = s1 W1^T + b1 */
	memset(da, 0, lf);
	KFN(sin_backward)(da, dfreq, ds, a2, freq, L, F);
	KFN(bias_backward)(db1, da, L, F);
	memset(ds, 0, lf);
	KFN(matmul_backward)(ds, dW1, da, s1, W1, L, F, F);
	/* s1 = sin(freq a1), a1 = z W0^T + b0 (z is fixed: no gradient) */
	memset(da, 0, lf);
	KFN(sin_backward)(da, dfreq, ds, a1, freq, L, F);
	KFN(bias_backward)(db0, da, L, F);
	KFN(matmul_backward)(NULL, dW0, da, z, NULL, L, E, F);
}
