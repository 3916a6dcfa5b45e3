/* Token embedding: a row gather forward, a scatter-add backward. */
#include <string.h>

#include "kernels/kreal.h"

void KFN(embedding_forward)(real *out, const int32_t *tokens, const real *wte, int64_t N, int64_t C)
{
#pragma omp parallel for schedule(static)
	for (int64_t n = 0; n < N; n++)
		memcpy(out + n * C, wte + (int64_t)tokens[n] * C, (size_t)C * sizeof(real));
}

/* dwte[tok] += dout[n]. Threads split the channel range, not the tokens, so two tokens with
 * the same id never race and the summation order (n ascending) is fixed. */
void KFN(embedding_backward)(real *dwte, const real *dout, const int32_t *tokens, int64_t N,
                             int64_t C)
{
#pragma omp parallel
	{
		int nt = 1, id = 0;
#ifdef _OPENMP
		nt = omp_get_num_threads();
		id = omp_get_thread_num();
#endif
		int64_t c0 = C * id / nt, c1 = C * (id + 1) / nt;
		for (int64_t n = 0; n < N; n++) {
			real *dst = dwte + (int64_t)tokens[n] * C;
			const real *src = dout + n * C;
			for (int64_t c = c0; c < c1; c++)
				dst[c] += src[c];
		}
	}
}
