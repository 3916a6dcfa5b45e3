/* infer/hyena_gen: see hyena_gen.h. The decoder is written once in hyena_gen_impl.h and
 * instantiated here for float and double. */
#include "infer/hyena_gen.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/timer.h"
#include "kernels/hyena_kernels.h"
#include "kernels/kernels.h"

#define HG_REAL    float
#define HG_S(name) name##_f32
#define HG_FILTER  hyena_filter_compute
#include "infer/hyena_gen_impl.h"
#undef HG_REAL
#undef HG_S
#undef HG_FILTER

#define HG_REAL    double
#define HG_S(name) name##_f64
#define HG_FILTER  hyena_filter_compute_f64
#include "infer/hyena_gen_impl.h"
#undef HG_REAL
#undef HG_S
#undef HG_FILTER

int64_t hgen_generate(struct hgen_f32 *g, const int32_t *prompt, const struct gen_opts *o,
                      int32_t *out)
{
	CHECK(g->o.B == 1 && g->o.n_prompt >= 1, "hyena generate: one sequence with a prompt");
	const float *logits = hgen_prompt_f32(g, prompt, NULL);
	float *work = xcalloc(2 * (size_t)g->V, sizeof(float));
	int64_t n = 0;
	while (n < o->max_new_tokens) {
		int32_t tok = gen_sample(logits, g->V, o, g->pos, work);
		out[n++] = tok;
		if (tok == o->stop_id || g->pos >= g->o.max_len)
			break;
		logits = hgen_step_f32(g, &tok);
	}
	free(work);
	return n;
}
