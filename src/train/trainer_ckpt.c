/* Checkpoint glue of the trainer: which tensors a checkpoint holds, save, load, resume and
 * the Hugging Face initial load (split from train/trainer.c along this seam). */
#include "train/trainer_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "base/log.h"
#include "io/file.h"
#include "model/model_hf.h"
#include "train/compute.h"

/* Where rows [row0, row0 + nrows) of table entry p (a TP rank's local piece when the table is
 * tensor-parallel) sit in the global tensor: a rectangle of it, less the vocabulary's zero
 * padding; a replicated tensor is saved by TP rank 0 only. */
static void trainer_tp_piece(const struct param_table *t, const struct param_entry *p,
                             struct ckpt_tensor *c)
{
	if (t->tp_size <= 1 && !p->expert) /* (an expert tensor: its ep rank's rows) */
		return;
	c->rows = p->global_shape[0];
	c->cols = p->ndim == 2 ? p->global_shape[1] : 1;
	if (p->tp_dim < 0) {
		c->replica = t->tp_rank != 0;
	} else if (p->tp_dim == 0) { /* its rows: keep those that exist globally */
		int64_t valid = p->tp_valid - c->row0;
		c->nrows = valid <= 0 ? 0 : (valid < c->nrows ? valid : c->nrows);
		c->row0 += p->tp_start;
	} else { /* columns [tp_start, +tp_valid) of every row it holds */
		c->col0 = p->tp_start;
		c->ncols = p->shape[1];
		CHECK(p->tp_valid == p->shape[1], "%s: padded column pieces are not saved", p->name);
	}
}

/* What this rank holds of every tensor: the whole tensor on one rank, its shard rows under
 * FSDP, a rectangle of the global tensor under TP. Parameters and both AdamW moments share
 * one layout. */
struct ckpt_tensor *trainer_ckpt_tensors(struct trainer *tr)
{
	const struct param_table *t = tr->model.table;
	struct ckpt_tensor *ct = xcalloc((size_t)t->count, sizeof(*ct));
	for (int i = 0; i < t->count; i++) {
		const struct param_entry *p = &t->p[i];
		int64_t row0 = 0, nrows = p->shape[0], at = p->offset;
		float *w = tr->model.params;
		if (tr->sharded) {
			fsdp_local_rows(&tr->fsdp, i, &row0, &nrows, &at);
			w = tr->fsdp.shard_w;
		} else if (tr->piped) {
			pp_local_rows(&tr->pp, i, &row0, &nrows, &at);
			w = tr->pp.shard_w;
		}
		ct[i] = (struct ckpt_tensor){.name = p->name,
		                             .ndim = p->ndim,
		                             .rows = p->shape[0],
		                             .cols = p->numel / p->shape[0],
		                             .row0 = row0,
		                             .nrows = nrows,
		                             .param = w + at,
		                             .exp_avg = tr->opt.m + at,
		                             .exp_avg_sq = tr->opt.v + at};
		trainer_tp_piece(t, p, &ct[i]);
	}
	return ct;
}

static void trainer_ckpt_root(const struct trainer *tr, char *out, size_t n)
{
	snprintf(out, n, "%s/%s", tr->cfg->job.dump_folder, tr->cfg->checkpoint.folder);
}

/* Is `part` listed in checkpoint.exclude_from_loading? */
static bool trainer_excluded(const struct trainer *tr, const char *part)
{
	char buf[CONFIG_STR_MAX], *save = NULL;
	snprintf(buf, sizeof(buf), "%s", tr->cfg->checkpoint.exclude_from_loading);
	for (char *p = strtok_r(buf, ", ", &save); p; p = strtok_r(NULL, ", ", &save))
		if (strcmp(p, part) == 0)
			return true;
	return false;
}

/* The model's state outside the parameter table (model_ops.state: MoE's balancing bias),
 * with the weights: a checkpoint saved before it was kept holds none (the state stays at
 * its start, said once). Raw doubles in the host's order, as the rest of the checkpoint. */
#define MODEL_STATE_FILE CKPT_MODEL_STATE_FILE

static int trainer_load_state(struct trainer *tr, const char *root, int64_t step)
{
	int64_t n = model_state(&tr->model, NULL);
	if (n <= 0)
		return CT_OK;
	char *data;
	size_t len;
	int rc = ckpt_read_extra(root, step, MODEL_STATE_FILE, &data, &len);
	if (rc == 1) {
		LOG_WARN("checkpoint: step %lld holds no %s (saved before model state was kept): "
		         "the model's state (e.g. MoE's balancing bias) starts again from zero",
		         (long long)step, MODEL_STATE_FILE);
		return CT_OK;
	}
	if (rc)
		return rc;
	if ((int64_t)len != n * (int64_t)sizeof(double)) {
		LOG_ERROR("checkpoint: step %lld: %s holds %zu bytes, this model's state is %lld "
		          "doubles",
		          (long long)step, MODEL_STATE_FILE, len, (long long)n);
		free(data);
		return CT_ERR_RUNTIME;
	}
	double *v = xcalloc((size_t)n, sizeof(double));
	memcpy(v, data, len);
	model_set_state(&tr->model, v, n);
	free(v);
	free(data);
	return CT_OK;
}

