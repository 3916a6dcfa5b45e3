/* cli/plot_memory: memory_timeline.png of `ctitan plot`, from the memory snapshots
 * ([profiling] enable_memory_snapshot) in a run folder: rank 0's tracked memory by category
 * over the last snapshotted step (or the allocation failure's iteration_<step>_exit), stacked,
 * with the schedule node running at the peak. */
#ifndef CT_CLI_PLOT_MEMORY_H
#define CT_CLI_PLOT_MEMORY_H

#include <stddef.h>
#include <stdio.h>

/* Finds the snapshot under FOLDER (RUN_DIR/memory_snapshot unless given), writes
 * OUT/memory_timeline.dat and the gnuplot commands for OUT/memory_timeline.png into gp, and
 * copies the PNG's path into png. Returns 1 when drawn, 0 when FOLDER holds no snapshot, or a
 * negative ct_err code (a snapshot that cannot be read, named). */
int plot_memory_timeline(FILE *gp, const char *folder, const char *out, char *png, size_t cap);

#endif
