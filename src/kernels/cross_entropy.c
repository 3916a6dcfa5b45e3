/* Fused output projection + softmax cross-entropy, in token chunks.
 *
 * For each chunk of rows: logits = x W^T (chunk x V, in caller scratch), then per row
 *   lse = log sum_j exp(z_j),  loss = lse - z_target,
 *   dz_j = (softmax_j - [j == target]) * dscale     (0 for ignored rows),
 * and dx += dz W, dW += dz^T x before the next chunk overwrites the scratch. So the full
 * (N, V) logits never exist; memory is chunk*V whatever N is.
 */
#include "kernels/kreal.h"

double KFN(cross_entropy_fused)(real *dx, real *dw, const real *x, const real *w,
                                const int32_t *targets, int64_t N, int64_t C, int64_t V,
                                int32_t ignore_index, double dscale, real *scratch, int64_t chunk,
                                int64_t *n_valid)
{
	double loss_sum = 0.0;
	int64_t valid = 0;
	int want_grad = dx || dw;
	for (int64_t n0 = 0; n0 < N; n0 += chunk) {
		int64_t rows = N - n0 < chunk ? N - n0 : chunk;
		const real *xc = x + n0 * C;
		KFN(matmul_forward)(scratch, xc, w, rows, C, V, 0);
		double chunk_loss = 0.0;
		int64_t chunk_valid = 0;
#pragma omp parallel for schedule(static) reduction(+ : chunk_loss, chunk_valid)
		for (int64_t r = 0; r < rows; r++) {
			real *z = scratch + r * V;
			int32_t tgt = targets[n0 + r];
			if (tgt == ignore_index) {
				if (want_grad)
					for (int64_t j = 0; j < V; j++)
						z[j] = 0;
				continue;
			}
			real zmax = z[0];
			for (int64_t j = 1; j < V; j++)
				zmax = z[j] > zmax ? z[j] : zmax;
			real sum = 0;
			for (int64_t j = 0; j < V; j++)
				sum += KEXP(z[j] - zmax);
			real lse = zmax + KLOG(sum);
			chunk_loss += (double)(lse - z[tgt]);
			chunk_valid++;
			if (want_grad) {
				real s = (real)dscale;
				for (int64_t j = 0; j < V; j++)
					z[j] = KEXP(z[j] - lse) * s;
				z[tgt] -= s;
			}
		}
		loss_sum += chunk_loss;
		valid += chunk_valid;
		if (want_grad)
			KFN(matmul_backward)
			(dx ? dx + n0 * C : NULL, dw, scratch, xc, w, rows, C, V);
	}
	if (n_valid)
		*n_valid = valid;
	return loss_sum;
}
