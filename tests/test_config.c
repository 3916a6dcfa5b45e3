/* tests/test_config: io/config — defaults, files, command-line overrides, round trips, and
 * malformed inputs, each checked for CT_ERR_USAGE, for a message that names the place and
 * the key, and for leaving the config untouched.
 *
 * Error messages are captured by pointing fd 2 at a file around each call. Set
 * CT_TEST_VERBOSE=1 to see every captured message.
 */
#include "io/config.h"
#include "model/model.h"

#include "base/log.h"
#include "testutil.h"

#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp_dir[64];
static char msg[8192]; /* what the last captured call wrote to stderr */

static void tmp_path(char *buf, size_t n, const char *name)
{
	snprintf(buf, n, "%s/%s", tmp_dir, name);
}

static void write_bytes(const char *path, const char *text, size_t len)
{
	FILE *f = fopen(path, "wb");
	if (!f) {
		perror(path);
		abort();
	}
	fwrite(text, 1, len, f);
	fclose(f);
}

static void write_text(const char *path, const char *text)
{
	write_bytes(path, text, strlen(text));
}

/* ---- stderr capture ---- */

static int saved_fd = -1;

static void capture_begin(void)
{
	char path[128];
	tmp_path(path, sizeof(path), "stderr.txt");
	fflush(stderr);
	saved_fd = dup(2);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (saved_fd < 0 || fd < 0 || dup2(fd, 2) < 0) {
		perror("capture_begin");
		abort();
	}
	close(fd);
}

static void capture_end(void)
{
	char path[128];
	tmp_path(path, sizeof(path), "stderr.txt");
	fflush(stderr);
	dup2(saved_fd, 2);
	close(saved_fd);
	FILE *f = fopen(path, "rb");
	size_t n = f ? fread(msg, 1, sizeof(msg) - 1, f) : 0;
	msg[n] = '\0';
	if (f)
		fclose(f);
	if (getenv("CT_TEST_VERBOSE"))
		printf("    captured: %s", msg);
}

static void expect_words(const char *what, const char *const *words, int n)
{
	for (int i = 0; i < n && words[i]; i++)
		EXPECT(strstr(msg, words[i]), "%s: message lacks \"%s\": %s", what, words[i], msg);
}

static bool same_config(const struct ct_config *a, const struct ct_config *b)
{
	if (memcmp(a, b, sizeof(*a)) == 0)
		return true;
	fprintf(stderr, "  --- configs differ; first:\n");
	config_print(a, stderr);
	fprintf(stderr, "  --- second:\n");
	config_print(b, stderr);
	return false;
}

/* Loads text as a file on top of the defaults; rc of the load. */
static int load_text(struct ct_config *c, const char *name, const char *text)
{
	char path[128];
	tmp_path(path, sizeof(path), name);
	write_text(path, text);
	config_defaults(c);
	return config_load_file(c, path);
}

static void set_str(char *field, size_t size, const char *s)
{
	memset(field, 0, size);
	memcpy(field, s, strlen(s));
}
#define SET_STR(field, s) set_str((field), sizeof(field), (s))

/* ---------------------------------------------------------------------------------------- */

TEST_CASE(defaults_match_header)
{
	struct ct_config c;
	config_defaults(&c);
	EXPECT(strcmp(c.job.dump_folder, "./outputs") == 0, "dump_folder %s", c.job.dump_folder);
	EXPECT(strcmp(c.job.description, "") == 0, "description");
	EXPECT(c.job.print_config == false, "print_config");
	EXPECT(strcmp(c.job.log_level, "info") == 0, "log_level");
	EXPECT(strcmp(c.model.name, "llama3") == 0, "model.name");
	EXPECT(strcmp(c.model.flavor, "debugmodel") == 0, "flavor");
	EXPECT(c.model.vocab_size == -1, "vocab_size");
	EXPECT(c.model.rope_scaling == false, "rope_scaling");
	EXPECT(strcmp(c.optimizer.name, "AdamW") == 0, "optimizer.name");
	EXPECT(c.optimizer.lr == 8e-4, "lr %g", c.optimizer.lr);
	EXPECT(c.optimizer.beta1 == 0.9, "beta1");
	EXPECT(c.optimizer.beta2 == 0.95, "beta2");
	EXPECT(c.optimizer.eps == 1e-8, "eps");
	EXPECT(c.optimizer.weight_decay == 0.1, "weight_decay");
	EXPECT(c.lr_scheduler.warmup_steps == 200, "warmup_steps");
	EXPECT(c.lr_scheduler.decay_ratio == -1, "decay_ratio");
	EXPECT(strcmp(c.lr_scheduler.decay_type, "linear") == 0, "decay_type");
	EXPECT(c.lr_scheduler.min_lr_factor == 0.0, "min_lr_factor");
	EXPECT(c.training.local_batch_size == 8, "local_batch_size");
	EXPECT(c.training.global_batch_size == -1, "global_batch_size");
	EXPECT(c.training.seq_len == 2048, "seq_len");
	EXPECT(c.training.max_norm == 1.0, "max_norm");
	EXPECT(c.training.steps == 10000, "steps");
	EXPECT(strcmp(c.training.dataset, "synthetic") == 0, "dataset");
	EXPECT(strcmp(c.training.mixed_precision_param, "float32") == 0, "mp param");
	EXPECT(strcmp(c.training.mixed_precision_reduce, "float32") == 0, "mp reduce");
	EXPECT(c.parallelism.data_parallel_shard_degree == -1, "shard");
	EXPECT(c.parallelism.data_parallel_replicate_degree == 1, "replicate");
	EXPECT(c.parallelism.tensor_parallel_degree == 1, "tp");
	EXPECT(c.parallelism.pipeline_parallel_degree == 1, "pp");
	EXPECT(strcmp(c.parallelism.fsdp_reshard_after_forward, "default") == 0, "reshard");
	EXPECT(c.metrics.log_freq == 1, "log_freq");
	EXPECT(c.metrics.peak_tflops == 0.0, "peak_tflops");
	EXPECT(c.metrics.enable_jsonl == true, "enable_jsonl");
	EXPECT(c.debug.seed == 0, "seed");
	EXPECT(c.debug.deterministic == true, "deterministic");
	EXPECT(c.comm.timeout_seconds == 300 && strcmp(c.comm.progress, "inline") == 0, "comm");
	EXPECT(c.debug.fail_rank == -1 && c.debug.fail_step == 0, "fault injection off");
	EXPECT(config_validate(&c) == 0, "defaults validate");

	/* Defaults are a pure function of the schema, padding included. */
	struct ct_config d;
	memset(&d, 0x5a, sizeof(d));
	config_defaults(&d);
	EXPECT(memcmp(&c, &d, sizeof(c)) == 0, "defaults depend on prior contents");
}

