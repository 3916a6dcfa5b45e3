/* io/config: the schema table, a TOML subset parser and command-line overrides.
 *
 * Everything about a key lives in one row of cfg_schema: where it is stored, its type (taken
 * from the struct field itself with _Generic, so the two cannot disagree), its default
 * (written as it would be on the command line and parsed by the same code, so every default
 * is checked against its own range at start-up), its range or choices, and its help.
 *
 * Values reach a field only through cfg_assign, which checks type, range and choices; the
 * file parser and config_apply_args differ only in how they find the value text. Loading is
 * atomic: a source is applied to a copy and committed only when every line of it is valid.
 */
#include "io/config.h"

#include "base/log.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* ------------------------------------------------------------------------------------------
 * Schema
 */

enum cfg_type { CFG_STRING, CFG_INT, CFG_FLOAT, CFG_BOOL, CFG_TYPE_COUNT };

static const char *const cfg_type_names[] = {"string", "int", "float", "bool"};
_Static_assert(ARRAY_SIZE(cfg_type_names) == CFG_TYPE_COUNT, "one name per type");

/* "expected <noun>" */
static const char *const cfg_type_nouns[] = {"a string", "an integer", "a float",
                                             "a boolean (true or false)"};
_Static_assert(ARRAY_SIZE(cfg_type_nouns) == CFG_TYPE_COUNT, "one noun per type");

enum cfg_bound { BOUND_NONE, BOUND_INCL, BOUND_EXCL };

struct cfg_range {
	enum cfg_bound lo_kind, hi_kind;
	double lo, hi;
	bool minus_one_ok; /* -1 ("unset") is accepted besides the range */
};

struct cfg_key {
	const char *section;
	const char *name;
	enum cfg_type type;
	size_t offset;
	size_t size;                /* bytes of the field; a string holds size - 1 bytes */
	const char *def;            /* the default, written as on the command line */
	struct cfg_range range;     /* numbers only */
	const char *const *choices; /* strings only; NULL-terminated, or NULL for any string */
	const char *help;
};

/* Sections in the order they are printed; rows below are grouped in this order. */
static const char *const cfg_sections[] = {"job",          "model",      "optimizer",
                                           "lr_scheduler", "training",   "parallelism",
                                           "validation",   "checkpoint", "activation_checkpoint",
                                           "comm",         "metrics",    "profiling",
                                           "plan",         "debug"};
#define CFG_N_SECTIONS ARRAY_SIZE(cfg_sections)

#define CFG_FIELD(sec, key) (((struct ct_config *)0)->sec.key)
#define CFG_TYPE_OF(sec, key)                                                                      \
	_Generic(CFG_FIELD(sec, key), char *: CFG_STRING, int64_t: CFG_INT, double: CFG_FLOAT, \
		 bool: CFG_BOOL)
#define ROW(sec, key)                                                                              \
	.section = #sec, .name = #key, .type = CFG_TYPE_OF(sec, key),                              \
	.offset = offsetof(struct ct_config, sec.key), .size = sizeof(CFG_FIELD(sec, key))

#define GE(a)          .range = {.lo_kind = BOUND_INCL, .lo = (a)}
#define GT(a)          .range = {.lo_kind = BOUND_EXCL, .lo = (a)}
#define IN_CO(a, b)    .range = {.lo_kind = BOUND_INCL, .lo = (a), .hi_kind = BOUND_EXCL, .hi = (b)}
#define IN_CC(a, b)    .range = {.lo_kind = BOUND_INCL, .lo = (a), .hi_kind = BOUND_INCL, .hi = (b)}
#define UNSET_OR_GE(a) .range = {.lo_kind = BOUND_INCL, .lo = (a), .minus_one_ok = true}
#define UNSET_OR_IN_CC(a, b)                                                                       \
	.range = {.lo_kind = BOUND_INCL,                                                           \
	          .lo = (a),                                                                       \
	          .hi_kind = BOUND_INCL,                                                           \
	          .hi = (b),                                                                       \
	          .minus_one_ok = true}
#define CHOICES(...)                                                                               \
	.choices = (const char *const[])                                                           \
	{                                                                                          \
		__VA_ARGS__, NULL                                                                  \
	}

