/* cli/generate_cmd: `ctitan generate` — sample from a trained checkpoint. */
#ifndef CT_CLI_GENERATE_CMD_H
#define CT_CLI_GENERATE_CMD_H

/* Returns an exit code (0, 1 runtime, 2 usage). Runs on one process. */
int cmd_generate(int argc, char **argv);

#endif
