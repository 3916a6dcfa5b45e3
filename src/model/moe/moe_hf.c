/* The deepseek_v3 family's Hugging Face format (model/model_hf.h): DeepSeek-V3's checkpoint
 * names (transformers' DeepseekV3ForCausalLM, as TorchTitan's deepseek_v3 state_dict_adapter
 * maps them) in model.safetensors, and DeepSeek-V3's config.json keys.
 *
 * Names: model.embed_tokens.weight; per layer model.layers.<l>.{input_layernorm,
 * post_attention_layernorm}.weight, self_attn.{q,k,v,o}_proj.weight; dense layers
 * mlp.{gate,up,down}_proj.weight; MoE layers mlp.gate.weight (router, (E, C)),
 * mlp.gate.e_score_correction_bias ((E): the aux-loss-free balancing bias, model state, not
 * a parameter: model_ops.state), mlp.experts.<e>.{gate,up,down}_proj.weight per routed
 * expert (rows of ctitan's grouped experts.w1, w3 (E*Fm, C) and w2 (E*C, Fm)),
 * mlp.shared_experts.{gate,up,down}_proj.weight (ctitan's shared experts are already one
 * SwiGLU of hidden Fm * n_shared_experts, as DeepSeek concatenates them); model.norm.weight;
 * lm_head.weight.
 *
 * Attention: ctitan's is GQA, not multi-head latent attention, so the names are Llama-style
 * q_proj/k_proj/v_proj/o_proj; MLA's q_a_proj, kv_a_proj_with_mqa, ... are not produced,
 * nor its config keys (q_lora_rank, kv_lora_rank, qk_rope_head_dim): transformers'
 * DeepseekV3 attention cannot load this file as it is. RoPE is the kernels' interleaved-pair
 * rotation (Llama's), so q_proj and k_proj rows are permuted per head for HF's rotate_half,
 * as Llama's export does.
 *
 * The bias is double in ctitan (the update accumulates in double) and F32 here, as DeepSeek
 * stores it; a float model's routing adds it rounded to float, so the round trip routes
 * the same tokens.
 *
 * Loading (checkpoint.initial_load_in_hf) reads the same names back from model.safetensors
 * or the shards a model.safetensors.index.json names (F32 or BF16); config.json must describe
 * this model; lm_head may be absent with tie_word_embeddings; a missing bias starts at 0. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/bf16.h"
#include "base/log.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/model_hf.h"
#include "model/moe/moe.h"

/* the per-expert projections: ctitan's grouped tensor, HF's name */
static const char *const expert_proj[3][2] = {
    {"moe.experts.w1", "gate_proj"},
    {"moe.experts.w3", "up_proj"},
    {"moe.experts.w2", "down_proj"},
};