static const struct cfg_key cfg_schema[] = {
    {ROW(job, dump_folder), .def = "./outputs",
     .help = "Folder for metrics.jsonl, checkpoints and traces."},
    {ROW(job, description), .def = "", .help = "Free-form description of the run."},
    {ROW(job, print_config), .def = "false",
     .help = "Print the effective config as TOML and exit."},
    {ROW(job, log_level), .def = "info", CHOICES("debug", "info", "warning", "error"),
     .help = "Least severe log message shown."},

    {ROW(model, name), .def = "llama3", .help = "Model family."},
    {ROW(model, flavor), .def = "debugmodel",
     CHOICES("debugmodel", "125M", "1B", "8B", "70B", "405B", "hyena-debug", "hyena-small"),
     .help = "Model size within the family (llama3: debugmodel .. 405B; hyena: hyena-debug, "
             "hyena-small)."},
    {ROW(model, vocab_size), .def = "-1", UNSET_OR_GE(1),
     .help = "Vocabulary size; -1: the flavor's vocabulary."},
    {ROW(model, rope_scaling), .def = "false",
     .help = "Llama 3.1 RoPE frequency scaling (factor 8, low 1, high 4, original context "
             "8192)."},
    {ROW(model, tokenizer_path), .def = "",
     .help = "Tokenizer (rank file or tokenizer.json) of the dataset; generate uses it for "
             "text, train checks that its ids fit the vocabulary."},
    {ROW(model, hyena_order), .def = "-1", UNSET_OR_GE(2),
     .help = "Hyena order N: N-1 gated long convolutions per block; -1: the flavor's (2)."},
    {ROW(model, hyena_filter_order), .def = "-1", UNSET_OR_GE(1),
     .help = "Width of Hyena's implicit filter MLP; -1: the flavor's."},
    {ROW(model, hyena_emb_dim), .def = "-1", UNSET_OR_GE(3),
     .help = "Positional features of Hyena's implicit filter (odd); -1: the flavor's."},
    {ROW(model, hyena_sin_freq), .def = "-1", UNSET_OR_GE(0),
     .help = "Initial frequency of the filter's sine activations (> 0); -1: the flavor's."},
    {ROW(model, hyena_l_max), .def = "-1", UNSET_OR_GE(1),
     .help = "Length of Hyena's long filters (>= training.seq_len); -1: training.seq_len."},

    {ROW(optimizer, name), .def = "AdamW", CHOICES("AdamW"), .help = "Optimizer."},
    {ROW(optimizer, lr), .def = "8e-4", GT(0), .help = "Peak learning rate."},
    {ROW(optimizer, beta1), .def = "0.9", IN_CO(0, 1), .help = "Decay rate of the first moment."},
    {ROW(optimizer, beta2), .def = "0.95", IN_CO(0, 1), .help = "Decay rate of the second moment."},
    {ROW(optimizer, eps), .def = "1e-8", GT(0), .help = "Added to the root of the second moment."},
    {ROW(optimizer, weight_decay), .def = "0.1", GE(0), .help = "Decoupled weight decay."},

    {ROW(lr_scheduler, warmup_steps), .def = "200", GE(0),
     .help = "Steps of linear warmup to optimizer.lr."},
    {ROW(lr_scheduler, decay_ratio), .def = "-1", UNSET_OR_IN_CC(0, 1),
     .help = "Fraction of the steps spent decaying, at the end; -1: decay starts right "
             "after warmup."},
    {ROW(lr_scheduler, decay_type), .def = "linear", CHOICES("linear", "sqrt", "cosine"),
     .help = "Shape of the decay."},
    {ROW(lr_scheduler, min_lr_factor), .def = "0.0", IN_CC(0, 1),
     .help = "Final learning rate as a fraction of optimizer.lr."},

    {ROW(training, local_batch_size), .def = "8", GE(1),
     .help = "Sequences per rank per micro-batch."},
    {ROW(training, global_batch_size), .def = "-1", UNSET_OR_GE(1),
     .help = "Sequences per step; -1: local * dp, else a multiple of local * dp "
             "(gradient accumulation)."},
    {ROW(training, seq_len), .def = "2048", GE(1), .help = "Tokens per sequence."},
    {ROW(training, max_norm), .def = "1.0", GT(0),
     .help = "Gradient clipping threshold on the global gradient norm."},
    {ROW(training, steps), .def = "10000", GE(1), .help = "Optimizer steps to run."},
    {ROW(training, dataset), .def = "synthetic",
     .help = "\"synthetic\" (seeded sequences with a learnable rule), \"default\" (the "
             "corpus `make run` prepares in outputs/data/default) or the name of the dataset "
             "in training.dataset_path."},
    {ROW(training, dataset_path), .def = "",
     .help = "Folder of token shards (train_*.bin, val_*.bin) written by `ctitan prepare`; "
             "used unless training.dataset is \"synthetic\"."},
    {ROW(training, mixed_precision_param), .def = "float32", CHOICES("float32", "bfloat16"),
     .help = "Type of the parameters in forward and backward."},
    {ROW(training, mixed_precision_reduce), .def = "float32", CHOICES("float32"),
     .help = "Type of gradient reductions."},

    {ROW(parallelism, data_parallel_shard_degree), .def = "-1", UNSET_OR_GE(1),
     .help = "FSDP degree; -1: the ranks left after the other degrees."},
    {ROW(parallelism, data_parallel_replicate_degree), .def = "1", GE(1),
     .help = "Replicated data-parallel degree (HSDP when sharded too)."},
    {ROW(parallelism, tensor_parallel_degree), .def = "1", GE(1),
     .help = "Tensor-parallel degree."},
    {ROW(parallelism, pipeline_parallel_degree), .def = "1", GE(1),
     .help = "Pipeline-parallel degree."},
    {ROW(parallelism, fsdp_reshard_after_forward), .def = "default",
     CHOICES("default", "always", "never"),
     .help = "Free gathered parameters after forward (default: except the last stage)."},
    {ROW(parallelism, enable_async_tensor_parallel), .def = "false",
     .help = "Async tensor parallelism: TP all-gathers and reduce-scatters decomposed into "
             "ring steps that overlap their matmuls. ctitan plan models it; ctitan train: "
             "not yet supported."},
    {ROW(parallelism, tp_bandwidth_gbps), .def = "3600", GT(0),
     .help = "ctitan plan: bandwidth of the link tensor-parallel collectives use, in Gbit/s "
             "per rank (3600: NVLink 4, 450 GB/s, inside a node)."},

    {ROW(validation, enable), .def = "false",
     .help = "Report the loss on the val split of training.dataset_path."},
    {ROW(validation, freq), .def = "100", GE(1),
     .help = "Evaluate every this many steps and at the last step."},
    {ROW(validation, steps), .def = "-1", UNSET_OR_GE(1),
     .help = "Steps per evaluation; -1: the whole val split."},

    {ROW(checkpoint, enable), .def = "false",
     .help = "Save checkpoints, and resume from the newest one (or checkpoint.load_step)."},
    {ROW(checkpoint, folder), .def = "checkpoint",
     .help = "Checkpoint folder, inside job.dump_folder."},
    {ROW(checkpoint, interval), .def = "500", GE(1),
     .help = "Save every this many steps, at the last step and on SIGTERM/SIGINT."},
    {ROW(checkpoint, keep_latest_k), .def = "10", GE(0),
     .help = "Keep this many newest checkpoints and delete older ones; 0 keeps all."},
    {ROW(checkpoint, load_step), .def = "-1", UNSET_OR_GE(0),
     .help = "Resume from this step; -1: the newest complete checkpoint, if any."},
    {ROW(checkpoint, async_mode), .def = "disabled", CHOICES("disabled", "async"),
     .help = "disabled: training waits while a checkpoint is written; async: the state is "
             "copied to a staging buffer and written by a background thread while training "
             "goes on."},
    {ROW(checkpoint, exclude_from_loading), .def = "",
     .help = "Comma-separated parts of a resumed checkpoint not to load: optimizer (fresh "
             "AdamW moments), lr_scheduler (the schedule restarts at the resumed step), "
             "dataloader (the data order restarts), train_state (step and tokens seen "
             "restart at 0)."},
    {ROW(checkpoint, initial_load_path), .def = "",
     .help = "When checkpoint.folder has no checkpoint: start from this checkpoint (a "
             "step-NNNNNNNN folder or a folder of them) or, with initial_load_in_hf, this "
             "Hugging Face folder (model.safetensors or an index of shards, config.json)."},
    {ROW(checkpoint, initial_load_model_only), .def = "true",
     .help = "With initial_load_path: load the weights only and start at step 0; false "
             "also loads optimizer, data and trainer state."},
    {ROW(checkpoint, initial_load_in_hf), .def = "false",
     .help = "initial_load_path is a Hugging Face Llama folder (as `ctitan export` writes)."},

    {ROW(activation_checkpoint, mode), .def = "none", CHOICES("none", "ffn", "selective", "full"),
     .help = "none: save every activation; ffn: recompute each block's FFN up-projections "
             "(w1, w3 outputs, the largest activations) in backward instead of saving them; "
             "selective: TorchTitan's per-op policy (keep matmul and attention outputs except "
             "every second matmul, recompute the rest); full: keep only each block's input and "
             "recompute the block before its backward."},
    {ROW(activation_checkpoint, selective_ac_option), .def = "op",
     .help = "For mode = selective: \"op\" (per-op policy). TorchTitan's per-layer integer "
             "option is not yet supported."},

    {ROW(comm, progress), .def = "inline", CHOICES("inline", "thread"),
     .help = "How collectives advance: inline on the compute thread (each runs, blocking, "
             "when issued), or on a communication thread that overlaps them with compute when "
             "the schedule issues them ahead (comm.prefetch, comm.reduce_scatter_defer)."},
    {ROW(comm, timeout_seconds), .def = "300", GT(0),
     .help = "A collective that takes longer aborts the job (a peer died or hangs)."},
    {ROW(comm, buckets), .def = "per_block",
     .help = "FSDP buckets: \"per_block\" (embedding, each block, norm + output), \"auto\" "
             "(greedy with the cost model, under comm.bucket_cap_mb), or comma-separated "
             "groups of '+'-joined units (embed, block indices from 0, norm) in order, e.g. "
             "\"embed+0,1+2,3+norm\"."},
    {ROW(comm, bucket_cap_mb), .def = "100", GT(0),
     .help = "Automatic bucketing: most gathered parameter MiB in one bucket."},
    {ROW(comm, prefetch), .def = "1", IN_CC(0, 16),
     .help = "Issue each all-gather this many gathers ahead of its use (0: at use)."},
    {ROW(comm, reduce_scatter_defer), .def = "1", IN_CC(0, 16),
     .help = "Wait for a reduce-scatter only when this many later ones are issued (0: at "
             "once)."},
    {ROW(comm, memory_budget_gb), .def = "0", GE(0),
     .help = "Peak memory per rank the reordering keeps to (predicted by the cost model; "
             "prefetch depth is lowered to fit); 0: no budget."},
    {ROW(comm, bandwidth_gbps), .def = "0", GE(0),
     .help = "Cost model: link bandwidth per rank in Gbit/s; 0: measured at start-up "
             "(ctitan plan needs it)."},
    {ROW(comm, latency_us), .def = "0", GE(0),
     .help = "Cost model: latency of one collective in microseconds (with "
             "comm.bandwidth_gbps)."},
    {ROW(comm, simulate_bandwidth_gbps), .def = "0", GE(0),
     .help = "Make every collective take at least its bytes over a link of this many Gbit/s "
             "(overlap experiments on one machine); 0: off."},
    {ROW(comm, simulate_latency_us), .def = "0", GE(0),
     .help = "Simulated link: microseconds added to every collective."},

    {ROW(metrics, log_freq), .def = "1", GE(1), .help = "Log every this many steps."},
    {ROW(metrics, peak_tflops), .def = "0.0", GE(0),
     .help = "Peak TFLOP/s per rank for MFU; 0: measure sgemm on a large square at "
             "start-up."},
    {ROW(metrics, enable_jsonl), .def = "true",
     .help = "Write metrics.jsonl into job.dump_folder."},

    {ROW(profiling, enable_profiling), .def = "false",
     .help = "Write a Chrome trace (Perfetto, chrome://tracing) per rank every profile_freq "
             "steps: compute and communication on separate tracks (FSDP runs)."},
    {ROW(profiling, save_traces_folder), .def = "profile_trace",
     .help = "Traces go to <job.dump_folder>/<this>/iteration_<step>/rank<r>_trace.json."},
    {ROW(profiling, profile_freq), .def = "10", GE(1), .help = "Trace every this many steps."},

    {ROW(plan, compute_efficiency), .def = "0.5", IN_CC(0.01, 1),
     .help = "ctitan plan: fraction of metrics.peak_tflops the kernels achieve on the "
             "target."},
    {ROW(plan, memory_bandwidth_gbs), .def = "3000", GT(0),
     .help = "ctitan plan: the target's memory bandwidth in GB/s (buffer copies, optimizer)."},
    {ROW(plan, activation_dtype), .def = "auto", CHOICES("auto", "float32", "bfloat16"),
     .help = "ctitan plan: element type of activations and gathered parameters on the "
             "target; auto: training.mixed_precision_param."},

    {ROW(debug, seed), .def = "0", GE(0), .help = "Seed of the weights and synthetic data."},
    {ROW(debug, deterministic), .def = "true",
     .help = "Kept for TorchTitan configs; ctitan is always deterministic."},
    {ROW(debug, fail_rank), .def = "-1", UNSET_OR_GE(0),
     .help = "Fault injection for tests: this rank kills itself during debug.fail_step."},
    {ROW(debug, fail_step), .def = "0", GE(0),
     .help = "The 1-based step in which debug.fail_rank dies (after any background "
             "checkpoint save has finished)."},
    {ROW(debug, sample_log), .def = "",
     .help = "Tests: each rank appends \"step sample\" lines for the dataset samples it "
             "trained on to <sample_log>.rank-R."},
};
#define CFG_N_KEYS ARRAY_SIZE(cfg_schema)

