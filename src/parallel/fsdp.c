#include "parallel/fsdp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "base/fp8.h"
#include "base/log.h"
#include "base/mem.h"
#include "comm/watchdog.h"
#include "kernels/fp8_linear.h"
#include "kernels/kernels.h"
#include "kernels/mm_engine.h"
#include "optim/grad_norm.h"
#include "schedule/sched_pass.h"

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

/* ---------------------------------------------------------------- pools */

static void pool_init(struct fsdp_pool *p, enum mem_cat cat)
{
	memset(p, 0, sizeof(*p));
	p->cat = cat;
}

static void pool_release_all(struct fsdp_pool *p)
{
	for (int i = 0; i < p->n; i++) {
		CHECK(!p->busy[i], "fsdp: %s buffer still in use", mem_cat_name(p->cat));
		mem_free(p->cat, p->buf[i], p->bytes);
	}
	free(p->buf), free(p->busy);
	enum mem_cat cat = p->cat;
	pool_init(p, cat);
}

static int pool_get(struct fsdp_pool *p)
{
	for (int i = 0; i < p->n; i++)
		if (!p->busy[i]) {
			p->busy[i] = true;
			return i;
		}
	p->buf = realloc(p->buf, (size_t)(p->n + 1) * sizeof(*p->buf));
	p->busy = realloc(p->busy, (size_t)(p->n + 1) * sizeof(*p->busy));
	CHECK(p->buf && p->busy, "out of memory");
	p->buf[p->n] = mem_alloc(p->cat, p->bytes);
	p->busy[p->n] = true;
	return p->n++;
}

static void pool_put(struct fsdp_pool *p, int *i)
{
	if (*i < 0)
		return;
	p->busy[*i] = false;
	*i = -1;
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
	const struct param_table *t = m->table;
	f->ep = mesh->ep > 1;
	f->gg[0] = &mesh->shard_group;
	f->gg[1] = f->ep ? &mesh->efsdp_group : &mesh->shard_group;
	for (int g = 0; g < 2; g++)
		f->gn[g] = f->gg[g]->size, f->gr[g] = f->gg[g]->rank;
	f->n_units = t->n_units;
	f->p = xcalloc((size_t)t->count, sizeof(*f->p));
	f->u = xcalloc((size_t)t->n_units, sizeof(*f->u));
	for (int u = 0; u < t->n_units; u++)
		f->u[u].first_param = -1;
	for (int i = 0; i < t->count; i++) {
		const struct param_entry *lp = &t->p[i];
		struct fsdp_param *p = &f->p[i];
		struct fsdp_unit *un = &f->u[lp->unit];
		if (un->first_param < 0)
			un->first_param = i;
		un->n_params++;
		p->grp = f->ep && lp->expert;
		int64_t N = f->gn[p->grp], r = f->gr[p->grp];
		p->rows = lp->shape[0];
		p->cols = lp->numel / lp->shape[0];
		p->chunk_rows = (p->rows + N - 1) / N;
		int64_t mine = p->rows - r * p->chunk_rows;
		p->my_rows = mine < 0 ? 0 : (mine > p->chunk_rows ? p->chunk_rows : mine);
		p->full_off = lp->offset - t->unit_begin[lp->unit];
		p->shard_off = un->shard_numel;
		CHECK(f->gn[0] > 1 || p->shard_off == p->full_off,
		      "fsdp: one shard must be the full layout");
		p->decay = lp->weight_decay;
		p->pack_off = un->grp_numel[p->grp];
		un->grp_numel[p->grp] += p->chunk_rows * p->cols;
		un->shard_numel += p->chunk_rows * p->cols;
	}
	for (int u = 0; u < t->n_units; u++) {
		struct fsdp_unit *un = &f->u[u];
		un->full_numel = t->unit_begin[u + 1] - t->unit_begin[u];
		un->shard_base = f->shard_numel;
		f->shard_numel += un->shard_numel;
	}
	f->n_stats = model_step_stats(m, NULL);
	if (f->n_stats)
		f->stats = xcalloc((size_t)f->n_stats, sizeof(double));
	f->shard_w = mem_alloc(MEM_PARAMS, (size_t)f->shard_numel * sizeof(float));
	f->shard_g = mem_alloc(MEM_GRADS, (size_t)f->shard_numel * sizeof(float));
	pool_init(&f->pw, MEM_FULL_PARAMS);
	pool_init(&f->pg, MEM_FULL_GRADS);
	pool_init(&f->ag_send, MEM_COMM);
	pool_init(&f->ag_recv, MEM_COMM);
	pool_init(&f->rs_send, MEM_COMM);
	pool_init(&f->rs_recv, MEM_COMM);
	pool_init(&f->pw16, MEM_FULL_PARAMS);
	fsdp_set_fp8_all_gather(f, false);
	for (int u = 0; u < t->n_units; u++)
		model_bind_unit(m, u, NULL, NULL);
	return CT_OK;
}

/* The wire layout: each parameter's chunk at a byte offset of its unit's block. */
static void fsdp_wire_layout(struct fsdp *f)
{
	for (int u = 0; u < f->n_units; u++) {
		struct fsdp_unit *un = &f->u[u];
		int64_t off[2] = {0, 0};
		for (int i = un->first_param; i < un->first_param + un->n_params; i++) {
			struct fsdp_param *p = &f->p[i];
			p->wire_off = off[p->grp];
			off[p->grp] += p->chunk_rows * p->cols * (p->fp8 ? 1 : f->bf16 ? 2 : 4);
		}
		un->grp_wire[0] = off[0];
		un->grp_wire[1] = off[1];
		un->wire_bytes = off[0] + off[1];
	}
}

