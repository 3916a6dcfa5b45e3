/* io/config: the run configuration — TOML files in TorchTitan's TOML-era sections and keys,
 * with `--section.key=value` / `--section.key value` overrides.
 *
 * A typed schema table in config_schema.c (section, key, type, field offset, default, range
 * or choices, help), with the rows the layers above add (config_add_keys: a model family's
 * own `[model]` keys), is the single source of truth: parsing, defaults, validation, `--help`
 * and `--job.print_config` all read it. Unknown keys, type errors and out-of-range values are
 * CT_ERR_USAGE errors whose message names the key, the file and line (or the argument), and
 * the expected type. No C TOML library ships in Debian, so the small TOML subset parser that
 * ctitan needs lives here: [section] headers, `key = value` with strings ("..." with escapes,
 * '...' literal), integers, floats, booleans, arrays of those, `#` comments.
 */
#ifndef CT_IO_CONFIG_H
#define CT_IO_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CONFIG_STR_MAX 512

/* Bytes for the values of the keys the layers above add (config_add_keys). */
#define CONFIG_EXT_BYTES 4096

struct ct_config {
	struct {
		char dump_folder[CONFIG_STR_MAX]; /* "./outputs" */
		char description[CONFIG_STR_MAX]; /* "" */
		bool print_config;                /* false: print the effective config and exit */
		char log_level[16];               /* "info": debug | info | warning | error */
	} job;
	struct {
		char name[64];      /* "llama3" */
		char flavor[64];    /* "debugmodel": a preset of the family (config_set_choices) */
		int64_t vocab_size; /* -1: the flavor's vocab */
		bool rope_scaling;  /* false: Llama 3.1 RoPE frequency scaling (factor 8, low 1,
		                       high 4, original context 8192) */
		char converters[64]; /* "": comma list of model converters ("float8") */
		char tokenizer_path[CONFIG_STR_MAX]; /* "": the tokenizer of the dataset (rank
		                                        file or tokenizer.json) */
		/* a family's own keys are added by it (config_add_keys; model/model.h) */
	} model;
	struct {
		char name[32];       /* "AdamW" (only choice) */
		double lr;           /* 8e-4, > 0 */
		double beta1;        /* 0.9, [0,1) */
		double beta2;        /* 0.95, [0,1) */
		double eps;          /* 1e-8, > 0 */
		double weight_decay; /* 0.1, >= 0 */
	} optimizer;
	struct {
		int64_t warmup_steps; /* 200, >= 0 */
		double decay_ratio;   /* -1 (unset: decay starts right after warmup), else [0,1] */
		char decay_type[16];  /* "linear": linear | sqrt | cosine */
		double min_lr_factor; /* 0.0, [0,1] */
	} lr_scheduler;
	struct {
		int64_t local_batch_size;     /* 8, >= 1 */
		int64_t global_batch_size;    /* -1 (= local * dp), else multiple of local * dp */
		int64_t seq_len;              /* 2048, >= 1 */
		double max_norm;              /* 1.0, > 0; gradient clipping on the global norm */
		int64_t steps;                /* 10000, >= 1 */
		char dataset[CONFIG_STR_MAX]; /* "synthetic" (seeded sequences with a learnable
		                                 rule) or a dataset name (needs dataset_path) */
		char dataset_path[CONFIG_STR_MAX]; /* "": a folder of token shards (train_*.bin,
		                                      val_*.bin) from `ctitan prepare` */
		char mixed_precision_param[16];    /* "float32": float32 | bfloat16 | auto */
		char mixed_precision_reduce[16];   /* "float32": float32 */
	} training;
	struct ct_config_float8 {
		/* [quantize.linear.float8] (TorchTitan's section and keys; torchao float8) */
		char recipe_name[32]; /* "tensorwise": tensorwise | rowwise | rowwise_with_gw_hp */
		bool enable_fsdp_float8_all_gather;            /* false */
		bool precompute_float8_dynamic_scale_for_fsdp; /* false (ctitan always does) */
		char filter_fqns[CONFIG_STR_MAX];              /* "output": comma list */
		bool emulate;                                  /* true (the only way here) */
	} float8;
	struct {
		char matmul_engine[16]; /* "auto": auto | onednn | openblas (kernels/mm_engine.h) */
	} compute;
	struct {
		int64_t data_parallel_shard_degree;     /* -1: fill the rest of the world */
		int64_t data_parallel_replicate_degree; /* 1, >= 1 */
		int64_t tensor_parallel_degree;         /* 1, >= 1 */
		int64_t pipeline_parallel_degree;       /* 1, >= 1 */
		int64_t context_parallel_degree;        /* 1, >= 1 */
		int64_t expert_parallel_degree;         /* 1, >= 1 */
		char context_parallel_load_balancer[16]; /* "headtail": headtail | none */
		char context_parallel_rotate_method[16]; /* "allgather": allgather | alltoall */
		/* pipeline parallelism (parallel/pp.h), TorchTitan's keys */
		char pipeline_parallel_schedule[32];           /* "1F1B" (GPipe, Interleaved1F1B,
		                                                  ZeroBubbleH1) */
		char pipeline_parallel_schedule_csv[CONFIG_STR_MAX]; /* "": a CSV schedule */
		int64_t pipeline_parallel_microbatch_size;      /* 1, >= 1 rows */
		int64_t pipeline_parallel_layers_per_stage;     /* -1: one stage per rank */
		int64_t pipeline_parallel_first_stage_less_layers; /* 1, >= 0 */
		int64_t pipeline_parallel_last_stage_less_layers;  /* 1, >= 0 */
		char fsdp_reshard_after_forward[16];    /* "default": default | always | never */
		/* tensor parallelism: async TP (ring-decomposed collective matmuls); ctitan plan
		 * models it, ctitan train runs it (also inside pipeline stages) */
		bool enable_async_tensor_parallel;
		/* ctitan plan: the link TP collectives use (inside a node), Gbit/s */
		double tp_bandwidth_gbps;
	} parallelism;
	struct {
		bool enable;   /* false: report the loss on the val split of dataset_path */
		int64_t freq;  /* 100, >= 1: every this many steps (and at the last) */
		int64_t steps; /* -1 (the whole split), else >= 1: steps per evaluation */
	} validation;
	struct {
		bool enable;                 /* false: save and resume checkpoints */
		char folder[CONFIG_STR_MAX]; /* "checkpoint": under job.dump_folder */
		int64_t interval; /* 500, >= 1: save every this many steps (and at the end) */
		int64_t
		    keep_latest_k; /* 10, >= 0: keep this many newest checkpoints; 0 keeps all */
		int64_t load_step; /* -1, >= -1: resume from this step; -1 the newest one */
		char async_mode[CONFIG_STR_MAX]; /* "disabled" | "async" (background writer) */
		char exclude_from_loading[CONFIG_STR_MAX]; /* "": comma list of optimizer,
		                                              lr_scheduler, dataloader, train_state
		                                            */
		char initial_load_path[CONFIG_STR_MAX]; /* "": with no checkpoint to resume, start
		                                           from this one (or HF folder) */
		bool initial_load_model_only;           /* true: weights only, from step 0 */
		bool initial_load_in_hf; /* false: initial_load_path is a Hugging Face folder */
	} checkpoint;
	struct {
		char mode[16]; /* "none": none | ffn | selective | full — what forward saves and
		                  backward recomputes (see llama.h) */
		char selective_ac_option[16]; /* "op": TorchTitan's per-op policy */
	} activation_checkpoint;
	struct {
		char progress[16]; /* "inline": inline | thread — how the comm stream advances */
		double timeout_seconds; /* 300, > 0: a collective waiting longer aborts the job */
		char buckets[CONFIG_STR_MAX];   /* "per_block" | "auto" | "embed+0,1,...,norm" */
		double bucket_cap_mb;           /* 100: auto bucketing's largest bucket */
		int64_t prefetch;               /* 1: all-gathers issued this many ahead */
		int64_t reduce_scatter_defer;   /* 1: reduce-scatter waits deferred this many */
		double memory_budget_gb;        /* 0 (none): reordering keeps peak memory under */
		double bandwidth_gbps;          /* 0 (measure): cost-model link, Gbit/s */
		double latency_us;              /* 0: cost-model latency per collective */
		double simulate_bandwidth_gbps; /* 0 (off): simulated link speed */
		double simulate_latency_us;     /* 0: simulated latency per collective */
		int64_t flight_recorder_entries; /* 2000: per-group ring of the last collectives
		                                    and transfers, dumped on a hang (0: off) */
	} comm;
	struct {
		int64_t log_freq; /* 1, >= 1 */
		double
		    peak_tflops; /* 0: measure sgemm on a large square at start-up; > 0: use this */
		bool enable_jsonl; /* true: write metrics.jsonl into job.dump_folder */
		bool enable_tensorboard;             /* false: TensorBoard event file (rank 0) */
		char save_tb_folder[CONFIG_STR_MAX]; /* "tb", under dump_folder */
	} metrics;
	struct {
		bool enable_profiling;                   /* false: Chrome traces per rank */
		char save_traces_folder[CONFIG_STR_MAX]; /* "profile_trace", under dump_folder */
		int64_t profile_freq;                    /* 10: trace every this many steps */
		bool enable_memory_snapshot; /* false: per-category memory timeline of a step */
		char save_memory_snapshot_folder[CONFIG_STR_MAX]; /* "memory_snapshot" */
	} profiling;
	struct {
		double compute_efficiency; /* 0.5: fraction of peak the target's kernels achieve */
		double memory_bandwidth_gbs; /* 3000: the target's memory bandwidth, GB/s */
		char activation_dtype[16];   /* "auto" | float32 | bfloat16 */
		double fp8_peak_tflops;      /* 0: the target's dense fp8 peak (0: none) */
		double attention_efficiency; /* 0: compute_efficiency; the attention kernel's */
	} plan;
	struct {
		int64_t seed;       /* 0, >= 0: weights and synthetic data */
		bool deterministic; /* true (ctitan is always deterministic; kept for TorchTitan
		                       configs) */
		int64_t fail_rank;  /* -1, >= -1: fault injection for tests — this rank kills */
		int64_t fail_step;  /* 0, >= 0: itself (SIGKILL) in the middle of this step */
		char sample_log[CONFIG_STR_MAX]; /* "": append "step sample" lines per rank to
		                                    <sample_log>.rank-R (tests) */
		int64_t skip_collective_rank; /* -1: fault injection — this rank issues a barrier */
		int64_t skip_collective_seq;  /* 1: in place of its collective number seq on */
		char skip_collective_group[16]; /* "dp_shard": this group (a desync, for tests) */
	} debug;
	/* the values of the keys added by config_add_keys (read them with config_get_*) */
	_Alignas(8) unsigned char ext[CONFIG_EXT_BYTES];
};

