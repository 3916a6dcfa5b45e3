#include "infer/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/rng.h"
#include "kernels/kernels.h"

struct gen_state {
	struct llama_config c;
	const struct param_table *t;
	const float *w;
	int64_t max_len, pos;
	float *kcache, *vcache; /* L x max_len x KVD */
	float *cos_tab, *sin_tab;
	float *x, *xn, *q, *k, *v, *att, *h1, *h3, *g, *scores, *logits;
	size_t bytes;
};

static const float *weight(const struct gen_state *g, const char *fmt, int64_t l)
{
	char name[PARAM_NAME_MAX];
	snprintf(name, sizeof(name), fmt, (int)l);
	const struct param_entry *p = param_table_find(g->t, name);
	CHECK(p, "generate: no tensor %s", name);
	return g->w + p->offset;
}

struct gen_state *gen_create(const struct llama_config *c, const struct param_table *t,
                             const float *params, int64_t max_len)
{
	struct gen_state *g = xcalloc(1, sizeof(*g));
	g->c = *c;
	g->t = t;
	g->w = params;
	g->max_len = max_len;
	int64_t C = c->dim, L = c->n_layers, KVD = c->n_kv_heads * c->head_dim;
	int64_t HD = c->n_heads * c->head_dim, F = c->ffn_hidden, V = c->vocab_size;
	int64_t half = c->head_dim / 2;
	int64_t floats = 2 * L * max_len * KVD + 2 * max_len * half + 3 * C + HD * 2 + 2 * KVD +
	                 3 * F + max_len + V;
	g->bytes = (size_t)floats * sizeof(float);
	float *p = mem_alloc(MEM_ACTIVATIONS, g->bytes);
	float **views[] = {&g->kcache, &g->vcache, &g->cos_tab, &g->sin_tab, &g->x,
	                   &g->xn,     &g->q,      &g->k,       &g->v,       &g->att,
	                   &g->h1,     &g->h3,     &g->g,       &g->scores,  &g->logits};
	int64_t sizes[] = {L * max_len * KVD,
	                   L * max_len * KVD,
	                   max_len * half,
	                   max_len * half,
	                   C,
	                   2 * C,
	                   HD,
	                   KVD,
	                   KVD,
	                   HD,
	                   F,
	                   F,
	                   F,
	                   max_len,
	                   V};
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		*views[i] = p;
		p += sizes[i];
	}
	llama_rope_tables(c, max_len, g->cos_tab, g->sin_tab);
	return g;
}

void gen_free(struct gen_state *g)
{
	if (!g)
		return;
	mem_free(MEM_ACTIVATIONS, g->kcache, g->bytes);
	free(g);
}

int64_t gen_position(const struct gen_state *g)
{
	return g->pos;
}

/* Causal attention of one query row over cached positions 0..pos (GQA). */
static void decode_attention(struct gen_state *g, int64_t l)
{
	const struct llama_config *c = &g->c;
	int64_t H = c->n_heads, KV = c->n_kv_heads, D = c->head_dim, KVD = KV * D;
	const float *kc = g->kcache + l * g->max_len * KVD, *vc = g->vcache + l * g->max_len * KVD;
	float scale = 1.0f / sqrtf((float)D);
	for (int64_t h = 0; h < H; h++) {
		int64_t kh = h / (H / KV);
		const float *qh = g->q + h * D;
		float mx = -INFINITY;
		for (int64_t j = 0; j <= g->pos; j++) {
			const float *kj = kc + j * KVD + kh * D;
			float s = 0;
			for (int64_t d = 0; d < D; d++)
				s += qh[d] * kj[d];
			g->scores[j] = s * scale;
			mx = g->scores[j] > mx ? g->scores[j] : mx;
		}
		double sum = 0;
		for (int64_t j = 0; j <= g->pos; j++) {
			g->scores[j] = expf(g->scores[j] - mx);
			sum += g->scores[j];
		}
		float *o = g->att + h * D;
		memset(o, 0, (size_t)D * sizeof(float));
		for (int64_t j = 0; j <= g->pos; j++) {
			float pj = (float)(g->scores[j] / sum);
			const float *vj = vc + j * KVD + kh * D;
			for (int64_t d = 0; d < D; d++)
				o[d] += pj * vj[d];
		}
	}
}

