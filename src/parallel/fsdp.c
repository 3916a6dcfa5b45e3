#include "parallel/fsdp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "base/log.h"
#include "base/mem.h"
#include "kernels/kernels.h"
#include "train/trainer.h"

int fsdp_reshard_parse(const char *name, enum fsdp_reshard *r)
{
	static const char *const names[] = {"default", "always", "never"};
	for (int i = 0; i < 3; i++)
		if (strcmp(name, names[i]) == 0) {
			*r = (enum fsdp_reshard)i;
			return CT_OK;
		}
	LOG_ERROR("parallelism.fsdp_reshard_after_forward: unknown '%s' (default, always, never)",
	          name);
	return CT_ERR_USAGE;
}

/* ---------------------------------------------------------------- plan */

int fsdp_build(struct fsdp *f, struct model *m, const struct mesh *mesh, bool bf16,
               enum fsdp_reshard reshard, struct comm_stream *stream)
{
	memset(f, 0, sizeof(*f));
	f->mesh = mesh;
	f->model = m;
	f->stream = stream;
	f->bf16 = bf16;
	f->reshard = reshard;
	const struct llama_table *t = m->table;
	int64_t N = mesh->dp_shard, r = mesh->dp_shard_rank;
	f->n_units = t->n_units;
	f->p = xcalloc((size_t)t->count, sizeof(*f->p));
	f->u = xcalloc((size_t)t->n_units, sizeof(*f->u));
	for (int u = 0; u < t->n_units; u++)
		f->u[u].first_param = -1;
	for (int i = 0; i < t->count; i++) {
		const struct llama_param *lp = &t->p[i];
		struct fsdp_param *p = &f->p[i];
		struct fsdp_unit *un = &f->u[lp->unit];
		if (un->first_param < 0)
			un->first_param = i;
		un->n_params++;
		p->rows = lp->shape[0];
		p->cols = lp->numel / lp->shape[0];
		p->chunk_rows = (p->rows + N - 1) / N;
		int64_t mine = p->rows - r * p->chunk_rows;
		p->my_rows = mine < 0 ? 0 : (mine > p->chunk_rows ? p->chunk_rows : mine);
		p->full_off = lp->offset - t->unit_begin[lp->unit];
		p->shard_off = un->shard_numel;
		p->decay = lp->weight_decay;
		un->shard_numel += p->chunk_rows * p->cols;
	}
	for (int u = 0; u < t->n_units; u++) {
		struct fsdp_unit *un = &f->u[u];
		un->full_numel = t->unit_begin[u + 1] - t->unit_begin[u];
		un->shard_base = f->shard_numel;
		un->w_slot = un->g_slot = -1;
		f->shard_numel += un->shard_numel;
		f->max_full = un->full_numel > f->max_full ? un->full_numel : f->max_full;
		f->max_shard = un->shard_numel > f->max_shard ? un->shard_numel : f->max_shard;
	}
	f->shard_w = mem_alloc(MEM_PARAMS, (size_t)f->shard_numel * sizeof(float));
	f->shard_g = mem_alloc(MEM_GRADS, (size_t)f->shard_numel * sizeof(float));
	/* Slots are allocated on first use, so the number ever allocated is the peak in use. */
	f->n_wslots = reshard == FSDP_RESHARD_NEVER ? t->n_units : 4;
	f->n_gslots = 3;
	f->wslot = xcalloc((size_t)f->n_wslots, sizeof(float *));
	f->gslot = xcalloc((size_t)f->n_gslots, sizeof(float *));
	f->wslot_busy = xcalloc((size_t)f->n_wslots, sizeof(bool));
	f->gslot_busy = xcalloc((size_t)f->n_gslots, sizeof(bool));
	size_t esz = bf16 ? 2 : 4;
	/* fp32 gathers send straight from the shard; bf16 needs a narrowed copy */
	f->ag_send = bf16 ? mem_alloc(MEM_COMM, (size_t)f->max_shard * esz) : NULL;
	f->ag_recv = mem_alloc(MEM_COMM, (size_t)(N * f->max_shard) * esz);
	f->rs_send = mem_alloc(MEM_COMM, (size_t)(N * f->max_shard) * sizeof(float));
	f->rs_recv = mem_alloc(MEM_COMM, (size_t)f->max_shard * sizeof(float));
	f->rs_scratch = mem_alloc(MEM_COMM, (size_t)(2 * f->max_shard) * sizeof(float));
	for (int u = 0; u < t->n_units; u++)
		model_bind_unit(m, u, NULL, NULL);
	return CT_OK;
}

