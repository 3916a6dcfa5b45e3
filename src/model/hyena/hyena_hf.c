/* Hyena's export format (model/model_hf.h): the state dict of safari's language model
 * (src/models/sequence/long_conv_lm.py, ConvLMHeadModel with the hyena layer of
 * src/models/sequence/hyena.py) in model.safetensors, and its model config in config.json.
 *
 * Names: backbone.embeddings.word_embeddings.weight; backbone.layers.L.{norm1, mixer, norm2,
 * mlp.fc1, mlp.fc2}; backbone.ln_f; lm_head.weight (tied: the embedding's values). safari's
 * shapes: the short filter is a depthwise Conv1d, (P, 1, 3); the shared Sin's frequency is
 * (1, F), stored under each place the module sits (implicit_filter.1, .3 and .5). Its buffers
 * and fixed features are written too, so the state dict loads whole: filter_fn.pos_emb.z
 * (1, l_max, E) and .t (1, l_max, 1), filter_fn.modulation.deltas (1, 1, (N-1)D).
 *
 * Loading (checkpoint.initial_load_in_hf) reads the same names back; what ctitan does not
 * train must be what it computes: z, t and deltas equal ctitan's features (safari can train
 * z, with lr_pos_emb; ctitan's filters take fixed ones), the three frequencies one tensor,
 * lm_head the embedding. Anything else is refused, naming the tensor. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "kernels/hyena_kernels.h"
#include "model/hyena/hyena.h"
#include "model/model.h"
#include "model/model_hf.h"

#define EXTRA_PER_LAYER 5

/* ctitan's table name -> safari's; false: none. */
static bool safari_name(const char *name, char *out, size_t n)
{
	static const char *const map[][2] = {
	    {"mixer_norm.", "norm1."},
	    {"ffn_norm.", "norm2."},
	    {"feed_forward.", "mlp."},
	    {"mixer.", "mixer."},
	};
	if (strcmp(name, "tok_embeddings.weight") == 0)
		return snprintf(out, n, "backbone.embeddings.word_embeddings.weight") > 0;
	if (strncmp(name, "norm.", 5) == 0)
		return snprintf(out, n, "backbone.ln_f.%s", name + 5) > 0;
	int layer, used = 0;
	if (sscanf(name, "layers.%d.%n", &layer, &used) != 1 || used == 0)
		return false;
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
		size_t k = strlen(map[i][0]);
		if (strncmp(name + used, map[i][0], k) == 0)
			return snprintf(out, n, "backbone.layers.%d.%s%s", layer, map[i][1],
			                name + used + k) > 0;
	}
	return false;
}

/* safari's shape of a table tensor (the same numel). */
static void safari_shape(const struct param_entry *e, int *ndim, int64_t *shape)
{
	if (strstr(e->name, "mixer.short_filter.weight")) {
		*ndim = 3;
		shape[0] = e->shape[0], shape[1] = 1, shape[2] = e->shape[1];
	} else if (strstr(e->name, "implicit_filter.1.freq")) {
		*ndim = 2;
		shape[0] = 1, shape[1] = e->shape[0];
	}
}

/* A per-stream (per-order) tensor of ctitan's table is a row range of safari's tensor: the
 * group's first one stands for the whole group (its g tensors are adjacent in the flat
 * buffer: rows x g), the others are inside it (an empty name). */
static bool hyena_hf_tensor(const struct model_config *mc, const struct param_entry *e,
                            const float *src, float *tmp, char *name, size_t n, const float **data,
                            int *ndim, int64_t *shape)
{
	(void)tmp;
	char group[PARAM_NAME_MAX];
	int piece, g = hyena_name_group(hyena_cfg(mc), e->name, group, sizeof(group), &piece);
	if (!safari_name(g > 1 ? group : e->name, name, n))
		return false;
	*data = src;
	struct param_entry whole = *e;
	whole.shape[0] *= g;
	whole.numel *= g;
	snprintf(whole.name, sizeof(whole.name), "%s", g > 1 ? group : e->name);
	if (g > 1)
		shape[0] = whole.shape[0];
	safari_shape(&whole, ndim, shape);
	if (piece > 0)
		name[0] = '\0';
	return true;
}