void fsdp_set_fp8_all_gather(struct fsdp *f, bool on)
{
	const struct param_table *t = f->model->table;
	f->fp8_ag = on;
	f->n_fp8 = 0;
	for (int i = 0; i < t->count; i++) {
		f->p[i].fp8 = on && model_fp8_linear(&t->p[i]);
		f->n_fp8 += f->p[i].fp8;
	}
	free(f->fp8_scale), free(f->fp8_amax);
	f->fp8_scale = xcalloc((size_t)t->count, sizeof(float));
	f->fp8_amax = xcalloc((size_t)(f->n_fp8 + 1), sizeof(float));
	fsdp_wire_layout(f);
}

/* torchao's precompute_float8_dynamic_scale_for_fsdp: every fp8 weight's amax over its
 * local rows, one all-reduce (max) of all of them over dp_shard and, under TP, one over tp
 * (the shards are of a TP slice), then the tensorwise scales (HSDP replicas hold the same
 * shards, so their maximum is the weight's). */
static void fsdp_fp8_scales(struct fsdp *f)
{
	if (!f->fp8_ag || f->n_fp8 == 0)
		return;
	const struct param_table *t = f->model->table;
	int k = 0;
	for (int i = 0; i < t->count; i++) {
		const struct fsdp_param *p = &f->p[i];
		if (p->fp8)
			f->fp8_amax[k++] =
			    fp8_amax(f->shard_w + f->u[t->p[i].unit].shard_base + p->shard_off,
			             p->my_rows * p->cols);
	}
	comm_label("fp8 all-gather scales: amax of %d weights", f->n_fp8);
	comm_all_reduce_max_f32(&f->mesh->shard_group, f->fp8_amax, f->n_fp8);
	if (f->mesh->tp > 1) /* a TP slice's maximum is not the weight's: one rank's scale */
		comm_all_reduce_max_f32(&f->mesh->tp_group, f->fp8_amax, f->n_fp8);
	k = 0;
	for (int i = 0; i < t->count; i++)
		if (f->p[i].fp8)
			f->fp8_scale[i] = fp8_scale_from_amax(f->fp8_amax[k++], FP8_E4M3, false);
}

static void fsdp_release_pools(struct fsdp *f)
{
	pool_release_all(&f->pw);
	pool_release_all(&f->pg);
	pool_release_all(&f->ag_send);
	pool_release_all(&f->ag_recv);
	pool_release_all(&f->rs_send);
	pool_release_all(&f->rs_recv);
	pool_release_all(&f->pw16);
}

void fsdp_free(struct fsdp *f)
{
	if (!f->p)
		return;
	fsdp_release_pools(f);
	mem_free(MEM_PARAMS, f->shard_w, (size_t)f->shard_numel * sizeof(float));
	mem_free(MEM_GRADS, f->shard_g, (size_t)f->shard_numel * sizeof(float));
	sched_free(&f->sched);
	free(f->rec), free(f->bs);
	free(f->p), free(f->u);
	free(f->fp8_scale), free(f->fp8_amax), free(f->stats);
	memset(f, 0, sizeof(*f));
}

void fsdp_init_params(struct fsdp *f, uint64_t seed)
{
	const struct param_table *t = f->model->table;
	for (int i = 0; i < t->count; i++) {
		const struct fsdp_param *p = &f->p[i];
		int64_t r = f->gr[p->grp];
		float *dst = f->shard_w + f->u[t->p[i].unit].shard_base + p->shard_off;
		model_init_params(f->model, seed, dst, t->p[i].offset + r * p->chunk_rows * p->cols,
		                  p->my_rows * p->cols);
	}
}

/* ---------------------------------------------------------------- schedule */

void fsdp_sched_units(const struct fsdp *f, struct sched_unit *out)
{
	for (int u = 0; u < f->n_units; u++) {
		out[u] = (struct sched_unit){.full_numel = f->u[u].full_numel,
		                             .shard_numel = f->u[u].shard_numel,
		                             .is_block = u > 0 && u < f->n_units - 1};
		if (f->ep) /* its chunks gather over two groups (the experts' over efsdp) */
			out[u].peer_numel = f->u[u].grp_numel[0] * (f->gn[0] - 1) +
			                    f->u[u].grp_numel[1] * (f->gn[1] - 1);
		for (int p = 0; p < MODEL_PASS_COUNT; p++) /* TP, CP, EP collectives (or none) */
			model_unit_prog(f->model, u, (enum model_pass)p, &out[u].prog[p]);
	}
}

void fsdp_naive_schedule(const struct fsdp *f, int accum, struct sched *s)
{
	struct sched_unit *units = xcalloc((size_t)f->n_units, sizeof(*units));
	fsdp_sched_units(f, units);
	sched_build(s, units, f->n_units, accum, (enum sched_reshard)f->reshard);
	free(units);
	/* the model's checkpointing is part of the step: RECOMPUTE before each such backward */
	if (f->model->ac != MODEL_AC_NONE) {
		struct sched next;
		sched_pass_ac(s, f->model->ac, f->model->ac_every, &next);
		sched_replace(s, &next);
	}
}

