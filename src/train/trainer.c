#include "train/trainer.h"

#include <math.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/timer.h"
#include "data/tokens.h"
#include "kernels/kernels.h"
#include "model/llama.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/optim.h"

struct trainer {
	const struct ct_config *cfg;
	struct llama_model model;
	struct adamw opt;
	struct lr_schedule lr;
	struct token_source data;
	struct metrics metrics;
	int64_t accum; /* micro-batches per step */
	int32_t *batch_tokens, *batch_targets; /* accum x N */
};

static int trainer_build_model(struct trainer *tr)
{
	const struct ct_config *cfg = tr->cfg;
	struct llama_config mc;
	int rc = llama_config_preset(&mc, cfg->model.flavor);
	if (rc)
		return rc;
	if (cfg->model.vocab_size > 0)
		mc.vocab_size = cfg->model.vocab_size;
	mc.rope_scaling = cfg->model.rope_scaling;
	rc = llama_build(&tr->model, &mc, cfg->training.local_batch_size, cfg->training.seq_len);
	if (rc)
		return rc;
	struct llama_model *m = &tr->model;
	llama_init_params(&m->cfg, &m->table, (uint64_t)cfg->debug.seed, m->params, 0,
			  m->table.numel);
	adamw_init(&tr->opt, m->table.numel, cfg->optimizer.beta1, cfg->optimizer.beta2,
		   cfg->optimizer.eps, cfg->optimizer.weight_decay);
	return CT_OK;
}

static int trainer_setup(struct trainer *tr)
{
	const struct ct_config *cfg = tr->cfg;
	int64_t dp = 1; /* data-parallel ranks: one until the FSDP layer lands */
	int64_t per_step = cfg->training.local_batch_size * dp;
	int64_t global = cfg->training.global_batch_size < 0 ? per_step
							      : cfg->training.global_batch_size;
	if (global % per_step) {
		LOG_ERROR("training.global_batch_size: %lld is not a multiple of local_batch_size x "
			  "data-parallel degree = %lld", (long long)global, (long long)per_step);
		return CT_ERR_USAGE;
	}
	tr->accum = global / per_step;
	int rc = trainer_build_model(tr);
	if (rc)
		return rc;
	rc = lr_schedule_init(&tr->lr, cfg->optimizer.lr, cfg->lr_scheduler.warmup_steps,
			      cfg->lr_scheduler.decay_ratio, cfg->lr_scheduler.decay_type,
			      cfg->lr_scheduler.min_lr_factor, cfg->training.steps);
	if (rc)
		return rc;
	rc = tokens_open(&tr->data, cfg->training.dataset, tr->model.cfg.vocab_size,
			 (uint64_t)cfg->debug.seed, cfg->training.seq_len);
	if (rc)
		return rc;
	size_t bytes = (size_t)(tr->accum * tr->model.N) * sizeof(int32_t);
	tr->batch_tokens = mem_alloc(MEM_OTHER, bytes);
	tr->batch_targets = mem_alloc(MEM_OTHER, bytes);

	double peak = cfg->metrics.peak_tflops > 0 ? cfg->metrics.peak_tflops * 1e12
						   : metrics_measure_peak_flops();
	double fpt = llama_flops_per_token(&tr->model.cfg, &tr->model.table, cfg->training.seq_len);
	const struct llama_config *mc = &tr->model.cfg;
	LOG_INFO("model llama3 %s: %lld parameters (dim %lld, %lld layers, %lld heads, %lld kv "
		 "heads, ffn %lld, vocab %lld)", mc->flavor, (long long)tr->model.table.numel,
		 (long long)mc->dim, (long long)mc->n_layers, (long long)mc->n_heads,
		 (long long)mc->n_kv_heads, (long long)mc->ffn_hidden, (long long)mc->vocab_size);
	LOG_INFO("training: %lld steps, batch %lld x seq %lld x %lld micro-batches, dataset %s; "
		 "%.3g FLOPs/token; peak %.1f GFLOP/s (%s)", (long long)cfg->training.steps,
		 (long long)cfg->training.local_batch_size, (long long)cfg->training.seq_len,
		 (long long)tr->accum, cfg->training.dataset, fpt, peak / 1e9,
		 cfg->metrics.peak_tflops > 0 ? "from config" : "measured sgemm");
	return metrics_open(&tr->metrics, cfg->job.dump_folder, cfg->metrics.enable_jsonl, fpt,
			    peak);
}

