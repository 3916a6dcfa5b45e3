#include "train/mem_snapshot.h"

#include <stdbool.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/mem_timeline.h"
#include "train/metrics.h"

static int64_t ms_first; /* the first step of this run (0: none yet) */
static bool ms_window;   /* the current step is snapshotted */
static int ms_rank;

int mem_snapshot_open(const struct ct_config *cfg, int rank)
{
	ms_first = 0;
	ms_window = false;
	ms_rank = rank;
	if (!cfg->profiling.enable_memory_snapshot)
		return CT_OK;
	char dir[2100];
	snprintf(dir, sizeof(dir), "%s/%s", cfg->job.dump_folder,
	         cfg->profiling.save_memory_snapshot_folder);
	int rc = metrics_mkdirs(dir);
	return rc ? rc : mem_timeline_start(dir, rank);
}

void mem_snapshot_step_begin(const struct ct_config *cfg, int64_t step)
{
	if (!mem_timeline_on())
		return;
	if (!ms_first)
		ms_first = step;
	ms_window = cfg->profiling.enable_profiling ? step % cfg->profiling.profile_freq == 0
	                                            : step == ms_first;
	mem_timeline_set_step(step);
	/* one rank does not run the schedule executor: its samples are the step's */
	mem_timeline_label("step");
	if (ms_window)
		mem_window_begin();
}

int mem_snapshot_step_end(const struct ct_config *cfg, int64_t step)
{
	(void)cfg;
	if (!mem_timeline_on())
		return CT_OK;
	mem_timeline_label("between steps");
	if (!ms_window)
		return CT_OK;
	ms_window = false;
	char path[1200];
	int rc = mem_timeline_write_window(step, path, sizeof(path));
	if (!rc && ms_rank == 0)
		LOG_INFO("memory snapshot: wrote %s (tracked peak %.3f GiB in the step)", path,
		         (double)mem_window_peak() / (1024.0 * 1024.0 * 1024.0));
	return rc;
}

void mem_snapshot_close(void)
{
	mem_timeline_stop();
}
