/* The table of decoders per model family (see infer/generator.h). */
#include "infer/generator.h"

#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "infer/hyena_gen.h"
#include "model/hyena/hyena.h"
#include "model/llama/llama.h"

/* Llama: one position at a time over a KV cache of prompt + new tokens (+ 1). */
static int llama_generate(const struct model_config *c, const struct param_table *t,
                          const float *params, const int32_t *prompt, int64_t n_prompt,
                          const struct gen_opts *o, const struct generator_opts *x, int32_t *out,
                          int64_t *n_out)
{
	(void)x;
	struct gen_state *g = gen_create(llama_cfg(c), t, params, n_prompt + o->max_new_tokens + 1);
	*n_out = gen_generate(g, prompt, n_prompt, o, out);
	gen_free(g);
	return CT_OK;
}

/* Hyena: the prompt in one pass, then the online long convolutions; the filters are l_max
 * taps long, so prompt + new tokens must fit (hgen_create says so otherwise). */
static int hyena_generate(const struct model_config *c, const struct param_table *t,
                          const float *params, const int32_t *prompt, int64_t n_prompt,
                          const struct gen_opts *o, const struct generator_opts *x, int32_t *out,
                          int64_t *n_out)
{
	struct hgen_opts ho = {.thr = x->flash_thr >= 0 ? x->flash_thr : 32,
	                       .B = 1,
	                       .max_len = n_prompt + o->max_new_tokens,
	                       .n_prompt = n_prompt};
	CHECK(oc_mode_parse(x->mixer_mode ? x->mixer_mode : "flash", &ho.mode) == 0,
	      "mixer mode validated while parsing");
	struct hgen_f32 *hg = hgen_create_f32(hyena_cfg(c), t, params, &ho);
	if (!hg)
		return CT_ERR_USAGE;
	*n_out = hgen_generate(hg, prompt, o, out);
	hgen_free_f32(hg);
	return CT_OK;
}

static const struct generator generators[] = {
    {.family = "llama3", .alias = "llama", .generate = llama_generate},
    {.family = "hyena", .mixer_opts = true, .generate = hyena_generate},
};
#define N_GENERATORS (sizeof(generators) / sizeof(generators[0]))

const struct generator *generator_of(const char *name)
{
	for (size_t i = 0; i < N_GENERATORS; i++)
		if (strcmp(generators[i].family, name) == 0 ||
		    (generators[i].alias && strcmp(generators[i].alias, name) == 0))
			return &generators[i];
	return NULL;
}

void generator_names(char *buf, size_t n, const char *sep)
{
	buf[0] = '\0';
	for (size_t i = 0; i < N_GENERATORS; i++)
		snprintf(buf + strlen(buf), n - strlen(buf), "%s%s", i ? sep : "",
		         generators[i].family);
}