int fsdp_set_schedule(struct fsdp *f, const struct sched *s)
{
	char why[256];
	if (s->n_units != f->n_units || !sched_validate(s, why, sizeof(why))) {
		LOG_ERROR("schedule: invalid (%s)",
		          s->n_units != f->n_units ? "wrong number of units" : why);
		return CT_ERR_USAGE;
	}
	if (s->ac != f->model->ac || s->ac_every != f->model->ac_every) {
		LOG_ERROR("schedule: activation checkpointing '%s' does not match the model's",
		          sched_ac_name(s->ac));
		return CT_ERR_USAGE;
	}
	fsdp_release_pools(f);
	sched_free(&f->sched);
	sched_lower_tp(s, &f->sched); /* the TP collectives as nodes (a copy if none) */
	CHECK(sched_validate(&f->sched, why, sizeof(why)), "lowered schedule: %s", why);
	free(f->rec), free(f->bs);
	f->rec = xcalloc((size_t)f->sched.n_nodes, sizeof(*f->rec));
	f->bs = xcalloc((size_t)s->n_buckets, sizeof(*f->bs));
	int64_t max_full = 0, max_shard = 0, N = f->mesh->shard;
	for (int b = 0; b < s->n_buckets; b++) {
		f->bs[b] = (struct fsdp_bucket_state){-1, -1, -1, -1, -1, -1, -1};
		int64_t full = sched_bucket_full(s, b), shard = sched_bucket_shard(s, b);
		max_full = full > max_full ? full : max_full;
		max_shard = shard > max_shard ? shard : max_shard;
	}
	size_t esz = f->bf16 ? 2 : 4;
	f->pw.bytes = f->pg.bytes = (size_t)max_full * sizeof(float);
	f->pw16.bytes = (size_t)max_full * sizeof(uint16_t);
	f->ag_send.bytes = (size_t)max_shard * esz; /* bf16 only: fp32 sends the shard itself */
	f->ag_recv.bytes = (size_t)(N * max_shard) * esz;
	f->rs_send.bytes = (size_t)(N * max_shard) * sizeof(float);
	f->rs_recv.bytes = (size_t)(2 * max_shard) * sizeof(float); /* recv + its scratch */
	return CT_OK;
}

/* ---------------------------------------------------------------- bucket buffers */

static int64_t bucket_shard_base(const struct fsdp *f, int b)
{
	return f->u[f->sched.buckets[b].unit0].shard_base;
}

/* Offset of unit u's parameters inside its bucket's full buffer. */
static int64_t unit_full_off(const struct fsdp *f, int b, int u)
{
	const struct param_table *t = f->model->table;
	return t->unit_begin[u] - t->unit_begin[f->sched.buckets[b].unit0];
}

#define FOR_BUCKET_UNITS(f, b, u)                                                                  \
	for (int u = (f)->sched.buckets[b].unit0;                                                  \
	     u < (f)->sched.buckets[b].unit0 + (f)->sched.buckets[b].n_units; u++)

/* One shard (dp_shard = 1): a bucket's shard IS its full buffer (chunk = rows, no padding,
 * the same table order), so the units compute on the master parameters in place when the
 * compute dtype is the master's (fp32, no fp8 wire), and accumulate into the shard gradients
 * directly when no replica needs them reduced per micro-batch. Nothing is copied or sent. */
static bool fsdp_w_in_place(const struct fsdp *f)
{
	return f->mesh->shard == 1 && !f->bf16 && !f->fp8_ag;
}
static bool fsdp_g_in_place(const struct fsdp *f)
{
	/* (TP keeps the pooled per-micro-batch buffers: its results stay bitwise as they were) */
	return f->mesh->shard == 1 && f->mesh->dp_replicate == 1 && f->mesh->tp == 1;
}
#define FSDP_IN_PLACE (-2) /* a bucket state's buffer index: the shard itself */

/* Where bucket b's gathered parameters are (while gathered). */
static float *bucket_w(struct fsdp *f, int b)
{
	int w = f->bs[b].w;
	return w == FSDP_IN_PLACE ? f->shard_w + bucket_shard_base(f, b) : f->pw.buf[w];
}

/* The bucket's gradients (zeroed when first needed in a micro-batch), bound to its units. */
static void bucket_grads(struct fsdp *f, int b)
{
	struct fsdp_bucket_state *st = &f->bs[b];
	if (st->g >= 0 || st->g == FSDP_IN_PLACE)
		return;
	if (fsdp_g_in_place(f)) { /* zeroed once per step (fsdp_begin) */
		st->g = FSDP_IN_PLACE;
		float *g = f->shard_g + bucket_shard_base(f, b);
		FOR_BUCKET_UNITS(f, b, u)
		model_bind_unit(f->model, u, f->model->unit_w[u], g + unit_full_off(f, b, u));
		return;
	}
	st->g = pool_get(&f->pg);
	float *g = f->pg.buf[st->g];
	memset(g, 0, (size_t)sched_bucket_full(&f->sched, b) * sizeof(float));
	FOR_BUCKET_UNITS(f, b, u)
	model_bind_unit(f->model, u, f->model->unit_w[u], g + unit_full_off(f, b, u));
}

static int rows_of(const struct fsdp_param *p, int64_t q)
{
	int64_t rows = p->rows - q * p->chunk_rows;
	return (int)(rows < 0 ? 0 : (rows > p->chunk_rows ? p->chunk_rows : rows));
}

/* copy-out: rank q's chunk of each tensor lands in rows [q*chunk, q*chunk + rows_q) of the
 * bucket's full buffer. */
/* Bytes of bucket b's block of group g on the wire (per rank), and of the units before u in
 * it (upto -1: all); elements likewise (the reduce-scatter's packing). */