/* ctitan's table name -> DeepSeek-V3's; false: none (the grouped experts). */
static bool moe_hf_name(const char *name, char *out, size_t n)
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
	    {"moe.router.gate.weight", "mlp.gate.weight"},
	    {"moe.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
	    {"moe.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
	    {"moe.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
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

/* heads whose rows RoPE rotates (wq: H, wk: KV), 0 for any other tensor */
static int64_t rope_heads(const struct moe_config *c, const char *name)
{
	if (strstr(name, "attention.wq.weight"))
		return c->n_heads;
	if (strstr(name, "attention.wk.weight"))
		return c->n_kv_heads;
	return 0;
}

static bool moe_hf_tensor(const struct model_config *mc, const struct param_entry *e,
                          const float *src, float *tmp, char *name, size_t n, const float **data,
                          int *ndim, int64_t *shape)
{
	(void)ndim, (void)shape; /* HF's shapes are the table's */
	if (!moe_hf_name(e->name, name, n))
		return false;
	*data = src;
	int64_t heads = rope_heads(moe_cfg(mc), e->name);
	if (heads) {
		model_hf_permute_rope_rows(src, tmp, heads, moe_cfg(mc)->head_dim, e->shape[1], true);
		*data = tmp;
	}
	return true;
}

/* ---------------------------------------------------------------- extra tensors */

/* Extra tensor i: per MoE layer, for each expert gate_proj, up_proj, down_proj, then the
 * layer's e_score_correction_bias (3E + 1 per MoE layer). */
static bool moe_hf_extra(const struct model_config *mc, const struct param_table *t,
                         const float *params, const double *state, int64_t n_state, int i,
                         char *name, size_t n, int *ndim, int64_t *shape, float **data)
{
	const struct moe_config *c = moe_cfg(mc);
	int64_t E = c->n_routed_experts, per = 3 * E + 1, Lm = c->n_layers - c->n_dense_layers;
	if (i < 0 || i >= Lm * per)
		return false;
	int64_t j = i / per, k = i % per, l = c->n_dense_layers + j;
	if (k == 3 * E) { /* the bias */
		CHECK(!state || n_state == Lm * E, "moe: a state of %lld doubles, want %lld",
		      (long long)n_state, (long long)(Lm * E));
		if (!state && j == 0)
			LOG_WARN("export: the checkpoint holds no balancing bias (%s); "
			         "e_score_correction_bias is written as zeros",
			         "model_state.bin");
		snprintf(name, n, "model.layers.%lld.mlp.gate.e_score_correction_bias",
		         (long long)l);
		*ndim = 1, shape[0] = E;
		*data = xcalloc((size_t)E, sizeof(float));
		for (int64_t e = 0; state && e < E; e++)
			(*data)[e] = (float)state[j * E + e];
		return true;
	}
	int64_t e = k / 3, p = k % 3;
	char own[PARAM_NAME_MAX];
	snprintf(own, sizeof(own), "layers.%lld.%s", (long long)l, expert_proj[p][0]);
	const struct param_entry *pe = param_table_find(t, own);
	CHECK(pe && pe->shape[0] % E == 0, "moe: no whole-model %s", own);
	int64_t rows = pe->shape[0] / E, cols = pe->shape[1]; /* Fm x C, or C x Fm (w2) */
	snprintf(name, n, "model.layers.%lld.mlp.experts.%lld.%s.weight", (long long)l,
	         (long long)e, expert_proj[p][1]);
	*ndim = 2, shape[0] = rows, shape[1] = cols;
	*data = xcalloc((size_t)(rows * cols), sizeof(float));
	memcpy(*data, params + pe->offset + e * rows * cols, (size_t)(rows * cols) * sizeof(float));
	return true;
}

/* ---------------------------------------------------------------- config.json */

static char *moe_hf_json(const struct model_config *mc)
{
	const struct moe_config *c = moe_cfg(mc);
	LOG_INFO("export: deepseek_v3 attention as GQA self_attn.{q,k,v,o}_proj (ctitan's model "
	         "has GQA projections, not MLA: no q_a_proj / kv_a_proj_with_mqa)");
	cJSON *o = cJSON_CreateObject();
	cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
	cJSON_AddItemToArray(arch, cJSON_CreateString("DeepseekV3ForCausalLM"));
	cJSON_AddStringToObject(o, "model_type", "deepseek_v3");
	cJSON_AddStringToObject(o, "exported_by", "ctitan");
	cJSON_AddStringToObject(o, "ctitan_attention",
	                        "GQA (q_proj/k_proj/v_proj/o_proj, head_dim), not MLA: no "
	                        "q_lora_rank / kv_lora_rank / qk_rope_head_dim");
	const struct {
		const char *key;
		double v;
	} nums[] = {
	    {"hidden_size", (double)c->dim},
	    {"intermediate_size", (double)c->inter_dim},
	    {"moe_intermediate_size", (double)c->moe_inter_dim},
	    {"num_hidden_layers", (double)c->n_layers},
	    {"num_attention_heads", (double)c->n_heads},
	    {"num_key_value_heads", (double)c->n_kv_heads},
	    {"head_dim", (double)c->head_dim},
	    {"n_routed_experts", (double)c->n_routed_experts},
	    {"n_shared_experts", (double)c->n_shared_experts},
	    {"num_experts_per_tok", (double)c->top_k},
	    {"first_k_dense_replace", (double)c->n_dense_layers},
	    {"moe_layer_freq", 1},
	    {"n_group", 1},
	    {"topk_group", 1},
	    {"routed_scaling_factor", c->route_scale},
	    {"aux_loss_alpha", c->aux_loss_alpha},
	    {"vocab_size", (double)c->vocab_size},
	    {"rope_theta", c->rope_theta},
	    {"rms_norm_eps", c->norm_eps},
	    {"max_position_embeddings", 8192},
	};
	for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++)
		cJSON_AddNumberToObject(o, nums[i].key, nums[i].v);
	cJSON_AddStringToObject(o, "scoring_func", moe_score_name(c->score_func));
	cJSON_AddStringToObject(o, "topk_method", "noaux_tc"); /* top-k of score + bias */
	cJSON_AddBoolToObject(o, "norm_topk_prob", c->route_norm);
	cJSON_AddBoolToObject(o, "seq_aux", true);
	cJSON_AddBoolToObject(o, "tie_word_embeddings", false);
	cJSON_AddBoolToObject(o, "attention_bias", false);
	cJSON_AddStringToObject(o, "hidden_act", "silu");
	cJSON_AddNullToObject(o, "rope_scaling");
	cJSON_AddStringToObject(o, "torch_dtype", "float32");
	char *s = cJSON_Print(o);
	cJSON_Delete(o);
	CHECK(s, "out of memory");
	return s;
}

/* ---------------------------------------------------------------- loading */

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

/* config.json must describe this model; *tied: tie_word_embeddings. */
static int check_config(const char *dir, const struct moe_config *c, bool *tied)
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
	    {"intermediate_size", (double)c->inter_dim},
	    {"moe_intermediate_size", (double)c->moe_inter_dim},
	    {"num_hidden_layers", (double)c->n_layers},
	    {"num_attention_heads", (double)c->n_heads},
	    {"num_key_value_heads", (double)c->n_kv_heads},
	    {"n_routed_experts", (double)c->n_routed_experts},
	    {"n_shared_experts", (double)c->n_shared_experts},
	    {"num_experts_per_tok", (double)c->top_k},
	    {"first_k_dense_replace", (double)c->n_dense_layers},
	    {"routed_scaling_factor", c->route_scale},
	    {"vocab_size", (double)c->vocab_size},
	    {"rope_theta", c->rope_theta},
	};
	int rc = CT_OK;
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]) && !rc; i++) {
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, keys[i].key);
		if (!cJSON_IsNumber(v) || v->valuedouble != keys[i].want) {
			LOG_ERROR("hf: '%s': %s is %s%g, this model has %g", path, keys[i].key,
			          cJSON_IsNumber(v) ? "" : "missing, not ",
			          cJSON_IsNumber(v) ? v->valuedouble : 0.0, keys[i].want);
			rc = CT_ERR_USAGE;
		}
	}
	const cJSON *sf = cJSON_GetObjectItemCaseSensitive(o, "scoring_func");
	const char *want_sf = moe_score_name(c->score_func);
	if (!rc && (!cJSON_IsString(sf) || strcmp(sf->valuestring, want_sf) != 0)) {
		LOG_ERROR("hf: '%s': scoring_func is %s, this model has \"%s\"", path,
		          cJSON_IsString(sf) ? sf->valuestring : "missing", want_sf);
		rc = CT_ERR_USAGE;
	}
	const cJSON *nt = cJSON_GetObjectItemCaseSensitive(o, "norm_topk_prob");
	if (!rc && (!cJSON_IsBool(nt) || cJSON_IsTrue(nt) != c->route_norm)) {
		LOG_ERROR("hf: '%s': norm_topk_prob is %s, this model has %s", path,
		          !cJSON_IsBool(nt)  ? "missing"
		          : cJSON_IsTrue(nt) ? "true"
		                             : "false",
		          c->route_norm ? "true" : "false");
		rc = CT_ERR_USAGE;
	}
	*tied = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "tie_word_embeddings"));
	cJSON_Delete(o);
	return rc;
}

