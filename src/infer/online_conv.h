/* infer/online_conv: exact online causal long convolution for autoregressive decoding.
 *
 * A bank of long convolutions that all advance one position per decoding step:
 *   z[t] = sum_{k<=t} rho[t-k] * y[k]
 * per (instance, batch row, channel), where each (instance, channel) has its own filter rho
 * of length L (the Hyena skip/bias term folded into rho[0]). "Instances" are the independent
 * convolutions of a model (layers x chained convs of a Hyena operator); batch rows share
 * filters. Generation is online: y[t] is known only after z[t-1] has been used, so z[t] must be
 * final as soon as y[t] arrives.
 *
 * Every mode keeps the invariant "before step t, acc[t] = sum_{k<t} rho[t-k] y[k]" and splits
 * a step into two phases (notes/flash_inference.md, sections 2-4):
 *   oc_red_*   : sequential, per instance, inside the layer loop: stores y[t] and returns the
 *                final z[t] = acc[t] + rho[0] y[t] (the "red cell", O(1) per channel);
 *   oc_tiles_* : after every instance had its red cell at t: the work on future positions,
 *                parallel over all (instance, row, channel) with OpenMP threads; advances t.
 * Modes differ only in phase B:
 *   OC_LAZY      acc[t+1] = dot(y[0..t], rho[t+1..1])               O(t) per step
 *   OC_EAGER     acc[j] += rho[j-t] y[t] for every future j          O(L-t) per step
 *   OC_RECOMPUTE acc[t+1] read from a full FFT convolution of the prefix y[0..t] with rho
 *                (both transformed each step, as reference Hyena's fftconv does)  O(t log t)
 *   OC_FLASH     the relaxed tiling: at step i = t+1, U = lowbit(i); the block y[t-U+1..t] is
 *                added into acc[t+1..t+U] with one size-2U FFT against a precomputed filter
 *                spectrum per level (tiles with U <= thr are direct sums). O(log^2 L)
 *                amortised per step, exact cover of the lower triangle.
 *
 * Prompts: with a prompt of P positions, oc_prompt_* convolves the whole prompt at once (one
 * FFT per channel), returns its outputs z[0..P-1] and adds its contribution to all future
 * positions into acc; the online modes then run over the G = L - P generated positions with
 * relative index r = t - P (lags, hence filters, are unchanged). Memory per (instance, row,
 * channel) is y and acc of G reals; filters take L reals per (instance, channel) (flash keeps
 * only 2*thr filter taps plus about 2G reals of level spectra).
 *
 * Layouts: rho (nconv, C, L); prompt activations (B, P, C) (position-major, as the model's);
 * one step's y and z (B, C). Compiled for float (_f32, FFTW single) and double (_f64, FFTW
 * double, for exactness tests) from one template (online_conv_impl.h).
 */
#ifndef CT_INFER_ONLINE_CONV_H
#define CT_INFER_ONLINE_CONV_H

#include <stddef.h>
#include <stdint.h>

enum oc_mode { OC_LAZY, OC_EAGER, OC_RECOMPUTE, OC_FLASH, OC_MODE_COUNT };

const char *oc_mode_name(enum oc_mode m);
/* 0 on success; -1 when s names no mode. */
int oc_mode_parse(const char *s, enum oc_mode *m);

struct oc_config {
	int64_t nconv; /* independent convolution instances */
	int64_t B, C;  /* batch rows, channels per instance */
	int64_t L;     /* total positions: prompt + generated */
	int64_t P;     /* prompt length, 0..L */
	enum oc_mode mode;
	int64_t thr;        /* flash: tiles of side U <= thr are direct sums (0: all FFT) */
	unsigned fft_flags; /* FFTW planner flags; 0 means FFTW_ESTIMATE */
};

#define OC_DECLARE(real, S)                                                                        \
	struct oc_engine##S;                                                                       \
	/* Copies what it needs of rho (nconv, C, L). */                                           \
	struct oc_engine##S *oc_create##S(const struct oc_config *cfg, const real *rho);           \
	void oc_free##S(struct oc_engine##S *e);                                                   \
	/* Once per instance before the first red cell when P > 0: y, z are (B, P, C). */          \
	void oc_prompt##S(struct oc_engine##S *e, int64_t conv, const real *y, real *z);           \
	/* Phase A at the current position: y, z are (B, C). */                                    \
	void oc_red##S(struct oc_engine##S *e, int64_t conv, const real *y, real *z);              \
	/* Phase B for the current position (all instances), then moves to the next. */            \
	void oc_tiles##S(struct oc_engine##S *e);                                                  \
	/* Benchmarks only: jump to generated position r keeping whatever y/acc hold (the cost     \
	 * of the following steps is exact, their values are not). */                              \
	void oc_seek##S(struct oc_engine##S *e, int64_t r);                                        \
	/* Absolute position of the next red cell (P + steps done). */                             \
	int64_t oc_position##S(const struct oc_engine##S *e);                                      \
	/* Bytes held (histories, accumulators, filters, spectra, scratch). */                     \
	size_t oc_bytes##S(const struct oc_engine##S *e);

OC_DECLARE(float, _f32)
OC_DECLARE(double, _f64)

#endif
