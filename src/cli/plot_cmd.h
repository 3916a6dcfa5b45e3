/* cli/plot_cmd: `ctitan plot RUN_DIR` — PNG charts of a run's metrics.jsonl via gnuplot. */
#ifndef CT_CLI_PLOT_CMD_H
#define CT_CLI_PLOT_CMD_H

/* Returns an exit code (0, 1 runtime, 2 usage). */
int cmd_plot(int argc, char **argv);

#endif
