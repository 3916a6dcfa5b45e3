/* train/mem_snapshot: [profiling] enable_memory_snapshot, the trainer's side of the memory
 * timeline (base/mem_timeline): recording from before the model is built, the window of the
 * snapshotted steps, and where the files go.
 *
 * Which steps: with profiling.enable_profiling, every profile_freq-th step (the steps that
 * get a trace, so the two line up); without it, the first step this run trains (where the
 * FSDP pools and the matmul engine's scratch are allocated: ctitan plans the rest of its
 * memory when it builds the model, so later steps change little). A step's window runs from
 * before its batch is read to after its optimizer update (and trace). An allocation failure at
 * any time after recording starts writes iteration_<step>_exit/ (base/mem_timeline). */
#ifndef CT_TRAIN_MEM_SNAPSHOT_H
#define CT_TRAIN_MEM_SNAPSHOT_H

#include <stdint.h>

#include "io/config.h"

/* Creates <dump_folder>/<save_memory_snapshot_folder> and starts recording, if enabled. */
int mem_snapshot_open(const struct ct_config *cfg, int rank);
/* Around 1-based step `step` of the training loop. */
void mem_snapshot_step_begin(const struct ct_config *cfg, int64_t step);
int mem_snapshot_step_end(const struct ct_config *cfg, int64_t step);
void mem_snapshot_close(void);

#endif