static int64_t bucket_wire_g(const struct fsdp *f, int b, int upto, int g)
{
	int64_t n = 0;
	FOR_BUCKET_UNITS(f, b, u)
	{
		if (u == upto)
			break;
		n += f->u[u].grp_wire[g];
	}
	return n;
}
static int64_t bucket_wire_bytes(const struct fsdp *f, int b, int upto)
{
	return bucket_wire_g(f, b, upto, 0) + bucket_wire_g(f, b, upto, 1);
}
static int64_t bucket_numel_g(const struct fsdp *f, int b, int upto, int g)
{
	int64_t n = 0;
	FOR_BUCKET_UNITS(f, b, u)
	{
		if (u == upto)
			break;
		n += f->u[u].grp_numel[g];
	}
	return n;
}

/* The gathered bucket (wire layout) into the full weights; with full16 (bf16 compute) also
 * their bf16 copy of the same layout in the same pass: the received bf16 values themselves
 * under a bf16 all-gather, else each weight rounded. */
static void bucket_copy_out(const struct fsdp *f, int b, const void *recv, bool bf16, float *full,
                            uint16_t *full16)
{
	/* group 0's blocks (rank-major), then group 1's */
	const int64_t S[2] = {bucket_wire_g(f, b, -1, 0), bucket_wire_g(f, b, -1, 1)};
	const char *gbase[2] = {recv, (const char *)recv + f->gn[0] * S[0]};
	FOR_BUCKET_UNITS(f, b, u)
	{
		const struct fsdp_unit *un = &f->u[u];
		float *ufull = full + unit_full_off(f, b, u);
		const int64_t ubase[2] = {bucket_wire_g(f, b, u, 0), bucket_wire_g(f, b, u, 1)};
		for (int i = un->first_param; i < un->first_param + un->n_params; i++) {
			const struct fsdp_param *p = &f->p[i];
			int g = p->grp;
			for (int64_t q = 0; q < f->gn[g]; q++) {
				int64_t n = rows_of(p, q) * p->cols;
				const char *src = gbase[g] + q * S[g] + ubase[g] + p->wire_off;
				const int64_t at = p->full_off + q * p->chunk_rows * p->cols;
				float *dst = ufull + at;
				uint16_t *d16 = full16 ? full16 + unit_full_off(f, b, u) + at : NULL;
				if (p->fp8) {
					/* the fp8 values themselves: the scale goes with the weight
					 */
					fp8_dequantize(dst, (const uint8_t *)src, n, 1.0f,
					               FP8_E4M3);
				} else if (bf16) {
					const uint16_t *h = (const uint16_t *)src;
#pragma omp parallel for simd schedule(static)
					for (int64_t k = 0; k < n; k++)
						dst[k] = bf16_to_f32(h[k]);
					if (d16) {
						memcpy(d16, h, (size_t)n * sizeof(uint16_t));
						continue;
					}
				} else {
					memcpy(dst, src, (size_t)n * sizeof(float));
				}
				if (d16)
#pragma omp parallel for simd schedule(static)
					for (int64_t k = 0; k < n; k++)
						d16[k] = bf16_from_f32(dst[k]);
			}
		}
	}
}

/* fp8 all-gather: the bucket's shards into the wire format (fp8 / bf16 / fp32 per param). */
static void bucket_pack(const struct fsdp *f, int b, char *send)
{
	const int64_t S0 = bucket_wire_g(f, b, -1, 0); /* group 1's block follows group 0's */
	FOR_BUCKET_UNITS(f, b, u)
	{
		const struct fsdp_unit *un = &f->u[u];
		char *ublock[2] = {send + bucket_wire_g(f, b, u, 0),
		                   send + S0 + bucket_wire_g(f, b, u, 1)};
		for (int i = un->first_param; i < un->first_param + un->n_params; i++) {
			const struct fsdp_param *p = &f->p[i];
			const float *x = f->shard_w + un->shard_base + p->shard_off;
			int64_t n = p->chunk_rows * p->cols; /* padding rows are zeros */
			char *dst = ublock[p->grp] + p->wire_off;
			if (p->fp8) {
				fp8_quantize((uint8_t *)dst, x, n, f->fp8_scale[i], FP8_E4M3);
			} else if (f->bf16) {
				uint16_t *h = (uint16_t *)dst;
#pragma omp parallel for simd schedule(static)
				for (int64_t k = 0; k < n; k++)
					h[k] = bf16_from_f32(x[k]);
			} else {
				memcpy(dst, x, (size_t)n * sizeof(float));
			}
		}
	}
}

/* A bf16 all-gather over one shard is a rounding: the shard's weights, rounded to bf16, into
 * the full weights (as fp32) and, under bf16 compute, their bf16 copy, in one pass with no
 * wire buffers (the values are those the gather would give). */
static bool fsdp_w_local_bf16(const struct fsdp *f)
{
	return f->mesh->shard == 1 && f->bf16 && !f->fp8_ag && !f->ep;
}

static void bucket_round_local(const struct fsdp *f, int b, float *full, uint16_t *full16)
{
	FOR_BUCKET_UNITS(f, b, u)
	{
		const struct fsdp_unit *un = &f->u[u];
		for (int i = un->first_param; i < un->first_param + un->n_params; i++) {
			const struct fsdp_param *p = &f->p[i];
			const float *x = f->shard_w + un->shard_base + p->shard_off;
			const int64_t n = rows_of(p, 0) * p->cols, at = unit_full_off(f, b, u) + p->full_off;
			float *dst = full + at;
			uint16_t *d16 = full16 ? full16 + at : NULL;
#pragma omp parallel for simd schedule(static)
			for (int64_t k = 0; k < n; k++) {
				const uint16_t h = bf16_from_f32(x[k]);
				dst[k] = bf16_to_f32(h);
				if (d16)
					d16[k] = h;
			}
		}
	}
}

