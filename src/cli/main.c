/* ctitan: command-line entry point. Dispatches subcommands; maps error codes to exit codes
 * (0 success, 1 runtime failure, 2 bad usage or configuration). */
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "cli/export_cmd.h"
#include "cli/generate_cmd.h"
#include "cli/launch_cmd.h"
#include "cli/plan_cmd.h"
#include "cli/plot_cmd.h"
#include "cli/prepare_cmd.h"
#include "cli/tokenizer_cmd.h"
#include "cli/trace_comm_cmd.h"
#include "comm/comm.h"
#include "io/config.h"
#include "model/model.h"
#include "train/trainer.h"

#define CTITAN_VERSION "0.1.0"

static void usage(FILE *f)
{
	fprintf(f,
	        "ctitan %s: distributed LLM training in C\n\n"
	        "usage: ctitan <command> [args]\n\n"
	        "commands:\n"
	        "  train CONFIG.toml [--section.key=value | --section.key value ...]\n"
	        "        train a model; `ctitan train --help` lists every config key\n"
	        "  tokenizer train --vocab-size N --input FILES... --out PATH\n"
	        "        train a byte-level BPE tokenizer (also: encode, decode)\n"
	        "  prepare --tokenizer PATH --input FILES_OR_DIRS... --out DIR\n"
	        "        tokenize text into token shards (training.dataset_path)\n"
	        "  generate CONFIG.toml [--section.key=value ...] [--prompt-ids IDS ...]\n"
	        "  generate --checkpoint DIR [--prompt-ids IDS | --prompt TEXT ...]\n"
	        "        sample from the newest checkpoint of a run (or the checkpoint DIR,\n"
	        "        which carries its config); `ctitan generate --help` lists the options\n"
	        "  export CHECKPOINT OUT_DIR\n"
	        "        a Llama checkpoint as Hugging Face model.safetensors + config.json\n"
	        "  plan CONFIG.toml [--section.key=value ...] --world-size N\n"
	        "        the step's schedule, predicted step time, memory and exposed\n"
	        "        communication on N ranks of the configured hardware\n"
	        "  plot RUN_DIR [--out DIR]\n"
	        "        loss, learning-rate, throughput and memory charts (PNG) of a run\n"
	        "  trace-comm DIR\n"
	        "        after a hang: match every rank's flight recorder dump (DIR/comm_traces)\n"
	        "        and name the first collective some rank never joined, and mismatches\n"
	        "  launch [-n N] [--hostfile F] [--nnodes MIN:MAX] [--max-restarts K] COMMAND...\n"
	        "        run COMMAND on MPI ranks (mpiexec) and supervise it: the job ends as a\n"
	        "        whole; elastic restarts on the hosts that answer\n"
	        "  help  this text\n\n"
	        "exit codes: 0 success, 1 runtime failure, 2 bad usage or configuration\n",
	        CTITAN_VERSION);
}

static int log_level_from(const char *s)
{
	static const char *const names[] = {"debug", "info", "warning", "error"};
	for (int i = 0; i < LOG_LEVEL_COUNT; i++)
		if (strcmp(s, names[i]) == 0)
			return i;
	return LOG_INFO;
}

static int cmd_train_config(struct ct_config *cfg, int argc, char **argv);

static int cmd_train(int argc, char **argv)
{
	for (int i = 0; i < argc; i++)
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			printf("usage: ctitan train CONFIG.toml [--section.key=value ...]\n\n");
			config_print_help(stdout);
			return 0;
		}
	if (argc < 1 || strncmp(argv[0], "--", 2) == 0) {
		fprintf(stderr, "ctitan train: missing CONFIG.toml (see ctitan train --help)\n");
		return 2;
	}
	struct ct_config cfg;
	config_defaults(&cfg);
	int rc = comm_init(&argc, &argv);
	if (rc)
		return ct_exit_code(rc);
	rc = cmd_train_config(&cfg, argc, argv);
	comm_finalize();
	return ct_exit_code(rc);
}

/* Everything after MPI is up; returns a ct_err code. */
static int cmd_train_config(struct ct_config *cfg, int argc, char **argv)
{
	int rc = config_load_file(cfg, argv[0]);
	if (!rc)
		rc = config_apply_args(cfg, argc - 1, argv + 1);
	if (!rc)
		rc = config_validate(cfg);
	if (rc)
		return rc;
	log_set_level((enum log_level)log_level_from(cfg->job.log_level));
	if (cfg->job.print_config) {
		if (comm_world_rank() == 0) {
			cfg->job.print_config = false; /* the printed file trains when run */
			config_print(cfg, stdout);
		}
		return CT_OK;
	}
	return trainer_run(cfg);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	const char *cmd = argv[1];
	model_config_schema_init(); /* the families' [model] keys and presets */
	if (strcmp(cmd, "train") == 0)
		return cmd_train(argc - 2, argv + 2);
	if (strcmp(cmd, "generate") == 0)
		return cmd_generate(argc - 2, argv + 2);
	if (strcmp(cmd, "prepare") == 0)
		return cmd_prepare(argc - 2, argv + 2);
	if (strcmp(cmd, "tokenizer") == 0)
		return cmd_tokenizer(argc - 2, argv + 2);
	if (strcmp(cmd, "plan") == 0)
		return cmd_plan(argc - 2, argv + 2);
	if (strcmp(cmd, "plot") == 0)
		return cmd_plot(argc - 2, argv + 2);
	if (strcmp(cmd, "launch") == 0)
		return cmd_launch(argc - 2, argv + 2);
	if (strcmp(cmd, "export") == 0)
		return cmd_export(argc - 2, argv + 2);
	if (strcmp(cmd, "trace-comm") == 0)
		return cmd_trace_comm(argc - 2, argv + 2);
	if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
		usage(stdout);
		return 0;
	}
	if (strcmp(cmd, "--version") == 0) {
		printf("ctitan %s\n", CTITAN_VERSION);
		return 0;
	}
	fprintf(stderr, "ctitan: unknown command '%s'\n\n", cmd);
	usage(stderr);
	return 2;
}