static void trainer_teardown(struct trainer *tr)
{
	size_t bytes = (size_t)(tr->accum * tr->model.N) * sizeof(int32_t);
	if (tr->batch_tokens) {
		mem_free(MEM_OTHER, tr->batch_tokens, bytes);
		mem_free(MEM_OTHER, tr->batch_targets, bytes);
	}
	metrics_close(&tr->metrics);
	tokens_close(&tr->data);
	if (tr->opt.m)
		adamw_free(&tr->opt);
	llama_free(&tr->model);
}

int train_step(struct llama_model *m, struct adamw *opt, const int32_t *tokens,
	       const int32_t *targets, int64_t accum, double lr, double max_norm,
	       struct train_step_result *res)
{
	int64_t N = m->N;
	int64_t valid = llama_count_valid(targets, accum * N);
	memset(m->grads, 0, (size_t)m->table.numel * sizeof(float));
	m->loss_dscale = valid > 0 ? 1.0 / (double)valid : 0.0;
	double loss_sum = 0.0;
	for (int64_t a = 0; a < accum; a++) {
		memcpy(m->tokens, tokens + a * N, (size_t)N * sizeof(int32_t));
		memcpy(m->targets, targets + a * N, (size_t)N * sizeof(int32_t));
		loss_sum += llama_forward(m, NULL);
		llama_backward(m, m->loss_dscale);
	}
	res->valid = valid;
	res->loss = valid > 0 ? loss_sum / (double)valid : 0.0;
	res->grad_norm = sqrt(sumsq_f32(m->grads, m->table.numel));
	if (!isfinite(res->loss) || !isfinite(res->grad_norm)) {
		LOG_ERROR("non-finite %s (loss %g, grad norm %g); stopping",
			  isfinite(res->loss) ? "gradient norm" : "loss", res->loss, res->grad_norm);
		return CT_ERR_RUNTIME;
	}
	adamw_step(opt, &m->table, m->params, m->grads, 0, m->table.numel, lr,
		   clip_coefficient(res->grad_norm, max_norm));
	return CT_OK;
}

static int trainer_step(struct trainer *tr, int64_t step, struct step_metrics *sm)
{
	struct llama_model *m = &tr->model;
	double t0 = timer_now();
	tokens_batch(&tr->data, step * tr->accum * m->B, tr->accum * m->B, m->T, tr->batch_tokens,
		     tr->batch_targets);
	double t_data = timer_now() - t0;
	double lr = lr_schedule_at(&tr->lr, step);
	struct train_step_result res;
	int rc = train_step(m, &tr->opt, tr->batch_tokens, tr->batch_targets, tr->accum, lr,
			    tr->cfg->training.max_norm, &res);
	if (rc) {
		LOG_ERROR("step %lld failed", (long long)step + 1);
		return rc;
	}
	sm->step = step + 1;
	sm->loss = res.loss;
	sm->grad_norm = res.grad_norm;
	sm->lr = lr;
	sm->data_s = t_data;
	sm->tokens = tr->accum * m->N;
	sm->tokens_seen += tr->accum * m->N;
	sm->step_s = timer_now() - t0;
	return CT_OK;
}

int trainer_run(const struct ct_config *cfg)
{
	struct trainer tr = { .cfg = cfg };
	int rc = trainer_setup(&tr);
	struct step_metrics sm = { 0 };
	for (int64_t step = 0; rc == CT_OK && step < cfg->training.steps; step++) {
		rc = trainer_step(&tr, step, &sm);
		if (rc == CT_OK && ((step + 1) % cfg->metrics.log_freq == 0 ||
				    step + 1 == cfg->training.steps))
			metrics_log_step(&tr.metrics, &sm);
	}
	if (rc == CT_OK)
		LOG_INFO("training done: %lld steps, final loss %.4f, peak RSS %.2f GiB",
			 (long long)cfg->training.steps, sm.loss,
			 (double)mem_rss_peak_bytes() / (1024.0 * 1024.0 * 1024.0));
	trainer_teardown(&tr);
	return rc;
}
