/* base/mem_timeline: the memory snapshot, a timeline of tracked memory by category.
 *
 * While recording, every change base/mem counts (each mem_alloc and mem_free) appends a
 * sample: the time, the bytes of every category after the change, and the current label, the
 * schedule node (or pipeline action) running then, which the executors set with
 * mem_timeline_label. Samples go to a ring of MEM_TIMELINE_CAP entries (the oldest are
 * overwritten, and counted as dropped); the ring's buffer is plain malloc, not tracked.
 *
 * A window (one training step) starts at mem_window_begin (base/mem), which restarts mem.c's
 * window peak and samples the state at that moment; mem_timeline_write_window writes the window's
 * samples, closed by one of the state at its end, as JSON:
 *     {"rank", "step", "reason": "step", "categories": [names], "peak_total_bytes" (mem.c's
 *      peak over the window), "run_peak_total_bytes", "dropped_samples",
 *      "samples": [{"t": seconds since the window began, "node": label,
 *                   "bytes": [per category]}, ...]}
 * into FOLDER/iteration_<step>/rank<r>_memory_snapshot.json. When mem_alloc fails, mem.c
 * calls mem_timeline_alloc_failed, which writes every sample the ring holds (reason
 * "alloc_failure", with "failed_alloc": {category, bytes, node}, closed by a sample of the
 * state at the failure) into
 * FOLDER/iteration_<step>_exit/ before the job aborts.
 *
 * Samples are taken under mem.c's lock, so each one's categories add up to the tracked total
 * at that instant, whichever thread allocates.
 */
#ifndef CT_BASE_MEM_TIMELINE_H
#define CT_BASE_MEM_TIMELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/mem.h"

#define MEM_TIMELINE_CAP 32768

/* Start recording; FOLDER (which must exist) receives the files, named with RANK. */
int mem_timeline_start(const char *folder, int rank);
void mem_timeline_stop(void);
bool mem_timeline_on(void);

/* The label of samples from now on (copied; at most 47 bytes kept). No-op when off. */
void mem_timeline_label(const char *label);
/* The step a failure dump is named after (0: before the first step). */
void mem_timeline_set_step(int64_t step);

/* Write the window begun by the last mem_window_begin; CT_OK or CT_ERR_RUNTIME naming the
 * file. The path written is copied into path_out (if not NULL). */
int mem_timeline_write_window(int64_t step, char *path_out, size_t path_cap);

/* ---- for base/mem, under its lock */
void mem_timeline_sample_locked(const int64_t cur[MEM_CAT_COUNT]);
void mem_timeline_mark_locked(const int64_t cur[MEM_CAT_COUNT]);
/* mem_alloc could not get BYTES for CAT: write what the ring holds (takes the lock). */
void mem_timeline_alloc_failed(enum mem_cat cat, size_t bytes);

#endif
