/* cli/plan_cmd: `ctitan plan CONFIG [--section.key=value ...] --world-size N` — the step's
 * schedule after the passes, and the cost model's predicted step time, memory per rank and
 * exposed communication for the target in the config, without running anything. */
#ifndef CT_CLI_PLAN_CMD_H
#define CT_CLI_PLAN_CMD_H

int cmd_plan(int argc, char **argv);

#endif
