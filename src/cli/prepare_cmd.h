/* cli/prepare_cmd: `ctitan prepare` — text files, folders or stdin into token shards. */
#ifndef CT_CLI_PREPARE_CMD_H
#define CT_CLI_PREPARE_CMD_H

/* Returns an exit code (0, 1 runtime, 2 usage). */
int cmd_prepare(int argc, char **argv);

#endif
