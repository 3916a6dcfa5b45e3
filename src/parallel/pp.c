/* Pipeline parallelism: stages, shards, and the executor of a pipeline schedule. */
#include "parallel/pp.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/mem_timeline.h"
#include "base/timer.h"
#include "comm/watchdog.h"
#include "kernels/kernels.h"
#include "optim/grad_norm.h"
#include "schedule/sched_cost.h"

/* ---------------------------------------------------------------- stages */

int pp_split_stages(int64_t L, int S, int64_t first_less, int64_t last_less, int *u0)
{
	int64_t W = L + first_less + last_less;
	if (first_less < 0 || last_less < 0 || S < 1 || W % S != 0) {
		LOG_ERROR("parallelism.pipeline_parallel_layers_per_stage: %lld layers (+%lld for "
		          "the embedding, +%lld for the output: "
		          "pipeline_parallel_first/last_stage_less_layers) do not split into %d "
		          "equal stages",
		          (long long)L, (long long)first_less, (long long)last_less, S);
		return CT_ERR_USAGE;
	}
	int64_t k = W / S;
	if (S > 1 && (k < first_less || k < last_less || (S == 2 && 2 * k < W))) {
		LOG_ERROR("parallelism.pipeline_parallel_layers_per_stage: stages of %lld layers "
		          "cannot hold the embedding (%lld) or the output (%lld)",
		          (long long)k, (long long)first_less, (long long)last_less);
		return CT_ERR_USAGE;
	}
	u0[0] = 0;
	if (S == 1) {
		u0[1] = (int)L + 2;
		return CT_OK;
	}
	u0[1] = 1 + (int)(k - first_less);
	for (int s = 2; s < S; s++)
		u0[s] = u0[s - 1] + (int)k;
	u0[S] = (int)L + 2;
	CHECK(u0[S] - u0[S - 1] == 1 + k - last_less, "stage split");
	return CT_OK;
}

int pp_stages_per_rank(int64_t L, int pp, enum pp_style style, int64_t layers_per_stage,
                       int64_t first_less, int64_t last_less, int *v)
{
	if (layers_per_stage <= 0) {
		*v = style == PP_INTERLEAVED_1F1B ? 2 : 1;
		return CT_OK;
	}
	int64_t W = L + first_less + last_less;
	if (W % layers_per_stage) {
		LOG_ERROR("parallelism.pipeline_parallel_layers_per_stage: %lld layers (+%lld, "
		          "+%lld for the embedding and output) do not split into stages of %lld",
		          (long long)L, (long long)first_less, (long long)last_less,
		          (long long)layers_per_stage);
		return CT_ERR_USAGE;
	}
	int64_t S = W / layers_per_stage;
	if (S % pp) {
		LOG_ERROR("parallelism.pipeline_parallel_layers_per_stage: %lld stages of %lld "
		          "layers are not a multiple of pipeline_parallel_degree %d",
		          (long long)S, (long long)layers_per_stage, pp);
		return CT_ERR_USAGE;
	}
	*v = (int)(S / pp);
	return CT_OK;
}

/* ---------------------------------------------------------------- build */

static int pp_make_schedule(struct pp *pp)
{
	const struct pp_opts *o = &pp->o;
	if (o->csv && o->csv[0])
		return pp_sched_read_csv(&pp->sched, o->csv, pp->p, (int)o->n_micro);
	int64_t L = model_config_n_layers(&pp->cfg);
	int v;
	int rc = pp_stages_per_rank(L, pp->p, o->style, o->layers_per_stage, o->first_less,
	                            o->last_less, &v);
	return rc ? rc : pp_sched_generate(&pp->sched, o->style, pp->p, v, (int)o->n_micro);
}

