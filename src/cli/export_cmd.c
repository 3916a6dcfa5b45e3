/* ctitan export CHECKPOINT OUT_DIR
 *
 * Loads a checkpoint (a step folder, or a folder of them: the newest) on one process, whatever
 * number of ranks saved it, and writes OUT_DIR/model.safetensors with Hugging Face
 * LlamaForCausalLM tensor names, OUT_DIR/config.json, and the tokenizer if the checkpoint has
 * one. RoPE: ctitan (like Meta and TorchTitan) rotates interleaved pairs (x[2i], x[2i+1]);
 * Hugging Face rotates halves (x[i], x[i + D/2]). Permuting the rows of each head of wq and wk
 * (HF row j*D/2 + i = ctitan row 2i + j) makes the two forwards equal. */
#include "cli/export_cmd.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "comm/comm.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/trainer.h"

/* ctitan (TorchTitan) name -> Hugging Face name; returns false for an unknown name. */
static bool hf_name(const char *name, char *out, size_t n)
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

/* Interleaved-pair rows -> half-split rows, per head of D rows. */
static void permute_rope_rows(const float *in, float *out, int64_t heads, int64_t D, int64_t cols)
{
	for (int64_t h = 0; h < heads; h++)
		for (int64_t i = 0; i < D / 2; i++)
			for (int64_t j = 0; j < 2; j++)
				memcpy(out + (h * D + j * (D / 2) + i) * cols,
				       in + (h * D + 2 * i + j) * cols,
				       (size_t)cols * sizeof(float));
}

static char *hf_config_json(const struct llama_config *c)
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

static int copy_file(const char *from, const char *to)
{
	FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
	int ok = in && out;
	char buf[65536];
	size_t n;
	while (ok && (n = fread(buf, 1, sizeof(buf), in)) > 0)
		ok = fwrite(buf, 1, n, out) == n;
	if (in)
		fclose(in);
	if (out)
		ok = (fclose(out) == 0) && ok;
	if (!ok)
		LOG_ERROR("export: cannot copy '%s' to '%s'", from, to);
	return ok ? CT_OK : CT_ERR_RUNTIME;
}

static int export_run(const char *ckpt, const char *out)
{
	char root[1100], path[1300];
	int64_t step;
	int rc = ckpt_resolve(ckpt, root, sizeof(root), &step);
	if (rc)
		return rc;
	struct ct_config cfg;
	config_defaults(&cfg);
	snprintf(path, sizeof(path), "%s/step-%08lld/config.toml", root, (long long)step);
	if ((rc = config_load_file(&cfg, path)))
		return rc;
	struct llama_config mc;
	if ((rc = trainer_model_config(&cfg, &mc)))
		return rc;
	struct llama_table t;
	llama_table_build(&t, &mc);
	size_t bytes = (size_t)t.numel * sizeof(float);
	float *params = mem_alloc(MEM_PARAMS, bytes), *perm = mem_alloc(MEM_OTHER, bytes);
	rc = ckpt_load_params(root, step, &(struct model_config){.kind = MODEL_LLAMA, .llama = mc},
	                      &t, params);
	if (!rc)
		rc = metrics_mkdirs(out);
	struct st_file f;
	st_init(&f);
	char **names = xcalloc((size_t)t.count, sizeof(char *));
	for (int i = 0; !rc && i < t.count; i++) {
		const struct llama_param *p = &t.p[i];
		char name[160];
		CHECK(hf_name(p->name, name, sizeof(name)), "export: no HF name for %s", p->name);
		const float *src = params + p->offset;
		bool q = strstr(p->name, "attention.wq.weight") != NULL;
		if (q || strstr(p->name, "attention.wk.weight")) {
			permute_rope_rows(src, perm + p->offset, q ? mc.n_heads : mc.n_kv_heads,
			                  mc.head_dim, p->shape[1]);
			src = perm + p->offset;
		}
		names[i] = xstrdup(name);
		st_add(&f, names[i], ST_F32, p->ndim, p->shape, src);
	}
	if (!rc) {
		st_add_meta(&f, "format", "pt");
		snprintf(path, sizeof(path), "%s/model.safetensors", out);
		rc = st_write(&f, path);
	}
	if (!rc) {
		char *js = hf_config_json(&mc);
		snprintf(path, sizeof(path), "%s/config.json", out);
		FILE *cf = fopen(path, "w");
		rc = cf && fputs(js, cf) >= 0 && fclose(cf) == 0 ? CT_OK : CT_ERR_RUNTIME;
		if (rc)
			LOG_ERROR("export: cannot write '%s'", path);
		free(js);
	}
	char tok[1300];
	snprintf(tok, sizeof(tok), "%s/step-%08lld/tokenizer.model", root, (long long)step);
	if (!rc && access(tok, R_OK) == 0) {
		snprintf(path, sizeof(path), "%s/tokenizer.model", out);
		rc = copy_file(tok, path);
	}
	if (!rc)
		printf("exported step %lld (%lld parameters) to %s/model.safetensors and "
		       "config.json\n",
		       (long long)step, (long long)t.numel, out);
	st_free(&f);
	for (int i = 0; i < t.count; i++)
		free(names[i]);
	free(names);
	mem_free(MEM_PARAMS, params, bytes);
	mem_free(MEM_OTHER, perm, bytes);
	llama_table_free(&t);
	return rc;
}

int cmd_export(int argc, char **argv)
{
	if (argc == 1 && (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0)) {
		printf("usage: ctitan export CHECKPOINT OUT_DIR\n\n"
		       "Writes OUT_DIR/model.safetensors (Hugging Face Llama names, RoPE rows "
		       "permuted "
		       "for rotate_half),\nOUT_DIR/config.json and the tokenizer. CHECKPOINT is a "
		       "step-NNNNNNNN folder or a folder of them (newest).\n");
		return 0;
	}
	if (argc != 2) {
		fprintf(stderr, "usage: ctitan export CHECKPOINT OUT_DIR\n");
		return 2;
	}
	int rc = comm_init(&argc, &argv);
	if (!rc) {
		rc = export_run(argv[0], argv[1]);
		comm_finalize();
	}
	return rc == CT_OK ? 0 : (rc == CT_ERR_USAGE ? 2 : 1);
}