/* Every key, set to a value that is not its default: the TOML spelling and the command-line
 * spelling of the same value. */
static const struct {
	const char *key, *toml, *cli;
} every_key[] = {
    {"job.dump_folder", "\"/tmp/run 1\"", "/tmp/run 1"},
    {"job.description", "'say \"hi\" #not a comment'", "say \"hi\" #not a comment"},
    {"job.print_config", "true", "true"},
    {"job.log_level", "\"warning\"", "warning"},
    {"model.name", "\"llama3x\"", "llama3x"},
    {"model.flavor", "\"8B\"", "8B"},
    {"model.vocab_size", "128_256", "128256"},
    {"model.rope_scaling", "true", "true"},
    {"model.tokenizer_path", "'tok.model'", "tok.model"},
    {"optimizer.name", "\"AdamW\"", "AdamW"},
    {"optimizer.lr", "3e-4", "3e-4"},
    {"optimizer.beta1", "0.85", "0.85"},
    {"optimizer.beta2", "0.999", "0.999"},
    {"optimizer.eps", "1E-10", "1E-10"},
    {"optimizer.weight_decay", "0", "0"},
    {"lr_scheduler.warmup_steps", "0", "0"},
    {"lr_scheduler.decay_ratio", "0.8", "0.8"},
    {"lr_scheduler.decay_type", "\"cosine\"", "cosine"},
    {"lr_scheduler.min_lr_factor", "1", "1"},
    {"training.local_batch_size", "+4", "+4"},
    {"training.global_batch_size", "64", "64"},
    {"training.seq_len", "8_192", "8192"},
    {"training.max_norm", "0.5", "0.5"},
    {"training.steps", "1_000_000", "1000000"},
    {"training.dataset", "'C:\\data\\tokens.bin'", "C:\\data\\tokens.bin"},
    {"training.dataset_path", "\"data/x\"", "data/x"},
    {"training.mixed_precision_param", "\"bfloat16\"", "bfloat16"},
    {"training.mixed_precision_reduce", "\"float32\"", "float32"},
    {"parallelism.data_parallel_shard_degree", "4", "4"},
    {"parallelism.data_parallel_replicate_degree", "2", "2"},
    {"parallelism.tensor_parallel_degree", "8", "8"},
    {"parallelism.pipeline_parallel_degree", "3", "3"},
    {"parallelism.fsdp_reshard_after_forward", "\"never\"", "never"},
    {"validation.enable", "true", "true"},
    {"validation.freq", "25", "25"},
    {"validation.steps", "3", "3"},
    {"checkpoint.enable", "true", "true"},
    {"checkpoint.folder", "\"ckpt\"", "ckpt"},
    {"checkpoint.interval", "7", "7"},
    {"checkpoint.keep_latest_k", "0", "0"},
    {"checkpoint.load_step", "12", "12"},
    {"activation_checkpoint.mode", "\"ffn\"", "ffn"},
    {"comm.progress", "\"thread\"", "thread"},
    {"comm.timeout_seconds", "12.5", "12.5"},
    {"metrics.log_freq", "10", "10"},
    {"metrics.peak_tflops", "989.5", "989.5"},
    {"metrics.enable_jsonl", "false", "false"},
    {"debug.seed", "9_223_372_036_854_775_807", "9223372036854775807"},
    {"debug.deterministic", "false", "false"},
    {"debug.fail_rank", "3", "3"},
    {"debug.fail_step", "7", "7"},
};
#define N_EVERY (sizeof(every_key) / sizeof(every_key[0]))