int pp_build(struct pp *pp, const struct model_config *mc, const struct mesh *mesh,
             const struct pp_opts *o)
{
	memset(pp, 0, sizeof(*pp));
	pp->mesh = mesh;
	pp->cfg = *mc;
	pp->o = *o;
	pp->p = mesh->pp;
	pp->r = mesh->pp_rank;
	if (mesh->tp > 1)
		tp_coll_init(&pp->tp, &mesh->tp_group, 0.0, 0.0, 0.0);
	if (mesh->cp > 1)
		tp_coll_init(&pp->cp, &mesh->cp_group, 0.0, 0.0, o->timeout_s);
	pp->use_ep = mesh->ep > 1;
	if (pp->use_ep)
		tp_coll_init(&pp->ep, &mesh->ep_group, 0.0, 0.0, o->timeout_s);
	pp->gg[0] = &mesh->shard_group;
	pp->gg[1] = pp->use_ep ? &mesh->efsdp_group : &mesh->shard_group;
	if (!model_family_of(mc->kind)->pp) {
		LOG_ERROR("parallelism.pipeline_parallel_degree > 1 with model.name = \"%s\": not "
		          "supported (the family has no pipeline stages)",
		          model_kind_name(mc->kind));
		return CT_ERR_USAGE;
	}
	int rc = pp_make_schedule(pp);
	if (rc)
		return rc;
	char why[256];
	if (!pp_sched_check(&pp->sched, &pp->sim, why, sizeof(why))) {
		LOG_ERROR("parallelism.pipeline_parallel_schedule: %s does not check: %s",
		          pp_style_name(pp->sched.style), why);
		return CT_ERR_USAGE;
	}
	for (int r = 0; r < pp->p; r++)
		for (int i = 0; i < pp->sched.n[r]; i++)
			pp->split |= pp->sched.a[r][i].kind == PP_I || pp->sched.a[r][i].kind == PP_W;
	if (pp->split && mesh->tp > 1 && o->tp_async) {
		LOG_ERROR("parallelism.pipeline_parallel_schedule = %s (split backward, I/W) with "
		          "enable_async_tensor_parallel = true: not supported (async TP's rings "
		          "compute the weight gradients inside the input-gradient matmuls, so there "
		          "is no weight-gradient pass to defer); use plain TP or GPipe, 1F1B, "
		          "Interleaved1F1B",
		          pp_style_name(pp->sched.style));
		return CT_ERR_USAGE;
	}
	pp->v = pp->sched.v;
	pp->S = pp->sched.n_stages;
	pp->stage_u0 = xcalloc((size_t)pp->S + 1, sizeof(int));
	rc = pp_split_stages(model_config_n_layers(mc), pp->S, o->first_less, o->last_less,
	                     pp->stage_u0);
	if (rc)
		return rc;
	int64_t tag_need = 4LL * pp->S * o->n_micro + 2; /* data, header and tied tags */
	pp->tag_max = comm_p2p_tag_max();
	if (tag_need > pp->tag_max) {
		LOG_ERROR("parallelism: %d stages x %lld micro-batches need more message tags "
		          "than MPI offers (%d)",
		          pp->S, (long long)o->n_micro, pp->tag_max);
		return CT_ERR_USAGE;
	}
	/* tensor parallelism: every stage holds this TP rank's slice of its units (the TP
	 * table), and its boundary activations are the rank's sequence shard; expert
	 * parallelism: this ep rank's experts */
	rc = pp->use_ep ? model_table_build_ep(&pp->table, mc, mesh->ep, mesh->ep_rank)
	                : model_table_build_tp(&pp->table, mc, mesh->tp, mesh->tp_rank);
	if (rc)
		return rc;
	const struct param_table *t = &pp->table;
	int64_t D = mesh->shard;
	pp->vstages = xcalloc((size_t)pp->v, sizeof(*pp->vstages));
	pp->t = xcalloc((size_t)t->count, sizeof(*pp->t));
	for (int i = 0; i < t->count; i++)
		pp->t[i].vstage = -1;
	for (int c = 0; c < pp->v; c++) {
		struct pp_vstage *ch = &pp->vstages[c];
		ch->stage = c * pp->p + pp->r;
		ch->u0 = pp->stage_u0[ch->stage];
		ch->u1 = pp->stage_u0[ch->stage + 1];
		ch->full_off = pp->full_numel;
		ch->shard_off = pp->shard_numel;
		for (int g = 0; g < 2; g++) { /* the dense tensors' shards, then the experts' */
			int64_t Dg = pp->gg[g]->size, rg = pp->gg[g]->rank;
			ch->gshard_off[g] = pp->shard_numel;
			for (int i = 0; i < t->count; i++) {
				const struct param_entry *lp = &t->p[i];
				if (lp->unit < ch->u0 || lp->unit >= ch->u1 ||
				    (pp->use_ep && lp->expert) != (g == 1))
					continue;
				struct pp_tensor *pt = &pp->t[i];
				pt->vstage = c;
				pt->grp = g;
				pt->rows = lp->shape[0];
				pt->cols = lp->numel / lp->shape[0];
				pt->chunk_rows = (pt->rows + Dg - 1) / Dg;
				int64_t mine = pt->rows - rg * pt->chunk_rows;
				pt->my_rows =
				    mine < 0 ? 0 : (mine > pt->chunk_rows ? pt->chunk_rows : mine);
				pt->full_off = ch->full_off + lp->offset - t->unit_begin[ch->u0];
				pt->shard_off = pp->shard_numel;
				pt->decay = lp->weight_decay;
				pp->shard_numel += pt->chunk_rows * pt->cols;
			}
			ch->gshard_numel[g] = pp->shard_numel - ch->gshard_off[g];
		}
		ch->full_numel = t->unit_begin[ch->u1] - t->unit_begin[ch->u0];
		ch->shard_numel = pp->shard_numel - ch->shard_off;
		pp->full_numel += ch->full_numel;
		int64_t need = D * ch->shard_numel * 2 + 3 * ch->shard_numel;
		pp->comm_numel = need > pp->comm_numel ? need : pp->comm_numel;
		ch->slots = NULL;
		ch->slot_of = xcalloc((size_t)o->n_micro, sizeof(int));
		for (int d = 0; d < 2; d++) {
			ch->send[d] = xcalloc((size_t)o->n_micro, sizeof(*ch->send[d]));
			ch->recv[d] = xcalloc((size_t)o->n_micro, sizeof(*ch->recv[d]));
		}
		for (int64_t m = 0; m < o->n_micro; m++)
			ch->slot_of[m] = -1;
	}
	pp->full_w = mem_alloc(MEM_FULL_PARAMS, (size_t)pp->full_numel * sizeof(float));
	pp->full_g = mem_alloc(MEM_FULL_GRADS, (size_t)pp->full_numel * sizeof(float));
	pp->shard_w = mem_alloc(MEM_PARAMS, (size_t)pp->shard_numel * sizeof(float));
	pp->shard_g = mem_alloc(MEM_GRADS, (size_t)pp->shard_numel * sizeof(float));
	pp->comm_buf = mem_alloc(MEM_COMM, (size_t)pp->comm_numel * sizeof(float));
	if (o->state_model) { /* the family's step statistics and state (MoE's bias) */
		pp->n_stats = model_step_stats(o->state_model, NULL);
		pp->n_state = model_state(o->state_model, NULL);
		pp->stats = xcalloc((size_t)(2 * pp->n_stats + 1), sizeof(double));
		pp->stats_slot = pp->stats + pp->n_stats;
		pp->state = xcalloc((size_t)(pp->n_state + 1), sizeof(double));
	}
	pp->tied = model_family_of(mc->kind)->tied_head && pp->p > 1;
	if (pp->tied) {
		/* (under tensor parallelism each tp rank sends its own copy to its peer stage's
		 * same tp rank; a replicated tied tensor, as Hyena's embedding, is that copy) */
		CHECK(mesh->tp == 1 || t->p[0].tp_dim < 0,
		      "pp: a tied head split by tensor parallelism");
		pp->tied_numel = t->p[0].numel;
		CHECK(t->p[0].unit == 0, "pp: the tied tensor is not unit 0's");
		if (pp->vstages[0].u0 == 0 || pp->vstages[pp->v - 1].u1 == t->n_units)
			pp->tied_g = mem_alloc(MEM_COMM, (size_t)pp->tied_numel * sizeof(float));
		if (pp->vstages[pp->v - 1].u1 == t->n_units)
			pp->tied_w = mem_alloc(MEM_FULL_PARAMS, (size_t)pp->tied_numel * sizeof(float));
	}
	/* this rank's step as schedule nodes, over the whole model's units */
	struct sched_unit *units = xcalloc((size_t)t->n_units, sizeof(*units));
	sched_units_from_table(t, D, units);
	sched_build_pp(&pp->step, &pp->sched, pp->r, units, t->n_units, pp->stage_u0);
	CHECK(sched_validate(&pp->step, why, sizeof(why)), "pipeline step rejected: %s", why);
	/* and the validation loss's forward-only step over the same stages */
	rc = pp_sched_forward_only(&pp->eval_sched, pp->sched.style, pp->p, pp->v,
	                           (int)o->n_micro);
	CHECK(rc == CT_OK && pp_sched_check(&pp->eval_sched, NULL, why, sizeof(why)),
	      "forward-only pipeline schedule rejected: %s", why);
	sched_build_pp(&pp->eval_step, &pp->eval_sched, pp->r, units, t->n_units, pp->stage_u0);
	free(units);
	CHECK(sched_validate(&pp->eval_step, why, sizeof(why)), "forward-only step rejected: %s",
	      why);
	pp->rec = xcalloc((size_t)pp->step.n_nodes, sizeof(*pp->rec));
	return CT_OK;
}