const float *gen_step(struct gen_state *g, int32_t token)
{
	const struct llama_config *c = &g->c;
	CHECK(g->pos < g->max_len, "generate: sequence longer than %lld", (long long)g->max_len);
	CHECK(token >= 0 && token < c->vocab_size, "generate: token %d outside vocab", token);
	int64_t C = c->dim, D = c->head_dim, H = c->n_heads, KV = c->n_kv_heads;
	int64_t HD = H * D, KVD = KV * D, F = c->ffn_hidden, half = D / 2;
	const float *ct = g->cos_tab + g->pos * half, *st = g->sin_tab + g->pos * half;
	memcpy(g->x, weight(g, "tok_embeddings.weight", 0) + (int64_t)token * C,
	       (size_t)C * sizeof(float));
	for (int64_t l = 0; l < c->n_layers; l++) {
		float *kslot = g->kcache + (l * g->max_len + g->pos) * KVD;
		float *vslot = g->vcache + (l * g->max_len + g->pos) * KVD;
		rmsnorm_forward_f32(g->xn, NULL, g->x,
		                    weight(g, "layers.%d.attention_norm.weight", l), 1, C,
		                    c->norm_eps);
		matmul_forward_f32(g->q, g->xn, weight(g, "layers.%d.attention.wq.weight", l), 1, C,
		                   HD, 0);
		matmul_forward_f32(kslot, g->xn, weight(g, "layers.%d.attention.wk.weight", l), 1,
		                   C, KVD, 0);
		matmul_forward_f32(vslot, g->xn, weight(g, "layers.%d.attention.wv.weight", l), 1,
		                   C, KVD, 0);
		rope_forward_f32(g->q, ct, st, 1, 1, H, D);
		rope_forward_f32(kslot, ct, st, 1, 1, KV, D);
		decode_attention(g, l);
		matmul_forward_f32(g->x, g->att, weight(g, "layers.%d.attention.wo.weight", l), 1,
		                   HD, C, 1);
		rmsnorm_forward_f32(g->xn, NULL, g->x, weight(g, "layers.%d.ffn_norm.weight", l), 1,
		                    C, c->norm_eps);
		matmul_forward_f32(g->h1, g->xn, weight(g, "layers.%d.feed_forward.w1.weight", l),
		                   1, C, F, 0);
		matmul_forward_f32(g->h3, g->xn, weight(g, "layers.%d.feed_forward.w3.weight", l),
		                   1, C, F, 0);
		swiglu_forward_f32(g->g, g->h1, g->h3, F);
		matmul_forward_f32(g->x, g->g, weight(g, "layers.%d.feed_forward.w2.weight", l), 1,
		                   F, C, 1);
	}
	rmsnorm_forward_f32(g->xn, NULL, g->x, weight(g, "norm.weight", 0), 1, C, c->norm_eps);
	matmul_forward_f32(g->logits, g->xn, weight(g, "output.weight", 0), 1, C, c->vocab_size, 0);
	g->pos++;
	return g->logits;
}

static int cmp_desc(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x < y) - (x > y);
}

int32_t gen_sample(const float *logits, int64_t V, const struct gen_opts *o, int64_t pos,
                   float *work)
{
	int64_t best = 0;
	for (int64_t i = 1; i < V; i++)
		best = logits[i] > logits[best] ? i : best;
	if (o->temperature <= 0)
		return (int32_t)best;
	/* weights exp((l - l_max) / T); the top-k cut is the k-th largest logit */
	float cut = -INFINITY;
	if (o->top_k > 0 && o->top_k < V) {
		memcpy(work, logits, (size_t)V * sizeof(float));
		qsort(work, (size_t)V, sizeof(float), cmp_desc);
		cut = work[o->top_k - 1];
	}
	double sum = 0;
	for (int64_t i = 0; i < V; i++) {
		work[i] =
		    logits[i] >= cut ? (float)exp((logits[i] - logits[best]) / o->temperature) : 0;
		sum += work[i];
	}
	float wcut = 0; /* nucleus: the smallest weight kept */
	if (o->top_p > 0 && o->top_p < 1) {
		float *sorted = work + V;
		memcpy(sorted, work, (size_t)V * sizeof(float));
		qsort(sorted, (size_t)V, sizeof(float), cmp_desc);
		double acc = 0;
		for (int64_t i = 0; i < V && sorted[i] > 0; i++) {
			acc += sorted[i];
			wcut = sorted[i];
			if (acc >= o->top_p * sum)
				break;
		}
		sum = 0;
		for (int64_t i = 0; i < V; i++)
			sum += work[i] >= wcut ? work[i] : 0;
	}
	double u = rng_uniform(o->seed, 0x67656e, (uint64_t)pos) * sum, acc = 0;
	for (int64_t i = 0; i < V; i++) {
		if (work[i] <= 0 || work[i] < wcut)
			continue;
		acc += work[i];
		if (acc >= u)
			return (int32_t)i;
	}
	return (int32_t)best;
}

int64_t gen_generate(struct gen_state *g, const int32_t *prompt, int64_t n_prompt,
                     const struct gen_opts *o, int32_t *out)
{
	CHECK(n_prompt >= 1, "generate: empty prompt");
	const float *logits = NULL;
	for (int64_t i = 0; i < n_prompt; i++)
		logits = gen_step(g, prompt[i]);
	float *work = xcalloc(2 * (size_t)g->c.vocab_size, sizeof(float));
	int64_t n = 0;
	while (n < o->max_new_tokens) {
		int32_t tok = gen_sample(logits, g->c.vocab_size, o, g->pos, work);
		out[n++] = tok;
		if (tok == o->stop_id || g->pos >= g->max_len)
			break;
		logits = gen_step(g, tok);
	}
	free(work);
	return n;
}
