/* schedule/sched_cost: the cost model — predicts the timeline, peak memory and exposed
 * communication of any schedule without running it.
 *
 * Compute: a node's time is a sum of terms, each work / rate, kept per node kind (FWD, BWD,
 * RECOMPUTE) so new node kinds add rows: matmul FLOPs, attention FLOPs, elementwise bytes
 * (norms, RoPE, SwiGLU: memory-bandwidth bound), the fused output projection + cross-entropy
 * (FLOPs) and the embedding (bytes). The work is the model family's (model/model_cost.h:
 * from its shapes, the activation-checkpointing mode and the TP slice); the rates are measured
 * at start-up at the model's real shapes (sched_calib.c, running the family's calibration
 * kernels), or, for planning, the target's peak FLOP/s times an efficiency and
 * its memory bandwidth. Copies (collective copy-in/out, gradient zeroing), the clip norm and
 * AdamW are memory-bound terms of their own. Communication: latency + wire bytes / bandwidth
 * per collective kind, fitted over sizes at start-up or given.
 *
 * The timeline has two resources, the compute thread and the comm stream (FIFO): a collective
 * starts when issued and the stream is free; a WAIT stalls compute until it ends (that stall
 * is exposed communication); without a progress thread a collective runs at issue, all of it
 * exposed; with one, the comm thread's CPU time (copies, reductions: cpu latency + wire bytes
 * / cpu rate per kind, measured on the thread) is taken from compute in the measured share
 * (interference: 1 when the thread has no core of its own), repaid by the compute nodes after
 * the collective's issue at up to half their speed, or by a WAIT's stall, during which the
 * thread has the core. Memory mirrors parallel/fsdp: persistent
 * shards, moments, activations by mode, and pools of largest-bucket-sized buffers whose count
 * is the schedule's peak in use.
 */
#ifndef CT_SCHEDULE_SCHED_COST_H
#define CT_SCHEDULE_SCHED_COST_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/stream.h"
#include "model/model_cost.h"
#include "model/param_table.h"
#include "schedule/schedule.h"

/* Terms of a compute node's time (the family's, model/model_cost.h), and the node kinds that
 * carry per-unit work (a unit's passes). */
enum sched_term {
	SCHED_TERM_MATMUL = MODEL_COST_MATMUL, /* FLOPs */
	SCHED_TERM_ATTN = MODEL_COST_ATTN,     /* FLOPs */
	SCHED_TERM_ELEM = MODEL_COST_ELEM,     /* bytes: norms, RoPE, SwiGLU */
	SCHED_TERM_HEAD = MODEL_COST_HEAD,     /* FLOPs: output projection + cross-entropy, fused */
	SCHED_TERM_EMBED = MODEL_COST_EMBED,   /* bytes: embedding lookup / scatter */
	SCHED_TERM_COUNT = MODEL_COST_TERM_COUNT
};
enum sched_work {
	SCHED_WORK_FWD = MODEL_PASS_FWD,
	SCHED_WORK_BWD = MODEL_PASS_BWD,
	SCHED_WORK_REC = MODEL_PASS_REC,
	SCHED_WORK_COUNT = MODEL_PASS_COUNT
};

/* AdamW traffic per parameter: read p, g, m, v; write p, m, v (fp32). */
#define SCHED_OPTIM_BYTES 28.0