void pp_free(struct pp *pp)
{
	if (!pp->vstages) {
		pp_sched_free(&pp->sched);
		pp_sched_free(&pp->eval_sched);
		pp_sim_free(&pp->sim);
		free(pp->stage_u0);
		return;
	}
	for (int c = 0; c < pp->v; c++) {
		struct pp_vstage *ch = &pp->vstages[c];
		for (int k = 0; k < ch->n_slots; k++)
			model_free(&ch->slots[k].m);
		free(ch->slots), free(ch->slot_of);
		for (int d = 0; d < 2; d++)
			free(ch->send[d]), free(ch->recv[d]);
	}
	mem_free(MEM_FULL_PARAMS, pp->full_w, (size_t)pp->full_numel * sizeof(float));
	mem_free(MEM_FULL_GRADS, pp->full_g, (size_t)pp->full_numel * sizeof(float));
	mem_free(MEM_PARAMS, pp->shard_w, (size_t)pp->shard_numel * sizeof(float));
	mem_free(MEM_GRADS, pp->shard_g, (size_t)pp->shard_numel * sizeof(float));
	mem_free(MEM_COMM, pp->comm_buf, (size_t)pp->comm_numel * sizeof(float));
	if (pp->tied_g)
		mem_free(MEM_COMM, pp->tied_g, (size_t)pp->tied_numel * sizeof(float));
	if (pp->tied_w)
		mem_free(MEM_FULL_PARAMS, pp->tied_w, (size_t)pp->tied_numel * sizeof(float));
	param_table_free(&pp->table);
	pp_sched_free(&pp->sched);
	pp_sched_free(&pp->eval_sched);
	pp_sim_free(&pp->sim);
	sched_free(&pp->step);
	sched_free(&pp->eval_step);
	free(pp->stage_u0), free(pp->vstages), free(pp->t), free(pp->rec);
	free(pp->stats), free(pp->state);
	memset(pp, 0, sizeof(*pp));
}

void pp_init_params(struct pp *pp, uint64_t seed)
{
	const struct param_table *t = &pp->table;
	for (int i = 0; i < t->count; i++) {
		const struct pp_tensor *pt = &pp->t[i];
		if (pt->vstage < 0)
			continue;
		int64_t dr = pp->gg[pt->grp]->rank;
		float *dst = pp->shard_w + pt->shard_off;
		memset(dst, 0, (size_t)(pt->chunk_rows * pt->cols) * sizeof(float));
		model_init_params_cfg(&pp->cfg, t, seed, dst,
		                      t->p[i].offset + dr * pt->chunk_rows * pt->cols,
		                      pt->my_rows * pt->cols);
	}
}

bool pp_local_rows(const struct pp *pp, int i, int64_t *row0, int64_t *nrows, int64_t *at)
{
	const struct pp_tensor *pt = &pp->t[i];
	*row0 = 0;
	*nrows = 0;
	*at = 0;
	if (pt->vstage < 0)
		return false;
	*row0 = pp->gg[pt->grp]->rank * pt->chunk_rows;
	*nrows = pt->my_rows;
	*at = pt->shard_off;
	return true;
}

/* ---------------------------------------------------------------- shards <-> full */

static int64_t rows_of(const struct pp_tensor *pt, int64_t q)
{
	int64_t rows = pt->rows - q * pt->chunk_rows;
	return rows < 0 ? 0 : (rows > pt->chunk_rows ? pt->chunk_rows : rows);
}

#define FOR_CHUNK_TENSORS(pp, c, i)                                                                \
	for (int i = 0; i < (pp)->table.count; i++)                                                \
		if ((pp)->t[i].vstage == (c))

/* All-gather virtual stage c's shards over dp_shard (under ep: the experts' over efsdp) into
 * the full parameter buffer. */
static void gather_vstage(struct pp *pp, int c, float *full)
{
	const struct pp_vstage *ch = &pp->vstages[c];
	float *recv = pp->comm_buf;
	for (int g = 0; g < (pp->use_ep ? 2 : 1); g++) {
		int64_t D = pp->gg[g]->size, S = ch->gshard_numel[g];
		comm_all_gather(pp->gg[g], pp->shard_w + ch->gshard_off[g], recv,
		                S * (int64_t)sizeof(float));
		FOR_CHUNK_TENSORS(pp, c, i)
		{
			const struct pp_tensor *pt = &pp->t[i];
			if (pt->grp != g)
				continue;
			for (int64_t q = 0; q < D; q++)
				memcpy(full + pt->full_off - ch->full_off +
				           q * pt->chunk_rows * pt->cols,
				       recv + q * S + pt->shard_off - ch->gshard_off[g],
				       (size_t)(rows_of(pt, q) * pt->cols) * sizeof(float));
		}
	}
}