static void *cfg_field(struct ct_config *cfg, const struct cfg_key *k)
{
	return (char *)cfg + k->offset;
}

static const void *cfg_field_const(const struct ct_config *cfg, const struct cfg_key *k)
{
	return (const char *)cfg + k->offset;
}

static int cfg_section_index(const char *s, size_t n)
{
	for (size_t i = 0; i < CFG_N_SECTIONS; i++)
		if (strlen(cfg_sections[i]) == n && memcmp(cfg_sections[i], s, n) == 0)
			return (int)i;
	return -1;
}

static int cfg_key_index(const char *sec, const char *key, size_t n)
{
	for (size_t i = 0; i < CFG_N_KEYS; i++)
		if (strcmp(cfg_schema[i].section, sec) == 0 && strlen(cfg_schema[i].name) == n &&
		    memcmp(cfg_schema[i].name, key, n) == 0)
			return (int)i;
	return -1;
}

/* ------------------------------------------------------------------------------------------
 * Messages: where an error is, what a key expects, what was found, what was probably meant.
 */

/* Up to max bytes of s[0..n) for a message, non-printable bytes as '?', "..." if cut. */
static void cfg_snippet(const char *s, size_t n, size_t max, char *buf, size_t size)
{
	size_t j = 0;
	for (size_t i = 0; i < n && i < max && j + 4 < size; i++) {
		unsigned char c = (unsigned char)s[i];
		buf[j++] = c < 0x20 || c == 0x7f ? '?' : (char)c;
	}
	if (n > max && j + 4 < size) {
		memcpy(buf + j, "...", 3);
		j += 3;
	}
	buf[j] = '\0';
}

struct cfg_where {
	const char *name; /* file name, or the command-line argument */
	int line;         /* 1-based; 0 for a command-line argument */
};

__attribute__((format(printf, 2, 3))) static int cfg_fail(const struct cfg_where *w,
                                                          const char *fmt, ...)
{
	char msg[2048], name[1100];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	cfg_snippet(w->name, strlen(w->name), 1024, name, sizeof(name));
	if (w->line > 0)
		LOG_ERROR("%s:%d: %s", name, w->line, msg);
	else
		LOG_ERROR("%s: %s", name, msg);
	return CT_ERR_USAGE;
}

static void cfg_range_text(const struct cfg_range *r, char *buf, size_t n)
{
	if (r->lo_kind != BOUND_NONE && r->hi_kind != BOUND_NONE)
		snprintf(buf, n, "in %c%g, %g%c", r->lo_kind == BOUND_INCL ? '[' : '(', r->lo,
		         r->hi, r->hi_kind == BOUND_INCL ? ']' : ')');
	else if (r->lo_kind != BOUND_NONE)
		snprintf(buf, n, "%s %g", r->lo_kind == BOUND_INCL ? ">=" : ">", r->lo);
	else if (r->hi_kind != BOUND_NONE)
		snprintf(buf, n, "%s %g", r->hi_kind == BOUND_INCL ? "<=" : "<", r->hi);
	else
		buf[0] = '\0';
}

static void cfg_choices_text(const char *const *choices, char *buf, size_t n)
{
	size_t j = 0;
	buf[0] = '\0';
	for (const char *const *c = choices; *c && j < n; c++)
		j += (size_t)snprintf(buf + j, n - j, "%s%s", c == choices ? "" : " | ", *c);
}

/* The constraint alone, as shown in --help: ">= 1", "-1 or in [0, 1]", "linear | sqrt". */
static void cfg_constraint_text(const struct cfg_key *k, char *buf, size_t n)
{
	char r[96];
	buf[0] = '\0';
	if (k->type == CFG_STRING && k->choices) {
		cfg_choices_text(k->choices, buf, n);
	} else if (k->type == CFG_INT || k->type == CFG_FLOAT) {
		cfg_range_text(&k->range, r, sizeof(r));
		snprintf(buf, n, "%s%s", k->range.minus_one_ok ? "-1 or " : "", r);
	}
}

/* What the key expects, completing "expected ...": "an integer >= 1", "one of a | b". */
static void cfg_expect_text(const struct cfg_key *k, char *buf, size_t n)
{
	char c[192];
	if (k->type == CFG_STRING && k->choices) {
		cfg_choices_text(k->choices, c, sizeof(c));
		snprintf(buf, n, "one of %s", c);
	} else if (k->type == CFG_INT || k->type == CFG_FLOAT) {
		cfg_range_text(&k->range, c, sizeof(c));
		snprintf(buf, n, "%s%s%s%s", k->range.minus_one_ok ? "-1 or " : "",
		         cfg_type_nouns[k->type], c[0] ? " " : "", c);
	} else {
		snprintf(buf, n, "%s", cfg_type_nouns[k->type]);
	}
}

/* Edit distance, for "did you mean"; names longer than 63 bytes are compared cut. */
static size_t cfg_distance(const char *a, size_t na, const char *b, size_t nb)
{
	size_t row[64], prev_diag;
	if (na > 63)
		na = 63;
	if (nb > 63)
		nb = 63;
	for (size_t j = 0; j <= nb; j++)
		row[j] = j;
	for (size_t i = 1; i <= na; i++) {
		prev_diag = row[0];
		row[0] = i;
		for (size_t j = 1; j <= nb; j++) {
			size_t up = row[j];
			size_t best = prev_diag + (a[i - 1] != b[j - 1]);
			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			prev_diag = up;
			row[j] = best;
		}
	}
	return row[nb];
}

static bool cfg_close_enough(size_t d, size_t len)
{
	return d <= 3 && 2 * d < len + 1;
}

/* The closest section name, or NULL. */
static const char *cfg_suggest_section(const char *s, size_t n)
{
	const char *best = NULL;
	size_t best_d = (size_t)-1;
	for (size_t i = 0; i < CFG_N_SECTIONS; i++) {
		size_t d = cfg_distance(s, n, cfg_sections[i], strlen(cfg_sections[i]));
		if (d < best_d && cfg_close_enough(d, strlen(cfg_sections[i]))) {
			best = cfg_sections[i];
			best_d = d;
		}
	}
	return best;
}

/* The closest key to sec.key: the same key name in another section, else the nearest
 * "section.key" by edit distance; NULL if nothing is close. */
static const struct cfg_key *cfg_suggest_key(const char *sec, size_t sn, const char *key, size_t kn)
{
	char want[160], have[160];
	const struct cfg_key *best = NULL;
	size_t best_d = (size_t)-1;
	for (size_t i = 0; i < CFG_N_KEYS; i++)
		if (strlen(cfg_schema[i].name) == kn && memcmp(cfg_schema[i].name, key, kn) == 0)
			return &cfg_schema[i];
	int nw = snprintf(want, sizeof(want), "%.*s.%.*s", (int)(sn < 64 ? sn : 64), sec,
	                  (int)(kn < 64 ? kn : 64), key);
	for (size_t i = 0; i < CFG_N_KEYS; i++) {
		int nh = snprintf(have, sizeof(have), "%s.%s", cfg_schema[i].section,
		                  cfg_schema[i].name);
		size_t d = cfg_distance(want, (size_t)nw, have, (size_t)nh);
		if (d < best_d && cfg_close_enough(d, (size_t)nh)) {
			best = &cfg_schema[i];
			best_d = d;
		}
	}
	return best;
}