/* Fill *cfg with every default from the schema. */
void config_defaults(struct ct_config *cfg);
/* Parse a TOML file on top of *cfg. Loading is all or nothing: on error *cfg is unchanged. */
int config_load_file(struct ct_config *cfg, const char *path);
/* The same for text[0..len) already in memory (may hold any bytes); name is used in
 * messages in place of the file name. */
int config_load_string(struct ct_config *cfg, const char *text, size_t len, const char *name);
/* Apply argv[0..argc) overrides (`--section.key=value` or `--section.key value`). Arguments
 * that are not of that form are errors. Strings need no quotes; other values are TOML
 * literals. In the two-argument form a next argument starting with `--` is not taken as the
 * value (use `=`). Later overrides of a key win. All or nothing, like config_load_file. */
int config_apply_args(struct ct_config *cfg, int argc, char **argv);
/* Cross-field checks after all sources are applied (e.g. global batch divisibility needs the
 * world size, so that one is the trainer's; here: choices, ranges, combinations). */
int config_validate(const struct ct_config *cfg);
/* activation_checkpoint.selective_ac_option as TorchTitan's per-layer N: 0 for "op", N >= 1
 * for a positive integer, -1 for anything else. */
int config_ac_every(const struct ct_config *cfg);
/* The effective config as a TOML file that config_load_file reads back unchanged. */
void config_print(const struct ct_config *cfg, FILE *f);
/* Every key with type, default, range/choices and help, grouped by section. */
void config_print_help(FILE *f);

