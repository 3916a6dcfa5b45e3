/* parallel/pp: pipeline parallelism — the model cut into stages by layers, each pipeline
 * rank running its stages' part of a schedule (schedule/pp_schedule.h) on micro-batches,
 * with activations and their gradients sent point-to-point between stages.
 *
 * Stages: the L blocks plus the embedding and the head (final norm + output + loss) are split
 * into S = pp x v stages of equal weight, where the embedding counts as first_less blocks and
 * the head as last_less blocks (TorchTitan's pipeline_parallel_first/last_stage_less_layers):
 * stage 0 holds the embedding, stage S-1 the head. Stage s runs on pipeline rank s % pp (its
 * virtual stage s / pp); interleaved schedules give a rank v > 1 virtual stages.
 *
 * Per virtual stage the rank owns the contiguous parameter range of its units (flat, full
 * size, during the step) and, between steps, only its dp_shard slice of each tensor's rows
 * (FSDP's dim-0 chunks, padded): parameters are all-gathered over dp_shard at the start of
 * the step (FSDP with reshard_after_forward = never inside the step, TorchTitan's policy under
 * PP), gradients accumulate over the micro-batches and are reduce-scattered (and all-reduced
 * over dp_replicate under HSDP) once at the end; AdamW runs on the shards.
 *
 * Micro-batches in flight each own a model instance (a "slot": activations and scratch of
 * one micro-batch for the virtual stage's units only, parameters bound to the shared full buffers;
 * the bytes one slot holds are measured from MEM_ACTIVATIONS when it is built); slots are taken at a
 * stage's forward and returned after its backward, so the number ever built per virtual stage is the
 * schedule's peak of in-flight micro-batches there. The loss of every micro-batch is
 * normalised by the valid tokens of the whole step over all data-parallel ranks, so the
 * result equals a one-rank step over the same rows; the gradient norm for clipping is taken
 * over all stages (shards summed over dp_shard, then over pp).
 *
 * Tensor parallelism (mesh->tp > 1): the table is this TP rank's slice (model_table_build_tp)
 * and every slot a TP model over the TP group; a stage boundary is the rank's sequence shard
 * of the residual stream (Ns = ceil(N / tp) rows), sent to the same TP rank of the neighbour
 * stage. The loss is counted on TP rank 0 (every TP rank holds the whole sum), TP-split
 * gradients are summed over the TP group for the norm and replicated ones counted once.
 *
 * The step is this rank's action list as schedule nodes (schedule/sched_pp.c), run by the one
 * executor: this file is its backend. Transfers: SEND posts a non-blocking send of the slot's
 * boundary buffer (its output activation, or the gradient of its input), RECV posts a receive
 * into the slot, and a WAIT node before the compute that needs the data completes it; every
 * send is waited for after the last action. Open transfers are tested after every node so
 * they advance between compute. A simulated link (comm.simulate_bandwidth_gbps) gives each
 * transfer an arrival time, latency + bytes / bandwidth after this rank's outgoing link is
 * free, sent along in a small header message; the receiver treats the data as arrived only
 * then (one machine, one clock).
 *
 * Zero-bubble schedules (ZB-H1): I runs a stage's backward with the model's split backward
 * (input gradients only, model_build_opts.split_backward) and W its deferred weight
 * gradients; a slot is freed once its W has run and its input gradient is sent.
 *
 * A tied head (Hyena: the output matrix is the embedding): stage 0 sends the gathered
 * embedding to the last stage after each gather (a step's or validation's), and the last stage
 * sends the head's share of its gradient, summed over the micro-batches, back before stage 0
 * reduces its gradients (Megatron's embedding-group all-reduce, as one point-to-point pair).
 *
 * Validation (pp_eval_loss) runs the forward-only schedule over the same stages
 * (pp_sched_forward_only, lowered by sched_build_pp) through the same executor and backend:
 * the stage shards gathered, every micro-batch's forward with the loss gradient scale 0 (no
 * backward, so no recompute, no gradients, no reduce-scatter, no optimizer), a slot free again
 * once its activation is sent (the stage's next micro-batch reuses it: no slot more than the
 * step's). The last stage's loss sums and valid-token counts are summed over the whole mesh,
 * so every rank holds the mean of all data-parallel ranks' rows; the training state (shards,
 * moments, the last step's record) is untouched.
 *
 * Expert parallelism (mesh->ep > 1, MoE): the table is this ep rank's (its experts' rows of
 * the expert tensors); every slot runs its MoE layers' token all-to-alls over the ep group,
 * whose ranks are the same stage running the same action list, so they exchange the same
 * micro-batch in the same order. Expert tensors are sharded over efsdp (dp_shard / ep), the
 * rest over dp_shard, as under FSDP (parallel/fsdp.h): one gather and one reduce-scatter per
 * shard group and virtual stage.
 *
 * Model state (pp_opts.state_model, MoE's balancing bias): the whole model's, the same on
 * every rank; the stages' models count the tokens of their own layers, the sum over the
 * step's micro-batches, data-parallel and pipeline ranks updates it after AdamW.
 *
 * Refused (exit 2, saying why): split-backward schedules with async TP (its rings compute the
 * weight gradients inside the input-gradient matmuls), families without pipeline stages.
 */
