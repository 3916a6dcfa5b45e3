/* Rotary position embedding (Su et al. 2021) with interleaved pairs, Meta/TorchTitan style:
 * (x[2i], x[2i+1]) is a complex number multiplied by e^{i t f_i}. */
#include "kernels/kreal.h"

static void rope_rotate(real *x, const real *cos_tab, const real *sin_tab, int64_t B, int64_t T,
                        int64_t NH, int64_t D, real sign)
{
	int64_t half = D / 2;
#pragma omp parallel for collapse(2) schedule(static)
	for (int64_t b = 0; b < B; b++)
		for (int64_t t = 0; t < T; t++) {
			const real *ct = cos_tab + t * half, *st = sin_tab + t * half;
			real *xt = x + (b * T + t) * NH * D;
			for (int64_t h = 0; h < NH; h++) {
				real *xh = xt + h * D;
				for (int64_t i = 0; i < half; i++) {
					real a = xh[2 * i], bb = xh[2 * i + 1];
					real c = ct[i], s = sign * st[i];
					xh[2 * i] = a * c - bb * s;
					xh[2 * i + 1] = a * s + bb * c;
				}
			}
		}
}

void KFN(rope_forward)(real *x, const real *cos_tab, const real *sin_tab, int64_t B, int64_t T,
                       int64_t NH, int64_t D)
{
	rope_rotate(x, cos_tab, sin_tab, B, T, NH, D, (real)1);
}

/* A rotation's transpose is its inverse: rotate the gradient by -angle. */
void KFN(rope_backward)(real *dx, const real *cos_tab, const real *sin_tab, int64_t B, int64_t T,
                        int64_t NH, int64_t D)
{
	rope_rotate(dx, cos_tab, sin_tab, B, T, NH, D, (real)-1);
}