static int cfg_unknown_section(const struct cfg_where *w, const char *s, size_t n)
{
	char shown[80], all[256] = "";
	const char *hint = cfg_suggest_section(s, n);
	size_t j = 0;
	for (size_t i = 0; i < CFG_N_SECTIONS; i++)
		j += (size_t)snprintf(all + j, sizeof(all) - j, "%s%s", i ? ", " : "",
		                      cfg_sections[i]);
	cfg_snippet(s, n, 64, shown, sizeof(shown));
	if (hint)
		return cfg_fail(w, "unknown section '%s' (did you mean '%s'?)", shown, hint);
	return cfg_fail(w, "unknown section '%s'; the sections are %s", shown, all);
}

static int cfg_unknown_key(const struct cfg_where *w, const char *sec, const char *key, size_t kn)
{
	char shown[80], all[1024] = "";
	const struct cfg_key *hint = cfg_suggest_key(sec, strlen(sec), key, kn);
	size_t j = 0;
	cfg_snippet(key, kn, 64, shown, sizeof(shown));
	if (hint)
		return cfg_fail(w, "unknown key '%s.%s' (did you mean '%s.%s'?)", sec, shown,
		                hint->section, hint->name);
	for (size_t i = 0; i < CFG_N_KEYS && j < sizeof(all); i++)
		if (strcmp(cfg_schema[i].section, sec) == 0)
			j += (size_t)snprintf(all + j, sizeof(all) - j, "%s%s", j ? ", " : "",
			                      cfg_schema[i].name);
	return cfg_fail(w, "unknown key '%s.%s'; the keys of [%s] are %s", sec, shown, sec, all);
}

/* ------------------------------------------------------------------------------------------
 * Values: the TOML subset's literals, parsed before we look at what the key wants.
 */

enum cfg_vkind {
	VAL_STRING,
	VAL_INTEGER,
	VAL_FLOAT,
	VAL_BOOL,
	VAL_ARRAY,
	VAL_INVALID,
	VAL_KIND_COUNT
};

static const char *const cfg_vkind_nouns[] = {"a string",  "an integer", "a float",
                                              "a boolean", "an array",   "an invalid value"};
_Static_assert(ARRAY_SIZE(cfg_vkind_nouns) == VAL_KIND_COUNT, "one noun per value kind");

struct cfg_value {
	enum cfg_vkind kind;
	int64_t i;
	double f;
	bool b;
	char s[CONFIG_STR_MAX]; /* VAL_STRING: the first CONFIG_STR_MAX - 1 bytes */
	size_t len;             /* VAL_STRING: the full length */
	char text[72];          /* the literal as written (numbers, invalid tokens) */
	const char *note;       /* VAL_INVALID: why, if more can be said than "got 'text'" */
};

/* Parse functions return 0, or -1 for a syntax error described in err but not yet reported
 * (the caller adds the place and the key), or CT_ERR_USAGE for an error already reported. */
struct cfg_parser {
	const char *p, *end;
	int line;      /* 0 when parsing a command-line value */
	char err[256]; /* the syntax error, when a parse function returns -1 */
	int err_line;
};

#define CFG_MAX_DEPTH 32

__attribute__((format(printf, 2, 3))) static int cfg_syntax(struct cfg_parser *ps, const char *fmt,
                                                            ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(ps->err, sizeof(ps->err), fmt, ap);
	va_end(ap);
	if (!ps->err_line)
		ps->err_line = ps->line;
	return -1;
}

static bool cfg_is_bare(char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '-';
}

/* Characters of an unquoted literal: numbers, booleans, and the words we reject. */
static bool cfg_is_token(char c)
{
	return cfg_is_bare(c) || c == '+' || c == '.';
}

static void cfg_skip_ws(struct cfg_parser *ps)
{
	while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t'))
		ps->p++;
}

/* Inside arrays: whitespace, newlines and comments. */
static int cfg_skip_ws_lines(struct cfg_parser *ps)
{
	for (;;) {
		cfg_skip_ws(ps);
		if (ps->p >= ps->end)
			return 0;
		if (*ps->p == '#') {
			while (ps->p < ps->end && *ps->p != '\n')
				ps->p++;
		} else if (*ps->p == '\n') {
			ps->p++;
			ps->line++;
		} else if (*ps->p == '\r' && ps->p + 1 < ps->end && ps->p[1] == '\n') {
			ps->p += 2;
			ps->line++;
		} else {
			return 0;
		}
	}
}

/* "'x'" for a message about the text at p (up to the end of the line). */
static void cfg_here(const struct cfg_parser *ps, char *buf, size_t n)
{
	if (ps->p >= ps->end) {
		snprintf(buf, n, "end of input");
		return;
	}
	size_t len = 0;
	while (ps->p + len < ps->end && ps->p[len] != '\n' && ps->p[len] != '\r')
		len++;
	if (len == 0) {
		snprintf(buf, n, "%s", *ps->p == '\n' ? "end of line" : "carriage return");
		return;
	}
	if ((unsigned char)*ps->p < 0x20 || *ps->p == 0x7f) {
		snprintf(buf, n, "control character 0x%02x", (unsigned char)*ps->p);
		return;
	}
	char s[48];
	cfg_snippet(ps->p, len, 24, s, sizeof(s));
	snprintf(buf, n, "'%s'", s);
}

static void cfg_string_push(struct cfg_value *v, char c)
{
	if (v->len < sizeof(v->s) - 1)
		v->s[v->len] = c;
	v->len++;
}

static void cfg_string_end(struct cfg_value *v)
{
	v->s[v->len < sizeof(v->s) - 1 ? v->len : sizeof(v->s) - 1] = '\0';
}

/* At the opening quote of "..." or '...'. TOML forbids raw control characters in both. */
static int cfg_parse_string(struct cfg_parser *ps, struct cfg_value *v)
{
	char quote = *ps->p;
	bool basic = quote == '"';
	ps->p++;
	v->kind = VAL_STRING;
	v->len = 0;
	if (ps->end - ps->p >= 2 && ps->p[0] == quote && ps->p[1] == quote)
		return cfg_syntax(ps, "multi-line strings (%c%c%c) are not supported", quote, quote,
		                  quote);
	for (;;) {
		if (ps->p >= ps->end || *ps->p == '\n' || *ps->p == '\r')
			return cfg_syntax(ps, "unterminated string (missing closing %c)", quote);
		unsigned char c = (unsigned char)*ps->p++;
		if (c == (unsigned char)quote)
			break;
		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return cfg_syntax(ps, "control character 0x%02x in a string", c);
		if (!basic || c != '\\') {
			cfg_string_push(v, (char)c);
			continue;
		}
		if (ps->p >= ps->end)
			return cfg_syntax(ps, "unterminated string (missing closing %c)", quote);
		char e = *ps->p++;
		switch (e) {
		case 'b':
			cfg_string_push(v, '\b');
			break;
		case 't':
			cfg_string_push(v, '\t');
			break;
		case 'n':
			cfg_string_push(v, '\n');
			break;
		case 'f':
			cfg_string_push(v, '\f');
			break;
		case 'r':
			cfg_string_push(v, '\r');
			break;
		case '"':
			cfg_string_push(v, '"');
			break;
		case '\\':
			cfg_string_push(v, '\\');
			break;
		case 'u':
		case 'U':
			return cfg_syntax(ps,
			                  "\\%c escapes are not supported; write the character "
			                  "itself (UTF-8)",
			                  e);
		default: {
			char s[8];
			cfg_snippet(&e, 1, 1, s, sizeof(s));
			return cfg_syntax(ps,
			                  "invalid escape '\\%s' in a string (valid: \\b \\t \\n "
			                  "\\f \\r \\\" \\\\)",
			                  s);
		}
		}
	}
	cfg_string_end(v);
	return 0;
}

/* Digits with single underscores between them; at least one digit. */
static const char *cfg_scan_digits(const char *s)
{
	if (!(*s >= '0' && *s <= '9'))
		return NULL;
	while ((*s >= '0' && *s <= '9') || (*s == '_' && s[1] >= '0' && s[1] <= '9'))
		s++;
	return s;
}