static void check_every_key_values(const struct ct_config *c)
{
	EXPECT(strcmp(c->job.dump_folder, "/tmp/run 1") == 0, "dump_folder '%s'",
	       c->job.dump_folder);
	EXPECT(strcmp(c->job.description, "say \"hi\" #not a comment") == 0, "description '%s'",
	       c->job.description);
	EXPECT(c->job.print_config == true, "print_config");
	EXPECT(strcmp(c->job.log_level, "warning") == 0, "log_level");
	EXPECT(strcmp(c->model.name, "llama3x") == 0, "model.name");
	EXPECT(strcmp(c->model.flavor, "8B") == 0, "flavor");
	EXPECT(c->model.vocab_size == 128256, "vocab_size %lld", (long long)c->model.vocab_size);
	EXPECT(c->model.rope_scaling == true, "rope_scaling");
	EXPECT(strcmp(c->model.tokenizer_path, "tok.model") == 0, "tokenizer_path");
	EXPECT(strcmp(c->optimizer.name, "AdamW") == 0, "optimizer.name");
	EXPECT(c->optimizer.lr == 3e-4, "lr");
	EXPECT(c->optimizer.beta1 == 0.85, "beta1");
	EXPECT(c->optimizer.beta2 == 0.999, "beta2");
	EXPECT(c->optimizer.eps == 1e-10, "eps");
	EXPECT(c->optimizer.weight_decay == 0, "weight_decay");
	EXPECT(c->lr_scheduler.warmup_steps == 0, "warmup_steps");
	EXPECT(c->lr_scheduler.decay_ratio == 0.8, "decay_ratio");
	EXPECT(strcmp(c->lr_scheduler.decay_type, "cosine") == 0, "decay_type");
	EXPECT(c->lr_scheduler.min_lr_factor == 1.0, "min_lr_factor");
	EXPECT(c->training.local_batch_size == 4, "local_batch_size");
	EXPECT(c->training.global_batch_size == 64, "global_batch_size");
	EXPECT(c->training.seq_len == 8192, "seq_len");
	EXPECT(c->training.max_norm == 0.5, "max_norm");
	EXPECT(c->training.steps == 1000000, "steps");
	EXPECT(strcmp(c->training.dataset, "C:\\data\\tokens.bin") == 0, "dataset '%s'",
	       c->training.dataset);
	EXPECT(strcmp(c->training.mixed_precision_param, "bfloat16") == 0, "mp param");
	EXPECT(strcmp(c->training.mixed_precision_reduce, "float32") == 0, "mp reduce");
	EXPECT(c->parallelism.data_parallel_shard_degree == 4, "shard");
	EXPECT(c->parallelism.data_parallel_replicate_degree == 2, "replicate");
	EXPECT(c->parallelism.tensor_parallel_degree == 8, "tp");
	EXPECT(c->parallelism.pipeline_parallel_degree == 3, "pp");
	EXPECT(strcmp(c->parallelism.fsdp_reshard_after_forward, "never") == 0, "reshard");
	EXPECT(strcmp(c->training.dataset_path, "data/x") == 0, "dataset_path");
	EXPECT(c->validation.enable && c->validation.freq == 25 && c->validation.steps == 3,
	       "validation keys");
	EXPECT(c->checkpoint.enable && strcmp(c->checkpoint.folder, "ckpt") == 0 &&
	           c->checkpoint.interval == 7 && c->checkpoint.keep_latest_k == 0 &&
	           c->checkpoint.load_step == 12,
	       "checkpoint keys");
	EXPECT(strcmp(c->activation_checkpoint.mode, "ffn") == 0, "ac mode");
	EXPECT(strcmp(c->comm.progress, "thread") == 0, "comm.progress");
	EXPECT(c->comm.timeout_seconds == 12.5, "comm.timeout_seconds");
	EXPECT(c->metrics.log_freq == 10, "log_freq");
	EXPECT(c->metrics.peak_tflops == 989.5, "peak_tflops");
	EXPECT(c->metrics.enable_jsonl == false, "enable_jsonl");
	EXPECT(c->debug.seed == INT64_MAX, "seed");
	EXPECT(c->debug.deterministic == false, "deterministic");
	EXPECT(c->debug.fail_rank == 3 && c->debug.fail_step == 7, "fault injection");
}

/* A file setting every key, in the table's spelling, sections in table order. */
static void every_key_file(char *buf, size_t n)
{
	size_t j = 0;
	char sec[64] = "";
	j += (size_t)snprintf(buf + j, n - j, "# every key\n");
	for (size_t i = 0; i < N_EVERY; i++) {
		const char *dot = strchr(every_key[i].key, '.');
		if (strncmp(sec, every_key[i].key, (size_t)(dot - every_key[i].key)) != 0 ||
		    sec[dot - every_key[i].key] != '\0') {
			snprintf(sec, sizeof(sec), "%.*s", (int)(dot - every_key[i].key),
			         every_key[i].key);
			j += (size_t)snprintf(buf + j, n - j, "\n[%s]\n", sec);
		}
		j += (size_t)snprintf(buf + j, n - j, "%s = %s\n", dot + 1, every_key[i].toml);
	}
}

