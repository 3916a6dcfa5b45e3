/* kernels/hyena_kernels: the ops of the Hyena long-convolution model (Poli et al. 2023, safari's
 * definition), forward and backward, compiled for float (_f32) and double (_f64) like
 * kernels.h:
 *   - the FFT causal long convolution through FFTW (plans cached per size, created under a
 *     lock: FFTW's planner is not thread-safe; execution with the new-array API is), and its
 *     direct O(T^2) twin, used by tests and by exact token-by-token generation;
 *   - the short depthwise causal convolution (K taps), LayerNorm (with bias), GELU (tanh
 *     approximation), the sine activation with a learnable per-unit frequency, bias rows;
 *   - the implicit filter: an MLP over positional features with sine activations, times an
 *     exponential-decay window.
 * Conventions as in kernels.h: row-major shapes next to every pointer, backward ACCUMULATES
 * into gradients, no allocation in the kernels (FFT scratch comes from the caller, sized by
 * fftconv_scratch_reals). Reductions over tokens split channels across threads, so results
 * do not depend on the thread count.
 *
 * The long convolution, per batch row b and channel c (h: filter taps, bias: the skip term):
 *   y[b,t,c] = sum_{s=0..t} h[t-s][c] * x[b,s,c] + bias[c] * x[b,t,c],   t < T.
 */
#ifndef CT_KERNELS_HYENA_KERNELS_H
#define CT_KERNELS_HYENA_KERNELS_H

#include <stdint.h>

/* FFT length of a causal convolution of T taps: the smallest 2^a 3^b 5^c >= 2T - 1 (no wrap
 * of the circular convolution into outputs 0..T-1). */
static inline int64_t fftconv_size(int64_t T)
{
	for (int64_t n = 2 * T - 1 > 1 ? 2 * T - 1 : 1;; n++) {
		int64_t r = n;
		while (r % 2 == 0)
			r /= 2;
		while (r % 3 == 0)
			r /= 3;
		while (r % 5 == 0)
			r /= 5;
		if (r == 1)
			return n;
	}
}
/* Reals per channel of a spectrum (n/2+1 complex numbers), padded to 64 bytes of doubles. */
static inline int64_t fftconv_spectrum_stride(int64_t T)
{
	return (2 * (fftconv_size(T) / 2 + 1) + 15) / 16 * 16;
}
/* Scratch (reals) the FFT convolutions need with up to nthreads OpenMP threads. */
static inline int64_t fftconv_scratch_reals(int64_t T, int nthreads)
{
	return 3 * (int64_t)nthreads * fftconv_spectrum_stride(T);
}