/* The fixed filter features at l_max: z (l_max, E), t (l_max), deltas (C). */
static void features(const struct hyena_config *c, float **z, float **t, float **deltas)
{
	int64_t L = c->l_max, E = c->emb_dim, C = (c->order - 1) * c->dim;
	*z = malloc((size_t)(L * E) * sizeof(float));
	*t = malloc((size_t)L * sizeof(float));
	*deltas = malloc((size_t)C * sizeof(float));
	CHECK(*z && *t && *deltas, "out of memory");
	hyena_filter_features_f32(*z, NULL, L, L, E, C);
	for (int64_t i = 0; i < L; i++)
		(*t)[i] = (*z)[i * E];
	double lo = log(1e-2) / 1.5, hi = log(1e-2) / 0.3; /* as the window's */
	for (int64_t k = 0; k < C; k++)
		(*deltas)[k] = (float)(C > 1 ? lo + (double)k * (hi - lo) / (double)(C - 1) : lo);
}

/* Extra tensor i: per layer z, t, deltas, the frequency's two other places; then lm_head. */
static bool hyena_hf_extra(const struct model_config *mc, const struct param_table *t,
                           const float *params, const double *state, int64_t n_state, int i,
                           char *name, size_t n, int *ndim, int64_t *shape, float **data)
{
	(void)state, (void)n_state; /* Hyena has no model state */
	const struct hyena_config *c = hyena_cfg(mc);
	int L = (int)c->n_layers, l = i / EXTRA_PER_LAYER, k = i % EXTRA_PER_LAYER;
	if (i == L * EXTRA_PER_LAYER) {
		const struct param_entry *e = param_table_find(t, "tok_embeddings.weight");
		CHECK(e, "hyena: no embedding");
		snprintf(name, n, "lm_head.weight");
		*ndim = 2, shape[0] = e->shape[0], shape[1] = e->shape[1];
		*data = malloc((size_t)e->numel * sizeof(float));
		CHECK(*data, "out of memory");
		memcpy(*data, params + e->offset, (size_t)e->numel * sizeof(float));
		return true;
	}
	if (i > L * EXTRA_PER_LAYER)
		return false;
	const char *p = "backbone.layers";
	if (k >= 3) { /* the shared Sin's frequency, where safari's Sequential holds it again */
		char own[96];
		snprintf(own, sizeof(own), "layers.%d.mixer.filter_fn.implicit_filter.1.freq", l);
		const struct param_entry *e = param_table_find(t, own);
		CHECK(e, "hyena: no %s", own);
		snprintf(name, n, "%s.%d.mixer.filter_fn.implicit_filter.%d.freq", p, l,
		         k == 3 ? 3 : 5);
		*ndim = 2, shape[0] = 1, shape[1] = e->numel;
		*data = malloc((size_t)e->numel * sizeof(float));
		CHECK(*data, "out of memory");
		memcpy(*data, params + e->offset, (size_t)e->numel * sizeof(float));
		return true;
	}
	float *z, *tt, *d;
	features(c, &z, &tt, &d);
	if (k == 0) {
		snprintf(name, n, "%s.%d.mixer.filter_fn.pos_emb.z", p, l);
		*ndim = 3, shape[0] = 1, shape[1] = c->l_max, shape[2] = c->emb_dim;
		*data = z, free(tt), free(d);
	} else if (k == 1) {
		snprintf(name, n, "%s.%d.mixer.filter_fn.pos_emb.t", p, l);
		*ndim = 3, shape[0] = 1, shape[1] = c->l_max, shape[2] = 1;
		*data = tt, free(z), free(d);
	} else {
		snprintf(name, n, "%s.%d.mixer.filter_fn.modulation.deltas", p, l);
		*ndim = 3, shape[0] = 1, shape[1] = 1, shape[2] = (c->order - 1) * c->dim;
		*data = d, free(z), free(tt);
	}
	return true;
}