/* Classifies an unquoted token (NUL-terminated, underscores and all) into v. */
static void cfg_classify(const char *t, struct cfg_value *v)
{
	v->kind = VAL_INVALID;
	v->note = NULL;
	if (strcmp(t, "true") == 0 || strcmp(t, "false") == 0) {
		v->kind = VAL_BOOL;
		v->b = t[0] == 't';
		return;
	}
	const char *s = t + (t[0] == '+' || t[0] == '-');
	if (strcmp(s, "inf") == 0 || strcmp(s, "nan") == 0) {
		v->note = "inf and nan are not allowed";
		return;
	}
	const char *q = cfg_scan_digits(s);
	if (!q)
		return;
	if (s[0] == '0' && q - s > 1) {
		v->note = "leading zeros are not allowed";
		return;
	}
	bool is_float = false;
	if (*q == '.') {
		q = cfg_scan_digits(q + 1);
		if (!q)
			return;
		is_float = true;
	}
	if (*q == 'e' || *q == 'E') {
		q++;
		q += *q == '+' || *q == '-';
		q = cfg_scan_digits(q);
		if (!q)
			return;
		is_float = true;
	}
	if (*q)
		return;

	char clean[72];
	size_t n = 0;
	for (const char *c = t; *c; c++)
		if (*c != '_')
			clean[n++] = *c;
	clean[n] = '\0';
	errno = 0;
	if (is_float) {
		v->f = strtod(clean, NULL);
		if (isinf(v->f)) {
			v->note = "too large for a double";
			return;
		}
		v->kind = VAL_FLOAT;
	} else {
		v->i = strtoll(clean, NULL, 10);
		if (errno == ERANGE) {
			v->note = "does not fit in 64 bits";
			return;
		}
		v->kind = VAL_INTEGER;
	}
}

static int cfg_parse_value(struct cfg_parser *ps, struct cfg_value *v, int depth);

/* At '['. Parsed for TOML's sake; no key takes an array yet, so the elements are dropped. */
static int cfg_parse_array(struct cfg_parser *ps, struct cfg_value *v, int depth)
{
	int start_line = ps->line;
	struct cfg_value elem;
	char here[64];
	if (depth >= CFG_MAX_DEPTH)
		return cfg_syntax(ps, "arrays nested deeper than %d", CFG_MAX_DEPTH);
	ps->p++;
	v->kind = VAL_ARRAY;
	for (;;) {
		if (cfg_skip_ws_lines(ps))
			return -1;
		if (ps->p >= ps->end)
			goto unterminated;
		if (*ps->p == ']') {
			ps->p++;
			return 0;
		}
		if (cfg_parse_value(ps, &elem, depth + 1))
			return -1;
		if (elem.kind == VAL_INVALID)
			return cfg_syntax(ps, "invalid value '%s' in an array%s%s", elem.text,
			                  elem.note ? ": " : "", elem.note ? elem.note : "");
		cfg_skip_ws_lines(ps);
		if (ps->p >= ps->end)
			goto unterminated;
		if (*ps->p == ',') {
			ps->p++;
		} else if (*ps->p == ']') {
			ps->p++;
			return 0;
		} else {
			cfg_here(ps, here, sizeof(here));
			if (ps->line > start_line)
				return cfg_syntax(ps,
				                  "expected ',' or ']' in the array opened at "
				                  "line %d, got %s",
				                  start_line, here);
			return cfg_syntax(ps, "expected ',' or ']' in an array, got %s", here);
		}
	}
unterminated:
	ps->err_line = start_line;
	return cfg_syntax(ps, "unterminated array (missing ']')");
}

static int cfg_parse_value(struct cfg_parser *ps, struct cfg_value *v, int depth)
{
	char here[64];
	v->note = NULL;
	v->text[0] = '\0';
	if (ps->p >= ps->end || *ps->p == '\n' || *ps->p == '\r' || *ps->p == '#')
		return cfg_syntax(ps, "missing value");
	if (*ps->p == '"' || *ps->p == '\'')
		return cfg_parse_string(ps, v);
	if (*ps->p == '[')
		return cfg_parse_array(ps, v, depth);
	if (!cfg_is_token(*ps->p)) {
		cfg_here(ps, here, sizeof(here));
		return cfg_syntax(ps, "unexpected %s where a value should be", here);
	}
	const char *start = ps->p;
	while (ps->p < ps->end && cfg_is_token(*ps->p))
		ps->p++;
	size_t n = (size_t)(ps->p - start);
	cfg_snippet(start, n, 60, v->text, sizeof(v->text));
	if (n > 60) {
		v->kind = VAL_INVALID;
		v->note = "too long for a number";
		return 0;
	}
	cfg_classify(v->text, v);
	return 0;
}

/* ------------------------------------------------------------------------------------------
 * Assignment: the one place a value reaches a field.
 */

static bool cfg_in_range(const struct cfg_range *r, double x)
{
	if (isnan(x))
		return false;
	if (r->minus_one_ok && x == -1)
		return true;
	if ((r->lo_kind == BOUND_INCL && !(x >= r->lo)) ||
	    (r->lo_kind == BOUND_EXCL && !(x > r->lo)))
		return false;
	if ((r->hi_kind == BOUND_INCL && !(x <= r->hi)) ||
	    (r->hi_kind == BOUND_EXCL && !(x < r->hi)))
		return false;
	return true;
}

static bool cfg_is_choice(const char *const *choices, const char *s)
{
	for (const char *const *c = choices; *c; c++)
		if (strcmp(*c, s) == 0)
			return true;
	return false;
}

/* Describes v for "got ...": '"exp"', '1.5', 'true'. */
static void cfg_value_text(const struct cfg_value *v, char *buf, size_t n)
{
	char s[80];
	switch (v->kind) {
	case VAL_STRING:
		cfg_snippet(v->s, v->len < sizeof(v->s) ? v->len : sizeof(v->s) - 1, 60, s,
		            sizeof(s));
		snprintf(buf, n, "\"%s\"", s);
		break;
	case VAL_BOOL:
		snprintf(buf, n, "%s", v->b ? "true" : "false");
		break;
	case VAL_ARRAY:
		snprintf(buf, n, "an array");
		break;
	default:
		snprintf(buf, n, "%s", v->text);
		break;
	}
}

static int cfg_type_error(const struct cfg_where *w, const struct cfg_key *k,
                          const struct cfg_value *v, const char *want)
{
	char got[96];
	cfg_value_text(v, got, sizeof(got));
	if (v->kind == VAL_INVALID) {
		const char *note = v->note;
		if (!note && k->type == CFG_STRING && w->line > 0)
			note = "strings need quotes in a TOML file";
		return cfg_fail(w, "%s.%s: expected %s, got '%s'%s%s%s", k->section, k->name, want,
		                got, note ? " (" : "", note ? note : "", note ? ")" : "");
	}
	if (v->kind == VAL_ARRAY)
		return cfg_fail(w, "%s.%s: expected %s, got an array", k->section, k->name, want);
	return cfg_fail(w, "%s.%s: expected %s, got %s (%s)", k->section, k->name, want,
	                cfg_vkind_nouns[v->kind], got);
}

static int cfg_assign(struct ct_config *cfg, const struct cfg_key *k, const struct cfg_value *v,
                      const struct cfg_where *w)
{
	char want[256], got[96];
	void *field = cfg_field(cfg, k);
	double x;
	cfg_expect_text(k, want, sizeof(want));
	cfg_value_text(v, got, sizeof(got));
	switch (k->type) {
	case CFG_STRING:
		if (v->kind != VAL_STRING)
			return cfg_type_error(w, k, v, want);
		if (v->len >= k->size)
			return cfg_fail(w, "%s.%s: string too long (%zu bytes; at most %zu)",
			                k->section, k->name, v->len, k->size - 1);
		if (k->choices && !cfg_is_choice(k->choices, v->s))
			return cfg_fail(w, "%s.%s: expected %s, got %s", k->section, k->name, want,
			                got);
		memset(field, 0, k->size);
		memcpy(field, v->s, v->len);
		return 0;
	case CFG_INT:
		if (v->kind != VAL_INTEGER)
			return cfg_type_error(w, k, v, want);
		if (!cfg_in_range(&k->range, (double)v->i))
			return cfg_fail(w, "%s.%s: expected %s, got %s", k->section, k->name, want,
			                got);
		memcpy(field, &v->i, sizeof(v->i));
		return 0;
	case CFG_FLOAT:
		if (v->kind != VAL_INTEGER && v->kind != VAL_FLOAT)
			return cfg_type_error(w, k, v, want);
		x = v->kind == VAL_INTEGER ? (double)v->i : v->f;
		if (!cfg_in_range(&k->range, x))
			return cfg_fail(w, "%s.%s: expected %s, got %s", k->section, k->name, want,
			                got);
		memcpy(field, &x, sizeof(x));
		return 0;
	case CFG_BOOL:
		if (v->kind != VAL_BOOL)
			return cfg_type_error(w, k, v, want);
		memcpy(field, &v->b, sizeof(v->b));
		return 0;
	case CFG_TYPE_COUNT:
		break;
	}
	CHECK(0, "bad type %d for %s.%s", (int)k->type, k->section, k->name);
}