#define HYENA_KERNELS_DECLARE(real, S)                                                             \
	/* Hf(C, fftconv_spectrum_stride(T)) = the unscaled real FFT of each filter column:        \
	 * h[t*ld + c], t < T, zero-padded to fftconv_size(T). */                                  \
	void fftconv_filter_spectrum##S(real *Hf, const real *h, int64_t ld, int64_t T, int64_t C, \
	                                real *scratch, int nthreads);                              \
	/* y(B,T,C) = causal conv of x(B,T,C) with the filters of Hf, + bias(C) * x. */            \
	void fftconv_forward##S(real *y, const real *x, const real *Hf, const real *bias,          \
	                        int64_t B, int64_t T, int64_t C, real *scratch, int nthreads);     \
	/* dx(B,T,C) += ..., dh[t*ld + c] += ..., dbias(C) += ...; any may be NULL. */             \
	void fftconv_backward##S(real *dx, real *dh, int64_t ld, real *dbias, const real *dy,      \
	                         const real *x, const real *Hf, const real *bias, int64_t B,       \
	                         int64_t T, int64_t C, real *scratch, int nthreads);               \
	/* The same convolution as direct sums (reference twin; h[t*ld + c]). */                   \
	void longconv_forward_direct##S(real *y, const real *x, const real *h, int64_t ld,         \
	                                const real *bias, int64_t B, int64_t T, int64_t C);        \
	void longconv_backward_direct##S(real *dx, real *dh, int64_t ld, real *dbias,              \
	                                 const real *dy, const real *x, const real *h,             \
	                                 const real *bias, int64_t B, int64_t T, int64_t C);       \
	/* Depthwise causal conv, K taps (PyTorch Conv1d(groups=C, padding=K-1) truncated to T):   \
	 * y[b,t,c] = bias[c] + sum_{j<K} w[c*K + j] * x[b, t-K+1+j, c]  (x = 0 before t = 0). */  \
	void shortconv_forward##S(real *y, const real *x, const real *w, const real *bias,         \
	                          int64_t B, int64_t T, int64_t C, int64_t K);                     \
	void shortconv_backward##S(real *dx, real *dw, real *dbias, const real *dy, const real *x, \
	                           const real *w, int64_t B, int64_t T, int64_t C, int64_t K);     \
	/* LayerNorm over C: out = (x - mean) * rstd * w + b; mean, rstd (N) saved. */             \
	void layernorm_forward##S(real *out, real *mean, real *rstd, const real *x, const real *w, \
	                          const real *b, int64_t N, int64_t C, double eps);                \
	void layernorm_backward##S(real *dx, real *dw, real *db, const real *dout, const real *x,  \
	                           const real *w, const real *mean, const real *rstd, int64_t N,   \
	                           int64_t C);                                                     \
	/* out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (PyTorch approximate='tanh') */  \
	void gelu_forward##S(real *out, const real *x, int64_t n);                                 \
	void gelu_backward##S(real *dx, const real *dout, const real *x, int64_t n);               \
	/* out(N,C) = sin(freq[c] * x(N,C)) */                                                     \
	void sin_forward##S(real *out, const real *x, const real *freq, int64_t N, int64_t C);     \
	void sin_backward##S(real *dx, real *dfreq, const real *dout, const real *x,               \
	                     const real *freq, int64_t N, int64_t C);                              \
	/* out(N,C) += b(C) on every row; db(C) += column sums of dout(N,C). */                    \
	void bias_forward##S(real *out, const real *b, int64_t N, int64_t C);                      \
	void bias_backward##S(real *db, const real *dout, int64_t N, int64_t C);                   \
	/* Positional features z(L,E) of the implicit filter, for positions 0..L-1 of l_max:       \
	 * [t/(l_max-1), cos(f_k w_t) (k<B), -sin(f_k w_t) (k<B)], B = (E-1)/2,                    \
	 * f = linspace(1e-4, B-1, B), w_t = 2 pi t / l_max; and the window(L, C) =                \
	 * exp(-t/(l_max-1) * |delta_c|), delta = linspace(ln(1e-2)/1.5, ln(1e-2)/0.3, C). */      \
	void hyena_filter_features##S(real *z, real *window, int64_t L, int64_t l_max, int64_t E,  \
	                              int64_t C);                                                  \
	/* Implicit filter h(L,C) = window .* (s3 W3^T), s_k = sin(freq .* a_k),                   \
	 * a1 = z W0^T + b0, a2 = s1 W1^T + b1, a3 = s2 W2^T + b2. W0 (F,E), W1, W2 (F,F),         \
	 * W3 (C,F). acts holds 6*L*F reals: a1, s1, a2, s2, a3, s3 (saved for backward). */       \
	void hyena_filter_forward##S(                                                              \
	    real *h, real *acts, const real *z, const real *window, const real *W0,                \
	    const real *b0, const real *freq, const real *W1, const real *b1, const real *W2,      \
	    const real *b2, const real *W3, int64_t L, int64_t E, int64_t F, int64_t C);           \
	/* Accumulates the parameter gradients from dh(L,C). scratch holds L*(C + 2F) reals. */    \
	void hyena_filter_backward##S(                                                             \
	    real *dW0, real *db0, real *dfreq, real *dW1, real *db1, real *dW2, real *db2,         \
	    real *dW3, const real *dh, const real *acts, const real *z, const real *window,        \
	    const real *freq, const real *W1, const real *W2, const real *W3, int64_t L,           \
	    int64_t E, int64_t F, int64_t C, real *scratch);

HYENA_KERNELS_DECLARE(float, _f32)
HYENA_KERNELS_DECLARE(double, _f64)

#endif