/* safari's config: the model's shape as its long_conv_lm config names it. */
static char *hyena_hf_json(const struct model_config *mc)
{
	const struct hyena_config *c = hyena_cfg(mc);
	cJSON *o = cJSON_CreateObject(), *layer = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "_name_", "lm");
	cJSON_AddStringToObject(o, "exported_by", "ctitan");
	cJSON_AddNumberToObject(o, "d_model", (double)c->dim);
	cJSON_AddNumberToObject(o, "n_layer", (double)c->n_layers);
	cJSON_AddNumberToObject(o, "d_inner", (double)c->ffn_hidden);
	cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab_size);
	cJSON_AddNumberToObject(o, "layer_norm_epsilon", c->norm_eps);
	cJSON_AddBoolToObject(o, "tie_word_embeddings", true);
	cJSON_AddStringToObject(layer, "_name_", "hyena");
	cJSON_AddNumberToObject(layer, "order", (double)c->order);
	cJSON_AddNumberToObject(layer, "filter_order", (double)c->filter_order);
	cJSON_AddNumberToObject(layer, "emb_dim", (double)c->emb_dim);
	cJSON_AddNumberToObject(layer, "l_max", (double)c->l_max);
	cJSON_AddNumberToObject(layer, "short_filter_order", HYENA_SHORT_FILTER);
	cJSON_AddNumberToObject(layer, "w", c->sin_freq);
	cJSON_AddBoolToObject(layer, "modulate", true);
	cJSON_AddNumberToObject(layer, "num_inner_mlps", 2);
	cJSON_AddItemToObject(o, "layer", layer);
	char *s = cJSON_Print(o);
	cJSON_Delete(o);
	CHECK(s, "out of memory");
	return s;
}

/* config.json's shape against the model's. */
static int check_config(const char *dir, const struct hyena_config *c)
{
	char path[1200];
	snprintf(path, sizeof(path), "%s/config.json", dir);
	char *text;
	size_t len;
	if (io_read_file(path, &text, &len)) {
		LOG_ERROR("hf: cannot read '%s'", path);
		return CT_ERR_RUNTIME;
	}
	cJSON *o = cJSON_ParseWithLength(text, len);
	free(text);
	if (!o) {
		LOG_ERROR("hf: '%s' is not JSON", path);
		return CT_ERR_RUNTIME;
	}
	const cJSON *layer = cJSON_GetObjectItemCaseSensitive(o, "layer");
	const struct {
		const cJSON *obj;
		const char *key;
		int64_t want;
	} keys[] = {
	    {o, "d_model", c->dim},          {o, "n_layer", c->n_layers},
	    {o, "d_inner", c->ffn_hidden},   {o, "vocab_size", c->vocab_size},
	    {layer, "order", c->order},      {layer, "filter_order", c->filter_order},
	    {layer, "emb_dim", c->emb_dim},  {layer, "l_max", c->l_max},
	};
	int rc = CT_OK;
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]) && !rc; i++) {
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(keys[i].obj, keys[i].key);
		if (!cJSON_IsNumber(v) || (int64_t)v->valuedouble != keys[i].want) {
			LOG_ERROR("hf: '%s': %s%s is %s%g, this model has %lld", path,
			          keys[i].obj == layer ? "layer." : "", keys[i].key,
			          cJSON_IsNumber(v) ? "" : "missing, not ",
			          cJSON_IsNumber(v) ? v->valuedouble : 0.0, (long long)keys[i].want);
			rc = CT_ERR_USAGE;
		}
	}
	cJSON_Delete(o);
	return rc;
}

/* Tensor name of f as F32 with n values (shape checked by the caller's numel), or NULL with
 * an error naming it. */
static const float *find_f32(const struct st_file *f, const char *file, const char *name,
                             int64_t n)
{
	const struct st_tensor *s = st_find(f, name);
	if (!s) {
		LOG_ERROR("hf: %s has no tensor '%s'", file, name);
		return NULL;
	}
	int64_t numel = 1;
	for (int d = 0; d < s->ndim; d++)
		numel *= s->shape[d];
	if (s->dtype != ST_F32 || numel != n) {
		LOG_ERROR("hf: %s: tensor '%s' is not F32 with %lld values", file, name,
		          (long long)n);
		return NULL;
	}
	return s->data;
}

/* a ~ b within what float rounding of the same formula leaves */
static bool close_f32(const float *a, const float *b, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		if (fabsf(a[i] - b[i]) > 1e-6f * (1.0f + fabsf(b[i])))
			return false;
	return true;
}