/* Load checkpoint `step` of root into the model and, unless model_only, the optimizer, the
 * data loader and the trainer state (each unless checkpoint.exclude_from_loading names it). */
static int trainer_load(struct trainer *tr, const char *root, int64_t step, bool model_only,
                        int64_t *first_step, struct step_metrics *sm)
{
	bool no_optim = model_only || trainer_excluded(tr, "optimizer");
	bool no_data = model_only || trainer_excluded(tr, "dataloader");
	bool no_train = model_only || trainer_excluded(tr, "train_state");
	bool no_lr = model_only || trainer_excluded(tr, "lr_scheduler");
	struct ckpt_tensor *ct = trainer_ckpt_tensors(tr);
	for (int i = 0; no_optim && i < tr->model.table->count; i++)
		ct[i].exp_avg = ct[i].exp_avg_sq = NULL;
	struct ckpt_trainer_state st = {0};
	int rc = ckpt_load(root, step, &tr->model.cfg, &tr->mesh, ct, tr->model.table->count, &st);
	free(ct);
	if (rc)
		return rc;
	rc = trainer_load_state(tr, root, step);
	if (rc)
		return rc;
	*first_step = no_train ? 0 : st.step;
	sm->tokens_seen = no_train ? 0 : st.tokens_seen;
	tr->opt.t = no_optim ? 0 : st.optimizer_step;
	tr->lr_step0 = no_lr ? *first_step : 0;
	if (tr->train_ld && st.data_state[0] && !no_data) {
		cJSON *js = cJSON_Parse(st.data_state);
		struct loader_state ls;
		rc = loader_state_from_json(&ls, js, "checkpoint data_state");
		if (!rc)
			rc = loader_restore(tr->train_ld, &ls);
		cJSON_Delete(js);
	}
	if (!rc && (model_only || tr->cfg->checkpoint.exclude_from_loading[0]))
		LOG_INFO("checkpoint: loaded %s of step %lld; starting at step %lld",
		         model_only ? "the weights only" : "all but the excluded parts",
		         (long long)st.step, (long long)*first_step);
	return rc;
}

/* checkpoint.initial_load_path in Hugging Face format: every rank reads the whole model and
 * keeps its rows. */
static int trainer_load_hf(struct trainer *tr, const char *dir)
{
	const struct param_table *t = tr->model.table;
	const struct model_config *mc = &tr->model.cfg;
	if (!model_hf_of(mc)) {
		LOG_ERROR("checkpoint.initial_load_in_hf: model.name = \"%s\" has no Hugging "
		          "Face names; not supported",
		          model_kind_name(mc->kind));
		return CT_ERR_USAGE;
	}
	struct param_table g; /* the global table (this rank's may be a TP piece of it) */
	CHECK(model_table_build(&g, mc) == CT_OK, "the built model's table");
	size_t bytes = (size_t)g.numel * sizeof(float);
	float *full = mem_alloc(MEM_OTHER, bytes);
	/* the model's state (MoE's balancing bias) from the same folder, the same on every rank */
	int64_t n_state = model_state(&tr->model, NULL);
	double *state = n_state > 0 ? xcalloc((size_t)n_state, sizeof(double)) : NULL;
	int rc = model_hf_load(dir, mc, &g, full, state, n_state > 0 ? n_state : 0);
	if (!rc && state)
		model_set_state(&tr->model, state, n_state);
	free(state);
	if (!rc) {
		struct ckpt_tensor *ct = trainer_ckpt_tensors(tr);
		for (int i = 0; i < t->count; i++) {
			int64_t nc = ckpt_tensor_ncols(&ct[i]), c0 = ct[i].ncols > 0 ? ct[i].col0 : 0;
			const float *src = full + g.p[i].offset + ct[i].row0 * ct[i].cols + c0;
			for (int64_t r = 0; r < ct[i].nrows; r++)
				memcpy(ct[i].param + r * nc, src + r * ct[i].cols,
				       (size_t)nc * sizeof(float));
		}
		free(ct);
	}
	mem_free(MEM_OTHER, full, bytes);
	param_table_free(&g);
	int64_t any = rc != 0;
	comm_all_reduce_i64(&tr->mesh.world_group, &any, 1);
	if (any)
		return rc ? rc : CT_ERR_RUNTIME;
	LOG_INFO("checkpoint: loaded Hugging Face weights from %s; starting at step 0", dir);
	return CT_OK;
}

