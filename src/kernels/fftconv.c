/* Causal long convolution by FFT (FFTW), and its direct twin.
 *
 * Per channel, x and h are zero-padded to n = fftconv_size(T) >= 2T-1, so the circular
 * convolution of length n equals the linear one on outputs 0..T-1:
 *   forward  y  = irfft(X .* H)[0..T) / n + bias .* x
 *   backward dx = irfft(DY .* conj(H))[0..T) / n + bias .* dy   (correlation with h)
 *            dh = irfft(sum_b DY_b .* conj(X_b))[0..T) / n      (correlation of dy with x)
 * (FFTW transforms are unscaled.) Each channel's spectrum lives in place in a buffer of
 * fftconv_spectrum_stride(T) reals: n reals in, n/2+1 complex out.
 *
 * Plans: one in-place r2c/c2r pair per length n, created on first use with FFTW_ESTIMATE
 * (deterministic: no timing-based choice, so reruns and ranks agree bitwise) under a mutex,
 * and kept for the life of the process. Threads execute them on their own 64-byte-aligned
 * scratch with fftw_execute_dft_r2c/c2r, which is thread-safe.
 */
#include <fftw3.h>
#include <pthread.h>
#include <string.h>

#include "base/log.h"
#include "kernels/hyena_kernels.h"
#include "kernels/kreal.h"

#ifdef KERNELS_F64
#define KFFTW(x) fftw_##x
#else
#define KFFTW(x) fftwf_##x
#endif

typedef KFFTW(complex) kcomplex;

struct fft_plans {
	int64_t n;
	KFFTW(plan) r2c, c2r;
};

#define FFT_MAX_PLANS 64
static struct fft_plans fft_plans[FFT_MAX_PLANS];
static int fft_n_plans;
static pthread_mutex_t fft_lock = PTHREAD_MUTEX_INITIALIZER;

/* The plan pair for length n (created once; the planner is serialised by fft_lock). */
static const struct fft_plans *fft_get_plans(int64_t n)
{
	pthread_mutex_lock(&fft_lock);
	const struct fft_plans *found = NULL;
	for (int i = 0; i < fft_n_plans && !found; i++)
		if (fft_plans[i].n == n)
			found = &fft_plans[i];
	if (!found && fft_n_plans < FFT_MAX_PLANS) {
		int64_t stride = 2 * (n / 2 + 1);
		real *buf = KFFTW(malloc)((size_t)stride * sizeof(real));
		struct fft_plans *p = &fft_plans[fft_n_plans];
		p->n = n;
		p->r2c = KFFTW(plan_dft_r2c_1d)((int)n, buf, (kcomplex *)buf, FFTW_ESTIMATE);
		p->c2r = KFFTW(plan_dft_c2r_1d)((int)n, (kcomplex *)buf, buf, FFTW_ESTIMATE);
		KFFTW(free)(buf);
		if (p->r2c && p->c2r) {
			fft_n_plans++;
			found = p;
		}
	}
	pthread_mutex_unlock(&fft_lock);
	CHECK(found, "fftconv: no FFTW plan for length %lld (%d lengths cached, at most %d)",
	      (long long)n, fft_n_plans, FFT_MAX_PLANS);
	return found;
}

static int thread_id(void)
{
#ifdef _OPENMP
	return omp_get_thread_num();
#else
	return 0;
#endif
}

/* buf[0..n) = column c of x (B,T,C) row b, zero-padded to the whole stride. */
static void load_column(real *buf, const real *x, int64_t ld, int64_t b, int64_t T, int64_t c,
                        int64_t stride)
{
	const real *src = x + b * T * ld + c;
	for (int64_t t = 0; t < T; t++)
		buf[t] = src[t * ld];
	memset(buf + T, 0, (size_t)(stride - T) * sizeof(real));
}

void KFN(fftconv_filter_spectrum)(real *Hf, const real *h, int64_t ld, int64_t T, int64_t C,
                                  real *scratch, int nthreads)
{
	(void)scratch;
	int64_t n = fftconv_size(T), S = fftconv_spectrum_stride(T);
	const struct fft_plans *p = fft_get_plans(n);
#pragma omp parallel for schedule(static) num_threads(nthreads)
	for (int64_t c = 0; c < C; c++) {
		real *buf = Hf + c * S;
		load_column(buf, h, ld, 0, T, c, S);
		KFFTW(execute_dft_r2c)(p->r2c, buf, (kcomplex *)buf);
	}
}

/* a *= b (conj_b: a *= conj(b)) over m complex numbers stored as (re, im) pairs. */
static void cmul(real *a, const real *b, int64_t m, int conj_b)
{
	real s = conj_b ? (real)-1 : (real)1;
	for (int64_t k = 0; k < m; k++) {
		real ar = a[2 * k], ai = a[2 * k + 1], br = b[2 * k], bi = s * b[2 * k + 1];
		a[2 * k] = ar * br - ai * bi;
		a[2 * k + 1] = ar * bi + ai * br;
	}
}