static int64_t be_all_gather(void *ctx, int b, int64_t *bytes)
{
	struct fsdp *f = ctx;
	struct fsdp_bucket_state *st = &f->bs[b];
	int64_t S = sched_bucket_shard(&f->sched, b);
	const float *shard = f->shard_w + bucket_shard_base(f, b);
	const void *send = shard;
	if (fsdp_w_in_place(f) || fsdp_w_local_bf16(f)) {
		*bytes = 0;
		return 0; /* complete: be_all_gather_done binds or rounds the shard itself */
	}
	if (f->fp8_ag || f->ep) { /* ep: the two groups' chunks packed apart */
		st->ag_send = pool_get(&f->ag_send);
		bucket_pack(f, b, f->ag_send.buf[st->ag_send]);
		send = f->ag_send.buf[st->ag_send];
	} else if (f->bf16) {
		st->ag_send = pool_get(&f->ag_send);
		uint16_t *h = f->ag_send.buf[st->ag_send];
#pragma omp parallel for simd schedule(static)
		for (int64_t i = 0; i < S; i++)
			h[i] = bf16_from_f32(shard[i]);
		send = h;
	}
	st->ag_recv = pool_get(&f->ag_recv);
	*bytes = bucket_wire_bytes(f, b, -1);
	CHECK(f->fp8_ag || *bytes == S * (f->bf16 ? 2 : 4), "wire layout");
	char what[64];
	snprintf(what, sizeof(what), "all-gather of bucket %d", b);
	const int64_t S0 = f->ep ? bucket_wire_g(f, b, -1, 0) : *bytes;
	struct comm_op op = {.kind = COMM_ALL_GATHER,
	                     .group = &f->mesh->shard_group,
	                     .send = send,
	                     .recv = f->ag_recv.buf[st->ag_recv],
	                     .count = S0,
	                     .scratch = NULL,
	                     .what = what};
	int64_t ticket = comm_stream_enqueue(f->stream, &op);
	if (S0 == *bytes)
		return ticket;
	/* the experts' chunks over efsdp, after the dense ones (FIFO: its ticket is the last) */
	snprintf(what, sizeof(what), "all-gather of bucket %d (experts)", b);
	op.group = f->gg[1];
	op.send = (const char *)send + S0;
	op.recv = (char *)f->ag_recv.buf[st->ag_recv] + f->gn[0] * S0;
	op.count = *bytes - S0;
	return comm_stream_enqueue(f->stream, &op);
}

static void be_all_gather_done(void *ctx, int b)
{
	struct fsdp *f = ctx;
	struct fsdp_bucket_state *st = &f->bs[b];
	/* bf16 compute: weights cast to bf16 once per gather, by the copy-out when there is one */
	const bool twin = mm_engine_dtype() == MM_BF16;
	uint16_t *h = NULL;
	if (twin) {
		st->w16 = pool_get(&f->pw16);
		h = f->pw16.buf[st->w16];
	}
	if (fsdp_w_in_place(f)) {
		st->w = FSDP_IN_PLACE;
		if (twin) {
			const int64_t n = sched_bucket_full(&f->sched, b);
			const float *w = bucket_w(f, b);
#pragma omp parallel for simd schedule(static)
			for (int64_t i = 0; i < n; i++)
				h[i] = bf16_from_f32(w[i]);
		}
	} else if (fsdp_w_local_bf16(f)) {
		st->w = pool_get(&f->pw);
		bucket_round_local(f, b, f->pw.buf[st->w], h);
	} else {
		st->w = pool_get(&f->pw);
		bucket_copy_out(f, b, f->ag_recv.buf[st->ag_recv], f->bf16, f->pw.buf[st->w], h);
		pool_put(&f->ag_recv, &st->ag_recv);
		pool_put(&f->ag_send, &st->ag_send);
	}
	float *w = bucket_w(f, b);
	if (twin)
		mm_bf16_twin_add(w, h, sched_bucket_full(&f->sched, b));
	FOR_BUCKET_UNITS(f, b, u)
	{
		model_bind_unit(f->model, u, w + unit_full_off(f, b, u), f->model->unit_dw[u]);
		const struct fsdp_unit *un = &f->u[u];
		for (int i = un->first_param; i < un->first_param + un->n_params; i++)
			if (f->p[i].fp8)
				fp8_linear_set_prepared(
				    w + unit_full_off(f, b, u) + f->p[i].full_off, f->fp8_scale[i]);
	}
}

static void be_free_params(void *ctx, int b)
{
	struct fsdp *f = ctx;
	if (f->bs[b].w16 >= 0) {
		mm_bf16_twin_remove(bucket_w(f, b));
		pool_put(&f->pw16, &f->bs[b].w16);
	}
	if (f->bs[b].w == FSDP_IN_PLACE)
		f->bs[b].w = -1;
	else
		pool_put(&f->pw, &f->bs[b].w);
	FOR_BUCKET_UNITS(f, b, u)
	model_bind_unit(f->model, u, NULL, f->model->unit_dw[u]);
}

