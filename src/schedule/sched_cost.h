/* schedule/sched_cost: the cost model — predicts the timeline, peak memory and exposed
 * communication of any schedule without running it.
 *
 * Compute: each unit's forward, backward and recompute FLOPs (from the model's shapes and the
 * activation-checkpointing mode) over a rate per kernel kind (matmul, attention), measured at
 * start-up (sgemm and the attention kernel at the model's shapes) or, for planning, the
 * target's peak FLOP/s times an efficiency. Communication: latency + wire bytes / bandwidth
 * for all-gather and reduce-scatter, calibrated at start-up by timing a few sizes on the comm
 * stream (all ranks use the median over ranks, so they pick the same schedule) or given.
 *
 * The timeline has two resources, the compute thread and the comm stream (FIFO): a collective
 * starts when issued and the stream is free; a WAIT stalls compute until it ends (that stall
 * is exposed communication); without a progress thread a collective runs at issue, all of
 * it exposed. Memory mirrors parallel/fsdp: persistent shards, moments, activations by mode,
 * and pools of largest-bucket-sized buffers whose count is the schedule's peak in use.
 */
#ifndef CT_SCHEDULE_SCHED_COST_H
#define CT_SCHEDULE_SCHED_COST_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/stream.h"
#include "model/llama.h"
#include "schedule/schedule.h"

struct sched_cost_model {
	/* hardware */
	double matmul_flops;             /* FLOP/s of sgemm at the model's shapes */
	double attn_flops;               /* FLOP/s of the attention kernel */
	double mem_bytes_s;              /* copy bandwidth (copy-in/out, bf16 casts, AdamW) */
	double ag_latency_s, ag_bytes_s; /* all-gather: time = latency + wire bytes / rate */
	double rs_latency_s, rs_bytes_s;
	bool overlap; /* collectives progress during compute (comm.progress = thread) */
	/* model and layout */
	int n_units;
	double *fwd_mm, *fwd_attn, *bwd_mm, *bwd_attn, *rec_mm, *rec_attn; /* FLOPs per unit */
	int64_t dp_shard;
	int64_t ag_elem_bytes; /* 2 for bf16 all-gather, 4 for fp32 */
	int64_t act_elem_bytes;
	int64_t full_elem_bytes; /* gathered parameters and unsharded gradients: 4 here (the CPU
	                            computes in fp32); 2 when planning bf16 compute */
	/* persistent memory per rank (bytes) */
	int64_t params_bytes, grads_bytes, optim_bytes, act_bytes, other_bytes;
};

struct sched_prediction {
	double step_s, compute_s, comm_s, exposed_s;
	int64_t peak_bytes; /* persistent + pools */
	int64_t full_params_bytes, full_grads_bytes, comm_bytes;
	int64_t n_collectives;
};

/* Units of a Llama table sharded dim-0 over dp_shard ranks (chunk = ceil(rows / dp_shard),
 * padded): what fsdp_sched_units gives, without building anything. */
void sched_units_from_table(const struct param_table *t, int64_t dp_shard, struct sched_unit *out);

/* Fill the model-dependent parts: per-unit FLOPs of a (B, T) micro-batch and activation
 * bytes under `ac` (act_elem_bytes per activation element), shard sizes of s's units, the
 * all-gather dtype. Rates and latencies are left for the caller (or sched_cost_calibrate). */
void sched_cost_init(struct sched_cost_model *cm, const struct llama_config *c, int64_t B,
                     int64_t T, const struct sched *s, int64_t dp_shard, bool bf16_gather,
                     enum model_ac ac, int64_t act_elem_bytes);
void sched_cost_free(struct sched_cost_model *cm);

/* Activation bytes a model with these shapes allocates under `ac` (saved activations plus
 * backward scratch), elem_bytes per element: what MEM_ACTIVATIONS peaks at. */
int64_t sched_cost_activation_bytes(const struct llama_config *c, int64_t B, int64_t T,
                                    enum model_ac ac, int64_t elem_bytes);

/* Measure compute rates here and collective latency/bandwidth on `stream` over `group`
 * (a few sizes, fastest of a few runs each), then take the median over `world` so every rank
 * holds the same model. Collective calls on world and group: all ranks must call it. */
struct comm_group;
void sched_cost_calibrate(struct sched_cost_model *cm, const struct llama_config *c, int64_t B,
                          int64_t T, struct comm_stream *stream, const struct comm_group *group,
                          const struct comm_group *world);

/* Predict s's step. node_t (2 * n_nodes: start, end on the compute thread) may be NULL. */
void sched_predict(const struct sched *s, const struct sched_cost_model *cm,
                   struct sched_prediction *p, double *node_t);

#endif