struct sched_cost_model {
	/* hardware: rate[kind][term] in FLOP/s or bytes/s; 0 falls back to the uniform figures
	 * below (matmul_flops for matmul and head, attn_flops, mem_bytes_s for bytes) */
	double rate[SCHED_WORK_COUNT][SCHED_TERM_COUNT];
	double matmul_flops;  /* FLOP/s of matmuls (the forward rate when calibrated) */
	double attn_flops;    /* FLOP/s of the attention kernel */
	double mem_bytes_s;   /* copy bandwidth (copy-in/out, bf16 casts, gradient zeroing) */
	double optim_bytes_s; /* AdamW at SCHED_OPTIM_BYTES per parameter; 0: mem_bytes_s */
	double interference;  /* share of the comm thread's CPU seconds that compute loses */
	double ag_latency_s, ag_bytes_s; /* all-gather: time = latency + wire bytes / rate */
	double rs_latency_s, rs_bytes_s;
	/* CPU seconds the comm thread spends per collective: latency + wire bytes / rate (rate
	 * 0: none modelled — a NIC's DMA, or a planned machine) */
	double ag_cpu_latency_s, ag_cpu_bytes_s, rs_cpu_latency_s, rs_cpu_bytes_s;
	/* tensor-parallel collectives (TP_* nodes, on the compute thread): time = latency + wire
	 * bytes / rate; an async-TP ring exposes one step of it plus what its matmul (at the
	 * matmul rate) does not cover. tp_bytes_s = 0: priced at nothing (no TP link known). */
	double tp_latency_s, tp_bytes_s;
	/* context parallelism's K/V transfers (the family's in-pass collectives, role CP, on the
	 * compute thread inside the attention segment): the cp group's link, time = steps x
	 * latency + bytes / rate; a ring step beside attention exposes what that attention (at
	 * the pass's attention rate) does not cover. cp_bytes_s = 0: priced at nothing. */
	double cp_latency_s, cp_bytes_s;
	/* expert parallelism's all-to-alls (role EP, blocking calls inside a MoE unit's pass):
	 * the ep group's link, time = latency + bytes sent / rate each, nothing hides them.
	 * ep_bytes_s = 0: priced at nothing. */
	double ep_latency_s, ep_bytes_s;
	struct model_prog *inner; /* [unit * SCHED_WORK_COUNT + pass]: those collectives, or NULL */
	bool overlap; /* collectives progress during compute (comm.progress = thread) */
	bool single;  /* one shard computed in place (parallel/fsdp, dp_shard = 1 in fp32): the
	                 schedule's collectives and their copies cost nothing, only compute,
	                 norm and AdamW */
	/* model and layout */
	int n_units;
	double *work[SCHED_WORK_COUNT][SCHED_TERM_COUNT]; /* per unit: FLOPs or bytes */
	int64_t dp_shard;
	int64_t ag_elem_bytes; /* 2 for bf16 all-gather, 4 for fp32 */
	double *ag_unit_esz;   /* per unit: wire bytes per shard element (fp8 all-gather mixes
	                          1-byte float8 weights with the rest), or NULL: ag_elem_bytes */
	int64_t act_elem_bytes;
	int64_t full_elem_bytes; /* gathered parameters and unsharded gradients: 4 here (the CPU
	                            computes in fp32); 2 when planning bf16 compute */
	int64_t full_twin_bytes; /* per gathered parameter, its bf16 compute copy: 2 when this
	                            process computes in bf16 (kernels/mm_engine.h), else 0 */
	/* persistent memory per rank (bytes) */
	int64_t params_bytes, grads_bytes, optim_bytes, act_bytes, other_bytes;
};

struct sched_prediction {
	double step_s, compute_s, comm_s, exposed_s;
	double comm_cpu_s; /* the comm thread's CPU seconds (overlap only) */
	double comm_cpu_paid_s; /* of which compute lost (interference), in step_s */
	double tp_s; /* tensor-parallel collectives on the compute thread (exposed: in step_s,
	                not in exposed_s, which is the FSDP collectives') */
	int64_t peak_bytes; /* persistent + pools */
	int64_t full_params_bytes, full_grads_bytes, comm_bytes;
	int64_t n_collectives;
	int64_t ag_wire_bytes; /* what this rank's all-gathers of the step send (its shards) */
	double cp_s;      /* context parallelism's transfers exposed in the passes (in step_s) */
	double cp_comm_s; /* their time on the wire */
	int64_t cp_wire_bytes; /* what this rank sends in them over the step */
	double ep_s;      /* expert parallelism's all-to-alls exposed (in step_s): in the passes,
	                     the blocking EP-A2A nodes, and what the posted dispatches' EP-WAIT
	                     nodes wait for after the shared expert */
	double ep_comm_s; /* their time on the wire */
	int64_t ep_wire_bytes; /* what this rank sends in them over the step */
	int64_t n_ep;          /* how many */
};

/* One tensor-parallel collective's time on the compute thread, and what it moves on the
 * wire (*comm_s, may be NULL). `work` picks the matmul rate that hides a ring. */
double sched_cost_tp_s(const struct sched_cost_model *cm, enum sched_work work,
                       const struct model_coll_desc *c, double *comm_s);

/* One program collective of the cp group (role MODEL_GROUP_CP, a CP_* node): its time on the
 * compute thread (ring steps: what the attention beside them does not hide; the ring
 * backward's dK/dV steps all of theirs), and its time on the wire (*comm_s, may be NULL). */
double sched_cost_cp_s(const struct sched_cost_model *cm, enum sched_work work,
                       const struct model_coll_desc *c, double *comm_s);

/* One in-pass all-to-all of the ep group (role MODEL_GROUP_EP): latency + bytes at the ep
 * link's rate, all of it in the pass. */
double sched_cost_ep_s(const struct sched_cost_model *cm, const struct model_coll_desc *c);

/* Unit u's in-pass (ep, a family's tp) collectives' time in pass k (0 without any). */
double sched_cost_inner_s(const struct sched_cost_model *cm, int u, enum sched_work k);
/* Unit u's program's cp collectives' time in pass k (s->units[u].prog; a pipeline stage's
 * passes, which run unlowered). */
double sched_cost_prog_cp_s(const struct sched *s, const struct sched_cost_model *cm, int u,
                            enum sched_work k);

/* One node's time under cm, and its terms (terms may be NULL). */
double sched_cost_node_s(const struct sched_cost_model *cm, enum sched_work k, int unit,
                         double terms[SCHED_TERM_COUNT]);

/* Units of a table sharded dim-0 over dp_shard ranks (chunk = ceil(rows / dp_shard),
 * padded): what fsdp_sched_units gives, without building anything. */
void sched_units_from_table(const struct param_table *t, int64_t dp_shard, struct sched_unit *out);