/* The folder's safetensors files: model.safetensors, or every shard the index names. */
struct hf_files {
	struct st_file *f;
	char (*path)[1300];
	int n;
};

static int files_open(struct hf_files *h, const char *dir)
{
	memset(h, 0, sizeof(*h));
	char idx[1200];
	snprintf(idx, sizeof(idx), "%s/model.safetensors.index.json", dir);
	cJSON *index = access(idx, R_OK) == 0 ? read_json(idx) : NULL;
	const cJSON *wmap = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
	if (access(idx, R_OK) == 0 && !cJSON_IsObject(wmap)) {
		LOG_ERROR("hf: '%s' has no weight_map", idx);
		cJSON_Delete(index);
		return CT_ERR_RUNTIME;
	}
	int cap = wmap ? cJSON_GetArraySize(wmap) : 1, rc = CT_OK;
	h->f = xcalloc((size_t)(cap > 0 ? cap : 1), sizeof(*h->f));
	h->path = xcalloc((size_t)(cap > 0 ? cap : 1), sizeof(*h->path));
	const cJSON *it = wmap ? wmap->child : NULL;
	for (int k = 0; (wmap ? it != NULL : k == 0) && !rc; k++, it = it ? it->next : NULL) {
		const char *file = "model.safetensors";
		if (wmap) {
			if (!cJSON_IsString(it) || !it->valuestring[0] ||
			    strchr(it->valuestring, '/')) {
				LOG_ERROR("hf: '%s' maps '%s' to no plain file name", idx,
				          it->string);
				rc = CT_ERR_RUNTIME;
				break;
			}
			file = it->valuestring;
		}
		char path[1300];
		snprintf(path, sizeof(path), "%s/%s", dir, file);
		bool seen = false;
		for (int q = 0; q < h->n && !seen; q++)
			seen = strcmp(h->path[q], path) == 0;
		if (seen)
			continue;
		if ((rc = st_read(&h->f[h->n], path)))
			break;
		snprintf(h->path[h->n++], sizeof(h->path[0]), "%s", path);
	}
	cJSON_Delete(index);
	return rc;
}