/* Reduce-scatter the bucket's full gradients; they are free once copied in. */
static int64_t be_reduce_scatter(void *ctx, int b, int64_t *bytes)
{
	struct fsdp *f = ctx;
	struct fsdp_bucket_state *st = &f->bs[b];
	int64_t S = sched_bucket_shard(&f->sched, b);
	if (st->g == FSDP_IN_PLACE) { /* already summed into the shard gradients */
		st->g = -1;
		FOR_BUCKET_UNITS(f, b, u)
		model_bind_unit(f->model, u, f->model->unit_w[u], NULL);
		*bytes = 0;
		return 0;
	}
	const float *g = f->pg.buf[st->g];
	st->rs_send = pool_get(&f->rs_send);
	st->rs_recv = pool_get(&f->rs_recv);
	float *send = f->rs_send.buf[st->rs_send];
	/* copy-in, rank-major with zero padding: group 0's blocks, then group 1's (without ep
	 * group 0 is everything and its packing the shard's layout) */
	const int64_t Sg[2] = {bucket_numel_g(f, b, -1, 0), bucket_numel_g(f, b, -1, 1)};
	float *gsend[2] = {send, send + f->gn[0] * Sg[0]};
	FOR_BUCKET_UNITS(f, b, u)
	{
		const struct fsdp_unit *un = &f->u[u];
		const float *ug = g + unit_full_off(f, b, u);
		const int64_t ub[2] = {bucket_numel_g(f, b, u, 0), bucket_numel_g(f, b, u, 1)};
		for (int i = un->first_param; i < un->first_param + un->n_params; i++) {
			const struct fsdp_param *p = &f->p[i];
			for (int64_t q = 0; q < f->gn[p->grp]; q++) {
				int64_t rows = rows_of(p, q);
				float *dst = gsend[p->grp] + q * Sg[p->grp] + ub[p->grp] + p->pack_off;
				memcpy(dst, ug + p->full_off + q * p->chunk_rows * p->cols,
				       (size_t)(rows * p->cols) * sizeof(float));
				memset(dst + rows * p->cols, 0,
				       (size_t)((p->chunk_rows - rows) * p->cols) * sizeof(float));
			}
		}
	}
	pool_put(&f->pg, &st->g);
	FOR_BUCKET_UNITS(f, b, u)
	model_bind_unit(f->model, u, f->model->unit_w[u], NULL);
	*bytes = S * 4;
	char what[64];
	snprintf(what, sizeof(what), "reduce-scatter of bucket %d", b);
	float *recv = f->rs_recv.buf[st->rs_recv];
	/* recv: group 0's result, group 1's; then each one's scratch (its count) */
	struct comm_op op = {.kind = COMM_REDUCE_SCATTER,
	                     .group = &f->mesh->shard_group,
	                     .send = send,
	                     .recv = recv,
	                     .count = Sg[0],
	                     .scratch = recv + S,
	                     .what = what};
	int64_t ticket = comm_stream_enqueue(f->stream, &op);
	if (Sg[1] == 0)
		return ticket;
	snprintf(what, sizeof(what), "reduce-scatter of bucket %d (experts)", b);
	op.group = f->gg[1];
	op.send = gsend[1];
	op.recv = recv + Sg[0];
	op.count = Sg[1];
	op.scratch = recv + S + Sg[0];
	return comm_stream_enqueue(f->stream, &op);
}

/* Add the reduced shard gradients (all-reduced across replicas first under HSDP). */
static void be_reduce_scatter_done(void *ctx, int b)
{
	struct fsdp *f = ctx;
	struct fsdp_bucket_state *st = &f->bs[b];
	if (st->rs_recv < 0) /* in place (be_reduce_scatter): nothing to add */
		return;
	int64_t S = sched_bucket_shard(&f->sched, b);
	float *recv = f->rs_recv.buf[st->rs_recv];
	if (f->mesh->dp_replicate > 1) {
		comm_label("HSDP gradient all-reduce of bucket %d", b);
		comm_all_reduce_f32(&f->mesh->dp_replicate_group, recv, S);
	}
	float *sg = f->shard_g + bucket_shard_base(f, b);
	if (!f->ep) {
#pragma omp parallel for simd schedule(static)
		for (int64_t i = 0; i < S; i++)
			sg[i] += recv[i];
	} else { /* each chunk from its group's packed result into the shard's table order */
		const int64_t S0 = bucket_numel_g(f, b, -1, 0);
		FOR_BUCKET_UNITS(f, b, u)
		{
			const struct fsdp_unit *un = &f->u[u];
			const int64_t ub[2] = {bucket_numel_g(f, b, u, 0),
			                       S0 + bucket_numel_g(f, b, u, 1)};
			for (int i = un->first_param; i < un->first_param + un->n_params; i++) {
				const struct fsdp_param *p = &f->p[i];
				float *dst = f->shard_g + un->shard_base + p->shard_off;
				const float *src = recv + ub[p->grp] + p->pack_off;
				for (int64_t k = 0; k < p->chunk_rows * p->cols; k++)
					dst[k] += src[k];
			}
		}
	}
	pool_put(&f->rs_send, &st->rs_send);
	pool_put(&f->rs_recv, &st->rs_recv);
}

/* ---------------------------------------------------------------- compute: the model calls */

static void be_batch(void *ctx, int a)
{
	struct fsdp *f = ctx;
	struct model *m = f->model;
	memcpy(m->tokens, f->step.tokens + a * m->N, (size_t)m->N * sizeof(int32_t));
	memcpy(m->targets, f->step.targets + a * m->N, (size_t)m->N * sizeof(int32_t));
}

static void be_forward(void *ctx, int u, int op)
{
	struct fsdp *f = ctx;
	if (u == f->n_units - 1)
		bucket_grads(f, sched_bucket_of(&f->sched, u)); /* the fused loss writes grads */
	f->step.loss_sum += op < 0 ? model_unit_forward(f->model, u, NULL)
	                           : model_unit_op(f->model, u, MODEL_PASS_FWD, op, 0.0, NULL);
}

static void be_recompute(void *ctx, int u, int op)
{
	struct fsdp *f = ctx;
	if (op < 0)
		model_unit_recompute(f->model, u);
	else
		model_unit_op(f->model, u, MODEL_PASS_REC, op, 0.0, NULL);
}

