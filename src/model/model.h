/* model/model: one interface over the model families (one folder each under src/model/,
 * listed once in the family table in model/model.c), so the trainer, FSDP and checkpoints
 * run any of them.
 *
 * A family is a list of units over one flat parameter buffer described by a `struct
 * param_table` (model/param_table.h: name, shape, offset, unit): FSDP gathers and
 * reduce-scatters per unit, AdamW and checkpoints walk the table. What differs per family is
 * behind `struct model_ops`: binding a unit to its (gathered) parameters, unit
 * forward/backward, init and FLOPs.
 *
 * `struct model` holds the family's model (impl) and views of its stable buffers (tokens,
 * targets, flat params/grads, unit pointer arrays), so callers copy a batch into m->tokens or
 * re-point m->unit_w[u] whatever the family.
 */
#ifndef CT_MODEL_MODEL_H
#define CT_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model_ac.h"
#include "model/model_prog.h"
#include "model/param_table.h"

/* A family's index in the family table (model/model.c): the built-in families in the
 * table's order, then those model_family_register added. A number, not a name: the layers
 * above ask the family (model_family_of), never compare kinds. */
enum model_kind { MODEL_KIND_NONE = -1 /* no family */ };

/* What a checkpoint manifest and `[model] name` call the family ("llama3", ...). */
const char *model_kind_name(enum model_kind k);

/* Bytes a family's own config may take inside a model_config (each family checks that its
 * config fits with a _Static_assert). */
#define MODEL_CONFIG_BYTES 256

/* A model's config, of any family: the kind, and the family's own config struct by value
 * in `family`, which only the family's folder reads, through its
 * accessor (in the family's header). Copying a model_config copies it all. */
struct model_config {
	enum model_kind kind; /* a built-in kind, or one model_family_register returned */
	_Alignas(max_align_t) unsigned char family[MODEL_CONFIG_BYTES];
	const void *ext; /* a registered family's own config (it owns the pointee) */
};

int64_t model_config_vocab(const struct model_config *c);
const char *model_config_flavor(const struct model_config *c);
/* Blocks (units are the embedding, the blocks and the head: n_layers + 2). */
int64_t model_config_n_layers(const struct model_config *c);
/* Width of the residual stream: what one token carries between units (a pipeline stage's
 * boundary, per token, in elements). */
int64_t model_config_dim(const struct model_config *c);

/* Targets equal to this are not counted in the loss (PyTorch's ignore_index). */
#define MODEL_IGNORE_INDEX (-100)
/* Targets of n tokens that count (!= MODEL_IGNORE_INDEX). */
int64_t model_count_valid(const int32_t *targets, int64_t n);
/* The parameter table of a config (no model needed: generate, export, tests). */
int model_table_build(struct param_table *t, const struct model_config *c);
/* Tensor-parallel rank tp_rank's slice of it (tp = 1: the whole table). */
int model_table_build_tp(struct param_table *t, const struct model_config *c, int tp, int tp_rank);
/* Expert-parallel rank ep_rank's table of ep (ep = 1: model_table_build; ep > 1 needs a family
 * with ep). */
int model_table_build_ep(struct param_table *t, const struct model_config *c, int ep, int ep_rank);
void model_init_params_cfg(const struct model_config *c, const struct param_table *t, uint64_t seed,
                           float *out, int64_t first, int64_t n);

struct model_build_opts {
	bool own_params;    /* allocate flat params + grads and bind every unit to them */
	bool recompute_ffn; /* Llama: recompute the FFN up-projections in backward */
	enum model_ac ac;   /* activation checkpointing (families with .ac) */
	int ac_every;       /* ac = MODEL_AC_LAYER: full on every ac_every-th block */
	/* tensor parallelism over these collectives (Llama only; NULL or size 1: none) */
	const struct model_group *tp;
	/* plan activations only for units [unit_lo, unit_hi) (a pipeline stage: its
	 * blocks, its input and output boundary); unit_hi = 0: every unit */
	int unit_lo, unit_hi;
	/* Llama: split backward for zero-bubble schedules (input gradients in B/I, weight gradients in W) */
	bool split_backward;
	bool tp_async; /* TP collectives as async rings decomposed with their matmuls */
	/* context parallelism (families with cp): this model holds T = seq_len / cp tokens of
	 * each sequence, cp_order (seq_len positions, rank-major) says which, and its attention
	 * reaches the other shards through these collectives (NULL or size 1: none); cp_ring:
	 * K/V round the ring (rotate method alltoall) instead of one all-gather */
	const struct model_group *cp;
	const int64_t *cp_order;
	bool cp_ring;
	/* expert parallelism (families with ep): the routed experts are split over this group's
	 * ranks (size divides the experts), which exchange the tokens routed to each other's
	 * experts (all_to_all_v); NULL or size 1: every expert here */
	const struct model_group *ep;
};

