/* base/mem: memory accounting by category, with peaks, plus process RSS.
 *
 * Every long-lived buffer is allocated through mem_alloc with a category, so the trainer can
 * report what each kind of state costs (params, grads, optimizer moments, activations, ...)
 * and the peak of each. Allocations are 64-byte aligned and zero-filled.
 */
#ifndef CT_BASE_MEM_H
#define CT_BASE_MEM_H

#include <stddef.h>
#include <stdint.h>

enum mem_cat {
	MEM_PARAMS,      /* master parameters (or this rank's shards) */
	MEM_GRADS,       /* gradients */
	MEM_OPTIM,       /* AdamW moments */
	MEM_FULL_PARAMS, /* gathered full parameters (FSDP) */
	MEM_FULL_GRADS,  /* unsharded gradients of a unit before its reduce-scatter (FSDP) */
	MEM_ACTIVATIONS, /* saved activations and backward scratch */
	MEM_COMM,        /* communication buffers */
	MEM_CHECKPOINT,  /* staging buffer of asynchronous checkpoint saves */
	MEM_OTHER,
	MEM_CAT_COUNT
};

void *mem_alloc(enum mem_cat cat, size_t bytes);
void mem_free(enum mem_cat cat, void *p, size_t bytes);

int64_t mem_current(enum mem_cat cat);
int64_t mem_peak(enum mem_cat cat);
int64_t mem_total_current(void);
int64_t mem_total_peak(void);
const char *mem_cat_name(enum mem_cat cat);
void mem_reset_peaks(void);
/* A window over which the total's peak is kept apart from the run's (e.g. one step for the
 * memory snapshot, base/mem_timeline, whose window it also begins when recording). */
void mem_window_begin(void);
int64_t mem_window_peak(void);

/* Resident set size of this process now and at its peak (VmHWM), in bytes; -1 if unknown. */
int64_t mem_rss_bytes(void);
int64_t mem_rss_peak_bytes(void);
/* Physical memory of the machine in bytes. */
int64_t mem_machine_bytes(void);

#endif