static void be_backward(void *ctx, int u, int op)
{
	struct fsdp *f = ctx;
	bucket_grads(f, sched_bucket_of(&f->sched, u));
	if (op < 0)
		model_unit_backward(f->model, u, f->step.dscale);
	else
		model_unit_op(f->model, u, MODEL_PASS_BWD, op, f->step.dscale, NULL);
}

/* A TP or EP collective between two segments of unit u's pass: the bytes it sent (0: a
 * no-op); an all-to-all's are the step's own (model_ops.unit_op returns them: the routing
 * decides), a wait's none. */
static int64_t be_tp_collective(void *ctx, int u, enum model_pass p, int op)
{
	struct fsdp *f = ctx; /* the unit's segment 0 (be_backward) bound its gradients */
	bool ran = false;
	double r = model_unit_op(f->model, u, p, op, f->step.dscale, &ran);
	const struct model_coll_desc *c = &f->sched.units[u].prog[p].c[op / 2];
	if (c->role == MODEL_GROUP_EP)
		return c->kind == MODEL_COLL_ALL_TO_ALL ? (int64_t)r : 0;
	return ran ? c->bytes + c->back_bytes : 0;
}

/* ---------------------------------------------------------------- tail */

/* This rank's rows of table tensor i in the shard gradients (optim/grad_norm). */
static bool fsdp_grad_slice(const void *ctx, int i, int64_t *at, int64_t *n)
{
	const struct fsdp *f = ctx;
	int64_t row0, nrows;
	fsdp_local_rows(f, i, &row0, &nrows, at);
	*n = nrows * f->p[i].cols;
	return true;
}

static int be_clip(void *ctx)
{
	struct fsdp *f = ctx;
	const struct mesh *mesh = f->mesh;
	double sums[2] = {f->step.loss_sum,
	                  grad_norm_sumsq(f->shard_g, f->shard_numel, f->model->table,
	                                  fsdp_grad_slice, f, &mesh->tp_group)};
	comm_label("clip: loss sum");
	comm_all_reduce_f64(&mesh->loss_group, &sums[0], 1);
	comm_label("clip: gradient sum of squares");
	comm_all_reduce_f64(&mesh->shard_group, &sums[1], 1);
	return grad_norm_finish(f->step.res, sums[0], sums[1], f->step.valid, f->step.max_norm,
	                        &f->step.gscale);
}

static int be_optim(void *ctx)
{
	struct fsdp *f = ctx;
	struct adamw *opt = f->step.opt;
	adamw_begin_step(opt);
	const struct param_table *t = f->model->table;
	for (int i = 0; i < t->count; i++) {
		const struct fsdp_param *p = &f->p[i];
		int64_t at = f->u[t->p[i].unit].shard_base + p->shard_off;
		adamw_update_slice(opt, f->shard_w + at, f->shard_g + at, at, p->my_rows * p->cols,
		                   f->step.lr, p->decay, f->step.gscale);
	}
	if (f->n_stats) { /* the family's statistics of the whole step, then its update */
		CHECK(model_step_stats(f->model, f->stats) == f->n_stats,
		      "fsdp: the model's step statistics changed size");
		comm_label("per-step model statistics");
		comm_all_reduce_f64(&f->mesh->loss_group, f->stats, f->n_stats);
		model_after_step(f->model, f->stats);
	}
	return CT_OK;
}

static const struct sched_backend fsdp_backend_ops = {
    .batch = be_batch,
    .all_gather = be_all_gather,
    .reduce_scatter = be_reduce_scatter,
    .all_gather_done = be_all_gather_done,
    .reduce_scatter_done = be_reduce_scatter_done,
    .free_params = be_free_params,
    .forward = be_forward,
    .backward = be_backward,
    .recompute = be_recompute,
    .tp_collective = be_tp_collective,
    .clip = be_clip,
    .optim = be_optim,
};

/* ---------------------------------------------------------------- step */

static void ensure_schedule(struct fsdp *f, int accum)
{
	if (f->sched.n_nodes > 0 && f->sched.n_micro == accum)
		return;
	struct sched s;
	fsdp_naive_schedule(f, accum, &s);
	CHECK(fsdp_set_schedule(f, &s) == CT_OK, "naive schedule rejected");
	sched_free(&s);
}

static int fsdp_begin(void *ctx, const struct engine_step_in *in, const struct sched **s,
                      struct sched_record **rec)
{
	struct fsdp *f = ctx;
	struct model *m = f->model;
	ensure_schedule(f, (int)in->accum);
	int64_t valid = model_count_valid(in->targets, in->accum * m->N);
	comm_label("valid-token count");
	comm_all_reduce_i64(&f->mesh->loss_group, &valid, 1);
	double dscale = valid > 0 ? 1.0 / (double)valid : 0.0;
	model_set_loss_dscale(m, dscale);
	memset(f->shard_g, 0, (size_t)f->shard_numel * sizeof(float));
	fsdp_fp8_scales(f);
	f->step = (struct fsdp_step_ctx){.tokens = in->tokens,
	                                 .targets = in->targets,
	                                 .opt = in->opt,
	                                 .lr = in->lr,
	                                 .max_norm = in->max_norm,
	                                 .dscale = dscale,
	                                 .valid = valid,
	                                 .res = in->res};
	*s = &f->sched;
	*rec = f->rec;
	return CT_OK;
}

void fsdp_engine(struct fsdp *f, struct engine *e)
{
	*e = (struct engine){.ctx = f, .begin = fsdp_begin, .be = fsdp_backend_ops, .stream = f->stream};
	e->be.ctx = f;
}

