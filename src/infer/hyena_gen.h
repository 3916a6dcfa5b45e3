/* infer/hyena_gen: exact autoregressive generation for the Hyena model (model/hyena).
 *
 * A decoder over a trained (or random) parameter buffer in the model's table layout. Each
 * generated position runs the model on one row per sequence, split as in Flash Inference
 * (notes/flash_inference.md, section 4):
 *   phase A, sequential through the layers: LayerNorm, in_proj, the short causal conv from a
 *     ring of the last K-1 in_proj rows, the order-N gating with the red cell of each long
 *     conv (z[t] = acc[t] + rho[0] y[t], final at once), out_proj, the GELU MLP; then the
 *     final LayerNorm and the tied head;
 *   phase B: the long convolutions' work on future positions for all layers and channels at
 *     once, in parallel (infer/online_conv; lazy, eager, recompute or flash).
 * A prompt is processed as a whole (the full-sequence math of the model, batched matmuls) and
 * its effect on future positions added to the long-conv accumulators with one FFT per
 * channel; the online schedule then runs over the generated positions only.
 *
 * The logits at every position equal the model's full-sequence forward (hyena_logits) on the
 * same tokens up to rounding, in every mode. Compiled for float (_f32) and double (_f64, for
 * exactness tests) from one template (hyena_gen_impl.h). The long filters are computed once
 * from the implicit MLP at creation, for max_len positions (<= the model's l_max).
 */
#ifndef CT_INFER_HYENA_GEN_H
#define CT_INFER_HYENA_GEN_H

#include <stddef.h>
#include <stdint.h>

#include "infer/generate.h"
#include "infer/online_conv.h"
#include "model/hyena/hyena.h"

struct hgen_opts {
	enum oc_mode mode;
	int64_t thr;        /* flash: direct tiles up to this side (notes: 32 was best) */
	int64_t B;          /* sequences decoded together (rows) */
	int64_t max_len;    /* prompt + generated positions, <= l_max */
	int64_t n_prompt;   /* positions given at once to hgen_prompt (0: none) */
	unsigned fft_flags; /* FFTW planner flags (0: FFTW_ESTIMATE) */
};

/* Wall-clock split of the work so far (benchmarks). */
struct hgen_times {
	double mixer_s; /* red cells + phase B */
	double total_s; /* all of hgen_step */
	double max_step_s;
	int64_t steps;
};

#define HGEN_DECLARE(real, S)                                                                      \
	struct hgen##S;                                                                            \
	/* params: the flat buffer described by t (must outlive the decoder). NULL with a          \
	 * message on bad options. */                                                              \
	struct hgen##S *hgen_create##S(const struct hyena_config *c, const struct param_table *t,  \
	                               const real *params, const struct hgen_opts *o);             \
	void hgen_free##S(struct hgen##S *g);                                                      \
	/* tokens (B, n_prompt); all_logits (B, n_prompt, V) or NULL. Returns the logits (B, V)    \
	 * of the last prompt position (owned by the decoder). */                                  \
	const real *hgen_prompt##S(struct hgen##S *g, const int32_t *tokens, real *all_logits);    \
	/* One token per row (B) at the next position; returns its logits (B, V). */               \
	const real *hgen_step##S(struct hgen##S *g, const int32_t *tokens);                        \
	int64_t hgen_position##S(const struct hgen##S *g);                                         \
	/* Benchmarks: continue from position pos with the state as it is (exact per-step cost).   \
	 */                                                                                        \
	void hgen_seek##S(struct hgen##S *g, int64_t pos);                                         \
	void hgen_times##S(const struct hgen##S *g, struct hgen_times *out);                       \
	/* Bytes of decoder state: long-conv engine, rings, filters, step buffers. */              \
	size_t hgen_bytes##S(const struct hgen##S *g);

HGEN_DECLARE(float, _f32)
HGEN_DECLARE(double, _f64)

/* The generate loop for one sequence (B = 1, float): the prompt (n_prompt of the decoder's
 * options, >= 1) in one pass, then sample/step; out holds max_new_tokens. Returns the count. */
int64_t hgen_generate(struct hgen_f32 *g, const int32_t *prompt, const struct gen_opts *o,
                      int32_t *out);

#endif
