/* infer/generate: autoregressive generation for Llama with a KV cache.
 *
 * Each new token runs the model on one position: its keys and values are appended to a
 * per-layer cache, and attention reads the cached positions, so generating n tokens costs
 * O(n) matmuls of one row instead of O(n) full forwards. The math is the training forward's
 * (same kernels), so the logits at every position equal llama_logits' on the same sequence.
 */
#ifndef CT_INFER_GENERATE_H
#define CT_INFER_GENERATE_H

#include <stdint.h>

#include "model/llama/llama.h"

struct gen_opts {
	int64_t max_new_tokens;
	double temperature; /* 0: greedy (argmax) */
	int64_t top_k;      /* 0: no top-k filter */
	double top_p;       /* nucleus: keep the most likely tokens up to this mass; 0 or 1: all */
	uint64_t seed;
	int32_t stop_id; /* stop after producing this id; -1: none */
};

struct gen_state;

/* A decoder over parameters in table layout (not copied; must outlive the state), for
 * sequences of up to max_len positions. */
struct gen_state *gen_create(const struct llama_config *c, const struct param_table *t,
                             const float *params, int64_t max_len);
void gen_free(struct gen_state *g);
/* Feed one token at the next position; returns the logits (V floats, owned by the state). */
const float *gen_step(struct gen_state *g, int32_t token);
int64_t gen_position(const struct gen_state *g);

/* Greedy; or temperature sampling among the top_k most likely tokens, then within the smallest
 * set of them whose probability reaches top_p (nucleus). Draws come from the counter-based RNG
 * keyed by (seed, position), so a seed reproduces a generation. work holds 2V floats. Shared
 * by the Llama and Hyena decoders. */
int32_t gen_sample(const float *logits, int64_t V, const struct gen_opts *o, int64_t pos,
                   float *work);

/* Prompt in, up to max_new_tokens out (appended to out, which holds max_new_tokens);
 * returns how many were produced. */
int64_t gen_generate(struct gen_state *g, const int32_t *prompt, int64_t n_prompt,
                     const struct gen_opts *o, int32_t *out);

#endif