void fsdp_free(struct fsdp *f)
{
	if (!f->p)
		return;
	int64_t N = f->mesh->dp_shard;
	size_t esz = f->bf16 ? 2 : 4, full = (size_t)f->max_full * sizeof(float);
	for (int i = 0; i < f->n_wslots; i++)
		mem_free(MEM_FULL_PARAMS, f->wslot[i], full);
	for (int i = 0; i < f->n_gslots; i++)
		mem_free(MEM_FULL_GRADS, f->gslot[i], full);
	mem_free(MEM_PARAMS, f->shard_w, (size_t)f->shard_numel * sizeof(float));
	mem_free(MEM_GRADS, f->shard_g, (size_t)f->shard_numel * sizeof(float));
	if (f->ag_send)
		mem_free(MEM_COMM, f->ag_send, (size_t)f->max_shard * esz);
	mem_free(MEM_COMM, f->ag_recv, (size_t)(N * f->max_shard) * esz);
	mem_free(MEM_COMM, f->rs_send, (size_t)(N * f->max_shard) * sizeof(float));
	mem_free(MEM_COMM, f->rs_recv, (size_t)f->max_shard * sizeof(float));
	mem_free(MEM_COMM, f->rs_scratch, (size_t)(2 * f->max_shard) * sizeof(float));
	free(f->wslot), free(f->gslot), free(f->wslot_busy), free(f->gslot_busy);
	free(f->p), free(f->u);
	memset(f, 0, sizeof(*f));
}

void fsdp_init_params(struct fsdp *f, uint64_t seed)
{
	const struct llama_table *t = f->model->table;
	int64_t r = f->mesh->dp_shard_rank;
	for (int i = 0; i < t->count; i++) {
		const struct fsdp_param *p = &f->p[i];
		float *dst = f->shard_w + f->u[t->p[i].unit].shard_base + p->shard_off;
		model_init_params(f->model, seed, dst, t->p[i].offset + r * p->chunk_rows * p->cols,
		                  p->my_rows * p->cols);
	}
}

/* ---------------------------------------------------------------- slots */

static int slot_acquire(float **slots, bool *busy, int n, enum mem_cat cat, int64_t floats,
                        const char *what)
{
	for (int i = 0; i < n; i++) {
		if (busy[i])
			continue;
		if (!slots[i])
			slots[i] = mem_alloc(cat, (size_t)floats * sizeof(float));
		busy[i] = true;
		return i;
	}
	CHECK(false, "fsdp: no free %s slot (%d in use)", what, n);
}

static void unit_release_params(struct fsdp *f, int u)
{
	struct fsdp_unit *un = &f->u[u];
	if (un->w_slot < 0)
		return;
	f->wslot_busy[un->w_slot] = false;
	un->w_slot = -1;
	f->model->unit_w[u] = NULL;
}

static void unit_release_grads(struct fsdp *f, int u)
{
	struct fsdp_unit *un = &f->u[u];
	if (un->g_slot < 0)
		return;
	f->gslot_busy[un->g_slot] = false;
	un->g_slot = -1;
	f->model->unit_dw[u] = NULL;
}

static void unit_zero_grads(struct fsdp *f, int u)
{
	struct fsdp_unit *un = &f->u[u];
	if (un->g_slot < 0)
		un->g_slot = slot_acquire(f->gslot, f->gslot_busy, f->n_gslots, MEM_FULL_GRADS,
		                          f->max_full, "gradient");
	float *g = f->gslot[un->g_slot];
	memset(g, 0, (size_t)un->full_numel * sizeof(float));
	f->model->unit_dw[u] = g;
}

/* ---------------------------------------------------------------- collectives */

/* copy-out: rank q's chunk of each tensor of unit u lands in rows [q*chunk, q*chunk + rows_q)
 * of the full unit buffer. */
static void unit_copy_out(const struct fsdp *f, int u, const void *recv, bool bf16, float *full)
{
	const struct fsdp_unit *un = &f->u[u];
	int64_t N = f->mesh->dp_shard, S = un->shard_numel;
	for (int i = un->first_param; i < un->first_param + un->n_params; i++) {
		const struct fsdp_param *p = &f->p[i];
		for (int64_t q = 0; q < N; q++) {
			int64_t rows = p->rows - q * p->chunk_rows;
			rows = rows < 0 ? 0 : (rows > p->chunk_rows ? p->chunk_rows : rows);
			int64_t n = rows * p->cols, src = q * S + p->shard_off;
			float *dst = full + p->full_off + q * p->chunk_rows * p->cols;
			if (bf16) {
				const uint16_t *h = (const uint16_t *)recv + src;
#pragma omp parallel for simd schedule(static)
				for (int64_t k = 0; k < n; k++)
					dst[k] = bf16_to_f32(h[k]);
			} else {
				memcpy(dst, (const float *)recv + src, (size_t)n * sizeof(float));
			}
		}
	}
}