static void files_close(struct hf_files *h)
{
	for (int q = 0; q < h->n; q++)
		st_free(&h->f[q]);
	free(h->f);
	free(h->path);
}

static const struct st_tensor *files_find(const struct hf_files *h, const char *name,
                                          const char **path)
{
	for (int q = 0; q < h->n; q++) {
		const struct st_tensor *s = st_find(&h->f[q], name);
		if (s) {
			*path = h->path[q];
			return s;
		}
	}
	return NULL;
}

/* Tensor name (shape rows x cols, or a vector of rows with cols 0) as F32/BF16 into dst. */
static int take(const struct hf_files *h, const char *name, int64_t rows, int64_t cols, float *dst)
{
	const char *path = "";
	const struct st_tensor *s = files_find(h, name, &path);
	if (!s) {
		LOG_ERROR("hf: %s has no tensor '%s'", h->n == 1 ? h->path[0] : "the folder", name);
		return CT_ERR_RUNTIME;
	}
	int want_ndim = cols > 0 ? 2 : 1;
	bool ok = s->ndim == want_ndim && s->shape[0] == rows && (cols <= 0 || s->shape[1] == cols);
	if (!ok || (s->dtype != ST_F32 && s->dtype != ST_BF16)) {
		LOG_ERROR("hf: %s: tensor '%s' has the wrong shape or dtype (want F32/BF16, "
		          "[%lld%s%lld])",
		          path, name, (long long)rows, cols > 0 ? ", " : "",
		          cols > 0 ? (long long)cols : 0LL);
		return CT_ERR_RUNTIME;
	}
	int64_t n = rows * (cols > 0 ? cols : 1);
	if (s->dtype == ST_F32) {
		memcpy(dst, s->data, (size_t)n * sizeof(float));
	} else {
		const uint8_t *b = s->data;
		for (int64_t i = 0; i < n; i++)
			dst[i] = bf16_to_f32((uint16_t)(b[2 * i] | b[2 * i + 1] << 8));
	}
	return CT_OK;
}