/* ---- keys of the layers above ----
 * io/ sits below the model families, yet a family may have `[model]` keys of its own (a
 * long convolution's order, a filter's size, ...). A layer above adds them at start-up,
 * before the first config_defaults: an added key is parsed, checked, printed, listed in
 * --help and suggested in "did you mean" exactly like a row of the schema, and its value
 * lives in ct_config.ext, read with config_get_* by "section.name". Misuse (an unknown key,
 * a wrong type, a full table) is a broken invariant (CHECK). */

enum config_type { CONFIG_STRING, CONFIG_INT, CONFIG_FLOAT, CONFIG_BOOL, CONFIG_TYPE_COUNT };

enum config_bound { CONFIG_BOUND_NONE, CONFIG_BOUND_INCL, CONFIG_BOUND_EXCL };

struct config_range {
	enum config_bound lo_kind, hi_kind;
	double lo, hi;
	bool minus_one_ok; /* -1 ("unset") is accepted besides the range */
};

/* A key as a layer above declares it: a schema row without its place in struct ct_config. */
struct config_key_def {
	const char *name; /* within its section */
	enum config_type type;
	const char *def;            /* the default, written as on the command line */
	struct config_range range;  /* numbers only */
	const char *const *choices; /* strings only; NULL-terminated, or NULL for any string */
	bool list; /* strings only: a TOML array of strings (or a comma list), stored "a,b" */
	const char *help;
};