#ifndef CT_PARALLEL_PP_H
#define CT_PARALLEL_PP_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "comm/p2p.h"
#include "model/model.h"
#include "parallel/engine.h"
#include "parallel/tp_coll.h"
#include "schedule/pp_schedule.h"
#include "schedule/sched_exec.h"
#include "optim/optim.h"

struct pp_opts {
	enum pp_style style;
	const char *csv;          /* a CSV schedule (overrides style) or NULL / "" */
	int64_t layers_per_stage; /* 0: one stage per rank, two for interleaved styles */
	int64_t first_less, last_less;
	int64_t micro_rows; /* rows (sequences) per micro-batch */
	int64_t T;
	int64_t n_micro;    /* micro-batches per step */
	enum model_ac ac;
	int ac_every; /* ac = MODEL_AC_LAYER: full on every ac_every-th block */
	bool tp_async; /* the stage models' TP collectives as async TP's ring steps */
	/* training.mixed_precision_param = bfloat16: the gathered parameters are rounded to
	 * bf16 values before compute (FSDP2's param_dtype; the masters stay fp32), except the
	 * float8 linears' when fp8_from_masters (the fp8 all-gather casts the fp32 masters) */
	bool bf16, fp8_from_masters;
	double timeout_s;
	double sim_gbps, sim_latency_us; /* simulated link for the transfers (0: off) */
	/* context parallelism (mesh->cp > 1): T is this rank's T / cp tokens of each sequence,
	 * cp_order the token order (parallel/cp.h), cp_ring the ring variant */
	const int64_t *cp_order;
	bool cp_ring;
	bool cp_headtail; /* head-tail load balancing (the cost model's critical path) */
	/* the model that holds the family's step state (model_ops.step_stats / after_step /
	 * state: MoE's balancing bias and expert loads) for the whole model: the trainer's
	 * descriptive model, whose state checkpoints save and load and metrics read. Each step
	 * the stages' models take its state; after AdamW the tokens they counted, summed over
	 * the step's micro-batches, the data-parallel ranks and the pipeline ranks (each stage
	 * counts its own layers), update it, as one rank's step over the whole batch. NULL: a
	 * family without step state */
	struct model *state_model;
};

/* Split L blocks into S stages as above: u0[s] is the first unit of stage s (S + 1 entries,
 * u0[S] = L + 2). CT_ERR_USAGE naming the keys if they do not split evenly. */
int pp_split_stages(int64_t L, int S, int64_t first_less, int64_t last_less, int *u0);
/* Stages per rank for a style and layers_per_stage (0: default). CT_ERR_USAGE naming the
 * key when the stage count is not a multiple of pp or does not fit the style. */
int pp_stages_per_rank(int64_t L, int pp, enum pp_style style, int64_t layers_per_stage,
                       int64_t first_less, int64_t last_less, int *v);

struct pp_tensor {
	int vstage; /* the virtual stage (of this rank) holding it, -1: none here */
	int grp;    /* its shard group: 0 dp_shard, 1 efsdp (an expert tensor under ep) */
	int64_t rows, cols, chunk_rows, my_rows;
	int64_t full_off;  /* in this rank's full buffers */
	int64_t shard_off; /* in this rank's shard buffers */
	bool decay;
};

struct pp_slot {
	struct model m;
	int micro; /* -1: free */
	/* its last send (of its virtual stage's micro-batch send_micro): the slot's boundary
	 * buffer may not be reused before it completed */
	bool send_open, send_backward;
	int send_micro;
	bool sent_b, w_done; /* split backward: the slot is free once both happened */
};

/* Transfers of a virtual stage, per direction (0: the activation forward, 1: the input
 * gradient backward) and micro-batch. */
struct pp_xfer {
	struct comm_p2p data, hdr; /* hdr: the simulated arrival time (simulated link only) */
	double at;                 /* that time */
};

struct pp_vstage {
	int stage, u0, u1; /* units [u0, u1) */
	int64_t full_off, full_numel, shard_off, shard_numel;
	/* its shards per shard group (contiguous, group 0's first; group 1 empty without ep) */
	int64_t gshard_off[2], gshard_numel[2];
	int n_slots;
	int64_t slot_bytes; /* MEM_ACTIVATIONS one slot (in-flight micro-batch) holds, measured */
	struct pp_slot *slots;
	int *slot_of; /* n_micro: slot of micro-batch m, -1 none */
	struct pp_xfer *send[2], *recv[2]; /* n_micro each */
};

