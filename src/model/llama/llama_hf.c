#include "model/llama/llama_hf.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/bf16.h"
#include "base/log.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "model/model.h"

bool llama_hf_name(const char *name, char *out, size_t n)
{
	static const char *const map[][2] = {
	    {"attention_norm.weight", "input_layernorm.weight"},
	    {"attention.wq.weight", "self_attn.q_proj.weight"},
	    {"attention.wk.weight", "self_attn.k_proj.weight"},
	    {"attention.wv.weight", "self_attn.v_proj.weight"},
	    {"attention.wo.weight", "self_attn.o_proj.weight"},
	    {"ffn_norm.weight", "post_attention_layernorm.weight"},
	    {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
	    {"feed_forward.w2.weight", "mlp.down_proj.weight"},
	    {"feed_forward.w3.weight", "mlp.up_proj.weight"},
	};
	if (strcmp(name, "tok_embeddings.weight") == 0)
		return snprintf(out, n, "model.embed_tokens.weight") > 0;
	if (strcmp(name, "norm.weight") == 0)
		return snprintf(out, n, "model.norm.weight") > 0;
	if (strcmp(name, "output.weight") == 0)
		return snprintf(out, n, "lm_head.weight") > 0;
	int layer, used = 0;
	if (sscanf(name, "layers.%d.%n", &layer, &used) != 1 || used == 0)
		return false;
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		if (strcmp(name + used, map[i][0]) == 0)
			return snprintf(out, n, "model.layers.%d.%s", layer, map[i][1]) > 0;
	return false;
}

int64_t llama_hf_rope_heads(const struct llama_config *c, const char *name)
{
	if (strstr(name, "attention.wq.weight"))
		return c->n_heads;
	if (strstr(name, "attention.wk.weight"))
		return c->n_kv_heads;
	return 0;
}

char *llama_hf_config_json(const struct llama_config *c)
{
	cJSON *o = cJSON_CreateObject();
	cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
	cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM"));
	cJSON_AddStringToObject(o, "model_type", "llama");
	cJSON_AddNumberToObject(o, "hidden_size", (double)c->dim);
	cJSON_AddNumberToObject(o, "intermediate_size", (double)c->ffn_hidden);
	cJSON_AddNumberToObject(o, "num_hidden_layers", (double)c->n_layers);
	cJSON_AddNumberToObject(o, "num_attention_heads", (double)c->n_heads);
	cJSON_AddNumberToObject(o, "num_key_value_heads", (double)c->n_kv_heads);
	cJSON_AddNumberToObject(o, "head_dim", (double)c->head_dim);
	cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab_size);
	cJSON_AddNumberToObject(o, "rms_norm_eps", c->norm_eps);
	cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta);
	cJSON_AddNumberToObject(o, "max_position_embeddings", 8192);
	cJSON_AddBoolToObject(o, "tie_word_embeddings", false);
	cJSON_AddStringToObject(o, "hidden_act", "silu");
	cJSON_AddStringToObject(o, "torch_dtype", "float32");
	if (c->rope_scaling) {
		cJSON *r = cJSON_AddObjectToObject(o, "rope_scaling");
		cJSON_AddStringToObject(r, "rope_type", "llama3");
		cJSON_AddNumberToObject(r, "factor", c->rope_factor);
		cJSON_AddNumberToObject(r, "low_freq_factor", c->rope_low_freq_factor);
		cJSON_AddNumberToObject(r, "high_freq_factor", c->rope_high_freq_factor);
		cJSON_AddNumberToObject(r, "original_max_position_embeddings",
		                        (double)c->rope_original_ctx);
	} else {
		cJSON_AddNullToObject(o, "rope_scaling");
	}
	char *txt = cJSON_Print(o);
	cJSON_Delete(o);
	return txt;
}

static cJSON *read_json(const char *path)
{
	char *s;
	size_t n;
	if (io_read_file(path, &s, &n))
		return NULL;
	cJSON *o = cJSON_ParseWithLength(s, n);
	free(s);
	return o;
}