TEST_CASE(full_file_parses)
{
	/* Hand-written, with the syntax we accept: comments, blank lines, indentation, tabs,
	 * CRLF, a BOM, literal and basic strings with escapes, signs, underscores, exponents,
	 * integers for floats, sections out of the usual order. */
	const char *text = "\xEF\xBB\xBF# a full config\n"
	                   "\n"
	                   "[debug]   # trailing comment\n"
	                   "seed = 42\n"
	                   "deterministic = false\n"
	                   "[job]\r\n"
	                   "dump_folder = \"out/\\\"q\\\"\\\\x\"\r\n"
	                   "description = \"tab\\there\\nnewline # not a comment\"\r\n"
	                   "print_config = true\r\n"
	                   "  log_level   =   'debug'  \r\n"
	                   "\t\n"
	                   "[model]\n"
	                   "name = \"llama3\"\n"
	                   "flavor = '405B'\n"
	                   "vocab_size = 1_000\n"
	                   "rope_scaling = true\n"
	                   "[optimizer]\n"
	                   "\tlr = 1.5e-3\n"
	                   "beta1 = 0\n"
	                   "beta2 = 0.5\n"
	                   "eps = 1e+2\n"
	                   "weight_decay = 2\n"
	                   "[lr_scheduler]\n"
	                   "warmup_steps = 10\n"
	                   "decay_ratio = 0.25\n"
	                   "decay_type = \"sqrt\"\n"
	                   "min_lr_factor = 0.1\n"
	                   "[training]\n"
	                   "local_batch_size = 2\n"
	                   "global_batch_size = 16\n"
	                   "seq_len = 128\n"
	                   "max_norm = 2.5\n"
	                   "steps = 10\n"
	                   "dataset = \"data/tokens.bin\"\n"
	                   "mixed_precision_param = \"bfloat16\"\n"
	                   "mixed_precision_reduce = \"float32\"\n"
	                   "[parallelism]\n"
	                   "data_parallel_shard_degree = -1\n"
	                   "data_parallel_replicate_degree = 2\n"
	                   "tensor_parallel_degree = 2\n"
	                   "pipeline_parallel_degree = 1\n"
	                   "fsdp_reshard_after_forward = \"always\"\n"
	                   "[metrics]\n"
	                   "log_freq = 5\n"
	                   "peak_tflops = 100\n"
	                   "enable_jsonl = false\n"
	                   "# the end, no newline";
	struct ct_config c;
	int rc = load_text(&c, "full.toml", text);
	EXPECT(rc == 0, "rc %d", rc);
	EXPECT(c.debug.seed == 42 && !c.debug.deterministic, "debug");
	EXPECT(strcmp(c.job.dump_folder, "out/\"q\"\\x") == 0, "dump_folder '%s'",
	       c.job.dump_folder);
	EXPECT(strcmp(c.job.description, "tab\there\nnewline # not a comment") == 0, "description");
	EXPECT(c.job.print_config && strcmp(c.job.log_level, "debug") == 0, "job");
	EXPECT(strcmp(c.model.flavor, "405B") == 0 && c.model.vocab_size == 1000 &&
	           c.model.rope_scaling,
	       "model");
	EXPECT(c.optimizer.lr == 1.5e-3 && c.optimizer.beta1 == 0 && c.optimizer.beta2 == 0.5 &&
	           c.optimizer.eps == 100 && c.optimizer.weight_decay == 2,
	       "optimizer");
	EXPECT(c.lr_scheduler.warmup_steps == 10 && c.lr_scheduler.decay_ratio == 0.25 &&
	           strcmp(c.lr_scheduler.decay_type, "sqrt") == 0 &&
	           c.lr_scheduler.min_lr_factor == 0.1,
	       "lr_scheduler");
	EXPECT(c.training.local_batch_size == 2 && c.training.global_batch_size == 16 &&
	           c.training.seq_len == 128 && c.training.max_norm == 2.5 &&
	           c.training.steps == 10 && strcmp(c.training.dataset, "data/tokens.bin") == 0 &&
	           strcmp(c.training.mixed_precision_param, "bfloat16") == 0,
	       "training");
	EXPECT(c.parallelism.data_parallel_shard_degree == -1 &&
	           c.parallelism.data_parallel_replicate_degree == 2 &&
	           c.parallelism.tensor_parallel_degree == 2 &&
	           strcmp(c.parallelism.fsdp_reshard_after_forward, "always") == 0,
	       "parallelism");
	EXPECT(c.metrics.log_freq == 5 && c.metrics.peak_tflops == 100 && !c.metrics.enable_jsonl,
	       "metrics");
	/* debug.deterministic = false parses but would do nothing: validation refuses it */
	EXPECT(config_validate(&c) != 0, "deterministic = false validates");
	c.debug.deterministic = true;
	EXPECT(config_validate(&c) == 0, "full file validates");

	/* The generated file with every key in the table. */
	char buf[8192];
	every_key_file(buf, sizeof(buf));
	rc = load_text(&c, "every.toml", buf);
	EXPECT(rc == 0, "every-key file rc %d", rc);
	check_every_key_values(&c);

	/* Empty and comment-only files change nothing. */
	struct ct_config d;
	config_defaults(&d);
	EXPECT(load_text(&c, "empty.toml", "") == 0 && same_config(&c, &d), "empty file");
	EXPECT(load_text(&c, "comments.toml", "# x\n\n   # y\r\n[job]\n") == 0 &&
	           same_config(&c, &d),
	       "comments only");
	/* Arrays parse wherever a value may be, even if no key takes one yet: only the type is
	 * wrong, which shows the whole array was read (the error names an array). */
	capture_begin();
	rc = load_text(
	    &c, "arr.toml",
	    "[training]\nsteps = [ [1, 2], ['a', \"b\"], [true, 1.5e3,],\n # c\n [],\n]\n");
	capture_end();
	EXPECT(rc == CT_ERR_USAGE && strstr(msg, "arr.toml:2:") && strstr(msg, "got an array"),
	       "nested array: %s", msg);
}

TEST_CASE(every_key_on_command_line)
{
	struct ct_config want, c;
	char buf[8192];
	every_key_file(buf, sizeof(buf));
	EXPECT(load_text(&want, "every.toml", buf) == 0, "load");

	/* All at once, --key=value. */
	char *argv[2 * N_EVERY];
	char eq_args[N_EVERY][700], key_args[N_EVERY][128];
	for (size_t i = 0; i < N_EVERY; i++) {
		snprintf(eq_args[i], sizeof(eq_args[i]), "--%s=%s", every_key[i].key,
		         every_key[i].cli);
		argv[i] = eq_args[i];
	}
	config_defaults(&c);
	EXPECT(config_apply_args(&c, (int)N_EVERY, argv) == 0, "--key=value");
	check_every_key_values(&c);
	EXPECT(same_config(&c, &want), "--key=value differs from the file");

	/* All at once, --key value. */
	for (size_t i = 0; i < N_EVERY; i++) {
		snprintf(key_args[i], sizeof(key_args[i]), "--%s", every_key[i].key);
		argv[2 * i] = key_args[i];
		argv[2 * i + 1] = (char *)every_key[i].cli;
	}
	config_defaults(&c);
	EXPECT(config_apply_args(&c, (int)(2 * N_EVERY), argv) == 0, "--key value");
	EXPECT(same_config(&c, &want), "--key value differs from the file");

	/* One at a time, both ways, against a file that sets just that key: each key lands in
	 * its own field and nowhere else. */
	for (size_t i = 0; i < N_EVERY; i++) {
		const char *dot = strchr(every_key[i].key, '.');
		char one[1024], path[128];
		snprintf(one, sizeof(one), "[%.*s]\n%s = %s\n", (int)(dot - every_key[i].key),
		         every_key[i].key, dot + 1, every_key[i].toml);
		tmp_path(path, sizeof(path), "one.toml");
		write_text(path, one);
		config_defaults(&want);
		EXPECT(config_load_file(&want, path) == 0, "%s: file", every_key[i].key);

		struct ct_config d;
		config_defaults(&d);
		if (strcmp(every_key[i].key, "optimizer.name") != 0 &&
		    strcmp(every_key[i].key, "training.mixed_precision_reduce") != 0)
			EXPECT(memcmp(&d, &want, sizeof(d)) != 0, "%s: value equals the default",
			       every_key[i].key);

		char *a1[1] = {eq_args[i]};
		config_defaults(&c);
		EXPECT(config_apply_args(&c, 1, a1) == 0, "%s: --key=value", every_key[i].key);
		EXPECT(same_config(&c, &want), "%s: --key=value", every_key[i].key);

		char *a2[2] = {key_args[i], (char *)every_key[i].cli};
		config_defaults(&c);
		EXPECT(config_apply_args(&c, 2, a2) == 0, "%s: --key value", every_key[i].key);
		EXPECT(same_config(&c, &want), "%s: --key value", every_key[i].key);
	}

	/* Later overrides win; the command line goes on top of a file. */
	char *later[] = {"--training.steps=5", "--training.steps", "7"};
	config_defaults(&c);
	EXPECT(config_apply_args(&c, 3, later) == 0 && c.training.steps == 7, "later wins");
	/* Negative numbers are values, not options; an empty string is a string. */
	char *neg[] = {"--model.vocab_size", "-1",    "--job.description", "",
	               "--optimizer.lr",     " 1e-3 "};
	c.model.vocab_size = 5;
	SET_STR(c.job.description, "x");
	EXPECT(config_apply_args(&c, 6, neg) == 0 && c.model.vocab_size == -1 &&
	           c.job.description[0] == '\0' && c.optimizer.lr == 1e-3,
	       "negative / empty / padded values");
	EXPECT(config_apply_args(&c, 0, NULL) == 0, "no arguments");
}

