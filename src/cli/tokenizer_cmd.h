/* cli/tokenizer_cmd: `ctitan tokenizer train | encode | decode | info`.
 *
 * cmd_tokenizer takes the arguments after `tokenizer` (argv[0] is the subcommand) and returns
 * the process exit code: 0 success, 1 runtime failure, 2 bad usage.
 */
#ifndef CT_CLI_TOKENIZER_CMD_H
#define CT_CLI_TOKENIZER_CMD_H

int cmd_tokenizer(int argc, char **argv);

#endif
