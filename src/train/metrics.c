#include "train/metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/timer.h"
#include "model/model.h"
#include "io/tb_events.h"
#include "kernels/mm_engine.h"

int metrics_mkdirs(const char *path)
{
	char buf[1024];
	snprintf(buf, sizeof(buf), "%s", path);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(buf, 0755) != 0 && errno != EEXIST)
			goto fail;
		*p = '/';
	}
	if (mkdir(buf, 0755) != 0 && errno != EEXIST)
		goto fail;
	return CT_OK;
fail:
	LOG_ERROR("cannot create folder '%s': %s", buf, strerror(errno));
	return CT_ERR_RUNTIME;
}

int metrics_open(struct metrics *mt, const char *dump_folder, bool jsonl, bool append,
                 double flops_per_token, double peak_flops)
{
	memset(mt, 0, sizeof(*mt));
	mt->flops_per_token = flops_per_token;
	mt->peak_flops = peak_flops;
	/* OpenMPI hands ranks a pseudo-terminal even when mpiexec's own output is a pipe, so
	 * under a launcher colours stay off. */
	mt->tty = isatty(STDOUT_FILENO) && !getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_RANK");
	if (!jsonl)
		return CT_OK;
	int rc = metrics_mkdirs(dump_folder);
	if (rc)
		return rc;
	char path[1100];
	snprintf(path, sizeof(path), "%s/metrics.jsonl", dump_folder);
	mt->jsonl = fopen(path, append ? "a" : "w");
	if (!mt->jsonl) {
		LOG_ERROR("cannot write '%s': %s", path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	return CT_OK;
}

int metrics_open_tensorboard(struct metrics *mt, const char *dump_folder, const char *folder)
{
	char dir[2100];
	snprintf(dir, sizeof(dir), "%s/%s", dump_folder, folder);
	int rc = metrics_mkdirs(dir);
	if (!rc)
		rc = tb_open(&mt->tb, dir);
	if (!rc)
		LOG_INFO("tensorboard: writing %s", tb_path(mt->tb));
	return rc;
}

void metrics_close(struct metrics *mt)
{
	if (mt->jsonl)
		fclose(mt->jsonl);
	mt->jsonl = NULL;
	tb_close(mt->tb);
	mt->tb = NULL;
}

/* Tracked memory's peak so far, GiB (metrics.jsonl's memory_max_active_gib). */
static double metrics_max_active_gib(void)
{
	return (double)mem_total_peak() / (1024.0 * 1024.0 * 1024.0);
}

/* The step's scalars under TorchTitan's names (components/metrics.py), each the value of the
 * metrics.jsonl field named beside it; a write failure is logged once and does not stop
 * training. */
static void metrics_write_tb(struct metrics *mt, const struct step_metrics *s)
{
	const struct {
		const char *tag;
		double v;
	} sc[] = {
	    {"loss_metrics/global_avg_loss", s->loss},           /* global_avg_loss */
	    {"grad_norm", s->grad_norm},                         /* grad_norm */
	    {"lr", s->lr},                                       /* lr */
	    {"throughput(tps)", s->tps},                         /* tps */
	    {"tflops", s->tflops},                               /* tflops */
	    {"mfu(%)", s->mfu},                                  /* mfu */
	    {"memory/max_active(GiB)", metrics_max_active_gib()}, /* memory_max_active_gib */
	    {"time_metrics/end_to_end(s)", s->step_s},           /* step_s */
	    {"time_metrics/data_loading(s)", s->data_s},         /* data_loading_s */
	    {"n_tokens_seen", (double)s->tokens_seen},           /* tokens_seen */
	    {"validation_metrics/loss", s->val_loss}, /* validation_loss; last: only if run */
	};
	int n = (int)(sizeof(sc) / sizeof(sc[0])) - (s->val_loss < 0);
	double wall = tb_wall_time();
	for (int i = 0; i < n; i++)
		if (tb_add_scalar(mt->tb, sc[i].tag, (float)sc[i].v, s->step, wall))
			return;
}

void metrics_progress(const struct metrics *mt, int64_t step, int64_t total, double step_s)
{
	if (!mt->tty)
		return;
	double eta = step_s * (double)(total - step);
	fprintf(stdout, "\r  step %lld/%lld  %.2f s/step  ETA %02d:%02d:%02d ", (long long)step,
	        (long long)total, step_s, (int)(eta / 3600), (int)(eta / 60) % 60, (int)eta % 60);
	fflush(stdout);
}

void metrics_log_step(struct metrics *mt, struct step_metrics *s)
{
	if (mt->tty)
		fputs("\r\033[K", stdout); /* clear the progress line */
	const double gib = 1024.0 * 1024.0 * 1024.0;
	s->tps = s->step_s > 0 ? (double)s->tokens / s->step_s : 0.0;
	s->tflops = mt->flops_per_token * s->tps / 1e12;
	s->mfu = mt->peak_flops > 0 ? 100.0 * mt->flops_per_token * s->tps / mt->peak_flops : 0.0;
	/* the practical limit: the engine's own rate at the model's shapes, over every matmul */
	double mm_flops, mm_s;
	mm_engine_totals(&mm_flops, &mm_s);
	s->engine_gflops = mm_s > 0 ? mm_flops / mm_s / 1e9 : 0.0;
	s->mfu_engine = s->engine_gflops > 0 ? 100.0 * s->tflops * 1e3 / s->engine_gflops : 0.0;
	int64_t rss_peak = mem_rss_peak_bytes(), machine = mem_machine_bytes();
	double rss_gib = (double)rss_peak / gib;
	double rss_pct = machine > 0 ? 100.0 * (double)rss_peak / (double)machine : 0.0;
	const char *bold = mt->tty ? "\033[1m" : "", *reset = mt->tty ? "\033[0m" : "";
	char extra[256] = "";
	for (int i = 0; i < s->n_model; i++)
		if (s->model[i].console)
			snprintf(extra + strlen(extra), sizeof(extra) - strlen(extra), "  %s: %.3f",
			         s->model[i].name, s->model[i].value);
	LOG_INFO(
	    "%sstep: %5lld%s  loss: %8.4f  grad_norm: %7.4f  lr: %.3e  memory: %5.2fGiB(%4.1f%%)"
	    "  tps: %.0f  tflops: %.3f  mfu: %.2f%% (engine %.0f%%)  data: %.3fs  comm: %.3fs%s",
	    bold, (long long)s->step, reset, s->loss, s->grad_norm, s->lr, rss_gib, rss_pct, s->tps,
	    s->tflops, s->mfu, s->mfu_engine, s->data_s, s->comm_wait_s, extra);
	if (s->val_loss >= 0)
		LOG_INFO("step: %5lld  validation loss: %8.4f", (long long)s->step, s->val_loss);
	metrics_write_record(mt, s);
	if (mt->tb)
		metrics_write_tb(mt, s);
}

void metrics_write_record(struct metrics *mt, const struct step_metrics *s)
{
	const double gib = 1024.0 * 1024.0 * 1024.0;
	int64_t rss_peak = mem_rss_peak_bytes(), machine = mem_machine_bytes();
	double rss_gib = (double)rss_peak / gib;
	double rss_pct = machine > 0 ? 100.0 * (double)rss_peak / (double)machine : 0.0;
	if (!mt->jsonl)
		return;
	cJSON *o = cJSON_CreateObject();
	if (s->val_loss >= 0)
		cJSON_AddNumberToObject(o, "validation_loss", s->val_loss);
	cJSON_AddNumberToObject(o, "step", (double)s->step);
	cJSON_AddNumberToObject(o, "loss", s->loss);
	cJSON_AddNumberToObject(o, "global_avg_loss", s->loss);
	cJSON_AddNumberToObject(o, "grad_norm", s->grad_norm);
	cJSON_AddNumberToObject(o, "lr", s->lr);
	cJSON_AddNumberToObject(o, "tps", s->tps);
	cJSON_AddNumberToObject(o, "tflops", s->tflops);
	cJSON_AddNumberToObject(o, "mfu", s->mfu);
	cJSON_AddNumberToObject(o, "mfu_engine", s->mfu_engine);
	cJSON_AddNumberToObject(o, "engine_gflops", s->engine_gflops);
	cJSON_AddNumberToObject(o, "step_s", s->step_s);
	cJSON_AddNumberToObject(o, "data_loading_s", s->data_s);
	cJSON_AddNumberToObject(o, "exposed_comm_s", s->comm_wait_s);
	cJSON_AddNumberToObject(o, "checkpoint_s", s->checkpoint_s);
	cJSON_AddNumberToObject(o, "tokens_seen", (double)s->tokens_seen);
	cJSON_AddNumberToObject(o, "memory_peak_rss_gib", rss_gib);
	cJSON_AddNumberToObject(o, "memory_peak_rss_pct", rss_pct);
	cJSON_AddNumberToObject(o, "memory_max_active_gib", metrics_max_active_gib());
	for (int i = 0; i < s->n_model; i++)
		cJSON_AddNumberToObject(o, s->model[i].name, s->model[i].value);
	for (int c = 0; c < MEM_CAT_COUNT; c++) {
		char key[64];
		snprintf(key, sizeof(key), "memory_%s_bytes", mem_cat_name((enum mem_cat)c));
		cJSON_AddNumberToObject(o, key, (double)mem_current((enum mem_cat)c));
		snprintf(key, sizeof(key), "memory_%s_peak_bytes", mem_cat_name((enum mem_cat)c));
		cJSON_AddNumberToObject(o, key, (double)mem_peak((enum mem_cat)c));
	}
	char *txt = cJSON_PrintUnformatted(o);
	fprintf(mt->jsonl, "%s\n", txt);
	fflush(mt->jsonl);
	free(txt);
	cJSON_Delete(o);
}
