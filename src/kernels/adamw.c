/* AdamW (Loshchilov & Hutter 2019), in PyTorch's exact formulation, and the squared norm. */
#include <math.h>
#include <stdint.h>

#include "kernels/kernels.h"

void adamw_update(float *p, const float *grad, float *m, float *v, int64_t n, double lr,
                  double beta1, double beta2, double eps, double weight_decay, int64_t t,
                  double gscale)
{
	double bc1 = 1.0 - pow(beta1, (double)t);
	double bc2 = 1.0 - pow(beta2, (double)t);
	float step_size = (float)(lr / bc1);
	float bc2_sqrt = (float)sqrt(bc2);
	float decay = (float)(1.0 - lr * weight_decay);
	float b1 = (float)beta1, b2 = (float)beta2, fe = (float)eps, gs = (float)gscale;
#pragma omp parallel for simd schedule(static)
	for (int64_t i = 0; i < n; i++) {
		float g = grad[i] * gs;
		float mi = b1 * m[i] + (1.0f - b1) * g;
		float vi = b2 * v[i] + (1.0f - b2) * g * g;
		m[i] = mi;
		v[i] = vi;
		float denom = sqrtf(vi) / bc2_sqrt + fe;
		p[i] = p[i] * decay - step_size * mi / denom;
	}
}

/* Sum of squares of one block in double: 8 independent partial sums (element i into lane
 * i mod 8, so the compiler keeps them in one vector register instead of waiting on one
 * serial add per element), combined in a fixed pairwise order. */
static double sumsq_block(const float *x, int64_t n)
{
	double acc[8] = {0};
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int k = 0; k < 8; k++)
			acc[k] += (double)x[i + k] * x[i + k];
	for (int k = 0; i < n; i++, k++)
		acc[k] += (double)x[i] * x[i];
	return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

double sumsq_f32(const float *x, int64_t n)
{
	/* Fixed-size blocks summed in order, so the result does not depend on thread count. */
	const int64_t blk = 1 << 14;
	int64_t nb = (n + blk - 1) / blk;
	double total = 0.0;
	for (int64_t b0 = 0; b0 < nb; b0 += 256) {
		double part[256];
		int64_t cnt = nb - b0 < 256 ? nb - b0 : 256;
#pragma omp parallel for schedule(static)
		for (int64_t b = 0; b < cnt; b++) {
			int64_t i0 = (b0 + b) * blk, i1 = i0 + blk < n ? i0 + blk : n;
			part[b] = sumsq_block(x + i0, i1 - i0);
		}
		for (int64_t b = 0; b < cnt; b++)
			total += part[b];
	}
	return total;
}