static void roundtrip(const struct ct_config *c, const char *what)
{
	char path[128];
	tmp_path(path, sizeof(path), "printed.toml");
	FILE *f = fopen(path, "w");
	config_print(c, f);
	fclose(f);
	struct ct_config back;
	config_defaults(&back);
	int rc = config_load_file(&back, path);
	EXPECT(rc == 0, "%s: printed config does not load (rc %d)", what, rc);
	EXPECT(same_config(&back, c), "%s: round trip changed the config", what);
}

static int64_t rand_i64(int64_t lo, int64_t hi)
{
	double u = test_uniform(0, 1);
	if (u < 0.1)
		return lo;
	if (u < 0.2)
		return hi;
	return lo + (int64_t)(test_uniform(0, 1) * (double)(hi - lo) * 0.5);
}

/* Positive doubles over many magnitudes, with the odd extreme. */
static double rand_pos(void)
{
	double u = test_uniform(0, 1);
	if (u < 0.05)
		return DBL_MAX;
	if (u < 0.1)
		return 5e-324; /* smallest denormal */
	if (u < 0.15)
		return DBL_MIN;
	return test_uniform(0.5, 1) * pow(10, floor(test_uniform(-30, 30)));
}

static double rand_unit(bool closed)
{
	double u = test_uniform(0, 1);
	if (u < 0.1)
		return 0.0;
	if (closed && u < 0.2)
		return 1.0;
	if (u < 0.3)
		return nextafter(1.0, 0.0);
	return test_uniform(0, 1);
}

static void rand_string(char *field, size_t size)
{
	static const char alphabet[] = "abcXYZ019 _-./\\\"'#=[]{},\t\n\r\b\f\xc3\xa9\xe2\x82\xac";
	size_t len = 1 + (size_t)test_uniform(0, test_uniform(0, 1) < 0.1 ? (double)size : 20);
	if (len > size - 1)
		len = size - 1;
	memset(field, 0, size);
	for (size_t i = 0; i < len; i++)
		field[i] = alphabet[(size_t)test_uniform(0, sizeof(alphabet) - 1)];
}

TEST_CASE(print_roundtrip)
{
	struct ct_config c;
	config_defaults(&c);
	roundtrip(&c, "defaults");

	char buf[8192];
	every_key_file(buf, sizeof(buf));
	EXPECT(load_text(&c, "every.toml", buf) == 0, "load");
	roundtrip(&c, "every key");

	/* Values set by code: awkward strings and floats that need all 17 digits. */
	static const char *const flavors[] = {"debugmodel", "125M", "1B", "8B", "70B", "405B"};
	static const char *const decays[] = {"linear", "sqrt", "cosine"};
	for (int it = 0; it < 300; it++) {
		config_defaults(&c);
		rand_string(c.job.dump_folder, sizeof(c.job.dump_folder));
		rand_string(c.job.description, sizeof(c.job.description));
		rand_string(c.model.name, sizeof(c.model.name));
		rand_string(c.training.dataset, sizeof(c.training.dataset));
		SET_STR(c.model.flavor, flavors[it % 6]);
		SET_STR(c.lr_scheduler.decay_type, decays[it % 3]);
		c.job.print_config = it & 1;
		c.model.rope_scaling = it & 2;
		c.metrics.enable_jsonl = it & 4;
		c.model.vocab_size = it % 5 == 0 ? -1 : rand_i64(1, INT64_MAX);
		c.optimizer.lr = rand_pos();
		c.optimizer.eps = rand_pos();
		c.training.max_norm = rand_pos();
		c.optimizer.beta1 = rand_unit(false);
		c.optimizer.beta2 = rand_unit(false);
		c.optimizer.weight_decay = it % 7 == 0 ? -0.0 : rand_pos();
		c.metrics.peak_tflops = it % 3 == 0 ? 0.0 : rand_pos();
		c.lr_scheduler.decay_ratio = it % 4 == 0 ? -1.0 : rand_unit(true);
		c.lr_scheduler.min_lr_factor = rand_unit(true);
		c.lr_scheduler.warmup_steps = rand_i64(0, INT64_MAX);
		c.training.steps = rand_i64(1, INT64_MAX);
		c.training.seq_len = rand_i64(1, 1 << 20);
		c.debug.seed = rand_i64(0, INT64_MAX);
		c.metrics.log_freq = rand_i64(1, 1000);
		c.training.local_batch_size = rand_i64(1, 64);
		c.training.global_batch_size =
		    it % 2 ? -1 : c.training.local_batch_size * rand_i64(1, 64);
		c.parallelism.data_parallel_shard_degree = it % 3 ? -1 : rand_i64(1, 64);
		c.parallelism.tensor_parallel_degree = rand_i64(1, 8);
		EXPECT(config_validate(&c) == 0, "random config %d does not validate", it);
		roundtrip(&c, "random");
		if (test_failures_in_case)
			break;
	}

	/* Printing is idempotent: print -> load -> print gives the same text. */
	char p1[128], p2[128];
	tmp_path(p1, sizeof(p1), "p1.toml");
	tmp_path(p2, sizeof(p2), "p2.toml");
	FILE *f = fopen(p1, "w");
	config_print(&c, f);
	fclose(f);
	struct ct_config back;
	config_defaults(&back);
	EXPECT(config_load_file(&back, p1) == 0, "load p1");
	f = fopen(p2, "w");
	config_print(&back, f);
	fclose(f);
	char a[16384], b[16384];
	f = fopen(p1, "rb");
	size_t na = fread(a, 1, sizeof(a), f);
	fclose(f);
	f = fopen(p2, "rb");
	size_t nb = fread(b, 1, sizeof(b), f);
	fclose(f);
	EXPECT(na == nb && memcmp(a, b, na) == 0, "print is not idempotent");
}