static int hyena_hf_load(const char *dir, const struct model_config *mc,
                         const struct param_table *t, float *params, double *state,
                         int64_t n_state)
{
	(void)state, (void)n_state;
	const struct hyena_config *c = hyena_cfg(mc);
	int rc = check_config(dir, c);
	if (rc)
		return rc;
	char path[1300];
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	struct st_file f;
	if ((rc = st_read(&f, path)))
		return rc;
	for (int i = 0; i < t->count && !rc; i++) {
		const struct param_entry *p = &t->p[i];
		char name[160], group[PARAM_NAME_MAX];
		/* a group's tensors are adjacent: its first reads safari's whole tensor */
		int piece, g = hyena_name_group(c, p->name, group, sizeof(group), &piece);
		if (piece > 0)
			continue;
		CHECK(safari_name(g > 1 ? group : p->name, name, sizeof(name)), "hf: no name for %s",
		      p->name);
		const float *src = find_f32(&f, path, name, p->numel * g);
		if (!src)
			rc = CT_ERR_RUNTIME;
		else
			memcpy(params + p->offset, src, (size_t)(p->numel * g) * sizeof(float));
	}
	/* what ctitan does not train must be what it computes or holds once */
	float *z, *tt, *d;
	features(c, &z, &tt, &d);
	int64_t Cf = (c->order - 1) * c->dim;
	for (int l = 0; l < c->n_layers && !rc; l++) {
		char name[160], own[96];
		const char *b = "backbone.layers";
		const struct {
			const char *suffix;
			const float *want;
			int64_t n;
		} fixed[] = {{"mixer.filter_fn.pos_emb.z", z, c->l_max * c->emb_dim},
		             {"mixer.filter_fn.pos_emb.t", tt, c->l_max},
		             {"mixer.filter_fn.modulation.deltas", d, Cf}};
		for (size_t k = 0; k < 3 && !rc; k++) {
			snprintf(name, sizeof(name), "%s.%d.%s", b, l, fixed[k].suffix);
			const float *got = find_f32(&f, path, name, fixed[k].n);
			if (!got) {
				rc = CT_ERR_RUNTIME;
			} else if (!close_f32(got, fixed[k].want, fixed[k].n)) {
				LOG_ERROR("hf: %s: '%s' differs from the fixed features ctitan's "
				          "filters take (a trained positional embedding cannot load)",
				          path, name);
				rc = CT_ERR_USAGE;
			}
		}
		snprintf(own, sizeof(own), "layers.%d.mixer.filter_fn.implicit_filter.1.freq", l);
		const struct param_entry *fe = param_table_find(t, own);
		CHECK(fe, "hyena: no %s", own);
		for (int at = 3; at <= 5 && !rc; at += 2) {
			snprintf(name, sizeof(name), "%s.%d.mixer.filter_fn.implicit_filter.%d.freq", b,
			         l, at);
			const float *got = find_f32(&f, path, name, fe->numel);
			if (!got) {
				rc = CT_ERR_RUNTIME;
			} else if (memcmp(got, params + fe->offset, (size_t)fe->numel * sizeof(float))) {
				LOG_ERROR("hf: %s: '%s' differs from implicit_filter.1.freq (safari's "
				          "filter shares one Sin)",
				          path, name);
				rc = CT_ERR_USAGE;
			}
		}
	}
	free(z), free(tt), free(d);
	const struct param_entry *emb = param_table_find(t, "tok_embeddings.weight");
	const struct st_tensor *head = rc ? NULL : st_find(&f, "lm_head.weight");
	if (head) { /* absent: tied, as HF writes it */
		const float *got = find_f32(&f, path, "lm_head.weight", emb->numel);
		if (!got) {
			rc = CT_ERR_RUNTIME;
		} else if (memcmp(got, params + emb->offset, (size_t)emb->numel * sizeof(float))) {
			LOG_ERROR("hf: %s: lm_head.weight differs from the embedding (Hyena's head "
			          "is tied)",
			          path);
			rc = CT_ERR_USAGE;
		}
	}
	st_free(&f);
	return rc;
}

const struct model_hf_ops hyena_hf_ops = {
    .tensor = hyena_hf_tensor,
    .extra = hyena_hf_extra,
    .config_json = hyena_hf_json,
    .load = hyena_hf_load,
};