/* One figure a family reports per step (model_ops.step_metrics), e.g. MoE's expert load. */
struct model_step_metric {
	char name[48];  /* the metrics.jsonl key */
	double value;
	bool console;   /* also on the console line (as "name: value") */
};

struct model_ops {
	void (*bind_unit)(void *impl, int u, float *params, float *grads);
	double (*unit_forward)(void *impl, int u, int64_t *n_valid);
	void (*unit_backward)(void *impl, int u, double dscale);
	/* built with split_backward: the deferred weight gradients of unit u (NULL: none) */
	void (*unit_backward_weight)(void *impl, int u);
	/* activation checkpointing: re-derive unit u's dropped activations right before its
	 * backward, when unit_needs_recompute says so */
	void (*unit_recompute)(void *impl, int u);
	bool (*unit_needs_recompute)(const void *impl, int u);
	/* a unit's pass as a program (model/model_prog.h) and one op of it (NULL: every pass is
	 * one segment, run by the three calls above); an expert-parallel all-to-all op returns
	 * the bytes it sent to the other ranks (this step's routing), a segment what
	 * unit_forward would (the head's loss sum) */
	void (*unit_prog)(const void *impl, int u, enum model_pass p, struct model_prog *out);
	double (*unit_op)(void *impl, int u, enum model_pass p, int op, double dscale, bool *ran);
	/* > 0: the last unit's forward also makes the loss gradient, scaled by this */
	void (*set_loss_dscale)(void *impl, double dscale);
	void (*logits)(void *impl, float *logits);
	/* the residual stream between units (pipeline stage boundaries; NULL: the family has
	 * no pipeline stages): unit u's output activation, the next unit's input; and the
	 * gradient buffer a unit's backward reads as its output's gradient and leaves as its
	 * input's */
	float *(*unit_output)(void *impl, int u);
	float *(*residual_grad)(void *impl);
	/* Families with tied_head (the last unit reads table tensor 0, the embedding, as its
	 * output matrix): the last unit reads it from where set_tied points (NULL: from unit
	 * 0's binding) and leaves its share of that tensor's gradient for the current
	 * micro-batch in tied_grad's buffer, which unit 0's backward adds to the tensor's
	 * gradient (zero while the model never runs its last unit). Pipeline parallelism,
	 * whose first and last stages are different models, sends the tensor to the last
	 * stage and that gradient back (parallel/pp). */
	void (*set_tied)(void *impl, const float *w);
	float *(*tied_grad)(void *impl);
	double (*flops_per_token)(const struct model_config *c, const struct param_table *t,
	                          int64_t seq_len);
	/* Per-step statistics and an update after the optimizer step (NULL: none; families
	 * without them are untouched). step_stats returns how many doubles the family counted
	 * since the last call (e.g. MoE's tokens per expert, over the step's micro-batches) and,
	 * when out is non-NULL, copies them there and resets them. The layout's optimizer tail
	 * (parallel/fsdp) sums them over the data-parallel group and hands the sum to
	 * after_step, so what it updates (MoE's balancing bias) is the same on every rank and
	 * on one rank with the whole batch. */
	int64_t (*step_stats)(void *impl, double *out);
	void (*after_step)(void *impl, const double *sum);
	/* the figures of the last after_step for the log (NULL: none): up to max of them into
	 * out, returns how many (metrics.jsonl gets each; the console line those marked) */
	int (*step_metrics)(const void *impl, struct model_step_metric *out, int max);
	/* Model state outside the parameter table that training changes and a checkpoint must
	 * hold (NULL: none), the same on every rank (e.g. MoE's balancing bias, TorchTitan's
	 * expert_bias buffer): state returns how many doubles it has, copied into out when
	 * non-NULL; set_state takes them back (n must be that count). */
	int64_t (*state)(const void *impl, double *out);
	void (*set_state)(void *impl, const double *in, int64_t n);
	void (*free)(void *impl);
};

struct model {
	struct model_config cfg;
	const struct model_ops *ops;
	void *impl; /* the family's model */
	bool owns_impl;
	/* views of the implementation's buffers (valid while it lives) */
	const struct param_table *table;
	enum model_ac ac; /* the activation checkpointing it was built with */
	int ac_every;     /* and MODEL_AC_LAYER's N */
	int n_units;
	int64_t B, T, N, vocab_size;
	int32_t *tokens, *targets; /* (N) current micro-batch */
	float *params, *grads;     /* flat (own_params only, else NULL) */
	float **unit_w, **unit_dw; /* n_units each: where unit u's params/grads are now */
	int64_t act_bytes, scratch_bytes;
};

struct cJSON;
struct model_cost_ops;
struct model_hf_ops;
struct config_key_def;
struct ct_config;