/* bf16 parameters: virtual stage c's gathered weights as bf16 values (what a bf16 all-gather
 * delivers; the wire itself stays fp32), the float8 linears' kept when the fp8 all-gather
 * casts them from the fp32 masters. */
static void round_vstage_bf16(struct pp *pp, int c, float *full)
{
	const struct pp_vstage *ch = &pp->vstages[c];
	FOR_CHUNK_TENSORS(pp, c, i)
	{
		const struct pp_tensor *pt = &pp->t[i];
		if (pp->o.fp8_from_masters && model_fp8_linear(&pp->table.p[i]))
			continue;
		float *w = full + pt->full_off - ch->full_off;
		int64_t n = pt->rows * pt->cols;
#pragma omp parallel for simd schedule(static)
		for (int64_t k = 0; k < n; k++)
			w[k] = bf16_to_f32(bf16_from_f32(w[k]));
	}
}

/* Reduce-scatter virtual stage c's full gradients into its shard gradients (+ HSDP
 * all-reduce). Under ep an expert's gradient already holds every ep rank's tokens routed to
 * it: summed over efsdp (and the replicas), never divided (parallel/fsdp.h). */
static void reduce_vstage(struct pp *pp, int c)
{
	const struct pp_vstage *ch = &pp->vstages[c];
	for (int g = 0; g < (pp->use_ep ? 2 : 1); g++) {
		int64_t D = pp->gg[g]->size, S = ch->gshard_numel[g];
		float *send = pp->comm_buf, *scratch = pp->comm_buf + D * S;
		for (int64_t q = 0; q < D; q++)
			FOR_CHUNK_TENSORS(pp, c, i)
			{
				const struct pp_tensor *pt = &pp->t[i];
				if (pt->grp != g)
					continue;
				int64_t rows = rows_of(pt, q);
				float *dst = send + q * S + pt->shard_off - ch->gshard_off[g];
				memcpy(dst, pp->full_g + pt->full_off + q * pt->chunk_rows * pt->cols,
				       (size_t)(rows * pt->cols) * sizeof(float));
				memset(dst + rows * pt->cols, 0,
				       (size_t)((pt->chunk_rows - rows) * pt->cols) * sizeof(float));
			}
		comm_reduce_scatter_f32(pp->gg[g], send, pp->shard_g + ch->gshard_off[g], S,
		                        scratch);
	}
	if (pp->mesh->dp_replicate > 1)
		comm_all_reduce_f32(&pp->mesh->dp_replicate_group, pp->shard_g + ch->shard_off,
		                    ch->shard_numel);
}

void pp_gather_full(struct pp *pp, float *out)
{
	const struct param_table *t = &pp->table;
	float *mine = xcalloc((size_t)t->numel, sizeof(float));
	for (int c = 0; c < pp->v; c++) {
		const struct pp_vstage *ch = &pp->vstages[c];
		gather_vstage(pp, c, pp->full_g); /* scratch: gradients are dead between steps */
		memcpy(mine + t->unit_begin[ch->u0], pp->full_g,
		       (size_t)ch->full_numel * sizeof(float));
	}
	/* every element is owned by exactly one pipeline rank: a sum over pp assembles it */
	comm_all_reduce_f32(&pp->mesh->pp_group, mine, t->numel);
	if (!pp->use_ep) {
		memcpy(out, mine, (size_t)t->numel * sizeof(float));
		free(mine);
		return;
	}
	int64_t at = 0; /* the global layout: the table's order, expert tensors whole */
	for (int i = 0; i < t->count; i++) {
		const struct param_entry *e = &t->p[i];
		if (e->expert) {
			comm_all_gather(&pp->mesh->ep_group, mine + e->offset, out + at,
			                e->numel * (int64_t)sizeof(float));
			at += e->numel * pp->mesh->ep;
		} else {
			memcpy(out + at, mine + e->offset, (size_t)e->numel * sizeof(float));
			at += e->numel;
		}
	}
	free(mine);
}

/* ---------------------------------------------------------------- slots */

static void slot_wait_sends(struct pp *pp, int c, struct pp_slot *s);

static int t_units(const struct pp *pp)
{
	return pp->table.n_units;
}

/* (a slot built later takes pp->state when it is built) */
void pp_pull_state(struct pp *pp)
{
	if (pp->n_state <= 0)
		return;
	CHECK(model_state(pp->o.state_model, pp->state) == pp->n_state,
	      "pp: the model's state changed size");
	for (int c = 0; c < pp->v; c++)
		for (int k = 0; k < pp->vstages[c].n_slots; k++)
			model_set_state(&pp->vstages[c].slots[k].m, pp->state, pp->n_state);
}