void KFN(fftconv_forward)(real *y, const real *x, const real *Hf, const real *bias, int64_t B,
                          int64_t T, int64_t C, real *scratch, int nthreads)
{
	int64_t n = fftconv_size(T), S = fftconv_spectrum_stride(T), m = n / 2 + 1;
	const struct fft_plans *p = fft_get_plans(n);
	real inv_n = (real)(1.0 / (double)n);
#pragma omp parallel for schedule(static) num_threads(nthreads)
	for (int64_t c = 0; c < C; c++) {
		real *buf = scratch + (int64_t)thread_id() * 3 * S;
		real bc = bias ? bias[c] : (real)0;
		for (int64_t b = 0; b < B; b++) {
			load_column(buf, x, C, b, T, c, S);
			KFFTW(execute_dft_r2c)(p->r2c, buf, (kcomplex *)buf);
			cmul(buf, Hf + c * S, m, 0);
			KFFTW(execute_dft_c2r)(p->c2r, (kcomplex *)buf, buf);
			const real *xs = x + b * T * C + c;
			real *ys = y + b * T * C + c;
			for (int64_t t = 0; t < T; t++)
				ys[t * C] = buf[t] * inv_n + bc * xs[t * C];
		}
	}
}

void KFN(fftconv_backward)(real *dx, real *dh, int64_t ld, real *dbias, const real *dy,
                           const real *x, const real *Hf, const real *bias, int64_t B, int64_t T,
                           int64_t C, real *scratch, int nthreads)
{
	int64_t n = fftconv_size(T), S = fftconv_spectrum_stride(T), m = n / 2 + 1;
	const struct fft_plans *p = fft_get_plans(n);
	real inv_n = (real)(1.0 / (double)n);
#pragma omp parallel for schedule(static) num_threads(nthreads)
	for (int64_t c = 0; c < C; c++) {
		real *bdy = scratch + (int64_t)thread_id() * 3 * S, *bx = bdy + S, *acc = bx + S;
		real bc = bias ? bias[c] : (real)0;
		double db = 0.0;
		if (dh)
			memset(acc, 0, (size_t)S * sizeof(real));
		for (int64_t b = 0; b < B; b++) {
			const real *dys = dy + b * T * C + c, *xs = x + b * T * C + c;
			load_column(bdy, dy, C, b, T, c, S);
			KFFTW(execute_dft_r2c)(p->r2c, bdy, (kcomplex *)bdy);
			if (dh) {
				load_column(bx, x, C, b, T, c, S);
				KFFTW(execute_dft_r2c)(p->r2c, bx, (kcomplex *)bx);
				for (int64_t k = 0; k < m; k++) {
					real ar = bdy[2 * k], ai = bdy[2 * k + 1];
					real br = bx[2 * k], bi = bx[2 * k + 1];
					acc[2 * k] += ar * br + ai * bi; /* dy .* conj(x) */
					acc[2 * k + 1] += ai * br - ar * bi;
				}
			}
			if (dbias)
				for (int64_t t = 0; t < T; t++)
					db += (double)dys[t * C] * xs[t * C];
			if (dx) {
				cmul(bdy, Hf + c * S, m, 1);
				KFFTW(execute_dft_c2r)(p->c2r, (kcomplex *)bdy, bdy);
				real *dxs = dx + b * T * C + c;
				for (int64_t t = 0; t < T; t++)
					dxs[t * C] += bdy[t] * inv_n + bc * dys[t * C];
			}
		}
		if (dh) {
			KFFTW(execute_dft_c2r)(p->c2r, (kcomplex *)acc, acc);
			for (int64_t t = 0; t < T; t++)
				dh[t * ld + c] += acc[t] * inv_n;
		}
		if (dbias)
			dbias[c] += (real)db;
	}
}

/* ------------------------------------------------------------ direct twin */

void KFN(longconv_forward_direct)(real *y, const real *x, const real *h, int64_t ld,
                                  const real *bias, int64_t B, int64_t T, int64_t C)
{
#pragma omp parallel for schedule(static)
	for (int64_t c = 0; c < C; c++)
		for (int64_t b = 0; b < B; b++) {
			const real *xs = x + b * T * C + c;
			for (int64_t t = 0; t < T; t++) {
				double s = bias ? (double)bias[c] * xs[t * C] : 0.0;
				for (int64_t k = 0; k <= t; k++)
					s += (double)h[(t - k) * ld + c] * xs[k * C];
				y[(b * T + t) * C + c] = (real)s;
			}
		}
}

void KFN(longconv_backward_direct)(real *dx, real *dh, int64_t ld, real *dbias, const real *dy,
                                   const real *x, const real *h, const real *bias, int64_t B,
                                   int64_t T, int64_t C)
{
#pragma omp parallel for schedule(static)
	for (int64_t c = 0; c < C; c++) {
		double db = 0.0;
		for (int64_t b = 0; b < B; b++) {
			const real *xs = x + b * T * C + c, *dys = dy + b * T * C + c;
			for (int64_t s = 0; s < T; s++) {
				double g = bias ? (double)bias[c] * dys[s * C] : 0.0;
				for (int64_t t = s; t < T; t++)
					g += (double)h[(t - s) * ld + c] * dys[t * C];
				if (dx)
					dx[(b * T + s) * C + c] += (real)g;
				db += (double)dys[s * C] * xs[s * C];
			}
		}
		if (dh)
			for (int64_t k = 0; k < T; k++) {
				double g = 0.0;
				for (int64_t b = 0; b < B; b++)
					for (int64_t t = k; t < T; t++)
						g += (double)dy[(b * T + t) * C + c] *
						     x[(b * T + t - k) * C + c];
				dh[k * ld + c] += (real)g;
			}
		if (dbias)
			dbias[c] += (real)db;
	}
}