/* config.json must describe this model. */
static int check_config(const char *dir, const struct llama_config *c, bool *tied)
{
	char path[1200];
	snprintf(path, sizeof(path), "%s/config.json", dir);
	cJSON *o = read_json(path);
	if (!cJSON_IsObject(o)) {
		LOG_ERROR("hf: '%s' is missing or not JSON", path);
		cJSON_Delete(o);
		return CT_ERR_RUNTIME;
	}
	const struct {
		const char *key;
		double want;
	} keys[] = {
	    {"hidden_size", (double)c->dim},
	    {"intermediate_size", (double)c->ffn_hidden},
	    {"num_hidden_layers", (double)c->n_layers},
	    {"num_attention_heads", (double)c->n_heads},
	    {"num_key_value_heads", (double)c->n_kv_heads},
	    {"vocab_size", (double)c->vocab_size},
	    {"rope_theta", c->rope_theta},
	};
	int rc = CT_OK;
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]) && !rc; i++) {
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, keys[i].key);
		if (!cJSON_IsNumber(v) || v->valuedouble != keys[i].want) {
			LOG_ERROR("hf: '%s': %s is %g, this model has %g", path, keys[i].key,
			          cJSON_IsNumber(v) ? v->valuedouble : -1.0, keys[i].want);
			rc = CT_ERR_USAGE;
		}
	}
	const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
	if (!rc && (cJSON_IsObject(rs) != c->rope_scaling)) {
		LOG_ERROR("hf: '%s': rope_scaling is %s, this model has %s", path,
		          cJSON_IsObject(rs) ? "set" : "null", c->rope_scaling ? "set" : "null");
		rc = CT_ERR_USAGE;
	}
	*tied = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "tie_word_embeddings"));
	cJSON_Delete(o);
	return rc;
}

/* Copy an F32 or BF16 tensor into dst as float, checking its shape. */
static int take(const struct st_tensor *s, const char *file, const struct param_entry *p,
                float *dst)
{
	bool shape_ok = s->ndim == p->ndim;
	for (int d = 0; shape_ok && d < p->ndim; d++)
		shape_ok = s->shape[d] == p->shape[d];
	if (!shape_ok || (s->dtype != ST_F32 && s->dtype != ST_BF16)) {
		LOG_ERROR("hf: %s: tensor '%s' has the wrong shape or dtype (want F32/BF16, "
		          "[%lld%s%lld])",
		          file, s->name, (long long)p->shape[0], p->ndim == 2 ? ", " : "",
		          p->ndim == 2 ? (long long)p->shape[1] : 0LL);
		return CT_ERR_RUNTIME;
	}
	if (s->dtype == ST_F32) {
		memcpy(dst, s->data, (size_t)p->numel * sizeof(float));
	} else {
		const uint8_t *b = s->data;
		for (int64_t i = 0; i < p->numel; i++)
			dst[i] = bf16_to_f32((uint16_t)(b[2 * i] | b[2 * i + 1] << 8));
	}
	return CT_OK;
}

