#include "base/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem_timeline.h"

static int64_t mem_cur[MEM_CAT_COUNT];
static int64_t mem_max[MEM_CAT_COUNT];
static int64_t mem_tot_cur, mem_tot_max;
static int64_t mem_win_max; /* peak of the total since mem_window_begin */

static const char *const mem_names[] = {"params",      "grads",      "optimizer",
                                        "full_params", "full_grads", "activations",
                                        "comm",        "checkpoint", "other"};
_Static_assert(sizeof(mem_names) / sizeof(mem_names[0]) == MEM_CAT_COUNT, "one name per category");

const char *mem_cat_name(enum mem_cat cat)
{
	return mem_names[cat];
}

void *mem_alloc(enum mem_cat cat, size_t bytes)
{
	size_t rounded = (bytes + 63) & ~(size_t)63;
	void *p = NULL;
	if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0) {
		mem_timeline_alloc_failed(cat, bytes); /* the memory snapshot, if recording */
		CHECK(false, "out of memory allocating %zu bytes for %s", bytes, mem_names[cat]);
	}
	memset(p, 0, rounded);
	/* one lock for the counters, the peaks and the timeline's sample, so a sample's
	 * categories add up to the total at that instant */
#pragma omp critical(mem_peak)
	{
		mem_cur[cat] += (int64_t)bytes;
		if (mem_cur[cat] > mem_max[cat])
			mem_max[cat] = mem_cur[cat];
		mem_tot_cur += (int64_t)bytes;
		if (mem_tot_cur > mem_tot_max)
			mem_tot_max = mem_tot_cur;
		if (mem_tot_cur > mem_win_max)
			mem_win_max = mem_tot_cur;
		mem_timeline_sample_locked(mem_cur);
	}
	return p;
}

void mem_free(enum mem_cat cat, void *p, size_t bytes)
{
	if (!p)
		return;
	free(p);
#pragma omp critical(mem_peak)
	{
		mem_cur[cat] -= (int64_t)bytes;
		mem_tot_cur -= (int64_t)bytes;
		mem_timeline_sample_locked(mem_cur);
	}
}

void mem_window_begin(void)
{
#pragma omp critical(mem_peak)
	{
		mem_win_max = mem_tot_cur;
		mem_timeline_mark_locked(mem_cur);
	}
}

int64_t mem_window_peak(void)
{
	return mem_win_max;
}

int64_t mem_current(enum mem_cat cat)
{
	return mem_cur[cat];
}
int64_t mem_peak(enum mem_cat cat)
{
	return mem_max[cat];
}
int64_t mem_total_current(void)
{
	return mem_tot_cur;
}
int64_t mem_total_peak(void)
{
	return mem_tot_max;
}

void mem_reset_peaks(void)
{
	for (int c = 0; c < MEM_CAT_COUNT; c++)
		mem_max[c] = mem_cur[c];
	mem_tot_max = mem_tot_cur;
}

static int64_t mem_status_kb(const char *key)
{
	FILE *f = fopen("/proc/self/status", "r");
	if (!f)
		return -1;
	char line[256];
	int64_t kb = -1;
	size_t n = strlen(key);
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, key, n) == 0) {
			kb = strtoll(line + n, NULL, 10);
			break;
		}
	}
	fclose(f);
	return kb;
}

int64_t mem_rss_bytes(void)
{
	int64_t kb = mem_status_kb("VmRSS:");
	return kb < 0 ? -1 : kb * 1024;
}

int64_t mem_rss_peak_bytes(void)
{
	int64_t kb = mem_status_kb("VmHWM:");
	return kb < 0 ? -1 : kb * 1024;
}

int64_t mem_machine_bytes(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
	return pages > 0 && size > 0 ? (int64_t)pages * size : -1;
}