/* A model family (one folder under src/model/, listed once in the family table in
 * model/model.c): what the layers above ask of a model instead of its kind — its config's
 * sizes, its table and init, how to build it, and what it supports. */
struct model_family {
	const char *name; /* `[model] name` and the manifests: "llama3", ... */
	/* its presets (`[model] flavor`): the i-th one's name, NULL past the last */
	const char *(*flavor_name)(int i);
	/* its own `[model]` keys (io/config.h rows; n_keys of them), which
	 * model_config_schema_init adds to the run configuration: only read with
	 * `[model] name` = name, so a key set for another family is refused */
	const struct config_key_def *keys;
	int n_keys;
	/* the model a run configuration describes (CT_ERR_USAGE with a message naming the
	 * key); NULL: the family is built from code only */
	int (*from_config)(const struct ct_config *cfg, struct model_config *mc);
	/* cross-key checks of a run configuration naming this family, at config_validate
	 * (0, or CT_ERR_USAGE after config_error); NULL: none */
	int (*check_config)(const struct ct_config *cfg);
	/* what it supports: tensor / pipeline parallelism, activation checkpointing modes
	 * other than none, float8 linears, `ctitan export` to Hugging Face, the cost model
	 * (comm.buckets = auto, memory budgets, profiled predictions, `ctitan plan`);
	 * context parallelism */
	bool tp, pp, ac, float8, export_hf, cost_model;
	bool cp; /* context parallelism (the sequence split over ranks) */
	bool tied_head; /* the last unit reads table tensor 0 too (model_ops.set_tied) */
	bool ep; /* expert parallelism (routed experts split over ranks) */
	/* under tensor parallelism every tp rank holds the whole residual stream (no sequence
	 * parallelism: Hyena), so a pipeline stage boundary carries all of a micro-batch's
	 * tokens; false: each tp rank holds its ceil(N/tp) token rows (Llama) */
	bool tp_whole_stream;
	/* families without tp / cp: why, in words a user understands (NULL: a generic reason) */
	const char *no_tp_why, *no_cp_why;
	int64_t (*vocab)(const struct model_config *c);
	int64_t (*n_layers)(const struct model_config *c);
	int64_t (*dim)(const struct model_config *c); /* residual stream width */
	const char *(*flavor)(const struct model_config *c);
	int (*table_build)(struct param_table *t, const struct model_config *c);
	/* tensor-parallel rank tp_rank's slice (families with tp) */
	int (*table_build_tp)(struct param_table *t, const struct model_config *c, int tp,
	                      int tp_rank);
	/* expert-parallel rank ep_rank's table (families with ep): its experts' rows, marked
	 * `expert` (what FSDP shards over the efsdp group) */
	int (*table_build_ep)(struct param_table *t, const struct model_config *c, int ep,
	                      int ep_rank);
	/* families with tp: CT_OK when tp ranks can split c, else CT_ERR_USAGE with a message
	 * naming what tp must divide */
	int (*tp_check)(const struct model_config *c, int64_t tp);
	/* a table tensor that is a row range of another tensor of an older layout of the
	 * family's table (NULL, or 1: none): returns g > 1 when `name` is tensor *piece of g
	 * equal row ranges of the tensor named `group` (a checkpoint written before the split
	 * loads those rows), e.g. Hyena's per-stream in_proj of safari's one in_proj */
	int (*tensor_group)(const struct model_config *c, const char *name, char *group, size_t n,
	                    int *piece);
	void (*init_params)(const struct model_config *c, const struct param_table *t, uint64_t seed,
	                    float *out, int64_t first, int64_t n);
	int (*build)(struct model *m, const struct model_config *c, int64_t B, int64_t T,
	             const struct model_build_opts *opts);
	void (*describe)(const struct model *m, char *buf, size_t n);
	/* its config's fields in a checkpoint manifest (object o; the name is added for it) */
	void (*manifest_fields)(const struct model_config *c, struct cJSON *o);
	/* with cost_model: its figures for the cost model (model/model_cost.h) */
	const struct model_cost_ops *cost;
	/* with export_hf: its Hugging Face names, layout, config.json and loader
	 * (model/model_hf.h) */
	const struct model_hf_ops *hf;
};

/* Add a family to the table (one defined outside src/model/, e.g. by a test); returns the
 * kind it gets (MODEL_KIND_NONE: the table is full or the name taken). */
#define MODEL_FAMILY_MAX 8
int model_family_register(const struct model_family *f);
/* The family of a kind, or of a `[model] name` (NULL: no such family). */
const struct model_family *model_family_of(enum model_kind k);
const struct model_family *model_family_named(const char *name);
/* The families' names, comma-separated, in the table's order, for messages. */
const char *model_family_list(void);
/* Add what the families bring to the run configuration (io/config.h): their `[model]`
 * keys, their presets as model.flavor's choices, and the check that a family's keys are set
 * only for it. Once, before the first config_defaults (the CLI's main calls it; later
 * calls do nothing); families registered after it bring no keys. */