/* All-gather unit u's parameters into a slot and bind them to the model. */
static void unit_gather(struct fsdp *f, int u)
{
	struct fsdp_unit *un = &f->u[u];
	if (un->w_slot >= 0)
		return;
	int64_t S = un->shard_numel;
	const float *shard = f->shard_w + un->shard_base;
	const void *send = shard;
	if (f->bf16) {
		uint16_t *h = f->ag_send;
#pragma omp parallel for simd schedule(static)
		for (int64_t i = 0; i < S; i++)
			h[i] = bf16_from_f32(shard[i]);
		send = h;
	}
	char what[64];
	snprintf(what, sizeof(what), "all-gather of unit %d", u);
	struct comm_op op = {COMM_ALL_GATHER,
	                     &f->mesh->dp_shard_group,
	                     send,
	                     f->ag_recv,
	                     S * (f->bf16 ? 2 : 4),
	                     NULL,
	                     what};
	comm_stream_wait(f->stream, comm_stream_enqueue(f->stream, &op));

	un->w_slot = slot_acquire(f->wslot, f->wslot_busy, f->n_wslots, MEM_FULL_PARAMS,
	                          f->max_full, "parameter");
	unit_copy_out(f, u, f->ag_recv, f->bf16, f->wslot[un->w_slot]);
	f->model->unit_w[u] = f->wslot[un->w_slot];
}

/* Reduce-scatter unit u's full gradients and add them to this rank's shard gradients. */
static void unit_reduce_scatter(struct fsdp *f, int u)
{
	struct fsdp_unit *un = &f->u[u];
	int64_t N = f->mesh->dp_shard, S = un->shard_numel;
	const float *g = f->gslot[un->g_slot];
	/* copy-in, rank-major with zero padding */
	for (int64_t q = 0; q < N; q++)
		for (int i = un->first_param; i < un->first_param + un->n_params; i++) {
			const struct fsdp_param *p = &f->p[i];
			int64_t rows = p->rows - q * p->chunk_rows;
			rows = rows < 0 ? 0 : (rows > p->chunk_rows ? p->chunk_rows : rows);
			float *dst = f->rs_send + q * S + p->shard_off;
			memcpy(dst, g + p->full_off + q * p->chunk_rows * p->cols,
			       (size_t)(rows * p->cols) * sizeof(float));
			memset(dst + rows * p->cols, 0,
			       (size_t)((p->chunk_rows - rows) * p->cols) * sizeof(float));
		}
	char what[64];
	snprintf(what, sizeof(what), "reduce-scatter of unit %d", u);
	struct comm_op op = {COMM_REDUCE_SCATTER,
	                     &f->mesh->dp_shard_group,
	                     f->rs_send,
	                     f->rs_recv,
	                     S,
	                     f->rs_scratch,
	                     what};
	comm_stream_wait(f->stream, comm_stream_enqueue(f->stream, &op));
	if (f->mesh->dp_replicate > 1)
		comm_all_reduce_f32(&f->mesh->dp_replicate_group, f->rs_recv, S);
	float *sg = f->shard_g + un->shard_base;
#pragma omp parallel for simd schedule(static)
	for (int64_t i = 0; i < S; i++)
		sg[i] += f->rs_recv[i];
}

/* ---------------------------------------------------------------- step */

static bool reshard_after_forward(const struct fsdp *f, int u)
{
	switch (f->reshard) {
	case FSDP_RESHARD_NEVER:
		return false;
	case FSDP_RESHARD_ALWAYS:
		return true;
	default: /* backward needs the last unit right away: keep it (TorchTitan's default) */
		return u != f->n_units - 1;
	}
}