static struct pp_slot *slot_get(struct pp *pp, int c, int m)
{
	struct pp_vstage *ch = &pp->vstages[c];
	if (ch->slot_of[m] >= 0)
		return &ch->slots[ch->slot_of[m]];
	int k = 0;
	while (k < ch->n_slots && ch->slots[k].micro >= 0)
		k++;
	if (k == ch->n_slots) {
		ch->slots = realloc(ch->slots, (size_t)(k + 1) * sizeof(*ch->slots));
		CHECK(ch->slots, "out of memory");
		struct pp_slot *s = &ch->slots[k];
		memset(s, 0, sizeof(*s));
		const struct model_build_opts mo = {
		    .own_params = false,
		    .ac = pp->o.ac,
		    .ac_every = pp->o.ac_every,
		    .tp = pp->mesh->tp > 1 ? &pp->tp.ops : NULL,
		    .tp_async = pp->mesh->tp > 1 && pp->o.tp_async,
		    .unit_lo = ch->u0, /* only this stage's activations */
		    .unit_hi = ch->u1,
		    .split_backward = pp->split,
		    .cp = pp->mesh->cp > 1 ? &pp->cp.ops : NULL,
		    .cp_order = pp->o.cp_order,
		    .cp_ring = pp->o.cp_ring,
		    .ep = pp->use_ep ? &pp->ep.ops : NULL};
		int64_t before = mem_current(MEM_ACTIVATIONS);
		CHECK(model_build(&s->m, &pp->cfg, pp->o.micro_rows, pp->o.T, &mo) == CT_OK,
		      "pp: cannot build a stage model");
		if (pp->n_state > 0)
			model_set_state(&s->m, pp->state, pp->n_state);
		ch->slot_bytes = mem_current(MEM_ACTIVATIONS) - before;
		ch->n_slots++;
		if (pp->tied && ch->u1 == t_units(pp)) /* the head reads the sent embedding */
			model_set_tied(&s->m, pp->tied_w);
	}
	struct pp_slot *s = &ch->slots[k];
	/* a slot last used by another micro-batch may still be sending its boundary buffer */
	slot_wait_sends(pp, c, s);
	const struct param_table *t = &pp->table;
	for (int u = ch->u0; u < ch->u1; u++) {
		int64_t off = ch->full_off + t->unit_begin[u] - t->unit_begin[ch->u0];
		model_bind_unit(&s->m, u, pp->full_w + off, pp->full_g + off);
	}
	s->micro = m;
	s->sent_b = s->w_done = false;
	ch->slot_of[m] = k;
	return s;
}

static struct pp_slot *slot_of(struct pp *pp, int c, int m)
{
	struct pp_vstage *ch = &pp->vstages[c];
	CHECK(ch->slot_of[m] >= 0, "pp: stage %d has no slot for micro-batch %d", ch->stage, m);
	return &ch->slots[ch->slot_of[m]];
}

/* The backward's slot is free once its input gradient is sent (at once on stage 0) and, with
 * a split backward, its W has run. */
static void slot_release(struct pp *pp, int c, int m)
{
	struct pp_vstage *ch = &pp->vstages[c];
	struct pp_slot *s = slot_of(pp, c, m);
	if (s->sent_b && (s->w_done || !pp->split)) {
		s->micro = -1;
		ch->slot_of[m] = -1;
	}
}

/* ---------------------------------------------------------------- transfers */

/* Tag of the transfer sent by `stage` (forward: its output; backward: its input grad). */
static int tag_of(const struct pp *pp, bool backward, int stage, int m)
{
	return ((backward ? 1 : 0) * pp->S + stage) * (int)pp->o.n_micro + m;
}

/* Test every open send, so that MPI advances them between compute. */
static void progress(void *ctx)
{
	struct pp *pp = ctx;
	for (int c = 0; c < pp->v; c++)
		for (int k = 0; k < pp->vstages[c].n_slots; k++) {
			const struct pp_slot *s = &pp->vstages[c].slots[k];
			if (!s->send_open)
				continue;
			struct pp_xfer *x = &pp->vstages[c].send[s->send_backward][s->send_micro];
			comm_p2p_test(&x->data);
			comm_p2p_test(&x->hdr);
		}
}

/* Wait for a transfer with pipeline rank peer (and its simulated arrival). The comm watchdog
 * watches the wait (a hung neighbour aborts the job with a message naming the transfer and
 * what the neighbour is doing); the fallback timeout below, a few seconds later, serves runs
 * without a watchdog (tests). */
static void wait_until(struct pp *pp, struct comm_p2p *req, double not_before, int peer,
                       const char *what)
{
	if (comm_p2p_test(req) && timer_now() >= not_before)
		return;
	double t0 = timer_now();
	int token = comm_p2p_watch(&pp->mesh->pp_group, peer, what);
	double fallback = pp->o.timeout_s + 2 * WD_ASK_SECONDS + 2;
	for (;;) {
		progress(pp);
		if (comm_p2p_test(req) && timer_now() >= not_before) {
			comm_p2p_unwatch(token);
			return;
		}
		if (pp->o.timeout_s > 0 && timer_now() - t0 > fallback) {
			LOG_ERROR("comm: %s did not complete within %.0f s (comm.timeout_seconds and "
			          "the watchdog's grace); aborting the job",
			          what, fallback);
			comm_abort(1);
		}
		sched_yield(); /* ranks may share cores: let the one we wait for run */
	}
}

/* Wait for virtual stage c's receive of micro-batch m (and its simulated arrival). */
static void wait_recv(struct pp *pp, int c, int m, bool backward)
{
	const struct pp_vstage *ch = &pp->vstages[c];
	int from = backward ? ch->stage + 1 : ch->stage - 1;
	int peer = pp_stage_rank(&pp->sched, from);
	char what[160];
	snprintf(what, sizeof(what),
	         "pipeline receive of %s for stage %d, micro-batch %d, from stage %d (pipeline "
	         "rank %d)",
	         backward ? "an input gradient" : "an activation", ch->stage, m, from, peer);
	struct pp_xfer *x = &ch->recv[backward][m];
	if (pp->o.sim_gbps > 0)
		wait_until(pp, &x->hdr, 0, peer, what);
	wait_until(pp, &x->data, pp->o.sim_gbps > 0 ? x->at : 0, peer, what);
}

/* Wait for virtual stage c's send of micro-batch m in one direction. */
static void wait_send(struct pp *pp, int c, int m, bool backward)
{
	const struct pp_vstage *ch = &pp->vstages[c];
	int to = backward ? ch->stage - 1 : ch->stage + 1;
	int peer = pp_stage_rank(&pp->sched, to);
	char what[160];
	snprintf(what, sizeof(what),
	         "pipeline send of %s, micro-batch %d, to stage %d (pipeline rank %d)",
	         backward ? "an input gradient" : "an activation", m, to, peer);
	struct pp_xfer *x = &ch->send[backward][m];
	wait_until(pp, &x->data, 0, peer, what);
	wait_until(pp, &x->hdr, 0, peer, what);
}

