/* schedule/pp_schedule: pipeline-parallel schedules as data.
 *
 * A pipeline schedule is, for each of the p pipeline ranks, a list of actions in program
 * order: the forward (F) or backward (B) of micro-batch m on stage s, or for zero-bubble
 * schedules the backward split into its input-gradient (I) and weight-gradient (W) parts,
 * and the point-to-point transfers between stages: SEND_F / RECV_F carry stage s's output
 * activation to stage s+1, SEND_B / RECV_B carry stage s's input gradient to stage s-1
 * (RECV_F on stage s receives its input, RECV_B on stage s the gradient of its output).
 * The model is cut into S = p x v stages; stage s lives on rank s % p (v > 1: interleaved,
 * Megatron's "virtual stages").
 *
 * Generators: GPipe (all forwards, then all backwards), 1F1B (warm-up of p - r - 1 forwards,
 * then one forward / one backward), Interleaved1F1B (Megatron's interleaved order; micro-batch
 * count a multiple of p) and ZeroBubbleH1 (ZB-H1: 1F1B's memory, the weight-gradient part
 * deferred into the bubbles; chosen by a greedy list scheduler over unit-time actions). A
 * schedule may also come from a CSV in TorchTitan's pipeline_parallel_schedule_csv format:
 * one row per rank, one action per cell ("0F3", "1B0", "2I1", "2W1", "1SEND_F0",
 * "2RECV_F0", ...; an empty cell is an idle slot); without SEND/RECV cells the transfers are
 * inserted (pp_sched_add_comms).
 *
 * The checker (pp_sched_check) proves what the executor relies on: every compute action of
 * every (stage, micro-batch) exactly once on the stage's rank, in dependency order; every
 * send has exactly one matching receive and the reverse; and a unit-time simulation (F = 1,
 * B = 2, I = W = 1, transfers free; sends never block, a receive waits for its send) runs to
 * the end without deadlock. The simulation also yields each rank's idle fraction (the bubble)
 * and peak number of in-flight micro-batches (forward done, activations not yet freed by B
 * or W): the prediction the executor's measurement is tested against.
 *
 * A forward-only schedule (pp_sched_forward_only: the validation loss) has F actions and
 * their SEND_F / RECV_F only: each rank runs micro-batch after micro-batch, each through its
 * stages in order, so every rank's list is sorted by (micro-batch, stage), one topological
 * order of all forwards: no wait, not even a send's before its buffer is reused, can wait on
 * a later action (parallel/pp.c relies on it); the checker then asks for every (stage,
 * micro-batch)'s F once and no backward at all.
 */
#ifndef CT_SCHEDULE_PP_SCHEDULE_H
#define CT_SCHEDULE_PP_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum pp_kind { PP_F, PP_B, PP_I, PP_W, PP_SEND_F, PP_RECV_F, PP_SEND_B, PP_RECV_B, PP_KIND_COUNT };

enum pp_style { PP_GPIPE, PP_1F1B, PP_INTERLEAVED_1F1B, PP_ZB_H1, PP_CSV, PP_STYLE_COUNT };

struct pp_action {
	enum pp_kind kind;
	int stage, micro;
};

struct pp_sched {
	enum pp_style style;
	int p, v, n_stages, n_micro; /* n_stages = p * v */
	int *n;                      /* p: actions per rank */
	struct pp_action **a;        /* p lists */
	int *cap;
	bool forward_only; /* F and forward transfers only (pp_sched_forward_only) */
};

/* What the unit-time simulation found. */
struct pp_sim {
	double makespan;    /* time until the last rank finishes */
	double *busy;       /* p: compute time per rank */
	int *peak_inflight; /* p: most micro-batch x stage activations held at once */
	double bubble;      /* max over ranks of idle / makespan */
};

const char *pp_kind_name(enum pp_kind k);
const char *pp_style_name(enum pp_style s);
/* TorchTitan's names, case-insensitive: GPipe, 1F1B, Interleaved1F1B, ZeroBubbleH1 (ZBH1).
 * CT_ERR_USAGE naming parallelism.pipeline_parallel_schedule otherwise. */
int pp_style_parse(const char *name, enum pp_style *out);
/* Whether the style has stages split in p x v with v > 1 allowed / the backward split. */
bool pp_style_interleaved(enum pp_style s);
bool pp_style_split_backward(enum pp_style s);

/* Generate the compute order of `style` for p ranks, v stages per rank and m micro-batches,
 * with the transfers inserted. CT_ERR_USAGE (message naming the key) if the combination is
 * not usable: v != 1 for a non-interleaved style, m not a multiple of p for Interleaved1F1B. */
int pp_sched_generate(struct pp_sched *s, enum pp_style style, int p, int v, int m);
/* The forward-only schedule over the same p x v stages and m micro-batches (above); style
 * names the training schedule it evaluates (printing). CT_ERR_USAGE if p, v or m < 1. */
int pp_sched_forward_only(struct pp_sched *s, enum pp_style style, int p, int v, int m);
void pp_sched_free(struct pp_sched *s);
/* Insert RECV before and SEND after every compute action whose input / output crosses to
 * another rank (no-op for a schedule that already has transfers). */
void pp_sched_add_comms(struct pp_sched *s);
bool pp_sched_has_comms(const struct pp_sched *s);
int pp_stage_rank(const struct pp_sched *s, int stage);

/* Check and simulate (see above); sim may be NULL. False with the reason in why. */
bool pp_sched_check(const struct pp_sched *s, struct pp_sim *sim, char *why, size_t why_size);
void pp_sim_free(struct pp_sim *sim);
/* Simulate a checked schedule with durations dur[stage * PP_KIND_COUNT + kind] (seconds; NULL:
 * unit time) and every transfer taking xfer_s (planning). False on deadlock. */
bool pp_sched_simulate(const struct pp_sched *s, const double *dur, double xfer_s,
                       struct pp_sim *sim, char *why, size_t why_size);
/* Idle fraction theory for the style: (p-1)/(m+p-1) for GPipe and 1F1B,
 * (p-1)/(v*m+p-1) for Interleaved1F1B (the bubble divided by v), (p-1)/(3m+p-1) for ZB-H1
 * (one third of 1F1B's bubble time). */
double pp_bubble_theory(enum pp_style style, int p, int v, int m);

/* "0F3"-style text of an action (buf >= 32 bytes). */
void pp_action_str(const struct pp_action *a, char *buf, size_t size);
/* One line per rank: its actions in order. */
void pp_sched_print(const struct pp_sched *s, FILE *f);
/* Read a CSV schedule for p ranks and m micro-batches (v derived from the stages used).
 * CT_ERR_USAGE naming the file, row and cell on a bad cell, a stage on the wrong rank, or a
 * schedule that does not check (unmatched send, deadlock, missing action). */
int pp_sched_read_csv(struct pp_sched *s, const char *path, int p, int m);
/* Write s as CSV (compute and transfers). */
int pp_sched_write_csv(const struct pp_sched *s, const char *path);

#endif