/* A value as written on the command line (and in the schema's defaults): strings as they
 * are, everything else as a TOML literal. */
static int cfg_assign_text(struct ct_config *cfg, const struct cfg_key *k, const char *text,
                           const struct cfg_where *w)
{
	struct cfg_value v = {.kind = VAL_INVALID};
	char want[256], here[64];
	struct cfg_parser ps = {.p = text, .end = text + strlen(text)};
	if (k->type == CFG_STRING) {
		for (const char *c = text; *c; c++)
			if ((unsigned char)*c < 0x20 ? *c != '\t' : *c == 0x7f)
				return cfg_fail(w, "%s.%s: control character 0x%02x in a string",
				                k->section, k->name, (unsigned char)*c);
		v.kind = VAL_STRING;
		v.len = strlen(text);
		memcpy(v.s, text, v.len < sizeof(v.s) ? v.len : sizeof(v.s) - 1);
		cfg_string_end(&v);
		return cfg_assign(cfg, k, &v, w);
	}
	cfg_expect_text(k, want, sizeof(want));
	cfg_skip_ws(&ps);
	if (ps.p >= ps.end)
		return cfg_fail(w, "%s.%s: empty value; expected %s", k->section, k->name, want);
	if (cfg_parse_value(&ps, &v, 0))
		return cfg_fail(w, "%s.%s: %s; expected %s", k->section, k->name, ps.err, want);
	cfg_skip_ws(&ps);
	if (ps.p < ps.end) {
		cfg_here(&ps, here, sizeof(here));
		return cfg_fail(w, "%s.%s: unexpected %s after the value; expected %s", k->section,
		                k->name, here, want);
	}
	return cfg_assign(cfg, k, &v, w);
}

/* ------------------------------------------------------------------------------------------
 * Files
 */

struct cfg_file_state {
	int section;                      /* index in cfg_sections, -1 before the first header */
	int section_line[CFG_N_SECTIONS]; /* where each section was opened, 0 if not yet */
	int key_line[CFG_N_KEYS];         /* where each key was set, 0 if not yet */
	const char *name;
};

/* After a line's content: whitespace, an optional comment, then the end of the line. */
static int cfg_end_line(struct cfg_parser *ps, const char *after)
{
	char here[64];
	cfg_skip_ws(ps);
	if (ps->p < ps->end && *ps->p == '#')
		while (ps->p < ps->end && *ps->p != '\n')
			ps->p++;
	if (ps->p >= ps->end)
		return 0;
	if (*ps->p == '\n') {
		ps->p++;
		ps->line++;
		return 0;
	}
	if (*ps->p == '\r' && ps->p + 1 < ps->end && ps->p[1] == '\n') {
		ps->p += 2;
		ps->line++;
		return 0;
	}
	cfg_here(ps, here, sizeof(here));
	return cfg_syntax(ps, "unexpected %s%s%s", here, after ? " after " : "",
	                  after ? after : "");
}

static int cfg_parse_header(struct cfg_parser *ps, struct cfg_file_state *st)
{
	struct cfg_where w = {st->name, ps->line};
	char here[64], shown[80];
	ps->p++;
	if (ps->p < ps->end && *ps->p == '[')
		return cfg_syntax(ps, "arrays of tables ([[...]]) are not supported");
	cfg_skip_ws(ps);
	const char *name = ps->p;
	while (ps->p < ps->end && cfg_is_bare(*ps->p))
		ps->p++;
	size_t n = (size_t)(ps->p - name);
	if (n == 0) {
		if (ps->p < ps->end && (*ps->p == '"' || *ps->p == '\''))
			return cfg_syntax(ps, "quoted section names are not supported");
		cfg_here(ps, here, sizeof(here));
		return cfg_syntax(ps, "expected a section name after '[', got %s", here);
	}
	cfg_snippet(name, n, 64, shown, sizeof(shown));
	cfg_skip_ws(ps);
	if (ps->p < ps->end && *ps->p == '.')
		return cfg_syntax(ps, "nested sections ([%s.x]) are not supported", shown);
	if (ps->p >= ps->end || *ps->p != ']')
		return cfg_syntax(ps, "unterminated section header '[%s' (missing ']')", shown);
	ps->p++;
	int idx = cfg_section_index(name, n);
	if (idx < 0)
		return cfg_unknown_section(&w, name, n);
	if (st->section_line[idx])
		return cfg_fail(&w, "section [%s] appears twice (first at line %d)", shown,
		                st->section_line[idx]);
	st->section_line[idx] = ps->line;
	st->section = idx;
	return 0;
}

/* The section holding a key of that name, if exactly one does. */
static const char *cfg_section_of(const char *key, size_t n)
{
	const char *found = NULL;
	for (size_t i = 0; i < CFG_N_KEYS; i++)
		if (strlen(cfg_schema[i].name) == n && memcmp(cfg_schema[i].name, key, n) == 0) {
			if (found && strcmp(found, cfg_schema[i].section) != 0)
				return NULL;
			found = cfg_schema[i].section;
		}
	return found;
}

static int cfg_parse_keyval(struct cfg_parser *ps, struct cfg_file_state *st, struct ct_config *cfg)
{
	struct cfg_where w = {st->name, ps->line};
	char here[64], shown[80], want[256];
	const char *key = ps->p;
	while (ps->p < ps->end && cfg_is_bare(*ps->p))
		ps->p++;
	size_t n = (size_t)(ps->p - key);
	if (n == 0) {
		if (*ps->p == '"' || *ps->p == '\'')
			return cfg_syntax(ps, "quoted keys are not supported");
		if (*ps->p == '=')
			return cfg_syntax(ps, "missing key before '='");
		cfg_here(ps, here, sizeof(here));
		return cfg_syntax(ps, "unexpected %s; expected 'key = value' or '[section]'", here);
	}
	cfg_snippet(key, n, 64, shown, sizeof(shown));
	cfg_skip_ws(ps);
	if (ps->p < ps->end && *ps->p == '.') {
		const char *rest = ps->p + 1;
		size_t rn = 0;
		while (rest + rn < ps->end && cfg_is_bare(rest[rn]))
			rn++;
		char rshown[80];
		cfg_snippet(rest, rn, 64, rshown, sizeof(rshown));
		return cfg_syntax(ps, "dotted keys are not supported; write '%s = ...' under [%s]",
		                  rshown, shown);
	}
	if (st->section < 0) {
		const char *sec = cfg_section_of(key, n);
		return cfg_syntax(ps, "key '%s' before any [section] header%s%s%s", shown,
		                  sec ? " (it belongs under [" : "", sec ? sec : "",
		                  sec ? "])" : "");
	}
	const char *sec = cfg_sections[st->section];
	if (ps->p >= ps->end || *ps->p != '=') {
		cfg_here(ps, here, sizeof(here));
		return cfg_syntax(ps, "missing '=' after key '%s' (got %s)", shown, here);
	}
	ps->p++;
	int idx = cfg_key_index(sec, key, n);
	if (idx < 0)
		return cfg_unknown_key(&w, sec, key, n);
	const struct cfg_key *k = &cfg_schema[idx];
	if (st->key_line[idx])
		return cfg_fail(&w, "duplicate key '%s.%s' (first set at line %d)", k->section,
		                k->name, st->key_line[idx]);
	st->key_line[idx] = ps->line;
	cfg_skip_ws(ps);
	cfg_expect_text(k, want, sizeof(want));
	if (ps->p >= ps->end || *ps->p == '\n' || *ps->p == '\r' || *ps->p == '#')
		return cfg_fail(&w, "%s.%s: missing value after '='; expected %s", k->section,
		                k->name, want);
	struct cfg_value v;
	if (cfg_parse_value(ps, &v, 0)) {
		struct cfg_where we = {st->name, ps->err_line};
		return cfg_fail(&we, "%s.%s: %s", k->section, k->name, ps->err);
	}
	return cfg_assign(cfg, k, &v, &w);
}

