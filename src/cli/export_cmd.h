/* cli/export_cmd: `ctitan export CHECKPOINT OUT_DIR` — Hugging Face Llama weights. */
#ifndef CT_CLI_EXPORT_CMD_H
#define CT_CLI_EXPORT_CMD_H

/* Returns an exit code (0, 1 runtime, 2 usage). */
int cmd_export(int argc, char **argv);

#endif