void model_config_schema_init(void);

/* Build a model of family c->kind for micro-batches of (B, T). CT_OK or an error code. */
int model_build(struct model *m, const struct model_config *c, int64_t B, int64_t T,
                const struct model_build_opts *opts);
/* (A family's own header declares how to view an already built model of it as a struct
 * model: model_wrap_llama, ...) */
void model_free(struct model *m);

/* Whether table entry e is a float8 linear under the current float8 set-up
 * (kernels/fp8_linear.h): a matrix other than the embedding (and the tied head that reads
 * it), not marked high_precision by its family, whose module is not filtered. */
struct param_entry;
bool model_fp8_linear(const struct param_entry *e);

static inline void model_bind_unit(struct model *m, int u, float *params, float *grads)
{
	m->ops->bind_unit(m->impl, u, params, grads);
}
static inline double model_unit_forward(struct model *m, int u, int64_t *n_valid)
{
	return m->ops->unit_forward(m->impl, u, n_valid);
}
static inline void model_unit_backward(struct model *m, int u, double dscale)
{
	m->ops->unit_backward(m->impl, u, dscale);
}
static inline void model_unit_recompute(struct model *m, int u)
{
	m->ops->unit_recompute(m->impl, u);
}
/* (a family without a split backward made the weight gradients in unit_backward already) */
static inline void model_unit_backward_weight(struct model *m, int u)
{
	if (m->ops->unit_backward_weight)
		m->ops->unit_backward_weight(m->impl, u);
}
/* model_ops.state / set_state, or 0 / nothing for a family without model state */
static inline int64_t model_state(const struct model *m, double *out)
{
	return m->ops->state ? m->ops->state(m->impl, out) : 0;
}
static inline void model_set_state(struct model *m, const double *in, int64_t n)
{
	if (m->ops->set_state)
		m->ops->set_state(m->impl, in, n);
}
static inline void model_set_tied(struct model *m, const float *w)
{
	m->ops->set_tied(m->impl, w);
}
static inline float *model_tied_grad(struct model *m)
{
	return m->ops->tied_grad(m->impl);
}
static inline bool model_unit_needs_recompute(const struct model *m, int u)
{
	return m->ops->unit_needs_recompute(m->impl, u);
}
/* Unit u's pass p as a program: n collectives between n + 1 compute segments (n = 0 without
 * tensor parallelism). */
void model_unit_prog(const struct model *m, int u, enum model_pass p, struct model_prog *out);
/* Op `op` of it: segment op / 2 or collective op / 2 (*ran: whether the collective ran; may
 * be NULL). Returns the loss sum after the last op of the head's forward, else 0. Ops 0..2n
 * in order are model_unit_forward / _backward(dscale) / _recompute. */
double model_unit_op(struct model *m, int u, enum model_pass p, int op, double dscale, bool *ran);
static inline void model_set_loss_dscale(struct model *m, double dscale)
{
	m->ops->set_loss_dscale(m->impl, dscale);
}
static inline void model_logits(struct model *m, float *logits)
{
	m->ops->logits(m->impl, logits);
}
static inline float *model_unit_output(struct model *m, int u)
{
	return m->ops->unit_output(m->impl, u);
}
static inline float *model_residual_grad(struct model *m)
{
	return m->ops->residual_grad(m->impl);
}
/* model_ops.step_stats / after_step, or 0 / nothing for a family without them. */
static inline int64_t model_step_stats(struct model *m, double *out)
{
	return m->ops->step_stats ? m->ops->step_stats(m->impl, out) : 0;
}
static inline void model_after_step(struct model *m, const double *sum)
{
	if (m->ops->after_step)
		m->ops->after_step(m->impl, sum);
}
static inline int model_step_metrics(const struct model *m, struct model_step_metric *out, int max)
{
	return m->ops && m->ops->step_metrics ? m->ops->step_metrics(m->impl, out, max) : 0;
}
/* Whole-model conveniences built from the units. */
double model_forward(struct model *m, int64_t *n_valid);
void model_backward(struct model *m, double dscale);
/* Elements [first, first+n) of the family's init (same values on any sharding). */
void model_init_params(const struct model *m, uint64_t seed, float *out, int64_t first, int64_t n);
double model_flops_per_token(const struct model *m, int64_t seq_len);
/* One line for the log: family, flavor, shape, parameter count. */
void model_describe(const struct model *m, char *buf, size_t n);

/* What one optimizer step reports (parallel/engine.h; the tests' reference loop). */
struct train_step_result {
	double loss;      /* sum of token losses / valid tokens of the whole step */
	double grad_norm; /* before clipping */
	int64_t valid;    /* valid target tokens in the step */
};

#endif
