/* ctitan export CHECKPOINT OUT_DIR
 *
 * Loads a checkpoint (a step folder, or a folder of them: the newest) on one process, whatever
 * number of ranks saved it, and writes OUT_DIR/model.safetensors with Hugging Face
 * LlamaForCausalLM tensor names, OUT_DIR/config.json, and the tokenizer if the checkpoint has
 * one. Names, the RoPE row permutation and config.json come from model/llama_hf. */
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
#include "model/llama/llama.h"
#include "model/llama/llama_hf.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/model_spec.h"
#include "train/trainer.h"

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
	if ((rc = model_spec_llama(&cfg, &mc)))
		return rc;
	struct param_table t;
	llama_table_build(&t, &mc);
	size_t bytes = (size_t)t.numel * sizeof(float);
	float *params = mem_alloc(MEM_PARAMS, bytes), *perm = mem_alloc(MEM_OTHER, bytes);
	struct model_config mcfg;
	*llama_cfg_init(&mcfg) = mc;
	rc = ckpt_load_params(root, step, &mcfg, &t, params);
	if (!rc)
		rc = metrics_mkdirs(out);
	struct st_file f;
	st_init(&f);
	char **names = xcalloc((size_t)t.count, sizeof(char *));
	for (int i = 0; !rc && i < t.count; i++) {
		const struct param_entry *p = &t.p[i];
		char name[160];
		CHECK(llama_hf_name(p->name, name, sizeof(name)), "export: no HF name for %s",
		      p->name);
		const float *src = params + p->offset;
		int64_t heads = llama_hf_rope_heads(&mc, p->name);
		if (heads) {
			llama_hf_permute_rows(src, perm + p->offset, heads, mc.head_dim,
			                      p->shape[1]);
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
		char *js = llama_hf_config_json(&mc);
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
	param_table_free(&t);
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
	return ct_exit_code(rc);
}