/* Fill the model-dependent parts from the family's figures (model/model_cost.h; c's family
 * must have a cost model): per-unit work of a micro-batch of sh (its B, T, activation
 * checkpointing, TP slice, sh->elem_bytes per activation element) and the activation bytes,
 * shard sizes of s's units, the all-gather dtype. Rates and latencies are left for the
 * caller (or sched_cost_calibrate). */
struct model_config;
void sched_cost_init(struct sched_cost_model *cm, const struct model_config *c,
                     const struct model_cost_shape *sh, const struct sched *s, int64_t dp_shard,
                     bool bf16_gather);
void sched_cost_free(struct sched_cost_model *cm);

/* The tensor-parallel link (cm->tp_*): the simulated one when sim_gbps > 0 (the model
 * stretches its TP collectives to it), else blocking all-gathers on `tp` fitted over 4
 * sizes, the median over `world`. Collective on tp and world: all ranks call it. */
void sched_cost_calibrate_tp(struct sched_cost_model *cm, const struct comm_group *tp,
                             const struct comm_group *world, double sim_gbps,
                             double sim_latency_us);
/* The same for the context-parallel link (cm->cp_*) on the cp group. */
void sched_cost_calibrate_cp(struct sched_cost_model *cm, const struct comm_group *cp,
                             const struct comm_group *world, double sim_gbps,
                             double sim_latency_us);
/* The same for the expert-parallel link (cm->ep_*) on the ep group. */
void sched_cost_calibrate_ep(struct sched_cost_model *cm, const struct comm_group *ep,
                             const struct comm_group *world, double sim_gbps,
                             double sim_latency_us);

/* Measure every rate here at the model's shapes (sched_calib.c: the family's calibration
 * kernels at sh's B x T tokens, capped for time, and its TP slice), collective latency and
 * bandwidth on `stream` over `group` (5 sizes), and, when `overlap` (a progress thread), the
 * interference; then take the median over `world` so every rank holds the same model. With
 * `turns`, ranks sharing cores time the compute parts one at a time and scale them by the
 * host's load (steps whose ranks do not compute in lockstep: a pipeline's).
 * Collective calls on world and group: all ranks must call it. */
struct comm_group;
void sched_cost_calibrate(struct sched_cost_model *cm, const struct model_config *c,
                          const struct model_cost_shape *sh, struct comm_stream *stream,
                          const struct comm_group *group, const struct comm_group *world,
                          bool overlap, bool turns);

/* Predict s's step. node_t (2 * n_nodes: start, end on the compute thread) may be NULL.
 * The step also pays zeroing the gradient shards before the first node. */
void sched_predict(const struct sched *s, const struct sched_cost_model *cm,
                   struct sched_prediction *p, double *node_t);

/* ---------------------------------------------------------------- pipelines (sched_cost_pp.c)
 * A pipeline step is every pipeline rank's node list (sched_build_pp) timed together: each
 * rank's nodes in order on its compute thread, a stage's F / B / I / W the sum of its units'
 * FWD, BWD + RECOMPUTE terms (I and W split a block's matmul term in halves), a WAIT on a
 * receive stalling until the matching SEND's data crossed the link (latency + bytes / rate,
 * one transfer at a time per rank on a serial link), the gathers and reduce-scatters on the
 * compute thread (parallel/pp runs them blocking, once per step), and CLIP meeting every rank
 * (its all-reduces) before OPTIM. The FSDP shard size is cm->dp_shard's. */
struct sched_pp_link {
	double latency_s, bytes_s;
	int64_t bytes; /* one stage boundary */
	bool serial;   /* a rank's sends queue on its link (the simulated one) */
	/* the host's demand for cores when all its ranks compute (ranks x threads / cores) while
	 * the compute rates were calibrated; above 1 the ranks share cores (0: not known, 1) */
	double host_load;
};
struct sched_pp_prediction {
	double step_s;     /* the slowest rank's end of OPTIM */
	double pipeline_s; /* the longest span from a rank's first action to its last send */
	double compute_s;  /* the busiest rank's F / B / I / W seconds */
	double bubble;     /* the most idle rank: 1 - compute / its span */
	double wait_s;     /* stalls on receives, all ranks */
	double fsdp_s;     /* rank 0's gathers and reduce-scatters (blocking) */
};
/* A pipeline compute node's seconds under cm. */
double sched_cost_pp_node_s(const struct sched *s, const struct sched_cost_model *cm,
                            const struct sched_node *n);
/* ranks: pp_size schedules of one pipeline (ranks[r] is rank r's). */
void sched_predict_pp(const struct sched *ranks, const struct sched_cost_model *cm,
                      const struct sched_pp_link *link, struct sched_pp_prediction *out);
/* The stage link: the simulated one (sim_gbps > 0), else one-way times of 8 bytes and of a
 * boundary between pipeline neighbours, the mean over `world`. Collective on pp and world. */
void sched_cost_calibrate_pp_link(struct sched_pp_link *link, const struct comm_group *pp,
                                  const struct comm_group *world, int64_t bytes,
                                  double sim_gbps, double sim_latency_us);

#endif