static void slot_wait_sends(struct pp *pp, int c, struct pp_slot *s)
{
	if (!s->send_open)
		return;
	wait_send(pp, c, s->send_micro, s->send_backward);
	s->send_open = false;
}

/* A stage boundary carries the residual stream of one micro-batch: under TP's sequence
 * parallelism each TP rank holds (and sends to its peer of the same TP rank) Ns = ceil(N/tp)
 * token rows of it; a family without it (tp_whole_stream) sends all N. */
static int64_t boundary_bytes(const struct pp *pp)
{
	int64_t N = pp->o.micro_rows * pp->o.T, tp = pp->mesh->tp;
	if (model_family_of(pp->cfg.kind)->tp_whole_stream)
		tp = 1;
	return (N + tp - 1) / tp * model_config_dim(&pp->cfg) * (int64_t)sizeof(float);
}

static void send_buf(struct pp *pp, int c, int m, bool backward, const float *buf)
{
	struct pp_vstage *ch = &pp->vstages[c];
	struct pp_slot *s = slot_of(pp, c, m);
	int64_t bytes = boundary_bytes(pp);
	int peer_stage = backward ? ch->stage - 1 : ch->stage + 1;
	int peer = pp_stage_rank(&pp->sched, peer_stage), tag = tag_of(pp, backward, ch->stage, m);
	slot_wait_sends(pp, c, s); /* the slot's previous send (its activation) */
	struct pp_xfer *x = &ch->send[backward][m];
	if (pp->o.sim_gbps > 0) {
		double now = timer_now(), start = pp->link_free > now ? pp->link_free : now;
		x->at = start + pp->o.sim_latency_us * 1e-6 +
		        (double)bytes * 8.0 / (pp->o.sim_gbps * 1e9);
		pp->link_free = x->at;
		comm_p2p_isend(&pp->mesh->pp_group, peer, tag + 2 * pp->S * (int)pp->o.n_micro,
		               &x->at, sizeof(double), &x->hdr);
	}
	comm_p2p_isend(&pp->mesh->pp_group, peer, tag, buf, bytes, &x->data);
	s->send_open = true;
	s->send_micro = m;
	s->send_backward = backward;
}

static void recv_buf(struct pp *pp, int c, int m, bool backward, float *buf)
{
	struct pp_vstage *ch = &pp->vstages[c];
	int peer_stage = backward ? ch->stage + 1 : ch->stage - 1;
	int peer = pp_stage_rank(&pp->sched, peer_stage), tag = tag_of(pp, backward, peer_stage, m);
	struct pp_xfer *x = &ch->recv[backward][m];
	if (pp->o.sim_gbps > 0)
		comm_p2p_irecv(&pp->mesh->pp_group, peer, tag + 2 * pp->S * (int)pp->o.n_micro,
		               &x->at, sizeof(double), &x->hdr);
	comm_p2p_irecv(&pp->mesh->pp_group, peer, tag, buf, boundary_bytes(pp), &x->data);
}

/* ---------------------------------------------------------------- the backend: stages */

static void act_forward(struct pp *pp, int c, int m)
{
	struct pp_vstage *ch = &pp->vstages[c];
	struct model *mm = &slot_get(pp, c, m)->m;
	memcpy(mm->tokens, pp->tokens + (int64_t)m * mm->N, (size_t)mm->N * sizeof(int32_t));
	memcpy(mm->targets, pp->targets + (int64_t)m * mm->N, (size_t)mm->N * sizeof(int32_t));
	model_set_loss_dscale(mm, pp->dscale);
	for (int u = ch->u0; u < ch->u1; u++) {
		int64_t v = 0;
		pp->loss_sum += model_unit_forward(mm, u, pp->eval ? &v : NULL);
		pp->valid += v;
	}
	if (pp->eval)
		return;
	if (++pp->inflight > pp->peak_inflight)
		pp->peak_inflight = pp->inflight;
}

/* An evaluation's slot is free after its forward (the last stage) or its activation's send:
 * the stage's next micro-batch reuses it (slot_get waits for that send first), so an
 * evaluation builds no slot the step has not. The wait cannot deadlock: the forward-only
 * lists are sorted by (micro-batch, stage), and the receive it waits for belongs to an
 * earlier micro-batch than the waiting action, so an earlier action in that order. */
static void slot_release_eval(struct pp *pp, int c, int m)
{
	struct pp_vstage *ch = &pp->vstages[c];
	slot_of(pp, c, m)->micro = -1;
	ch->slot_of[m] = -1;
}

/* B, or with a split backward its I half (the input gradients). */
static void act_backward(struct pp *pp, int c, int m, bool input_only)
{
	struct pp_vstage *ch = &pp->vstages[c];
	struct pp_slot *s = slot_of(pp, c, m);
	for (int u = ch->u1 - 1; u >= ch->u0; u--) {
		if (model_unit_needs_recompute(&s->m, u))
			model_unit_recompute(&s->m, u);
		model_unit_backward(&s->m, u, pp->dscale);
	}
	if (pp->tied && ch->u1 == t_units(pp)) { /* the head's share of the embedding's gradient */
		const float *g = model_tied_grad(&s->m);
		float *acc = pp->tied_g;
		int64_t n = pp->tied_numel;
#pragma omp parallel for simd schedule(static)
		for (int64_t k = 0; k < n; k++)
			acc[k] += g[k];
	}
	if (!input_only)
		pp->inflight--;
	if (ch->stage == 0) /* nothing to send */
		s->sent_b = true;
}

/* W: the weight gradients a split backward deferred (the head has none). */
static void act_weight(struct pp *pp, int c, int m)
{
	struct pp_vstage *ch = &pp->vstages[c];
	struct pp_slot *s = slot_of(pp, c, m);
	int L = (int)model_config_n_layers(&pp->cfg);
	for (int u = ch->u1 - 1 > L ? L : ch->u1 - 1; u >= ch->u0; u--)
		model_unit_backward_weight(&s->m, u);
	s->w_done = true;
	pp->inflight--;
}