TEST_CASE(print_help_lists_every_key)
{
	char path[128], text[32768];
	tmp_path(path, sizeof(path), "help.txt");
	FILE *f = fopen(path, "w");
	config_print_help(f);
	fclose(f);
	f = fopen(path, "rb");
	size_t n = fread(text, 1, sizeof(text) - 1, f);
	fclose(f);
	text[n] = '\0';
	for (size_t i = 0; i < N_EVERY; i++) {
		const char *dot = strchr(every_key[i].key, '.');
		char sec[64], key[80];
		snprintf(sec, sizeof(sec), "[%.*s]", (int)(dot - every_key[i].key),
		         every_key[i].key);
		snprintf(key, sizeof(key), "  %s ", dot + 1);
		EXPECT(strstr(text, sec), "help lacks section %s", sec);
		EXPECT(strstr(text, key), "help lacks key %s", every_key[i].key);
	}
	const char *words[] = {"linear | sqrt | cosine",
	                       "\"./outputs\"",
	                       "8e-4",
	                       "in [0, 1)",
	                       "-1 or >= 1",
	                       "> 0",
	                       "float",
	                       "int",
	                       "bool",
	                       "string",
	                       "Peak learning rate",
	                       "debugmodel | 125M | 1B | 8B | 70B | 405B"};
	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
		EXPECT(strstr(text, words[i]), "help lacks \"%s\"", words[i]);
	EXPECT(!strstr(text, " \n"), "help has trailing blanks");
	if (getenv("CT_TEST_VERBOSE"))
		fputs(text, stdout);
}

/* ---- malformed files ---- */

#include "config_bad_files.h"

TEST_CASE(malformed_files)
{
	char path[128], long_text[1024];
	tmp_path(path, sizeof(path), "bad.toml");
	memcpy(long_text, "[job]\ndescription = \"", 21);
	memset(long_text + 21, 'x', 600);
	memcpy(long_text + 621, "\"\n", 3);
	int n = 0;
	for (size_t i = 0; i < sizeof(bad_files) / sizeof(bad_files[0]); i++) {
		const struct bad_file *b = &bad_files[i];
		struct ct_config c, before;
		write_text(path, b->text ? b->text : long_text);
		config_defaults(&c);
		c.training.steps = 77; /* not a default, to see that failure changes nothing */
		memcpy(&before, &c, sizeof(c));
		capture_begin();
		int rc = config_load_file(&c, path);
		capture_end();
		EXPECT(rc == CT_ERR_USAGE, "%s: rc %d", b->what, rc);
		EXPECT(strstr(msg, path), "%s: message does not name the file: %s", b->what, msg);
		EXPECT(strncmp(msg, "error: ", 7) == 0 &&
		           strchr(msg, '\n') == msg + strlen(msg) - 1,
		       "%s: not one error line: %s", b->what, msg);
		expect_words(b->what, b->words, 4);
		EXPECT(memcmp(&c, &before, sizeof(c)) == 0, "%s: config changed on error", b->what);
		n++;
	}
	EXPECT(n >= 30, "only %d malformed files", n);
}

TEST_CASE(missing_and_unreadable_files)
{
	struct ct_config c;
	char path[128];
	config_defaults(&c);
	tmp_path(path, sizeof(path), "no/such/file.toml");
	capture_begin();
	int rc = config_load_file(&c, path);
	capture_end();
	EXPECT(rc == CT_ERR_USAGE, "missing file rc %d", rc);
	EXPECT(strstr(msg, path) && strstr(msg, "No such file or directory"), "missing: %s", msg);

	capture_begin();
	rc = config_load_file(&c, tmp_dir); /* a directory */
	capture_end();
	EXPECT(rc == CT_ERR_USAGE, "directory rc %d", rc);
	EXPECT(strstr(msg, tmp_dir) && strstr(msg, "Is a directory"), "directory: %s", msg);
}

TEST_CASE(load_string_with_any_bytes)
{
	struct ct_config c;
	config_defaults(&c);
	const char ok[] = "[training]\nsteps = 12\n";
	EXPECT(config_load_string(&c, ok, sizeof(ok) - 1, "mem") == 0 && c.training.steps == 12,
	       "from memory");
	/* len, not NUL, ends the text. */
	EXPECT(config_load_string(&c, "[training]\nsteps = 13\nXXX", 22, "mem") == 0 &&
	           c.training.steps == 13,
	       "len bounds the text");
	const char nul_value[] = "[training]\nsteps = 5\0\n";
	capture_begin();
	int rc = config_load_string(&c, nul_value, sizeof(nul_value) - 1, "mem");
	capture_end();
	EXPECT(rc == CT_ERR_USAGE && strstr(msg, "mem:2:") &&
	           strstr(msg, "unexpected control character 0x00 after the value"),
	       "NUL after value: %s", msg);
	const char nul_string[] = "[job]\ndescription = \"a\0b\"\n";
	capture_begin();
	rc = config_load_string(&c, nul_string, sizeof(nul_string) - 1, "mem");
	capture_end();
	EXPECT(rc == CT_ERR_USAGE && strstr(msg, "control character 0x00"), "NUL in string: %s",
	       msg);
	EXPECT(c.training.steps == 13, "config changed on error");
}