struct pp {
	const struct mesh *mesh;
	struct model_config cfg;
	struct tp_coll tp;        /* the slots' TP collectives (mesh->tp > 1) */
	struct tp_coll cp;        /* and CP's (mesh->cp > 1) */
	struct tp_coll ep;        /* and the MoE layers' all-to-alls (mesh->ep > 1) */
	/* expert parallelism: the table is this ep rank's (its experts), and expert tensors
	 * are sharded over efsdp (gg[1]), the rest over dp_shard (gg[0]) */
	bool use_ep;
	const struct comm_group *gg[2];
	/* the family's step statistics (n_stats doubles, summed per step) and state (n_state:
	 * the state model's, which every stage model takes before it runs) */
	int64_t n_stats, n_state;
	double *stats, *stats_slot, *state;
	struct param_table table; /* the whole model's table */
	struct pp_opts o;
	struct pp_sched sched; /* every rank's action lists */
	struct pp_sim sim;     /* the schedule's unit-time prediction */
	struct sched step;     /* this rank's step as schedule nodes (sched_build_pp) */
	struct pp_sched eval_sched; /* the forward-only schedule of pp_eval_loss */
	struct sched eval_step;     /* and this rank's nodes of it */
	bool eval;                  /* pp_eval_loss is running */
	struct sched_record *rec; /* the executor's record of the last step */
	int p, r, v, S;
	bool split; /* the schedule splits backwards into I and W (zero-bubble) */
	int *stage_u0; /* S + 1 */
	struct pp_vstage *vstages;
	int64_t full_numel, shard_numel;
	float *full_w, *full_g;   /* this rank's virtual stages, full (during the step) */
	float *shard_w, *shard_g; /* master parameters and gradients (MEM_PARAMS, MEM_GRADS) */
	struct pp_tensor *t;      /* one per table entry */
	float *comm_buf;          /* gather / reduce-scatter scratch */
	int64_t comm_numel;
	int tag_max;
	/* the step */
	const int32_t *tokens, *targets;
	struct engine_step_in in;
	int64_t valid;
	double dscale, loss_sum, gscale;
	int inflight, peak_inflight;
	double link_free; /* simulated link: when this rank's outgoing link is next free */
	/* a tied head (model_family.tied_head, Hyena): the embedding travels from stage 0 to
	 * the last stage after the step's all-gather (into tied_w there), and the head's
	 * gradient of it, summed over the step's micro-batches on the last stage (tied_g),
	 * travels back before stage 0's reduce-scatter, which adds it to the embedding's */
	bool tied;
	int64_t tied_numel;
	float *tied_w, *tied_g;
	struct comm_p2p tied_send;
	bool tied_send_open;
};

/* Plan stages and shards for this rank's pipeline position and allocate them. */
int pp_build(struct pp *pp, const struct model_config *mc, const struct mesh *mesh,
             const struct pp_opts *o);
void pp_free(struct pp *pp);
/* Initialise this rank's shards with the model's init (same values as a one-rank init). */
void pp_init_params(struct pp *pp, uint64_t seed);
/* The layout's engine (parallel/engine.h): a step over n_micro micro-batches of micro_rows x
 * T tokens laid out one after another (the rank's rows; engine_step_in.accum is not read)
 * runs pp->step: the gathers, the rank's actions with their transfers, the reduce-scatters,
 * CLIP over all stages, AdamW. */
void pp_engine(struct pp *pp, struct engine *e);
/* The validation loss of one batch laid out as a step's (n_micro micro-batches of
 * micro_rows x T, this rank's rows), run as the forward-only schedule: the mean over every
 * data-parallel rank's rows, the same on every rank; *sum and *valid (may be NULL) its loss
 * sum and valid tokens over them (to combine batches). Leaves the training state as it was. */
double pp_eval_loss(struct pp *pp, const int32_t *tokens, const int32_t *targets, double *sum,
                    int64_t *valid);
/* The family's state (MoE's balancing bias) as pp_opts.state_model holds it, into every
 * stage model built so far (a step's and an evaluation's start: after a checkpoint's load or
 * the last step's update); nothing without a state model. */
void pp_pull_state(struct pp *pp);
/* Where this rank's rows of table tensor i live (false: the tensor is on another stage). */
bool pp_local_rows(const struct pp *pp, int i, int64_t *row0, int64_t *nrows, int64_t *at);
/* The full flat parameter buffer (table layout) on every rank (tests, export); under expert
 * parallelism the global table's layout (every expert tensor whole: its ep pieces in ep
 * rank order). */
void pp_gather_full(struct pp *pp, float *out);
/* The step's cost model (parallel/pp_cost.c): cm calibrated at the stages' shapes (the
 * rates, median over ranks), the stage link measured, and the prediction of the step from
 * every pipeline rank's schedule nodes. Collective over the mesh. CT_ERR_USAGE (warned) where
 * not modelled: tensor parallelism inside the stages, a family without a cost model. */
struct sched_cost_model;
struct sched_pp_link;
struct sched_pp_prediction;
int pp_cost_model(struct pp *pp, struct comm_stream *stream, struct sched_cost_model *cm,
                  struct sched_pp_link *link, struct sched_pp_prediction *pred);
/* The prediction alone, under a given cost model and link. */
void pp_predict(const struct pp *pp, const struct sched_cost_model *cm,
                const struct sched_pp_link *link, struct sched_pp_prediction *pred);
/* Measured idle fraction of the last step on this rank: 1 - compute time / the span from its
 * first action to its last send's completion (waits for transfers are idle time). */
double pp_measured_bubble(const struct pp *pp);
/* Seconds the last step waited for transfers (its exposed communication). */
double pp_wait_seconds(const struct pp *pp);

#endif
