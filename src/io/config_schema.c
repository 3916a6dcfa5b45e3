/* io/config_schema: the schema table, one row per key (see io/config.c for what a row holds).
 * New keys: one contiguous block of rows in their section; regenerate docs/config.md. */
#include "io/config_impl.h"

#include <stddef.h>

/* ------------------------------------------------------------------------------------------
 * Schema
 */

const char *const cfg_type_names[] = {"string", "int", "float", "bool"};
_Static_assert(ARRAY_SIZE(cfg_type_names) == CONFIG_TYPE_COUNT, "one name per type");

/* "expected <noun>" */
const char *const cfg_type_nouns[] = {"a string", "an integer", "a float",
                                             "a boolean (true or false)"};
_Static_assert(ARRAY_SIZE(cfg_type_nouns) == CONFIG_TYPE_COUNT, "one noun per type");

/* Sections in the order they are printed; rows below are grouped in this order. */
const char *const cfg_sections[] = {"job",          "model",      "optimizer",
                                           "lr_scheduler", "training",   "quantize.linear.float8",
                                           "compute",
                                           "parallelism",
                                           "validation",   "checkpoint", "activation_checkpoint",
                                           "comm",         "metrics",    "profiling",
                                           "plan",         "debug"};
const size_t cfg_n_sections = ARRAY_SIZE(cfg_sections);

#define CFG_FIELD(sec, key) (((struct ct_config *)0)->sec.key)
#define CFG_TYPE_OF(sec, key)                                                                      \
	_Generic(CFG_FIELD(sec, key), char *: CONFIG_STRING, int64_t: CONFIG_INT,                  \
		 double: CONFIG_FLOAT, bool: CONFIG_BOOL)
#define ROW(sec, key)                                                                              \
	.section = #sec, .name = #key, .type = CFG_TYPE_OF(sec, key),                              \
	.offset = offsetof(struct ct_config, sec.key), .size = sizeof(CFG_FIELD(sec, key))

/* A row of a section whose TOML name is not a C identifier (quantize.linear.float8). */
#define ROW_AS(name_, sec, key)                                                                    \
	.section = name_, .name = #key, .type = CFG_TYPE_OF(sec, key),                             \
	.offset = offsetof(struct ct_config, sec.key), .size = sizeof(CFG_FIELD(sec, key))
#define ROW_F8(key) ROW_AS("quantize.linear.float8", float8, key)

/* The range and choice macros of io/config.h, short. */
#define GE             CONFIG_GE
#define GT             CONFIG_GT
#define IN_CO          CONFIG_IN_CO
#define IN_CC          CONFIG_IN_CC
#define UNSET_OR_GE    CONFIG_UNSET_OR_GE
#define UNSET_OR_GT    CONFIG_UNSET_OR_GT
#define UNSET_OR_IN_CC CONFIG_UNSET_OR_IN_CC
#define CHOICES        CONFIG_CHOICES