/* Ranges and choices of a key, as designated initializers (.range = ..., .choices = ...). */
#define CONFIG_GE(a) .range = {.lo_kind = CONFIG_BOUND_INCL, .lo = (a)}
#define CONFIG_GT(a) .range = {.lo_kind = CONFIG_BOUND_EXCL, .lo = (a)}
#define CONFIG_IN_CO(a, b)                                                                         \
	.range = {.lo_kind = CONFIG_BOUND_INCL, .lo = (a), .hi_kind = CONFIG_BOUND_EXCL, .hi = (b)}
#define CONFIG_IN_CC(a, b)                                                                         \
	.range = {.lo_kind = CONFIG_BOUND_INCL, .lo = (a), .hi_kind = CONFIG_BOUND_INCL, .hi = (b)}
#define CONFIG_UNSET_OR_GE(a)                                                                      \
	.range = {.lo_kind = CONFIG_BOUND_INCL, .lo = (a), .minus_one_ok = true}
#define CONFIG_UNSET_OR_GT(a)                                                                      \
	.range = {.lo_kind = CONFIG_BOUND_EXCL, .lo = (a), .minus_one_ok = true}
#define CONFIG_UNSET_OR_IN_CC(a, b)                                                                \
	.range = {.lo_kind = CONFIG_BOUND_INCL,                                                    \
	          .lo = (a),                                                                       \
	          .hi_kind = CONFIG_BOUND_INCL,                                                    \
	          .hi = (b),                                                                       \
	          .minus_one_ok = true}
#define CONFIG_CHOICES(...)                                                                        \
	.choices = (const char *const[])                                                           \
	{                                                                                          \
		__VA_ARGS__, NULL                                                                  \
	}

/* Add n keys to an existing section (printed after its own rows, in this order). */
void config_add_keys(const char *section, const struct config_key_def *defs, size_t n);
/* Set what a string key accepts, and its help (NULL: keep it), e.g. model.flavor: the
 * families' presets. */
void config_set_choices(const char *key, const char *const *choices, const char *help);
/* A cross-field check of the layers above, run by config_validate (0, or CT_ERR_USAGE after
 * config_error), before its own checks of keys that would do nothing. At most 8. */
void config_add_check(int (*check)(const struct ct_config *cfg));
/* "config: <message>" as config_validate reports an error; returns CT_ERR_USAGE. */
__attribute__((format(printf, 1, 2))) int config_error(const char *fmt, ...);

/* The value of any key, built-in or added, by "section.name". */
int64_t config_get_int(const struct ct_config *cfg, const char *key);
double config_get_float(const struct ct_config *cfg, const char *key);
bool config_get_bool(const struct ct_config *cfg, const char *key);
const char *config_get_string(const struct ct_config *cfg, const char *key);
/* Whether the key holds its default (was not set, or was set to it). */
bool config_is_default(const struct ct_config *cfg, const char *key);

#endif
