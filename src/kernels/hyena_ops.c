/* Small Hyena ops: GELU (tanh), sine with learnable frequency, bias rows, short depthwise
 * causal convolution. */
#include "kernels/hyena_kernels.h"
#include "kernels/kreal.h"

#ifdef KERNELS_F64
#define KTANH(x) tanh(x)
#define KSIN(x)  sin(x)
#define KCOS(x)  cos(x)
#else
/* tanh u = 1 - 2 / (e^{2u} + 1) through the vectorised kexpf: libm's tanhf was a third of a
 * Hyena training step. Absolute error ~1e-7, which is all GELU's 0.5 x (1 + tanh) sees. */
#define KTANH(x) (1.0f - 2.0f / (kexpf(2.0f * (x)) + 1.0f))
#define KSIN(x)  sinf(x)
#define KCOS(x)  cosf(x)
#endif

#define GELU_K ((real)0.7978845608028654) /* sqrt(2/pi) */
#define GELU_A ((real)0.044715)

void KFN(gelu_forward)(real *out, const real *x, int64_t n)
{
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < n; i++) {
		real v = x[i];
		out[i] = (real)0.5 * v * ((real)1 + KTANH(GELU_K * (v + GELU_A * v * v * v)));
	}
}

/* d/dx = 0.5 (1 + th) + 0.5 x (1 - th^2) k (1 + 3 a x^2) */
void KFN(gelu_backward)(real *dx, const real *dout, const real *x, int64_t n)
{
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < n; i++) {
		real v = x[i];
		real th = KTANH(GELU_K * (v + GELU_A * v * v * v));
		real d = (real)0.5 * ((real)1 + th) + (real)0.5 * v * ((real)1 - th * th) * GELU_K *
		                                          ((real)1 + 3 * GELU_A * v * v);
		dx[i] += dout[i] * d;
	}
}

void KFN(sin_forward)(real *out, const real *x, const real *freq, int64_t N, int64_t C)
{
#pragma omp parallel for schedule(static)
	for (int64_t n = 0; n < N; n++)
		for (int64_t c = 0; c < C; c++)
			out[n * C + c] = KSIN(freq[c] * x[n * C + c]);
}

/* dx += dout * freq * cos(freq x);  dfreq[c] += sum_n dout * x * cos(freq x) */
void KFN(sin_backward)(real *dx, real *dfreq, const real *dout, const real *x, const real *freq,
                       int64_t N, int64_t C)
{
#pragma omp parallel
	{
		int nt = 1, id = 0;
#ifdef _OPENMP
		nt = omp_get_num_threads();
		id = omp_get_thread_num();
#endif
		int64_t c0 = C * id / nt, c1 = C * (id + 1) / nt;
		for (int64_t n = 0; n < N; n++)
			for (int64_t c = c0; c < c1; c++) {
				real v = x[n * C + c], g = dout[n * C + c] * KCOS(freq[c] * v);
				if (dx)
					dx[n * C + c] += g * freq[c];
				if (dfreq)
					dfreq[c] += g * v;
			}
	}
}

void KFN(bias_forward)(real *out, const real *b, int64_t N, int64_t C)
{
#pragma omp parallel for schedule(static)
	for (int64_t n = 0; n < N; n++)
		for (int64_t c = 0; c < C; c++)
			out[n * C + c] += b[c];
}

void KFN(bias_backward)(real *db, const real *dout, int64_t N, int64_t C)
{
#pragma omp parallel
	{
		int nt = 1, id = 0;
#ifdef _OPENMP
		nt = omp_get_num_threads();
		id = omp_get_thread_num();
#endif
		int64_t c0 = C * id / nt, c1 = C * (id + 1) / nt;
		for (int64_t n = 0; n < N; n++)
			for (int64_t c = c0; c < c1; c++)
				db[c] += dout[n * C + c];
	}
}

void KFN(shortconv_forward)(real *y, const real *x, const real *w, const real *bias, int64_t B,
                            int64_t T, int64_t C, int64_t K)
{
#pragma omp parallel for schedule(static)
	for (int64_t bt = 0; bt < B * T; bt++) {
		int64_t t = bt % T;
		real *yr = y + bt * C;
		for (int64_t c = 0; c < C; c++)
			yr[c] = bias ? bias[c] : (real)0;
		for (int64_t j = 0; j < K; j++) {
			int64_t s = t - K + 1 + j;
			if (s < 0)
				continue;
			const real *xr = x + (bt - t + s) * C;
			for (int64_t c = 0; c < C; c++)
				yr[c] += w[c * K + j] * xr[c];
		}
	}
}

/* dx[s] += sum_j w[j] dy[s+K-1-j];  dw[c,j] += sum dy[t] x[t-K+1+j];  dbias[c] += sum dy.
 * Parameter gradients: channels split across threads, tokens in order. */
void KFN(shortconv_backward)(real *dx, real *dw, real *dbias, const real *dy, const real *x,
                             const real *w, int64_t B, int64_t T, int64_t C, int64_t K)
{
	if (dx) {
#pragma omp parallel for schedule(static)
		for (int64_t bt = 0; bt < B * T; bt++) {
			int64_t s = bt % T;
			real *dxr = dx + bt * C;
			for (int64_t j = 0; j < K; j++) {
				int64_t t = s + K - 1 - j;
				if (t >= T)
					continue;
				const real *dyr = dy + (bt - s + t) * C;
				for (int64_t c = 0; c < C; c++)
					dxr[c] += w[c * K + j] * dyr[c];
			}
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
		for (int64_t bt = 0; bt < B * T; bt++) {
			int64_t t = bt % T;
			const real *dyr = dy + bt * C;
			for (int64_t c = c0; c < c1; c++) {
				if (dbias)
					dbias[c] += dyr[c];
				if (!dw)
					continue;
				for (int64_t j = 0; j < K; j++) {
					int64_t s = t - K + 1 + j;
					if (s >= 0)
						dw[c * K + j] += dyr[c] * x[(bt - t + s) * C + c];
				}
			}
		}
	}
}