static void be_pp_compute(void *ctx, const struct sched_node *n)
{
	struct pp *pp = ctx;
	int c = n->stage / pp->p, m = n->micro;
	CHECK(pp->vstages[c].stage == n->stage, "pp: stage %d is not on rank %d", n->stage, pp->r);
	switch (n->kind) {
	case SCHED_PP_F:
		act_forward(pp, c, m);
		if (pp->eval && pp->vstages[c].stage == pp->S - 1)
			slot_release_eval(pp, c, m);
		return;
	case SCHED_PP_B: act_backward(pp, c, m, false); break;
	case SCHED_PP_I: act_backward(pp, c, m, true); break;
	case SCHED_PP_W: act_weight(pp, c, m); break;
	default: CHECK(false, "pp: node kind %s", sched_kind_name(n->kind));
	}
	slot_release(pp, c, m);
}

static int64_t be_pp_transfer(void *ctx, const struct sched_node *n)
{
	struct pp *pp = ctx;
	int c = n->stage / pp->p, m = n->micro;
	const struct pp_vstage *ch = &pp->vstages[c];
	bool backward = n->phase == SCHED_PH_BWD;
	if (n->kind == SCHED_PP_SEND) {
		struct model *mm = &slot_of(pp, c, m)->m;
		send_buf(pp, c, m, backward,
		         backward ? model_residual_grad(mm) : model_unit_output(mm, ch->u1 - 1));
		if (backward) {
			slot_of(pp, c, m)->sent_b = true;
			slot_release(pp, c, m);
		} else if (pp->eval) {
			slot_release_eval(pp, c, m);
		}
	} else {
		struct model *mm = backward ? &slot_of(pp, c, m)->m : &slot_get(pp, c, m)->m;
		recv_buf(pp, c, m, backward,
		         backward ? model_residual_grad(mm) : model_unit_output(mm, ch->u0 - 1));
	}
	return boundary_bytes(pp);
}

static void be_pp_wait(void *ctx, const struct sched_node *n)
{
	struct pp *pp = ctx;
	int c = n->stage / pp->p;
	bool backward = n->phase == SCHED_PH_BWD;
	if (n->wait_kind == SCHED_PP_RECV) {
		wait_recv(pp, c, n->micro, backward);
		return;
	}
	wait_send(pp, c, n->micro, backward);
	struct pp_vstage *ch = &pp->vstages[c];
	for (int k = 0; k < ch->n_slots; k++) /* the slot no longer waits for it */
		if (ch->slots[k].send_open && ch->slots[k].send_micro == n->micro &&
		    ch->slots[k].send_backward == backward)
			ch->slots[k].send_open = false;
}

/* ---------------------------------------------------------------- the backend: shards */

/* Parameters are gathered (and gradients reduced) on the calling thread, once per step: the
 * collective is complete when its node returns (ticket 0). */
/* The tied tensor's tags (after the stage transfers') and the peer stage's rank. */
static int tied_tag(const struct pp *pp, bool grad)
{
	return 4 * pp->S * (int)pp->o.n_micro + (grad ? 1 : 0);
}

/* After stage 0's gather: its embedding to the last stage; on the last stage's rank, before
 * its first forward: receive it. */
static void tied_after_gather(struct pp *pp, int c)
{
	const struct pp_vstage *ch = &pp->vstages[c];
	size_t bytes = (size_t)pp->tied_numel * sizeof(float);
	const char *what = "pipeline: the tied embedding from stage 0";
	if (ch->u0 == 0) {
		CHECK(pp->t[0].vstage == c, "pp: the embedding is not on stage 0");
		if (pp->tied_send_open) /* the last gather's (validation gathers too) */
			comm_p2p_wait(&pp->tied_send, pp->o.timeout_s, what);
		comm_p2p_isend(&pp->mesh->pp_group, pp_stage_rank(&pp->sched, pp->S - 1),
		               tied_tag(pp, false), pp->full_w + pp->t[0].full_off, (int64_t)bytes,
		               &pp->tied_send);
		pp->tied_send_open = true;
	}
	if (ch->u1 == t_units(pp)) {
		struct comm_p2p r;
		comm_p2p_irecv(&pp->mesh->pp_group, pp_stage_rank(&pp->sched, 0), tied_tag(pp, false),
		               pp->tied_w, (int64_t)bytes, &r);
		comm_p2p_wait(&r, pp->o.timeout_s, what);
	}
}

/* Before stage 0's reduce-scatter: the head's gradient of the embedding from the last stage,
 * added to the embedding's; the last stage sends it after its last backward. */
static void tied_before_reduce(struct pp *pp, int c)
{
	const struct pp_vstage *ch = &pp->vstages[c];
	int64_t n = pp->tied_numel;
	if (ch->u1 == t_units(pp)) {
		if (pp->tied_send_open)
			comm_p2p_wait(&pp->tied_send, pp->o.timeout_s, "pipeline: the tied embedding");
		comm_p2p_isend(&pp->mesh->pp_group, pp_stage_rank(&pp->sched, 0), tied_tag(pp, true),
		               pp->tied_g, n * (int64_t)sizeof(float), &pp->tied_send);
		pp->tied_send_open = true;
	}
	if (ch->u0 == 0) {
		struct comm_p2p r;
		comm_p2p_irecv(&pp->mesh->pp_group, pp_stage_rank(&pp->sched, pp->S - 1),
		               tied_tag(pp, true), pp->tied_g, n * (int64_t)sizeof(float), &r);
		comm_p2p_wait(&r, pp->o.timeout_s, "pipeline: the head's gradient of the embedding");
		float *g = pp->full_g + pp->t[0].full_off;
		const float *h = pp->tied_g;
#pragma omp parallel for simd schedule(static)
		for (int64_t k = 0; k < n; k++)
			g[k] += h[k];
		if (pp->tied_send_open) { /* the embedding it sent at the step's start */
			comm_p2p_wait(&pp->tied_send, pp->o.timeout_s, "pipeline: the tied embedding");
			pp->tied_send_open = false;
		}
	}
}