int llama_hf_load(const char *dir, const struct llama_config *c, const struct param_table *t,
                  float *params)
{
	bool tied = false;
	int rc = check_config(dir, c, &tied);
	if (rc)
		return rc;
	/* the files: one model.safetensors, or the shards an index names */
	char path[1300], idx[1200];
	snprintf(idx, sizeof(idx), "%s/model.safetensors.index.json", dir);
	cJSON *index = access(idx, R_OK) == 0 ? read_json(idx) : NULL;
	const cJSON *wmap = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
	if (access(idx, R_OK) == 0 && !cJSON_IsObject(wmap)) {
		LOG_ERROR("hf: '%s' has no weight_map", idx);
		cJSON_Delete(index);
		return CT_ERR_RUNTIME;
	}
	/* each tensor's file; then each distinct file opened once */
	const char **file_of = calloc((size_t)t->count + 1, sizeof(char *));
	bool *done = calloc((size_t)t->count + 1, sizeof(bool));
	CHECK(file_of && done, "out of memory");
	char(*names)[160] = calloc((size_t)t->count + 1, sizeof(*names));
	CHECK(names, "out of memory");
	for (int i = 0; i < t->count && !rc; i++) {
		CHECK(llama_hf_name(t->p[i].name, names[i], sizeof(names[i])), "hf: no name for %s",
		      t->p[i].name);
		file_of[i] = "model.safetensors";
		if (!wmap)
			continue;
		const cJSON *fn = cJSON_GetObjectItemCaseSensitive(wmap, names[i]);
		if (cJSON_IsString(fn) && fn->valuestring[0] && !strchr(fn->valuestring, '/')) {
			file_of[i] = fn->valuestring;
		} else if (tied && strcmp(names[i], "lm_head.weight") == 0) {
			file_of[i] = NULL; /* copied from the embedding below */
		} else {
			LOG_ERROR("hf: '%s' does not map tensor '%s' to a file", idx, names[i]);
			rc = CT_ERR_RUNTIME;
		}
	}
	for (int i = 0; i < t->count && !rc; i++) {
		if (!file_of[i] || done[i])
			continue;
		struct st_file f;
		snprintf(path, sizeof(path), "%s/%s", dir, file_of[i]);
		if ((rc = st_read(&f, path)))
			break;
		for (int j = i; j < t->count && !rc; j++) {
			if (!file_of[j] || done[j] || strcmp(file_of[j], file_of[i]) != 0)
				continue;
			const struct param_entry *p = &t->p[j];
			const struct st_tensor *s = st_find(&f, names[j]);
			if (!s) {
				if (tied && strcmp(names[j], "lm_head.weight") == 0) {
					done[j] = false;
					file_of[j] = NULL;
					continue;
				}
				LOG_ERROR("hf: %s has no tensor '%s'", path, names[j]);
				rc = CT_ERR_RUNTIME;
				break;
			}
			float *dst = params + p->offset;
			rc = take(s, path, p, dst);
			int64_t heads = llama_hf_rope_heads(c, p->name);
			if (!rc && heads) {
				float *tmp = malloc((size_t)p->numel * sizeof(float));
				CHECK(tmp, "out of memory");
				memcpy(tmp, dst, (size_t)p->numel * sizeof(float));
				model_hf_permute_rope_rows(tmp, dst, heads, c->head_dim, p->shape[1], false);
				free(tmp);
			}
			done[j] = true;
		}
		st_free(&f);
	}
	const struct param_entry *emb = param_table_find(t, "tok_embeddings.weight"),
	                         *out = param_table_find(t, "output.weight");
	if (!rc && out && !done[out - t->p]) {
		CHECK(emb && emb->numel == out->numel, "hf: tied weights of different sizes");
		memcpy(params + out->offset, params + emb->offset,
		       (size_t)out->numel * sizeof(float));
	}
	free(done);
	free(file_of);
	free(names);
	cJSON_Delete(index);
	return rc;
}

/* ---------------------------------------------------------------- the family's interop */

static bool llama_hf_tensor(const struct model_config *mc, const struct param_entry *e,
                            const float *src, float *tmp, char *name, size_t n, const float **data,
                            int *ndim, int64_t *shape)
{
	(void)ndim, (void)shape; /* HF's shapes are the table's */
	if (!llama_hf_name(e->name, name, n))
		return false;
	*data = src;
	int64_t heads = llama_hf_rope_heads(llama_cfg(mc), e->name);
	if (heads) {
		model_hf_permute_rope_rows(src, tmp, heads, llama_cfg(mc)->head_dim, e->shape[1], true);
		*data = tmp;
	}
	return true;
}

static char *llama_hf_json(const struct model_config *mc)
{
	return llama_hf_config_json(llama_cfg(mc));
}

static int llama_hf_read(const char *dir, const struct model_config *mc,
                         const struct param_table *t, float *params, double *state,
                         int64_t n_state)
{
	(void)state, (void)n_state; /* Llama has no model state */
	return llama_hf_load(dir, llama_cfg(mc), t, params);
}

const struct model_hf_ops llama_hf_ops = {
    .tensor = llama_hf_tensor,
    .config_json = llama_hf_json,
    .load = llama_hf_read,
};