/* No checkpoint of this run: start from checkpoint.initial_load_path. */
int trainer_initial_load(struct trainer *tr, int64_t *first_step, struct step_metrics *sm)
{
	const struct ct_config *cfg = tr->cfg;
	const char *path = cfg->checkpoint.initial_load_path;
	if (cfg->checkpoint.initial_load_in_hf)
		return trainer_load_hf(tr, path);
	char root[1100];
	int64_t step;
	int rc = ckpt_resolve(path, root, sizeof(root), &step);
	if (rc) {
		LOG_ERROR("checkpoint.initial_load_path: '%s' holds no checkpoint", path);
		return rc;
	}
	return trainer_load(tr, root, step, cfg->checkpoint.initial_load_model_only, first_step,
	                    sm);
}

/* Resume from checkpoint.load_step, which must load; or (-1) from the newest checkpoint that
 * loads and verifies, falling back to older ones and saying so; with none at all, from
 * checkpoint.initial_load_path if set. Sets the first step to run. */
int trainer_resume(struct trainer *tr, int64_t *first_step, struct step_metrics *sm)
{
	char root[1100];
	trainer_ckpt_root(tr, root, sizeof(root));
	if (tr->cfg->checkpoint.load_step >= 0) {
		int64_t step;
		int rc = ckpt_find(root, tr->cfg->checkpoint.load_step, &step);
		return rc ? rc : trainer_load(tr, root, step, false, first_step, sm);
	}
	int64_t steps[256];
	int n = ckpt_list(root, steps, 256);
	for (int i = 0; i < n; i++) {
		if (trainer_load(tr, root, steps[i], false, first_step, sm) == CT_OK)
			return CT_OK;
		if (i + 1 < n)
			LOG_WARN(
			    "checkpoint of step %lld failed to load; falling back to step %lld",
			    (long long)steps[i], (long long)steps[i + 1]);
	}
	if (n > 0) {
		LOG_ERROR("no checkpoint in '%s' loads (%d tried); refusing to start over", root,
		          n);
		return CT_ERR_RUNTIME;
	}
	if (tr->cfg->checkpoint.initial_load_path[0])
		return trainer_initial_load(tr, first_step, sm);
	return CT_OK;
}

int trainer_save(struct trainer *tr, int64_t steps_done, const struct step_metrics *sm)
{
	char root[1100];
	trainer_ckpt_root(tr, root, sizeof(root));
	struct ckpt_tensor *ct = trainer_ckpt_tensors(tr);
	struct ckpt_trainer_state st = {
	    .step = steps_done, .tokens_seen = sm->tokens_seen, .optimizer_step = tr->opt.t};
	if (tr->train_ld) {
		struct loader_state ls;
		loader_state(tr->train_ld, &ls);
		cJSON *js = loader_state_to_json(&ls);
		char *txt = cJSON_PrintUnformatted(js);
		snprintf(st.data_state, sizeof(st.data_state), "%s", txt);
		free(txt);
		cJSON_Delete(js);
	}
	/* the effective config and the tokenizer travel with the weights */
	char *cfg_text = NULL, *tok_data = NULL;
	size_t cfg_len = 0, tok_len = 0;
	FILE *mf = open_memstream(&cfg_text, &cfg_len);
	CHECK(mf, "out of memory");
	config_print(tr->cfg, mf);
	fclose(mf);
	struct ckpt_extra extra[3] = {{"config.toml", cfg_text, cfg_len}};
	int n_extra = 1;
	/* the model's state outside the table (MoE's balancing bias), the same on every rank */
	int64_t n_state = model_state(&tr->model, NULL);
	double *state = n_state > 0 ? xcalloc((size_t)n_state, sizeof(double)) : NULL;
	if (state) {
		CHECK(model_state(&tr->model, state) == n_state, "model state changed size");
		extra[n_extra++] = (struct ckpt_extra){MODEL_STATE_FILE, state,
		                                       (size_t)n_state * sizeof(double)};
	}
	if (tr->cfg->model.tokenizer_path[0]) {
		if (io_read_file(tr->cfg->model.tokenizer_path, &tok_data, &tok_len) == CT_OK)
			extra[n_extra++] =
			    (struct ckpt_extra){"tokenizer.model", tok_data, tok_len};
		else
			LOG_ERROR("cannot read '%s': %s", tr->cfg->model.tokenizer_path,
			          strerror(errno));
	}
	int rc =
	    tr->ckpt_async
	        ? ckpt_async_save(tr->ckpt_async, root, &tr->model.cfg, ct, tr->model.table->count,
	                          &st, extra, n_extra, tr->cfg->checkpoint.keep_latest_k)
	        : ckpt_save(root, &tr->model.cfg, &tr->mesh, ct, tr->model.table->count, &st, extra,
	                    n_extra, tr->cfg->checkpoint.keep_latest_k);
	free(ct);
	free(cfg_text);
	free(tok_data);
	free(state);
	return rc;
}
