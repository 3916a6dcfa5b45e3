/* infer/generator: the decoders `ctitan generate` runs, one per model family, found by the
 * family's name (`[model] name`), so the command asks this table instead of comparing kinds:
 * Llama with a KV cache (infer/generate.h), Hyena with an exact online long convolution
 * (lazy, eager, recompute or flash). A family without a row here does not generate yet. */
#ifndef CT_INFER_GENERATOR_H
#define CT_INFER_GENERATOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "infer/generate.h"
#include "model/model.h"

/* What only a decoder with long convolutions takes (--mixer-mode, --flash-threshold). */
struct generator_opts {
	const char *mixer_mode; /* lazy | eager | recompute | flash (oc_mode_parse); NULL: flash */
	int64_t flash_thr;      /* flash: direct tiles up to this side; < 0: 32 */
};

struct generator {
	const char *family; /* the model_family's name */
	const char *alias;  /* another name --model-kind accepts for it (NULL: none) */
	bool mixer_opts;    /* takes struct generator_opts */
	/* Generate after prompt[0..n_prompt) with parameters params (flat, in t's layout) of a
	 * model of config c: up to o->max_new_tokens ids into out, *n_out of them. CT_OK, or
	 * CT_ERR_USAGE after a message (bad options: nothing generated). */
	int (*generate)(const struct model_config *c, const struct param_table *t,
	                const float *params, const int32_t *prompt, int64_t n_prompt,
	                const struct gen_opts *o, const struct generator_opts *x, int32_t *out,
	                int64_t *n_out);
};

/* The generator of a family name or an alias of it; NULL: none. */
const struct generator *generator_of(const char *name);
/* The families that generate, joined by sep ("llama3 | hyena"), for messages and usage. */
void generator_names(char *buf, size_t n, const char *sep);

#endif
