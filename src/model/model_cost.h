/* model/model_cost: what a family tells the cost model (schedule/sched_cost.h) about its units,
 * from the shapes alone (nothing built), so the cost model and `ctitan plan` take any family
 * that has one (model_family.cost_model, model_family.cost):
 *
 *  - the work of each unit's passes (forward, backward, recompute) for a (B, T) micro-batch,
 *    per term: matmul and attention FLOPs, elementwise and embedding bytes, the fused output
 *    projection + cross-entropy FLOPs, under an activation-checkpointing mode, on one of tp
 *    tensor-parallel ranks;
 *  - the activation bytes such a model allocates (what MEM_ACTIVATIONS peaks at);
 *  - its FLOPs per token (the MFU's numerator), and each unit's pass program (its TP
 *    collectives) from the shapes;
 *  - for calibration, the kernels a unit runs at those shapes, as parts timed one by one
 *    (each measures one term's rate: its work over its time). model/ runs kernels only; the
 *    collectives, AdamW and copies are measured by the schedule (schedule/sched_calib.c).
 */
#ifndef CT_MODEL_MODEL_COST_H
#define CT_MODEL_MODEL_COST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model_ac.h"
#include "model/model_prog.h"

struct model_config;

/* Terms of a unit pass's time: work over a rate the cost model holds per pass and term. */
enum model_cost_term {
	MODEL_COST_MATMUL, /* FLOPs */
	MODEL_COST_ATTN,   /* FLOPs */
	MODEL_COST_ELEM,   /* bytes: norms, RoPE, SwiGLU */
	MODEL_COST_HEAD,   /* FLOPs: output projection + cross-entropy, fused */
	MODEL_COST_EMBED,  /* bytes: embedding lookup / scatter */
	MODEL_COST_TERM_COUNT
};

/* The micro-batch and the slice the figures are for. */
struct model_cost_shape {
	int64_t B, T;
	enum model_ac ac;
	int ac_every;       /* ac = MODEL_AC_LAYER: its N (model/model_ac.h) */
	int64_t tp;         /* tensor-parallel ranks (1: none); the figures are one rank's */
	int64_t elem_bytes; /* per activation element: 4 (the CPU computes in fp32), 2 (bf16) */
	/* context parallelism (cp <= 1: none): T is the whole sequence, of which each of cp
	 * ranks holds T / cp tokens; the figures are the critical path's rank (head-tail
	 * balanced: every rank's causal attention is 1/cp of the sequence's; contiguous: the
	 * last shard's). cp_ring: K/V passed round a ring (rotate method alltoall), else
	 * all-gathered (allgather). */
	int64_t cp;
	bool cp_ring, cp_headtail;
	/* expert parallelism (ep <= 1: none): the routed experts split over ep ranks, each
	 * routing its own B x T tokens (families with ep; the others ignore it) */
	int64_t ep;
};

/* Work of one unit's passes: [MODEL_PASS_*][MODEL_COST_*], FLOPs or bytes (0: none). */
typedef double model_cost_work[MODEL_PASS_COUNT][MODEL_COST_TERM_COUNT];

/* One timed part of calibration: the rate it measures (pass = MODEL_PASS_COUNT: that term's
 * rate in every pass) and the work of one run. */
struct model_cost_part {
	enum model_pass pass;
	enum model_cost_term term;
	double work;
};

#define MODEL_COST_PARTS_MAX 12

/* A family's calibration at the given shapes: buffers filled with small values and the parts
 * run(impl, i) runs on them, once per call. Passes without a part of a term take the
 * forward's rate. busy_part is the compute the interference of the comm thread is measured
 * beside (a block's forward matmuls). */
struct model_cost_calib {
	int n_parts;
	struct model_cost_part part[MODEL_COST_PARTS_MAX];
	int busy_part;
	void *impl;
	void (*run)(void *impl, int part);
	void (*free)(void *impl);
};

/* Calibration buffers: views of one allocation, each *p n floats (64-byte aligned), filled
 * with small deterministic values, and N token ids below V into *tok (malloc'd); returns the
 * allocation (free both). */
struct model_cost_view {
	float **p;
	int64_t n;
};
float *model_cost_cal_buffers(const struct model_cost_view *views, size_t n_views, int32_t **tok,
                              int64_t N, int64_t V);

/* What a family with the cost model provides. */
struct model_cost_ops {
	void (*unit_work)(const struct model_config *c, const struct model_cost_shape *s, int u,
	                  model_cost_work w);
	int64_t (*activation_bytes)(const struct model_config *c, const struct model_cost_shape *s);
	double (*flops_per_token)(const struct model_config *c, int64_t seq_len);
	/* unit u's pass p as the model sliced over s->tp ranks makes it (async: ring steps),
	 * with its K/V transfers under s->cp and its all-to-alls under s->ep */
	void (*unit_prog)(const struct model_config *c, const struct model_cost_shape *s,
	                  bool async, int u, enum model_pass p, struct model_prog *out);
	void (*calib_init)(struct model_cost_calib *cal, const struct model_config *c,
	                   const struct model_cost_shape *s);
	/* the collectives run inside unit u's pass p, not program nodes (expert parallelism's
	 * row counts over the ep group, role MODEL_GROUP_EP; a family's tensor-parallel
	 * collectives, role MODEL_GROUP_TP, e.g. Hyena's all-reduces), priced with the pass;
	 * NULL: none */
	void (*unit_inner)(const struct model_config *c, const struct model_cost_shape *s, int u,
	                   enum model_pass p, struct model_prog *out);
};

/* The family's cost model (NULL: it has none; the callers refuse what needs it). */
const struct model_cost_ops *model_cost_of(const struct model_config *c);
/* The calls of the family's model_cost_ops (it must have one). */
void model_cost_unit_work(const struct model_config *c, const struct model_cost_shape *s, int u,
                          model_cost_work w);
int64_t model_cost_activation_bytes(const struct model_config *c, const struct model_cost_shape *s);
double model_cost_flops_per_token(const struct model_config *c, int64_t seq_len);
void model_cost_unit_prog(const struct model_config *c, const struct model_cost_shape *s,
                          bool async, int u, enum model_pass p, struct model_prog *out);
/* n = 0 without ep > 1 or tp > 1, or without a unit_inner hook */
void model_cost_unit_inner(const struct model_config *c, const struct model_cost_shape *s, int u,
                           enum model_pass p, struct model_prog *out);
void model_cost_calib_init(struct model_cost_calib *cal, const struct model_config *c,
                           const struct model_cost_shape *s);
void model_cost_calib_free(struct model_cost_calib *cal);

#endif
