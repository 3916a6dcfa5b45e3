/* train/metrics: the per-step console line and metrics.jsonl record, and the FLOP/s peak
 * that MFU is measured against. Names follow TorchTitan's metrics where they exist. */
#ifndef CT_TRAIN_METRICS_H
#define CT_TRAIN_METRICS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct step_metrics {
	int64_t step;     /* 1-based */
	double loss;      /* global average loss (sum of token losses / valid tokens) */
	double grad_norm; /* total norm before clipping */
	double lr;
	double step_s;       /* wall time of the step */
	double data_s;       /* time spent producing the batch */
	double comm_wait_s;  /* time blocked waiting for collectives (exposed communication) */
	int64_t tokens;      /* tokens processed by this rank in the step */
	int64_t tokens_seen; /* cumulative, all ranks */
	double tps;          /* tokens/s per rank */
	double tflops;       /* achieved TFLOP/s per rank */
	double mfu;          /* percent of peak (theoretical, or metrics.peak_tflops) */
	double engine_gflops; /* the matmul engine's measured rate at the model's shapes */
	double mfu_engine;    /* achieved model FLOP/s as a percent of engine_gflops */
	double val_loss;     /* validation loss of this step, < 0 when not evaluated */
	double checkpoint_s; /* training blocked by checkpointing after this step (a synchronous
	                        save, or an async save's snapshot and wait for the previous) */
	/* the model family's figures of the step (model_step_metrics; e.g. MoE's expert load) */
	const struct model_step_metric *model;
	int n_model;
};

struct tb_writer;
struct model_step_metric;

struct metrics {
	FILE *jsonl;          /* NULL: disabled */
	struct tb_writer *tb; /* TensorBoard event file; NULL: disabled */
	double flops_per_token;
	double peak_flops;
	bool tty;
};

int metrics_open(struct metrics *mt, const char *dump_folder, bool jsonl, bool append,
                 double flops_per_token, double peak_flops);
/* Also write each logged step as TensorBoard scalars into a new event file under
 * DUMP_FOLDER/FOLDER (created), after metrics_open. */
int metrics_open_tensorboard(struct metrics *mt, const char *dump_folder, const char *folder);
void metrics_close(struct metrics *mt);
/* On a terminal (rank 0), a progress line between logged steps: step k of N, time per step,
 * ETA. Elsewhere nothing. */
void metrics_progress(const struct metrics *mt, int64_t step, int64_t total, double step_s);
/* Fills tps/tflops/mfu from tokens and time, prints the console line, writes the record and
 * the TensorBoard scalars. */
void metrics_log_step(struct metrics *mt, struct step_metrics *s);
/* The step's metrics.jsonl record alone (no console line), e.g. again after a checkpoint save
 * with its checkpoint_s: a step may have several records, and the last one counts. */
void metrics_write_record(struct metrics *mt, const struct step_metrics *s);
/* mkdir -p */
int metrics_mkdirs(const char *path);

#endif