/* Parses a whole document into *cfg, which the caller commits only on success. */
static int cfg_parse_document(struct ct_config *cfg, const char *text, size_t len, const char *name)
{
	struct cfg_parser ps = {.p = text, .end = text + len, .line = 1};
	struct cfg_file_state st = {.section = -1, .name = name};
	if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
		ps.p += 3; /* UTF-8 byte order mark */
	while (ps.p < ps.end) {
		const char *after = NULL;
		int rc = 0;
		cfg_skip_ws(&ps);
		if (ps.p < ps.end && *ps.p != '#' && *ps.p != '\n' && *ps.p != '\r') {
			if (*ps.p == '[') {
				rc = cfg_parse_header(&ps, &st);
				after = "the section header";
			} else {
				rc = cfg_parse_keyval(&ps, &st, cfg);
				after = "the value";
			}
		}
		if (rc == 0)
			rc = cfg_end_line(&ps, after);
		if (rc == CT_ERR_USAGE)
			return rc; /* already reported */
		if (rc) {
			struct cfg_where w = {name, ps.err_line ? ps.err_line : ps.line};
			return cfg_fail(&w, "%s", ps.err);
		}
	}
	return 0;
}

int config_load_string(struct ct_config *cfg, const char *text, size_t len, const char *name)
{
	struct ct_config *tmp = xcalloc(1, sizeof(*tmp));
	memcpy(tmp, cfg, sizeof(*tmp));
	int rc = cfg_parse_document(tmp, text, len, name);
	if (rc == 0)
		memcpy(cfg, tmp, sizeof(*tmp));
	free(tmp);
	return rc;
}

#define CFG_FILE_MAX (16 << 20)

int config_load_file(struct ct_config *cfg, const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		LOG_ERROR("%s: cannot open config file: %s", path, strerror(errno));
		return CT_ERR_USAGE;
	}
	size_t cap = 4096, len = 0;
	char *buf = xcalloc(cap, 1);
	int rc = 0;
	for (;;) {
		if (len == cap) {
			if (cap >= CFG_FILE_MAX) {
				LOG_ERROR("%s: config file larger than %d MiB", path,
				          CFG_FILE_MAX >> 20);
				rc = CT_ERR_USAGE;
				goto out_free;
			}
			cap *= 2;
			char *grown = realloc(buf, cap);
			CHECK(grown, "out of memory reading %s", path);
			buf = grown;
		}
		size_t got = fread(buf + len, 1, cap - len, f);
		len += got;
		if (got == 0)
			break;
	}
	if (ferror(f)) {
		LOG_ERROR("%s: cannot read config file: %s", path, strerror(errno));
		rc = CT_ERR_USAGE;
		goto out_free;
	}
	rc = config_load_string(cfg, buf, len, path);
out_free:
	free(buf);
	fclose(f);
	return rc;
}

/* ------------------------------------------------------------------------------------------
 * Command line
 */

/* The row of "section.key" as written after "--", or -1 after saying why there is none. */
static int cfg_arg_key(const char *name, size_t n, const struct cfg_where *w)
{
	char shown[80];
	const char *dot = memchr(name, '.', n);
	int idx = -1;
	if (n == 0) {
		cfg_fail(w, "expected --section.key=value or --section.key value");
		return -1;
	}
	cfg_snippet(name, n, 64, shown, sizeof(shown));
	if (!dot) {
		const struct cfg_key *hint = cfg_suggest_key("", 0, name, n);
		if (hint)
			cfg_fail(w, "key '%s' has no section (did you mean '--%s.%s'?)", shown,
			         hint->section, hint->name);
		else
			cfg_fail(w, "key '%s' has no section; expected --section.key=value", shown);
		return -1;
	}
	size_t sn = (size_t)(dot - name);
	int sec = cfg_section_index(name, sn);
	if (sec < 0)
		cfg_unknown_section(w, name, sn);
	else if ((idx = cfg_key_index(cfg_sections[sec], dot + 1, n - sn - 1)) < 0)
		cfg_unknown_key(w, cfg_sections[sec], dot + 1, n - sn - 1);
	return idx;
}

static int cfg_apply_args(struct ct_config *cfg, int argc, char **argv)
{
	char joined[1024];
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		struct cfg_where w = {a, 0};
		if (strncmp(a, "--", 2) != 0)
			return cfg_fail(&w,
			                "unexpected argument; overrides are --section.key=value "
			                "or --section.key value");
		const char *name = a + 2, *eq = strchr(name, '='), *val;
		int idx = cfg_arg_key(name, eq ? (size_t)(eq - name) : strlen(name), &w);
		if (idx < 0)
			return CT_ERR_USAGE;
		if (eq) {
			val = eq + 1;
		} else {
			if (i + 1 >= argc)
				return cfg_fail(&w, "missing value (write %s=VALUE or %s VALUE)", a,
				                a);
			if (strncmp(argv[i + 1], "--", 2) == 0)
				return cfg_fail(&w,
				                "missing value: the next argument '%s' is an "
				                "option (write %s=VALUE)",
				                argv[i + 1], a);
			val = argv[++i];
			snprintf(joined, sizeof(joined), "%s %s", a, val);
			w.name = joined;
		}
		int rc = cfg_assign_text(cfg, &cfg_schema[idx], val, &w);
		if (rc)
			return rc;
	}
	return 0;
}

int config_apply_args(struct ct_config *cfg, int argc, char **argv)
{
	struct ct_config *tmp = xcalloc(1, sizeof(*tmp));
	memcpy(tmp, cfg, sizeof(*tmp));
	int rc = cfg_apply_args(tmp, argc, argv);
	if (rc == 0)
		memcpy(cfg, tmp, sizeof(*tmp));
	free(tmp);
	return rc;
}

/* ------------------------------------------------------------------------------------------
 * Defaults and validation
 */

/* The schema's own invariants; cheap, so checked every time defaults are built. */
static void cfg_schema_check(void)
{
	int last_section = 0;
	for (size_t i = 0; i < CFG_N_KEYS; i++) {
		const struct cfg_key *k = &cfg_schema[i];
		int s = cfg_section_index(k->section, strlen(k->section));
		CHECK(s >= last_section, "schema: %s.%s: unknown section or rows out of order",
		      k->section, k->name);
		last_section = s;
		CHECK(cfg_key_index(k->section, k->name, strlen(k->name)) == (int)i,
		      "schema: %s.%s appears twice", k->section, k->name);
		CHECK(k->type != CFG_STRING || (k->size >= 2 && k->size <= CONFIG_STR_MAX),
		      "schema: %s.%s: bad string size %zu", k->section, k->name, k->size);
		CHECK(!k->choices || k->type == CFG_STRING,
		      "schema: %s.%s: choices on a non-string", k->section, k->name);
		CHECK(k->def && k->help, "schema: %s.%s: no default or help", k->section, k->name);
	}
}

void config_defaults(struct ct_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg_schema_check();
	for (size_t i = 0; i < CFG_N_KEYS; i++) {
		const struct cfg_key *k = &cfg_schema[i];
		struct cfg_where w = {"schema default", 0};
		int rc = cfg_assign_text(cfg, k, k->def, &w);
		CHECK(rc == 0, "schema: default of %s.%s is invalid", k->section, k->name);
	}
}

/* One field of a struct that may have been filled by code rather than by this module. */
static int cfg_validate_field(const struct ct_config *cfg, const struct cfg_key *k)
{
	const struct cfg_where w = {"config", 0};
	const void *field = cfg_field_const(cfg, k);
	char want[256];
	cfg_expect_text(k, want, sizeof(want));
	if (k->type == CFG_STRING) {
		const char *s = field;
		size_t len = strnlen(s, k->size);
		if (len == k->size)
			return cfg_fail(&w, "%s.%s: string not terminated", k->section, k->name);
		for (size_t j = 0; j < len; j++) {
			unsigned char c = (unsigned char)s[j];
			if ((c < 0x20 && !strchr("\b\t\n\f\r", c)) || c == 0x7f)
				return cfg_fail(&w, "%s.%s: control character 0x%02x in a string",
				                k->section, k->name, c);
		}
		if (k->choices && !cfg_is_choice(k->choices, s))
			return cfg_fail(&w, "%s.%s: expected %s, got \"%s\"", k->section, k->name,
			                want, s);
	} else if (k->type == CFG_INT) {
		int64_t v;
		memcpy(&v, field, sizeof(v));
		if (!cfg_in_range(&k->range, (double)v))
			return cfg_fail(&w, "%s.%s: expected %s, got %lld", k->section, k->name,
			                want, (long long)v);
	} else if (k->type == CFG_FLOAT) {
		double v;
		memcpy(&v, field, sizeof(v));
		if (!isfinite(v) || !cfg_in_range(&k->range, v))
			return cfg_fail(&w, "%s.%s: expected %s, got %g", k->section, k->name, want,
			                v);
	}
	return 0;
}