/* Forward only, each bucket gathered (blocking) before its first unit and freed after its
 * last. */
double fsdp_eval_loss(struct fsdp *f, const int32_t *tokens, const int32_t *targets, int64_t *valid)
{
	struct model *m = f->model;
	ensure_schedule(f, f->sched.n_micro > 0 ? f->sched.n_micro : 1);
	memcpy(m->tokens, tokens, (size_t)m->N * sizeof(int32_t));
	memcpy(m->targets, targets, (size_t)m->N * sizeof(int32_t));
	double loss = 0.0;
	model_set_loss_dscale(m, 0); /* no loss gradient (each training step sets its own) */
	fsdp_fp8_scales(f);
	for (int b = 0; b < f->sched.n_buckets; b++) {
		int64_t bytes, ticket = be_all_gather(f, b, &bytes);
		if (ticket > 0)
			comm_stream_wait(f->stream, ticket);
		be_all_gather_done(f, b);
		FOR_BUCKET_UNITS(f, b, u)
		{
			int64_t v = 0;
			loss += model_unit_forward(m, u, &v);
			if (u == f->n_units - 1)
				*valid = v;
		}
		be_free_params(f, b);
	}
	return loss;
}

void fsdp_local_rows(const struct fsdp *f, int i, int64_t *row0, int64_t *nrows, int64_t *at)
{
	const struct fsdp_param *p = &f->p[i];
	*row0 = f->gr[p->grp] * p->chunk_rows;
	*nrows = p->my_rows;
	*at = f->u[f->model->table->p[i].unit].shard_base + p->shard_off;
}

/* Under ep: each unit's groups gathered apart into this rank's table layout, then the global
 * layout (every expert tensor's ep pieces, in ep rank order, over the ep group). */
static void fsdp_gather_full_ep(struct fsdp *f, float *out)
{
	const struct param_table *t = f->model->table;
	int64_t max_unit = 0;
	for (int u = 0; u < f->n_units; u++)
		max_unit = f->u[u].full_numel > max_unit ? f->u[u].full_numel : max_unit;
	float *loc = xcalloc((size_t)t->numel, sizeof(float));
	float *send = xcalloc((size_t)max_unit, sizeof(float));
	float *recv = xcalloc((size_t)(f->gn[0] * max_unit), sizeof(float));
	for (int u = 0; u < f->n_units; u++) {
		const struct fsdp_unit *un = &f->u[u];
		for (int g = 0; g < 2; g++) {
			if (un->grp_numel[g] == 0)
				continue;
			for (int i = un->first_param; i < un->first_param + un->n_params; i++)
				if (f->p[i].grp == g)
					memcpy(send + f->p[i].pack_off,
					       f->shard_w + un->shard_base + f->p[i].shard_off,
					       (size_t)(f->p[i].chunk_rows * f->p[i].cols) *
					           sizeof(float));
			comm_label("full-parameter gather of unit %d, group %d", u, g);
			comm_all_gather(f->gg[g], send, recv,
			                un->grp_numel[g] * (int64_t)sizeof(float));
			for (int i = un->first_param; i < un->first_param + un->n_params; i++) {
				const struct fsdp_param *p = &f->p[i];
				if (p->grp != g)
					continue;
				for (int64_t q = 0; q < f->gn[g]; q++)
					memcpy(loc + t->unit_begin[u] + p->full_off +
					           q * p->chunk_rows * p->cols,
					       recv + q * un->grp_numel[g] + p->pack_off,
					       (size_t)(rows_of(p, q) * p->cols) * sizeof(float));
			}
		}
	}
	int64_t at = 0; /* the global layout: the table's order, expert tensors whole */
	for (int i = 0; i < t->count; i++) {
		const struct param_entry *e = &t->p[i];
		if (e->expert) {
			comm_label("full-parameter gather of %s over ep", e->name);
			comm_all_gather(&f->mesh->ep_group, loc + e->offset, out + at,
			                e->numel * (int64_t)sizeof(float));
			at += e->numel * f->mesh->ep;
		} else {
			memcpy(out + at, loc + e->offset, (size_t)e->numel * sizeof(float));
			at += e->numel;
		}
	}
	free(loc), free(send), free(recv);
}

void fsdp_gather_full(struct fsdp *f, float *out)
{
	if (f->ep) {
		fsdp_gather_full_ep(f, out);
		return;
	}
	/* Always fp32, whatever the training all-gather dtype: this is the master copy. One unit
	 * at a time, bypassing the step's buckets. */
	const struct param_table *t = f->model->table;
	int64_t N = f->mesh->shard, max_shard = 0;
	for (int u = 0; u < f->n_units; u++)
		max_shard = f->u[u].shard_numel > max_shard ? f->u[u].shard_numel : max_shard;
	float *recv = malloc((size_t)(N * max_shard) * sizeof(float));
	CHECK(recv, "out of memory");
	for (int u = 0; u < f->n_units; u++) {
		const struct fsdp_unit *un = &f->u[u];
		comm_label("full-parameter gather of unit %d", u);
		comm_all_gather(&f->mesh->shard_group, f->shard_w + un->shard_base, recv,
		                un->shard_numel * (int64_t)sizeof(float));
		float *full = out + t->unit_begin[u];
		for (int i = un->first_param; i < un->first_param + un->n_params; i++) {
			const struct fsdp_param *p = &f->p[i];
			for (int64_t q = 0; q < N; q++)
				memcpy(full + p->full_off + q * p->chunk_rows * p->cols,
				       recv + q * un->shard_numel + p->shard_off,
				       (size_t)(rows_of(p, q) * p->cols) * sizeof(float));
		}
	}
	free(recv);
}