const struct cfg_key cfg_schema[] = {
    {ROW(job, dump_folder), .def = "./outputs",
     .help = "Folder for metrics.jsonl, checkpoints and traces."},
    {ROW(job, description), .def = "", .help = "Free-form description of the run."},
    {ROW(job, print_config), .def = "false",
     .help = "Print the effective config as TOML and exit."},
    {ROW(job, log_level), .def = "info", CHOICES("debug", "info", "warning", "error"),
     .help = "Least severe log message shown."},

    {ROW(model, name), .def = "llama3", .help = "Model family."},
    /* its choices and help: the families' presets (model_config_schema_init) */
    {ROW(model, flavor), .def = "debugmodel", .help = "Model size within the family."},
    {ROW(model, vocab_size), .def = "-1", UNSET_OR_GE(1),
     .help = "Vocabulary size; -1: the flavor's vocabulary."},
    {ROW(model, rope_scaling), .def = "false",
     .help = "Llama 3.1 RoPE frequency scaling (factor 8, low 1, high 4, original context "
             "8192)."},
    {ROW(model, tokenizer_path), .def = "",
     .help = "Tokenizer (rank file or tokenizer.json) of the dataset; generate uses it for "
             "text, train checks that its ids fit the vocabulary."},
    {ROW(model, converters), .def = "", .list = true, CHOICES("float8"),
     .help = "Model converters applied to the model's linears (TorchTitan's list): "
             "\"float8\" turns every linear not matched by "
             "quantize.linear.float8.filter_fqns into a torchao-style float8 linear "
             "(llama3 without tensor or pipeline parallelism). No CPU multiplies fp8, so the "
             "fp8 matmuls are EMULATED: fp8-valued operands through the bf16/fp32 engine with "
             "fp32 accumulation and the scales applied after - the numerics of a float8 "
             "recipe, not its speed."},
    /* then each family's own keys (model_config_schema_init) */

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
    {ROW(training, mixed_precision_param), .def = "float32",
     CHOICES("float32", "bfloat16", "auto"),
     .help = "Compute dtype (FSDP2 MixedPrecisionPolicy): bfloat16 gathers parameters in "
             "bf16 and runs every matmul, forward and backward, on bf16 operands with fp32 "
             "accumulation; master weights, AdamW moments, norms, softmax, RoPE and the loss "
             "stay fp32. On a CPU without bf16 hardware it runs the same numerics on fp32 "
             "units (slower). float32: everything fp32. auto: bfloat16 where the CPU has bf16 "
             "matmul hardware (AVX512-BF16, AMX), else float32."},
    {ROW(training, mixed_precision_reduce), .def = "float32", CHOICES("float32"),
     .help = "Type of the gradient reduce-scatter / all-reduce (fp32 only)."},

    {ROW_F8(recipe_name), .def = "tensorwise",
     CHOICES("tensorwise", "rowwise", "rowwise_with_gw_hp"),
     .help = "torchao float8 recipe (with model.converters = [\"float8\"]): tensorwise "
             "(input and weight e4m3, gradients e5m2, one scale per tensor), rowwise (all "
             "e4m3, per-row scales along each matmul's reduction dimension, power-of-two "
             "scales), rowwise_with_gw_hp (rowwise, but the weight-gradient matmul in high "
             "precision). Scales are dynamic: from each tensor's amax at every use."},
    {ROW_F8(enable_fsdp_float8_all_gather), .def = "false",
     .help = "FSDP all-gathers the float8 linears' weights as fp8 (e4m3, the whole weight's "
             "tensorwise scale) instead of the mixed_precision_param dtype: 1 byte per "
             "element on the wire; the gathered fp8 values are the linear's weight operand. "
             "tensorwise recipe only. Other parameters keep their wire format."},
    {ROW_F8(precompute_float8_dynamic_scale_for_fsdp), .def = "false",
     .help = "TorchTitan's key, accepted: ctitan always computes the fp8 all-gather's scales "
             "with one all-reduce (max) of every float8 weight's local amax per step."},
    {ROW_F8(filter_fqns), .def = "output", .list = true,
     .help = "Linears whose module name contains one of these strings stay high precision "
             "(TorchTitan's default: the output projection)."},
    {ROW_F8(emulate), .def = "true",
     .help = "TorchTitan's key: run fp8 matmuls emulated. Always the case here (no fp8 "
             "hardware on the CPUs ctitan runs on); false is refused."},
    {ROW(compute, matmul_engine), .def = "auto", CHOICES("auto", "onednn", "openblas"),
     .help = "Matmul engine: onednn (primitives per shape; AMX, AVX512-BF16, AVX-512 or AVX2 "
             "by CPU features), openblas (sgemm), or auto: time both at each of the model's "
             "shapes at start-up and keep the faster (oneDNN unless OpenBLAS is >= 15% "
             "faster). The CT_MATMUL_ENGINE environment variable overrides it."},

    {ROW(parallelism, data_parallel_shard_degree), .def = "-1", UNSET_OR_GE(1),
     .help = "FSDP degree; -1: the ranks left after the other degrees."},
    {ROW(parallelism, data_parallel_replicate_degree), .def = "1", GE(1),
     .help = "Replicated data-parallel degree (HSDP when sharded too)."},
    {ROW(parallelism, tensor_parallel_degree), .def = "1", GE(1),
     .help = "Tensor-parallel degree: Megatron column/row-parallel blocks with sequence "
             "parallelism and a vocabulary-parallel loss (llama3; inside each pipeline stage "
             "with pipeline_parallel_degree > 1)."},
    {ROW(parallelism, pipeline_parallel_degree), .def = "1", GE(1),
     .help = "Pipeline-parallel degree."},
    /* context parallelism: the sequence split over ranks (model/llama/llama_cp.c) */
    {ROW(parallelism, context_parallel_degree), .def = "1", GE(1),
     .help = "Context-parallel degree: each rank holds 1/cp of every sequence; attention "
             "reaches the other shards' keys and values. Mesh pp x dp_replicate x dp_shard "
             "x cp x tp; FSDP shards parameters over dp_shard x cp (llama3; with tensor "
             "and pipeline parallelism too, every schedule, and the cost model's options). "
             "training.seq_len must be divisible by 2 x cp (headtail) or cp "
             "(none)."},
    /* expert parallelism: the routed experts split over ranks (model/moe/moe.h) */
    {ROW(parallelism, expert_parallel_degree), .def = "1", GE(1),
     .help = "Expert-parallel degree: the routed experts of a mixture of experts "
             "(deepseek_v3) are split over ep ranks, which send each other the tokens routed "
             "to their experts (all-to-all). ep borrows from the FSDP shard group as "
             "TorchTitan places it: ep must divide data_parallel_shard_degree; dense "
             "parameters stay sharded over the whole shard group, expert parameters over "
             "dp_shard / ep (with pipeline parallelism too; not yet with context or tensor "
             "parallelism)."},
    {ROW(parallelism, context_parallel_load_balancer), .def = "headtail",
     CHOICES("headtail", "none"),
     .help = "How a sequence is cut over the cp ranks: headtail (2 x cp chunks, rank r holds "
             "chunks r and 2cp-1-r, so every rank does the same causal attention work) or "
             "none (rank r holds the r-th contiguous 1/cp). Inputs, labels and RoPE positions "
             "follow it."},
    {ROW(parallelism, context_parallel_rotate_method), .def = "allgather",
     CHOICES("allgather", "alltoall"),
     .help = "How keys and values reach the other cp ranks: allgather (one all-gather of K "
             "and V, dK/dV reduce-scattered back; Llama 3's choice) or alltoall (ring "
             "attention: K/V shards passed round the ring point-to-point, partial outputs "
             "merged with the online-softmax statistics; the backward rings dK/dV back)."},
    /* pipeline parallelism: one block (parallel/pp.h) */
    {ROW(parallelism, pipeline_parallel_schedule), .def = "1F1B",
     .help = "Pipeline schedule: GPipe, 1F1B, Interleaved1F1B, ZeroBubbleH1 (ZB-H1: the "
             "backward split into input- and weight-gradient halves; not with "
             "enable_async_tensor_parallel, whose rings compute the weight gradients inside "
             "the input-gradient matmuls) (case-insensitive)."},
    {ROW(parallelism, pipeline_parallel_schedule_csv), .def = "",
     .help = "A CSV of per-rank actions (one row per pipeline rank, cells like 0F1, 1B0, "
             "0SEND_F1); overrides pipeline_parallel_schedule."},
    {ROW(parallelism, pipeline_parallel_microbatch_size), .def = "1", GE(1),
     .help = "Sequences per pipeline micro-batch; the micro-batch count is the rank's "
             "sequences per step (local_batch_size x accumulation) divided by it."},
    {ROW(parallelism, pipeline_parallel_layers_per_stage), .def = "-1", UNSET_OR_GE(1),
     .help = "Layers per pipeline stage (the embedding and output count as the two keys "
             "below); -1: one stage per rank, two for Interleaved1F1B."},
    {ROW(parallelism, pipeline_parallel_first_stage_less_layers), .def = "1", GE(0),
     .help = "Layers the embedding counts as: the first stage holds that many fewer blocks."},
    {ROW(parallelism, pipeline_parallel_last_stage_less_layers), .def = "1", GE(0),
     .help = "Layers the output (norm, projection, loss) counts as: the last stage holds "
             "that many fewer blocks."},
    {ROW(parallelism, fsdp_reshard_after_forward), .def = "default",
     CHOICES("default", "always", "never"),
     .help = "Free gathered parameters after forward (default: except the last stage)."},
    {ROW(parallelism, enable_async_tensor_parallel), .def = "false",
     .help = "Async tensor parallelism: each transformer block's all-gather + matmul and "
             "matmul + reduce-scatter run as tp ring steps over point-to-point transfers, "
             "each rank multiplying the token block it has while the next one moves (the "
             "embedding and loss head keep plain collectives). Same results as plain TP "
             "up to fp32 summation order. ctitan plan models it too."},
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
     .help = "For mode = selective: \"op\" (the per-op policy on every block) or a positive "
             "integer N as a string (TorchTitan's per-layer option: full checkpointing on every "
             "N-th block, blocks N, 2N, ... counted from 1 over the whole model on every "
             "layout, none on the others; \"1\" is full on every block)."},

    {ROW(comm, progress), .def = "inline", CHOICES("inline", "thread"),
     .help = "How collectives advance: inline on the compute thread (each runs, blocking, "
             "when issued), or on a communication thread that overlaps them with compute when "
             "the schedule issues them ahead (comm.prefetch, comm.reduce_scatter_defer)."},
    {ROW(comm, timeout_seconds), .def = "300", GT(0),
     .help = "A collective that takes longer aborts the job (a peer died or hangs)."},
    {ROW(comm, buckets), .def = "per_block",
     .help = "FSDP buckets: \"per_block\" (embedding, each block, norm + output), \"auto\" "
             "(the plan with the fastest predicted step: buckets under comm.bucket_cap_mb, "
             "prefetch depth and reduce-scatter deferral up to comm.prefetch and "
             "comm.reduce_scatter_defer, searched together), or comma-separated "
             "groups of '+'-joined units (embed, block indices from 0, norm) in order, e.g. "
             "\"embed+0,1+2,3+norm\"."},
    {ROW(comm, bucket_cap_mb), .def = "100", GT(0),
     .help = "Automatic bucketing: most gathered parameter MiB in one bucket."},
    {ROW(comm, prefetch), .def = "1", IN_CC(0, 16),
     .help = "Issue each all-gather this many gathers ahead of its use (0: at use); with "
             "comm.buckets = \"auto\", the deepest the search tries."},
    {ROW(comm, reduce_scatter_defer), .def = "1", IN_CC(0, 16),
     .help = "Wait for a reduce-scatter only when this many later ones are issued (0: at "
             "once); with comm.buckets = \"auto\", the most the search tries."},
    {ROW(comm, memory_budget_gb), .def = "0", GE(0),
     .help = "Peak memory per rank the reordering keeps to (predicted by the cost model; "
             "prefetch depth is lowered to fit; a budget no plan fits exits 2 with the "
             "smallest predicted peak); 0: no budget."},
    {ROW(comm, bandwidth_gbps), .def = "0", GE(0),
     .help = "Cost model: link bandwidth per rank in Gbit/s; 0: measured at start-up "
             "(ctitan plan needs it)."},
    {ROW(comm, latency_us), .def = "0", GE(0),
     .help = "Cost model: latency of one collective in microseconds (with "
             "comm.bandwidth_gbps)."},
    {ROW(comm, simulate_bandwidth_gbps), .def = "0", GE(0),
     .help = "Make every collective take at least its bytes over a link of this many Gbit/s "
             "(overlap experiments on one machine; also tensor parallelism's collectives "
             "and ring transfers); 0: off."},
    {ROW(comm, simulate_latency_us), .def = "0", GE(0),
     .help = "Simulated link: microseconds added to every collective."},
    {ROW(comm, flight_recorder_entries), .def = "2000", IN_CC(0, 1000000),
     .help = "Flight recorder: each communicator keeps its last this many collectives and "
             "transfers (sequence number, op, bytes, label, step, state, times); every rank "
             "writes them to <job.dump_folder>/comm_traces/rank_N.json when the watchdog ends "
             "a hung job, or on SIGUSR1; `ctitan trace-comm` reads them. 0: off."},

    {ROW(metrics, log_freq), .def = "1", GE(1), .help = "Log every this many steps."},
    {ROW(metrics, peak_tflops), .def = "0.0", GE(0),
     .help = "Peak TFLOP/s per rank for MFU; 0: measure sgemm on a large square at "
             "start-up."},
    {ROW(metrics, enable_jsonl), .def = "true",
     .help = "Write metrics.jsonl into job.dump_folder."},
    {ROW(metrics, enable_tensorboard), .def = "false",
     .help = "Also write the logged metrics as TensorBoard scalars (TorchTitan's names), from "
             "the rank that writes metrics.jsonl."},
    {ROW(metrics, save_tb_folder), .def = "tb",
     .help = "The TensorBoard event file goes to <job.dump_folder>/<this>/"
             "events.out.tfevents.*."},

    {ROW(profiling, enable_profiling), .def = "false",
     .help = "Write a Chrome trace (Perfetto, chrome://tracing) per rank every profile_freq "
             "steps: compute and communication on separate tracks (FSDP runs)."},
    {ROW(profiling, save_traces_folder), .def = "profile_trace",
     .help = "Traces go to <job.dump_folder>/<this>/iteration_<step>/rank<r>_trace.json."},
    {ROW(profiling, profile_freq), .def = "10", GE(1), .help = "Trace every this many steps."},
    {ROW(profiling, enable_memory_snapshot), .def = "false",
     .help = "Record tracked memory by category over a step, with the schedule node running "
             "at each change: every profile_freq-th step with enable_profiling, else the "
             "first step; and on an allocation failure."},
    {ROW(profiling, save_memory_snapshot_folder), .def = "memory_snapshot",
     .help = "Memory snapshots go to <job.dump_folder>/<this>/iteration_<step>/"
             "rank<r>_memory_snapshot.json (iteration_<step>_exit on an allocation "
             "failure)."},

    {ROW(plan, compute_efficiency), .def = "0.5", IN_CC(0.01, 1),
     .help = "ctitan plan: fraction of metrics.peak_tflops the kernels achieve on the "
             "target."},
    {ROW(plan, memory_bandwidth_gbs), .def = "3000", GT(0),
     .help = "ctitan plan: the target's memory bandwidth in GB/s (buffer copies, optimizer)."},
    {ROW(plan, activation_dtype), .def = "auto", CHOICES("auto", "float32", "bfloat16"),
     .help = "ctitan plan: element type of activations and gathered parameters on the "
             "target; auto: training.mixed_precision_param."},
    {ROW(plan, fp8_peak_tflops), .def = "0", GE(0),
     .help = "ctitan plan with model.converters = [\"float8\"]: the target's dense fp8 peak "
             "in TFLOP/s (H100 SXM: 1979); the float8 linears' matmuls are planned at it. 0: "
             "at the bf16 rate, as the emulation runs on CPUs."},
    {ROW(plan, attention_efficiency), .def = "0", IN_CC(0, 1),
     .help = "ctitan plan: fraction of metrics.peak_tflops the attention kernel achieves on "
             "the target (its causal FLOPs); 0: plan.compute_efficiency."},

    {ROW(debug, seed), .def = "0", GE(0), .help = "Seed of the weights and synthetic data."},
    {ROW(debug, deterministic), .def = "true",
     .help = "Kept for TorchTitan configs; ctitan is always deterministic (false is "
             "refused)."},
    {ROW(debug, fail_rank), .def = "-1", UNSET_OR_GE(0),
     .help = "Fault injection for tests: this rank kills itself during debug.fail_step."},
    {ROW(debug, fail_step), .def = "0", GE(0),
     .help = "The 1-based step in which debug.fail_rank dies (after any background "
             "checkpoint save has finished)."},
    {ROW(debug, sample_log), .def = "",
     .help = "Tests: each rank appends \"step sample\" lines for the dataset samples it "
             "trained on to <sample_log>.rank-R (under tensor parallelism only TP rank 0 "
             "of each group, as its ranks share their samples)."},
    {ROW(debug, skip_collective_rank), .def = "-1", UNSET_OR_GE(0),
     .help = "Debug only (tests of the flight recorder): this rank issues a barrier in place "
             "of its debug.skip_collective_seq-th collective on group "
             "debug.skip_collective_group, so the job hangs on a mismatched collective and "
             "the watchdog ends it. -1: off."},
    {ROW(debug, skip_collective_seq), .def = "1", GE(1),
     .help = "Debug only: the per-group sequence number (from 1) of the collective "
             "debug.skip_collective_rank replaces."},
    {ROW(debug, skip_collective_group), .def = "dp_shard",
     CHOICES("world", "pp", "dp_replicate", "dp_shard", "tp", "dp", "cp", "dp_shard_cp",
             "dp_cp"),
     .help = "Debug only: the group of debug.skip_collective_seq (with context "
             "parallelism FSDP's is dp_shard_cp, the loss's dp_cp)."},
};
const size_t cfg_n_keys = ARRAY_SIZE(cfg_schema);