/* ---- malformed command lines ---- */

struct bad_args {
	const char *what;
	const char *argv[4];
	const char *words[4];
};

static const struct bad_args bad_cli[] = {
    {"no dashes",
     {"training.steps=5"},
     {"training.steps=5: unexpected argument", "--section.key=value"}},
    {"one dash",
     {"--training.steps=5", "-training.steps=6"},
     {"-training.steps=6: unexpected argument"}},
    {"the config file among overrides",
     {"configs/debug.toml"},
     {"configs/debug.toml: unexpected argument"}},
    {"no section",
     {"--steps=5"},
     {"--steps=5: key 'steps' has no section", "did you mean '--training.steps'"}},
    {"no section, no hint", {"--help"}, {"--help: key 'help' has no section"}},
    {"empty key", {"--=5"}, {"--=5: expected --section.key=value"}},
    {"bare --", {"--"}, {"--: expected --section.key=value"}},
    {"unknown section",
     {"--trainin.steps=5"},
     {"--trainin.steps=5: unknown section 'trainin'", "did you mean 'training'"}},
    {"unknown key",
     {"--training.stepz=5"},
     {"--training.stepz=5: unknown key 'training.stepz'", "did you mean 'training.steps'"}},
    {"unknown key, split form",
     {"--training.stepz", "5"},
     {"--training.stepz: unknown key 'training.stepz'"}},
    {"bad int",
     {"--training.steps=abc"},
     {"--training.steps=abc: ", "training.steps", "expected an integer", "got 'abc'"}},
    {"bad int, split form",
     {"--training.steps", "abc"},
     {"--training.steps abc: ", "expected an integer"}},
    {"missing value at the end",
     {"--training.steps=5", "--training.seq_len"},
     {"--training.seq_len: missing value", "--training.seq_len=VALUE"}},
    {"value is an option",
     {"--job.print_config", "--training.steps=5"},
     {"--job.print_config: missing value", "'--training.steps=5' is an option"}},
    {"empty value",
     {"--training.steps="},
     {"--training.steps=: ", "empty value", "expected an integer >= 1"}},
    {"blank value", {"--optimizer.lr", "  "}, {"empty value", "a float > 0"}},
    {"float to int", {"--training.steps=2.5"}, {"got a float (2.5)"}},
    {"out of range",
     {"--optimizer.beta1=1"},
     {"--optimizer.beta1=1: ", "expected a float in [0, 1)", "got 1"}},
    {"negative", {"--training.steps", "-5"}, {"--training.steps -5: ", ">= 1"}},
    {"bad choice",
     {"--lr_scheduler.decay_type=exp"},
     {"expected one of linear | sqrt | cosine", "got \"exp\""}},
    {"bool typo",
     {"--metrics.enable_jsonl=yes"},
     {"metrics.enable_jsonl", "expected a boolean (true or false)", "got 'yes'"}},
    {"bool as int", {"--metrics.enable_jsonl=1"}, {"got an integer (1)"}},
    {"garbage after value", {"--training.steps=5 x"}, {"unexpected 'x' after the value"}},
    {"comment is not a comment", {"--training.steps=5#x"}, {"unexpected '#x' after the value"}},
    {"quoted int", {"--training.steps=\"5\""}, {"got a string (\"5\")"}},
    {"array", {"--training.steps=[1]"}, {"got an array"}},
    {"unterminated array", {"--training.steps=[1"}, {"unterminated array"}},
    {"unterminated string for a number", {"--optimizer.lr='1"}, {"unterminated string"}},
    {"inf", {"--optimizer.lr=inf"}, {"inf and nan are not allowed"}},
    {"control character in a string",
     {"--job.description=a\nb"},
     {"--job.description=a?b: ", "job.description", "control character 0x0a"}},
    {"string too long",
     {"--model.flavor="
      "0123456789012345678901234567890123456789"
      "0123456789012345678901234567890123456789"},
     {"model.flavor", "string too long (80 bytes; at most 63)"}},
    {"later argument fails",
     {"--training.steps=5", "--debug.seed=-3"},
     {"--debug.seed=-3: ", "debug.seed", ">= 0"}},
};

TEST_CASE(malformed_command_lines)
{
	int n = 0;
	for (size_t i = 0; i < sizeof(bad_cli) / sizeof(bad_cli[0]); i++) {
		const struct bad_args *b = &bad_cli[i];
		struct ct_config c, before;
		int argc = 0;
		while (argc < 4 && b->argv[argc])
			argc++;
		config_defaults(&c);
		memcpy(&before, &c, sizeof(c));
		capture_begin();
		int rc = config_apply_args(&c, argc, (char **)b->argv);
		capture_end();
		EXPECT(rc == CT_ERR_USAGE, "%s: rc %d", b->what, rc);
		expect_words(b->what, b->words, 4);
		EXPECT(memcmp(&c, &before, sizeof(c)) == 0, "%s: config changed on error", b->what);
		n++;
	}
	EXPECT(n >= 20, "only %d malformed command lines", n);
}

/* ---- cross-field validation ---- */