int config_validate(const struct ct_config *cfg)
{
	const struct cfg_where w = {"config", 0};
	for (size_t i = 0; i < CFG_N_KEYS; i++) {
		int rc = cfg_validate_field(cfg, &cfg_schema[i]);
		if (rc)
			return rc;
	}
	if (cfg->job.dump_folder[0] == '\0')
		return cfg_fail(&w, "job.dump_folder: must not be empty");
	if (cfg->training.dataset[0] == '\0')
		return cfg_fail(&w,
		                "training.dataset: must not be empty (\"synthetic\" or a path)");
	if (cfg->checkpoint.exclude_from_loading[0]) {
		char buf[CONFIG_STR_MAX], *save = NULL;
		snprintf(buf, sizeof(buf), "%s", cfg->checkpoint.exclude_from_loading);
		for (char *p = strtok_r(buf, ", ", &save); p; p = strtok_r(NULL, ", ", &save))
			if (strcmp(p, "optimizer") && strcmp(p, "lr_scheduler") &&
			    strcmp(p, "dataloader") && strcmp(p, "train_state"))
				return cfg_fail(
				    &w,
				    "checkpoint.exclude_from_loading: unknown part '%s' "
				    "(expected optimizer, lr_scheduler, dataloader or "
				    "train_state)",
				    p);
	}
	if (cfg->checkpoint.initial_load_in_hf && !cfg->checkpoint.initial_load_path[0])
		return cfg_fail(&w, "checkpoint.initial_load_in_hf needs "
		                    "checkpoint.initial_load_path");
	/* Divisibility by local * dp needs the world size and is the trainer's; dividing by
	 * local alone is necessary for it and known now. */
	if (cfg->training.global_batch_size != -1 &&
	    cfg->training.global_batch_size % cfg->training.local_batch_size != 0)
		return cfg_fail(&w,
		                "training.global_batch_size (%lld) must be -1 or a multiple of "
		                "training.local_batch_size (%lld)",
		                (long long)cfg->training.global_batch_size,
		                (long long)cfg->training.local_batch_size);
	if (strcmp(cfg->activation_checkpoint.mode, "selective") == 0 &&
	    strcmp(cfg->activation_checkpoint.selective_ac_option, "op") != 0)
		return cfg_fail(&w,
		                "activation_checkpoint.selective_ac_option: '%s' is not yet "
		                "supported (only \"op\", the per-op policy)",
		                cfg->activation_checkpoint.selective_ac_option);
	/* Ranks are an int in MPI: the fixed degrees must multiply to something that fits. */
	const struct ct_config *c = cfg;
	int64_t degrees[] = {c->parallelism.data_parallel_replicate_degree,
	                     c->parallelism.tensor_parallel_degree,
	                     c->parallelism.pipeline_parallel_degree,
	                     c->parallelism.data_parallel_shard_degree == -1
	                         ? 1
	                         : c->parallelism.data_parallel_shard_degree};
	int64_t ranks = 1;
	for (size_t i = 0; i < ARRAY_SIZE(degrees); i++) {
		if (degrees[i] > INT32_MAX / ranks)
			return cfg_fail(&w,
			                "parallelism: the degrees multiply to more than %d ranks",
			                INT32_MAX);
		ranks *= degrees[i];
	}
	return 0;
}

/* ------------------------------------------------------------------------------------------
 * Printing
 */

/* The shortest of %.15g, %.16g, %.17g that reads back exactly, always with a '.' or an
 * exponent so that it reads back as a float. */
static void cfg_format_float(double x, char *buf, size_t n)
{
	for (int prec = 15; prec <= 17; prec++) {
		snprintf(buf, n, "%.*g", prec, x);
		if (strtod(buf, NULL) == x)
			break;
	}
	if (!strpbrk(buf, ".eEn")) /* n: inf, nan, which never pass validation */
		strncat(buf, ".0", n - strlen(buf) - 1);
}

static void cfg_print_string(const char *s, FILE *f)
{
	fputc('"', f);
	for (; *s; s++) {
		switch (*s) {
		case '"':
			fputs("\\\"", f);
			break;
		case '\\':
			fputs("\\\\", f);
			break;
		case '\b':
			fputs("\\b", f);
			break;
		case '\t':
			fputs("\\t", f);
			break;
		case '\n':
			fputs("\\n", f);
			break;
		case '\f':
			fputs("\\f", f);
			break;
		case '\r':
			fputs("\\r", f);
			break;
		default:
			fputc(*s, f);
			break;
		}
	}
	fputc('"', f);
}

static void cfg_print_value(const struct ct_config *cfg, const struct cfg_key *k, FILE *f)
{
	const void *field = cfg_field_const(cfg, k);
	char buf[64];
	int64_t i;
	double x;
	bool b;
	switch (k->type) {
	case CFG_STRING:
		cfg_print_string(field, f);
		break;
	case CFG_INT:
		memcpy(&i, field, sizeof(i));
		fprintf(f, "%lld", (long long)i);
		break;
	case CFG_FLOAT:
		memcpy(&x, field, sizeof(x));
		cfg_format_float(x, buf, sizeof(buf));
		fputs(buf, f);
		break;
	case CFG_BOOL:
		memcpy(&b, field, sizeof(b));
		fputs(b ? "true" : "false", f);
		break;
	case CFG_TYPE_COUNT:
		break;
	}
}

static size_t cfg_section_width(const char *sec)
{
	size_t w = 0;
	for (size_t i = 0; i < CFG_N_KEYS; i++)
		if (strcmp(cfg_schema[i].section, sec) == 0 && strlen(cfg_schema[i].name) > w)
			w = strlen(cfg_schema[i].name);
	return w;
}

void config_print(const struct ct_config *cfg, FILE *f)
{
	fprintf(f, "# ctitan effective configuration\n");
	for (size_t s = 0; s < CFG_N_SECTIONS; s++) {
		int width = (int)cfg_section_width(cfg_sections[s]);
		fprintf(f, "\n[%s]\n", cfg_sections[s]);
		for (size_t i = 0; i < CFG_N_KEYS; i++) {
			const struct cfg_key *k = &cfg_schema[i];
			if (strcmp(k->section, cfg_sections[s]) != 0)
				continue;
			fprintf(f, "%-*s = ", width, k->name);
			cfg_print_value(cfg, k, f);
			fputc('\n', f);
		}
	}
}

/* fputs of a line without its trailing blanks. */
static void cfg_put_line(char *line, FILE *f)
{
	size_t n = strlen(line);
	while (n > 0 && line[n - 1] == ' ')
		line[--n] = '\0';
	fprintf(f, "%s\n", line);
}

void config_print_help(FILE *f)
{
	int wname = 0, wdef = 0;
	char def[CONFIG_STR_MAX + 8], cons[256], line[1024];
	for (size_t i = 0; i < CFG_N_KEYS; i++) {
		const struct cfg_key *k = &cfg_schema[i];
		int dn = (int)strlen(k->def) + (k->type == CFG_STRING ? 2 : 0);
		if ((int)strlen(k->name) > wname)
			wname = (int)strlen(k->name);
		if (dn > wdef)
			wdef = dn;
	}
	fprintf(f, "Configuration keys: set them in the TOML file under [section], or override "
	           "them with --section.key=value or --section.key value.\n\n");
	snprintf(line, sizeof(line), "  %-*s  %-6s  %-*s  %s", wname, "key", "type", wdef,
	         "default", "allowed");
	cfg_put_line(line, f);
	for (size_t s = 0; s < CFG_N_SECTIONS; s++) {
		fprintf(f, "\n[%s]\n", cfg_sections[s]);
		for (size_t i = 0; i < CFG_N_KEYS; i++) {
			const struct cfg_key *k = &cfg_schema[i];
			if (strcmp(k->section, cfg_sections[s]) != 0)
				continue;
			snprintf(def, sizeof(def), k->type == CFG_STRING ? "\"%s\"" : "%s", k->def);
			cfg_constraint_text(k, cons, sizeof(cons));
			snprintf(line, sizeof(line), "  %-*s  %-6s  %-*s  %s", wname, k->name,
			         cfg_type_names[k->type], wdef, def, cons);
			cfg_put_line(line, f);
			fprintf(f, "  %*s  %s\n", wname, "", k->help);
		}
	}
}
