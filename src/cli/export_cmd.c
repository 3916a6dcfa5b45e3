/* ctitan export CHECKPOINT OUT_DIR
 *
 * Loads a checkpoint (a step folder, or a folder of them: the newest) on one process, whatever
 * number of ranks saved it, and writes OUT_DIR/model.safetensors with the family's Hugging
 * Face tensor names (Llama: LlamaForCausalLM's), OUT_DIR/config.json, and the tokenizer if the
 * checkpoint has one. Names, layout (Llama's RoPE row permutation, MoE's experts one tensor
 * each) and config.json come from the family (model/model_hf.h), with the model's state
 * outside the table (MoE's balancing bias, model_state.bin) among the family's extra
 * tensors; a family without them is refused. */
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
#include "model/model_hf.h"
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
	struct model_config mc;
	if ((rc = model_spec_from_config(&cfg, &mc)))
		return rc;
	if (!model_hf_of(&mc)) {
		LOG_ERROR("export: model.name = \"%s\": not supported (the family has no Hugging "
		          "Face names)",
		          model_kind_name(mc.kind));
		return CT_ERR_USAGE;
	}
	struct param_table t;
	if ((rc = model_table_build(&t, &mc)))
		return rc;
	size_t bytes = (size_t)t.numel * sizeof(float);
	float *params = mem_alloc(MEM_PARAMS, bytes), *perm = mem_alloc(MEM_OTHER, bytes);
	rc = ckpt_load_params(root, step, &mc, &t, params);
	if (!rc)
		rc = metrics_mkdirs(out);
	struct st_file f;
	st_init(&f);
	char **names = xcalloc((size_t)t.count, sizeof(char *));
	for (int i = 0; !rc && i < t.count; i++) {
		const struct param_entry *p = &t.p[i];
		char name[160];
		const float *src;
		int ndim = p->ndim;
		int64_t shape[ST_MAX_DIMS] = {0};
		memcpy(shape, p->shape, (size_t)p->ndim * sizeof(int64_t));
		if (!model_hf_tensor(&mc, p, params + p->offset, perm + p->offset, name,
		                     sizeof(name), &src, &ndim, shape))
			continue; /* held by the family's extra tensors (e.g. one per expert) */
		if (!name[0]) /* stored inside an earlier entry's tensor (model_hf.h) */
			continue;
		names[i] = xstrdup(name);
		st_add(&f, names[i], ST_F32, ndim, shape, src);
	}
	/* the model's state outside the table (MoE's balancing bias), when the checkpoint holds
	 * it: the family writes it among its extra tensors */
	char *state_raw = NULL;
	size_t state_len = 0;
	if (!rc) {
		int src = ckpt_read_extra(root, step, CKPT_MODEL_STATE_FILE, &state_raw, &state_len);
		if (src == 1)
			state_raw = NULL, state_len = 0; /* none kept: a family with state says so */
		else if (src)
			rc = src;
	}
	double *state = NULL;
	int64_t n_state = (int64_t)(state_len / sizeof(double));
	if (n_state > 0) {
		state = xcalloc((size_t)n_state, sizeof(double));
		memcpy(state, state_raw, (size_t)n_state * sizeof(double));
	}
	free(state_raw);
	/* what the format holds besides the table's tensors (buffers, tied copies, experts) */
	int n_extra = 0;
	char **xnames = NULL;
	float **xdata = NULL;
	for (;;) {
		char name[160];
		int ndim = 0;
		int64_t shape[ST_MAX_DIMS] = {0};
		float *data = NULL;
		if (rc || !model_hf_extra(&mc, &t, params, state, n_state, n_extra, name,
		                          sizeof(name), &ndim, shape, &data))
			break;
		xnames = realloc(xnames, (size_t)(n_extra + 1) * sizeof(*xnames));
		xdata = realloc(xdata, (size_t)(n_extra + 1) * sizeof(*xdata));
		CHECK(xnames && xdata, "out of memory");
		xnames[n_extra] = xstrdup(name);
		xdata[n_extra] = data;
		st_add(&f, xnames[n_extra], ST_F32, ndim, shape, data);
		n_extra++;
	}
	if (!rc) {
		st_add_meta(&f, "format", "pt");
		snprintf(path, sizeof(path), "%s/model.safetensors", out);
		rc = st_write(&f, path);
	}
	if (!rc) {
		char *js = model_hf_config_json(&mc);
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
	for (int i = 0; i < n_extra; i++)
		free(xnames[i]), free(xdata[i]);
	free(xnames), free(xdata);
	free(state);
	mem_free(MEM_PARAMS, params, bytes);
	mem_free(MEM_OTHER, perm, bytes);
	param_table_free(&t);
	return rc;
}

int cmd_export(int argc, char **argv)
{
	if (argc == 1 && (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0)) {
		printf("usage: ctitan export CHECKPOINT OUT_DIR\n\n"
		       "Writes OUT_DIR/model.safetensors (the family's Hugging Face names: Llama's "
		       "LlamaForCausalLM,\ndeepseek_v3's DeepseekV3ForCausalLM with GQA attention, "
		       "Hyena's safari; RoPE rows permuted\nfor rotate_half), OUT_DIR/config.json "
		       "and the tokenizer. CHECKPOINT is a step-NNNNNNNN\nfolder or a folder of "
		       "them (newest).\n");
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