int fsdp_train_step(struct fsdp *f, struct adamw *opt, const int32_t *tokens,
                    const int32_t *targets, int64_t accum, double lr, double max_norm,
                    struct train_step_result *res)
{
	struct model *m = f->model;
	const struct mesh *mesh = f->mesh;
	int64_t Nt = m->N, U = f->n_units;
	int64_t valid = llama_count_valid(targets, accum * Nt);
	comm_all_reduce_i64(&mesh->dp_group, &valid, 1);
	double dscale = valid > 0 ? 1.0 / (double)valid : 0.0;
	model_set_loss_dscale(m, dscale);
	memset(f->shard_g, 0, (size_t)f->shard_numel * sizeof(float));
	double loss_sum = 0.0;
	for (int64_t a = 0; a < accum; a++) {
		memcpy(m->tokens, tokens + a * Nt, (size_t)Nt * sizeof(int32_t));
		memcpy(m->targets, targets + a * Nt, (size_t)Nt * sizeof(int32_t));
		for (int u = 0; u < U; u++) {
			unit_gather(f, u);
			if (u == U - 1)
				unit_zero_grads(f, u); /* the fused loss writes output grads */
			loss_sum += model_unit_forward(m, u, NULL);
			if (reshard_after_forward(f, u))
				unit_release_params(f, u);
		}
		for (int u = (int)U - 1; u >= 0; u--) {
			unit_gather(f, u);
			if (u != U - 1)
				unit_zero_grads(f, u);
			model_unit_backward(m, u, dscale);
			unit_reduce_scatter(f, u);
			unit_release_grads(f, u);
			if (f->reshard != FSDP_RESHARD_NEVER)
				unit_release_params(f, u);
		}
	}
	for (int u = 0; u < U; u++)
		unit_release_params(f, u);

	double sums[2] = {loss_sum, sumsq_f32(f->shard_g, f->shard_numel)};
	comm_all_reduce_f64(&mesh->dp_group, &sums[0], 1);
	comm_all_reduce_f64(&mesh->dp_shard_group, &sums[1], 1);
	res->valid = valid;
	res->loss = valid > 0 ? sums[0] / (double)valid : 0.0;
	res->grad_norm = sqrt(sums[1]);
	if (!isfinite(res->loss) || !isfinite(res->grad_norm)) {
		LOG_ERROR("non-finite %s (loss %g, grad norm %g); stopping",
		          isfinite(res->loss) ? "gradient norm" : "loss", res->loss,
		          res->grad_norm);
		return CT_ERR_RUNTIME;
	}
	double gscale = clip_coefficient(res->grad_norm, max_norm);
	adamw_begin_step(opt);
	const struct llama_table *t = m->table;
	for (int i = 0; i < t->count; i++) {
		const struct fsdp_param *p = &f->p[i];
		int64_t at = f->u[t->p[i].unit].shard_base + p->shard_off;
		adamw_update_slice(opt, f->shard_w + at, f->shard_g + at, at, p->my_rows * p->cols,
		                   lr, p->decay, gscale);
	}
	return CT_OK;
}

double fsdp_eval_loss(struct fsdp *f, const int32_t *tokens, const int32_t *targets, int64_t *valid)
{
	struct model *m = f->model;
	memcpy(m->tokens, tokens, (size_t)m->N * sizeof(int32_t));
	memcpy(m->targets, targets, (size_t)m->N * sizeof(int32_t));
	double loss = 0.0;
	model_set_loss_dscale(m, 0); /* no loss gradient */
	for (int u = 0; u < f->n_units; u++) {
		unit_gather(f, u);
		int64_t v = 0;
		loss += model_unit_forward(m, u, &v);
		if (u == f->n_units - 1)
			*valid = v;
		unit_release_params(f, u);
	}
	return loss;
}

void fsdp_local_rows(const struct fsdp *f, int i, int64_t *row0, int64_t *nrows, int64_t *at)
{
	const struct fsdp_param *p = &f->p[i];
	*row0 = f->mesh->dp_shard_rank * p->chunk_rows;
	*nrows = p->my_rows;
	*at = f->u[f->model->table->p[i].unit].shard_base + p->shard_off;
}

void fsdp_gather_full(struct fsdp *f, float *out)
{
	/* Always fp32, whatever the training all-gather dtype: this is the master copy. */
	const struct llama_table *t = f->model->table;
	int64_t N = f->mesh->dp_shard;
	float *recv = malloc((size_t)(N * f->max_shard) * sizeof(float));
	CHECK(recv, "out of memory");
	for (int u = 0; u < f->n_units; u++) {
		const struct fsdp_unit *un = &f->u[u];
		comm_all_gather(&f->mesh->dp_shard_group, f->shard_w + un->shard_base, recv,
		                un->shard_numel * (int64_t)sizeof(float));
		unit_copy_out(f, u, recv, false, out + t->unit_begin[u]);
	}
	free(recv);
}