TEST_CASE(validate_cross_field)
{
	struct ct_config c;
	int rc;
#define EXPECT_INVALID(setup, word)                                                                \
	do {                                                                                       \
		config_defaults(&c);                                                               \
		setup;                                                                             \
		capture_begin();                                                                   \
		rc = config_validate(&c);                                                          \
		capture_end();                                                                     \
		EXPECT(rc == CT_ERR_USAGE, "%s: rc %d", #setup, rc);                               \
		EXPECT(strstr(msg, word), "%s: message lacks \"%s\": %s", #setup, word, msg);      \
	} while (0)

	EXPECT_INVALID(c.parallelism.tensor_parallel_degree = 0,
	               "parallelism.tensor_parallel_degree: expected an integer >= 1, got 0");
	EXPECT_INVALID(c.parallelism.pipeline_parallel_degree = -1, "pipeline_parallel_degree");
	EXPECT_INVALID(c.parallelism.data_parallel_replicate_degree = 0, "replicate_degree");
	EXPECT_INVALID(c.parallelism.data_parallel_shard_degree = 0,
	               "data_parallel_shard_degree: expected -1 or an integer >= 1");
	EXPECT_INVALID(c.parallelism.data_parallel_shard_degree = -2, "data_parallel_shard_degree");
	EXPECT_INVALID((c.parallelism.tensor_parallel_degree = 1 << 16,
	                c.parallelism.pipeline_parallel_degree = 1 << 16),
	               "multiply to more than");
	EXPECT_INVALID((c.training.local_batch_size = 8, c.training.global_batch_size = 12),
	               "training.global_batch_size (12) must be -1 or a multiple of "
	               "training.local_batch_size (8)");
	EXPECT_INVALID(c.training.dataset[0] = '\0', "training.dataset: must not be empty");
	EXPECT_INVALID(c.job.dump_folder[0] = '\0', "job.dump_folder: must not be empty");
	EXPECT_INVALID(SET_STR(c.lr_scheduler.decay_type, "exp"), "one of linear | sqrt | cosine");
	EXPECT_INVALID(c.optimizer.lr = NAN, "optimizer.lr");
	EXPECT_INVALID(c.optimizer.beta1 = 1.0, "optimizer.beta1: expected a float in [0, 1)");
	EXPECT_INVALID(memset(c.job.log_level, 'x', sizeof(c.job.log_level)),
	               "job.log_level: string not terminated");
	EXPECT_INVALID(SET_STR(c.job.description, "a\x01"), "control character 0x01");
#undef EXPECT_INVALID

	config_defaults(&c);
	c.parallelism.data_parallel_shard_degree = 4;
	c.parallelism.tensor_parallel_degree = 2;
	c.training.local_batch_size = 4;
	c.training.global_batch_size = 32;
	EXPECT(config_validate(&c) == 0, "valid parallel config rejected");
}

/* ---- keys a family adds (model_config_schema_init: Hyena's [model] keys) ---- */

TEST_CASE(family_keys)
{
	struct ct_config c;
	config_defaults(&c);
	EXPECT(config_get_int(&c, "model.hyena_order") == -1, "hyena_order default");
	EXPECT(config_get_float(&c, "model.hyena_sin_freq") == -1.0, "hyena_sin_freq default");
	EXPECT(config_is_default(&c, "model.hyena_l_max"), "hyena_l_max is its default");
	char *args[] = {"--model.name=hyena", "--model.flavor=hyena-small", "--model.hyena_order",
	                "3", "--model.hyena_sin_freq=2.5"};
	EXPECT(config_apply_args(&c, 5, args) == 0, "hyena keys on the command line");
	EXPECT(config_get_int(&c, "model.hyena_order") == 3 &&
	           config_get_float(&c, "model.hyena_sin_freq") == 2.5 &&
	           !config_is_default(&c, "model.hyena_order"),
	       "hyena keys set");
	EXPECT(config_validate(&c) == 0, "hyena keys of a hyena model validate");
	roundtrip(&c, "hyena keys");

	struct ct_config f;
	EXPECT(load_text(&f, "hyena.toml",
	                 "[model]\nname = \"hyena\"\nflavor = \"hyena-small\"\n"
	                 "hyena_order = 3\nhyena_sin_freq = 2.5\n") == 0,
	       "hyena keys in a file");
	EXPECT(same_config(&f, &c), "file and command line agree");

	char *llama[] = {"--model.name=llama3", "--model.flavor=8B"};
	EXPECT(config_apply_args(&c, 2, llama) == 0, "back to llama3");
	capture_begin();
	int rc = config_validate(&c);
	capture_end();
	EXPECT(rc == CT_ERR_USAGE, "a hyena key with llama3: rc %d", rc);
	const char *words[] = {"model.hyena_order: only read when model.name = \"hyena\"",
	                       "(this is llama3)"};
	expect_words("hyena key with llama3", words, 2);

	config_defaults(&c);
	char *rope[] = {"--model.name=hyena", "--model.rope_scaling=true"};
	EXPECT(config_apply_args(&c, 2, rope) == 0, "rope_scaling parses");
	capture_begin();
	rc = config_validate(&c);
	capture_end();
	EXPECT(rc == CT_ERR_USAGE && strstr(msg, "model.rope_scaling: Hyena has no RoPE"),
	       "rope_scaling with hyena: rc %d: %s", rc, msg);

	config_defaults(&c);
	char *bad[] = {"--model.hyena_emb_dim=2"};
	struct ct_config before = c;
	capture_begin();
	rc = config_apply_args(&c, 1, bad);
	capture_end();
	EXPECT(rc == CT_ERR_USAGE &&
	           strstr(msg, "model.hyena_emb_dim: expected -1 or an integer >= 3"),
	       "a hyena key out of range: rc %d: %s", rc, msg);
	EXPECT(memcmp(&c, &before, sizeof(c)) == 0, "a failed hyena key changed the config");
}

int main(void)
{
	model_config_schema_init(); /* the families' [model] keys and flavors, as in ctitan */
	snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/ct_test_config.XXXXXX");
	if (!mkdtemp(tmp_dir)) {
		perror("mkdtemp");
		return 1;
	}
	RUN(defaults_match_header);
	RUN(full_file_parses);
	RUN(every_key_on_command_line);
	RUN(print_roundtrip);
	RUN(print_help_lists_every_key);
	RUN(family_keys);
	RUN(malformed_files);
	RUN(missing_and_unreadable_files);
	RUN(load_string_with_any_bytes);
	RUN(malformed_command_lines);
	RUN(validate_cross_field);

	static const char *const files[] = {
	    "stderr.txt", "full.toml",    "every.toml", "empty.toml", "comments.toml", "arr.toml",
	    "one.toml",   "printed.toml", "p1.toml",    "p2.toml",    "help.txt",      "bad.toml"};
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		char path[128];
		tmp_path(path, sizeof(path), files[i]);
		unlink(path);
	}
	if (rmdir(tmp_dir) != 0)
		perror(tmp_dir);
	return test_summary();
}