/* A table tensor with an HF name of its own (RoPE rows back to ctitan's order). */
static int load_named(const struct hf_files *h, const struct moe_config *c,
                      const struct param_entry *p, const char *name, float *dst)
{
	int rc = take(h, name, p->shape[0], p->ndim == 2 ? p->shape[1] : 0, dst);
	int64_t heads = rope_heads(c, p->name);
	if (!rc && heads) {
		float *tmp = xcalloc((size_t)p->numel, sizeof(float));
		memcpy(tmp, dst, (size_t)p->numel * sizeof(float));
		model_hf_permute_rope_rows(tmp, dst, heads, c->head_dim, p->shape[1], false);
		free(tmp);
	}
	return rc;
}

/* A grouped expert tensor (layer l's experts.w1, w2 or w3) from its E per-expert tensors. */
static int load_experts(const struct hf_files *h, const struct moe_config *c,
                        const struct param_entry *p, float *dst)
{
	int layer = -1, used = 0;
	CHECK(sscanf(p->name, "layers.%d.%n", &layer, &used) == 1 && used > 0,
	      "moe: tensor %s has no layer", p->name);
	const char *proj = NULL;
	for (int q = 0; q < 3; q++)
		if (strcmp(p->name + used, expert_proj[q][0]) == 0)
			proj = expert_proj[q][1];
	CHECK(proj, "moe: tensor %s has no Hugging Face name", p->name);
	int64_t E = c->n_routed_experts, rows = p->shape[0] / E, cols = p->shape[1];
	int rc = CT_OK;
	for (int64_t e = 0; e < E && !rc; e++) {
		char name[160];
		snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.%lld.%s.weight", layer,
		         (long long)e, proj);
		rc = take(h, name, rows, cols, dst + e * rows * cols);
	}
	return rc;
}

static int moe_hf_load(const char *dir, const struct model_config *mc, const struct param_table *t,
                       float *params, double *state, int64_t n_state)
{
	const struct moe_config *c = moe_cfg(mc);
	bool tied = false;
	int rc = check_config(dir, c, &tied);
	if (rc)
		return rc;
	struct hf_files h;
	if ((rc = files_open(&h, dir))) {
		files_close(&h);
		return rc;
	}
	const char *ignored;
	for (int i = 0; i < t->count && !rc; i++) {
		const struct param_entry *p = &t->p[i];
		char name[160];
		float *dst = params + p->offset;
		if (!moe_hf_name(p->name, name, sizeof(name))) {
			rc = load_experts(&h, c, p, dst);
		} else if (tied && strcmp(name, "lm_head.weight") == 0 &&
		           !files_find(&h, name, &ignored)) {
			const struct param_entry *emb =
			    param_table_find(t, "tok_embeddings.weight");
			CHECK(emb && emb->numel == p->numel, "hf: tied weights of different sizes");
			rc = take(&h, "model.embed_tokens.weight", p->shape[0], p->shape[1], dst);
		} else {
			rc = load_named(&h, c, p, name, dst);
		}
	}
	/* the balancing bias, per MoE layer */
	int64_t E = c->n_routed_experts, Lm = c->n_layers - c->n_dense_layers;
	CHECK(!state || n_state == Lm * E, "moe: a state of %lld doubles, want %lld",
	      (long long)n_state, (long long)(Lm * E));
	float *b = xcalloc((size_t)(E > 0 ? E : 1), sizeof(float));
	for (int64_t j = 0; state && j < Lm && !rc; j++) {
		char name[160];
		snprintf(name, sizeof(name), "model.layers.%lld.mlp.gate.e_score_correction_bias",
		         (long long)(c->n_dense_layers + j));
		if (!files_find(&h, name, &ignored)) {
			LOG_WARN("hf: no '%s': layer %lld's balancing bias starts at 0", name,
			         (long long)(c->n_dense_layers + j));
			memset(b, 0, (size_t)E * sizeof(float));
		} else {
			rc = take(&h, name, E, 0, b);
		}
		for (int64_t e = 0; e < E; e++)
			state[j * E + e] = (double)b[e];
	}
	free(b);
	files_close(&h);
	return rc;
}

const struct model_hf_ops moe_hf_ops = {
    .tensor = moe_hf_tensor,
    .extra = moe_hf_extra,
    .config_json = moe_hf_json,
    .load = moe_hf_load,
};