static int64_t be_all_gather(void *ctx, int c, int64_t *bytes)
{
	struct pp *pp = ctx;
	const struct pp_vstage *ch = &pp->vstages[c];
	gather_vstage(pp, c, pp->full_w + ch->full_off);
	if (pp->o.bf16)
		round_vstage_bf16(pp, c, pp->full_w + ch->full_off);
	if (pp->tied)
		tied_after_gather(pp, c);
	*bytes = pp->mesh->shard > 1 ? ch->shard_numel * (int64_t)sizeof(float) : 0;
	return 0;
}

static int64_t be_reduce_scatter(void *ctx, int c, int64_t *bytes)
{
	struct pp *pp = ctx;
	if (pp->tied)
		tied_before_reduce(pp, c);
	reduce_vstage(pp, c);
	*bytes = pp->mesh->shard > 1 ? pp->vstages[c].full_numel * (int64_t)sizeof(float) : 0;
	return 0;
}

static void be_done(void *ctx, int c)
{
	(void)ctx, (void)c;
}

/* This rank's rows of table tensor i in the shard gradients (optim/grad_norm). */
static bool pp_grad_slice(const void *ctx, int i, int64_t *at, int64_t *n)
{
	const struct pp *pp = ctx;
	const struct pp_tensor *pt = &pp->t[i];
	*at = pt->shard_off;
	*n = pt->my_rows * pt->cols;
	return pt->vstage >= 0;
}

/* Loss: only the last stage has it (every TP rank of it the whole sum: TP rank 0's counts);
 * norm: each shard element lives on one (pp, shard) coordinate (replicas hold copies),
 * TP-split tensors on one TP rank, replicated ones (norms) on all of them. */
static int be_clip(void *ctx)
{
	struct pp *pp = ctx;
	const struct mesh *mesh = pp->mesh;
	double loss = mesh->tp_rank == 0 ? pp->loss_sum : 0.0;
	double sq = grad_norm_sumsq(pp->shard_g, pp->shard_numel, &pp->table, pp_grad_slice, pp,
	                            &mesh->tp_group);
	comm_all_reduce_f64(&mesh->world_group, &loss, 1);
	comm_all_reduce_f64(&mesh->shard_group, &sq, 1);
	comm_all_reduce_f64(&mesh->pp_group, &sq, 1);
	return grad_norm_finish(pp->in.res, loss, sq, pp->valid, pp->in.max_norm, &pp->gscale);
}

static int be_optim(void *ctx)
{
	struct pp *pp = ctx;
	struct adamw *opt = pp->in.opt;
	adamw_begin_step(opt);
	for (int i = 0; i < pp->table.count; i++) {
		const struct pp_tensor *pt = &pp->t[i];
		if (pt->vstage < 0)
			continue;
		adamw_update_slice(opt, pp->shard_w + pt->shard_off, pp->shard_g + pt->shard_off,
		                   pt->shard_off, pt->my_rows * pt->cols, pp->in.lr, pt->decay,
		                   pp->gscale);
	}
	if (pp->n_stats) { /* the family's statistics of the whole step, then its update */
		int64_t n = pp->n_stats;
		memset(pp->stats, 0, (size_t)n * sizeof(double));
		for (int c = 0; c < pp->v; c++) /* every micro-batch this rank's stages ran */
			for (int k = 0; k < pp->vstages[c].n_slots; k++) {
				CHECK(model_step_stats(&pp->vstages[c].slots[k].m, pp->stats_slot) == n,
				      "pp: the model's step statistics changed size");
				for (int64_t j = 0; j < n; j++)
					pp->stats[j] += pp->stats_slot[j];
			}
		comm_label("per-step model statistics");
		comm_all_reduce_f64(&pp->mesh->loss_group, pp->stats, n);
		comm_label("per-step model statistics over the stages");
		comm_all_reduce_f64(&pp->mesh->pp_group, pp->stats, n);
		model_after_step(pp->o.state_model, pp->stats);
	}
	return CT_OK;
}

/* ---------------------------------------------------------------- step */

static int pp_begin(void *ctx, const struct engine_step_in *in, const struct sched **s,
                    struct sched_record **rec)
{
	struct pp *pp = ctx;
	int64_t N = pp->o.micro_rows * pp->o.T;
	pp->in = *in;
	pp->valid = model_count_valid(in->targets, pp->o.n_micro * N);
	comm_all_reduce_i64(&pp->mesh->loss_group, &pp->valid, 1);
	pp->dscale = pp->valid > 0 ? 1.0 / (double)pp->valid : 0.0;
	pp->tokens = in->tokens;
	pp->targets = in->targets;
	pp->loss_sum = 0;
	pp->inflight = pp->peak_inflight = 0;
	pp->link_free = 0;
	memset(pp->full_g, 0, (size_t)pp->full_numel * sizeof(float));
	pp_pull_state(pp);
	if (pp->tied) {
		if (pp->tied_send_open) { /* the last step's gradient to stage 0 */
			comm_p2p_wait(&pp->tied_send, pp->o.timeout_s,
			              "pipeline: the head's gradient of the embedding");
			pp->tied_send_open = false;
		}
		if (pp->tied_g)
			memset(pp->tied_g, 0, (size_t)pp->tied_numel * sizeof(float));
	}
	*s = &pp->step;
	*rec = pp->rec;
	return CT_OK;
}

void pp_engine(struct pp *pp, struct engine *e)
{
	*e = (struct engine){.ctx = pp,
	                     .begin = pp_begin,
	                     .be = {.ctx = pp,
	                            .all_gather = be_all_gather,
	                            .reduce_scatter = be_reduce_scatter,
	                            .all_gather_done = be_done,
	                            .reduce_scatter_done = be_done,
	                            .clip = be_clip,
	                            .optim = be_optim,
	                            .pp_compute = be_pp_compute,
	                            .pp_transfer = be_pp_transfer,
	                            .pp_wait = be_pp_wait,
	                            .progress = progress}};
}
