#include "base/mem_timeline.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "base/timer.h"

#define TL_LABEL 48

struct tl_sample {
	double t; /* timer_now() */
	int64_t bytes[MEM_CAT_COUNT];
	char label[TL_LABEL];
};

/* Everything below is guarded by mem.c's lock, the named critical section mem_peak, except
 * tl_on (read without it by mem_timeline_label's early return). */
static atomic_bool tl_on;
static struct tl_sample *tl_ring;
static int64_t tl_n;    /* samples ever taken; the ring holds [tl_n - CAP, tl_n) */
static int64_t tl_mark; /* the window's first sample */
static double tl_t_mark, tl_t_start;
static char tl_label[TL_LABEL] = "";
static char tl_folder[1024];
static int tl_rank;
static int64_t tl_step;

int mem_timeline_start(const char *folder, int rank)
{
	struct tl_sample *ring = malloc(MEM_TIMELINE_CAP * sizeof(*ring));
	if (!ring) {
		LOG_ERROR("memory snapshot: cannot allocate its %zu-byte ring",
		          MEM_TIMELINE_CAP * sizeof(*ring));
		return CT_ERR_RUNTIME;
	}
#pragma omp critical(mem_peak)
	{
		free(tl_ring);
		tl_ring = ring;
		tl_n = tl_mark = 0;
		tl_t_start = tl_t_mark = timer_now();
		snprintf(tl_folder, sizeof(tl_folder), "%s", folder);
		tl_rank = rank;
		tl_step = 0;
		snprintf(tl_label, sizeof(tl_label), "setup");
		atomic_store(&tl_on, true);
	}
	return CT_OK;
}

void mem_timeline_stop(void)
{
#pragma omp critical(mem_peak)
	{
		atomic_store(&tl_on, false);
		free(tl_ring);
		tl_ring = NULL;
	}
}

bool mem_timeline_on(void)
{
	return atomic_load_explicit(&tl_on, memory_order_relaxed);
}

void mem_timeline_label(const char *label)
{
	if (!mem_timeline_on())
		return;
#pragma omp critical(mem_peak)
	snprintf(tl_label, sizeof(tl_label), "%s", label);
}

void mem_timeline_set_step(int64_t step)
{
#pragma omp critical(mem_peak)
	tl_step = step;
}

void mem_timeline_sample_locked(const int64_t cur[MEM_CAT_COUNT])
{
	if (!tl_ring)
		return;
	struct tl_sample *s = &tl_ring[tl_n % MEM_TIMELINE_CAP];
	s->t = timer_now();
	memcpy(s->bytes, cur, sizeof(s->bytes));
	memcpy(s->label, tl_label, sizeof(s->label));
	tl_n++;
}

void mem_timeline_mark_locked(const int64_t cur[MEM_CAT_COUNT])
{
	if (!tl_ring)
		return;
	tl_mark = tl_n;
	tl_t_mark = timer_now();
	mem_timeline_sample_locked(cur);
}

/* ---------------------------------------------------------------- JSON */

static void put_json_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

struct tl_dump {
	const char *reason; /* "step" | "alloc_failure" */
	int64_t step;
	double t0;
	int64_t peak, run_peak, dropped;
	const struct tl_sample *s;
	int64_t n;
	/* alloc_failure */
	enum mem_cat fail_cat;
	size_t fail_bytes;
	const char *fail_label;
};

static int tl_write(const char *dir, const struct tl_dump *d, char *path_out, size_t path_cap)
{
	char path[1200];
	if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
		LOG_ERROR("memory snapshot: cannot create folder '%s': %s", dir, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	snprintf(path, sizeof(path), "%s/rank%d_memory_snapshot.json", dir, tl_rank);
	if (path_out)
		snprintf(path_out, path_cap, "%s", path);
	FILE *f = fopen(path, "w");
	if (!f) {
		LOG_ERROR("memory snapshot: cannot write '%s': %s", path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	fprintf(f, "{\"rank\":%d,\"step\":%lld,\"reason\":\"%s\",\"categories\":[", tl_rank,
	        (long long)d->step, d->reason);
	for (int c = 0; c < MEM_CAT_COUNT; c++)
		fprintf(f, "%s\"%s\"", c ? "," : "", mem_cat_name((enum mem_cat)c));
	fprintf(f, "],\n\"peak_total_bytes\":%lld,\"run_peak_total_bytes\":%lld,"
	           "\"dropped_samples\":%lld,",
	        (long long)d->peak, (long long)d->run_peak, (long long)d->dropped);
	if (d->fail_label) {
		fprintf(f, "\n\"failed_alloc\":{\"category\":\"%s\",\"bytes\":%zu,\"node\":",
		        mem_cat_name(d->fail_cat), d->fail_bytes);
		put_json_string(f, d->fail_label);
		fprintf(f, "},");
	}
	fprintf(f, "\n\"samples\":[");
	for (int64_t i = 0; i < d->n; i++) {
		const struct tl_sample *s = &d->s[i];
		fprintf(f, "%s\n{\"t\":%.9f,\"node\":", i ? "," : "", s->t - d->t0);
		put_json_string(f, s->label);
		fprintf(f, ",\"bytes\":[");
		for (int c = 0; c < MEM_CAT_COUNT; c++)
			fprintf(f, "%s%lld", c ? "," : "", (long long)s->bytes[c]);
		fprintf(f, "]}");
	}
	fprintf(f, "\n]}\n");
	bool bad = ferror(f) != 0;
	if (fclose(f) != 0 || bad) {
		LOG_ERROR("memory snapshot: cannot write '%s': %s", path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	return CT_OK;
}

/* Copy samples [from, tl_n) still in the ring, oldest first (under the lock). */
static struct tl_sample *tl_copy(int64_t from, int64_t *n, int64_t *dropped)
{
	int64_t oldest = tl_n > MEM_TIMELINE_CAP ? tl_n - MEM_TIMELINE_CAP : 0;
	*dropped = from < oldest ? oldest - from : 0;
	if (from < oldest)
		from = oldest;
	*n = tl_n - from;
	struct tl_sample *out = malloc((size_t)(*n ? *n : 1) * sizeof(*out));
	if (!out)
		return NULL;
	for (int64_t i = 0; i < *n; i++)
		out[i] = tl_ring[(from + i) % MEM_TIMELINE_CAP];
	return out;
}

int mem_timeline_write_window(int64_t step, char *path_out, size_t path_cap)
{
	struct tl_dump d = {.reason = "step", .step = step};
	struct tl_sample *copy = NULL;
	bool on = false;
#pragma omp critical(mem_peak)
	{
		on = tl_ring != NULL;
		if (on) {
			int64_t cur[MEM_CAT_COUNT];
			for (int c = 0; c < MEM_CAT_COUNT; c++)
				cur[c] = mem_current((enum mem_cat)c);
			mem_timeline_sample_locked(cur); /* the state at the window's end */
			copy = tl_copy(tl_mark, &d.n, &d.dropped);
			d.t0 = tl_t_mark;
			d.peak = mem_window_peak();
			d.run_peak = mem_total_peak();
		}
	}
	if (!on)
		return CT_OK;
	if (!copy) {
		LOG_ERROR("memory snapshot: out of memory copying %lld samples", (long long)d.n);
		return CT_ERR_RUNTIME;
	}
	if (d.dropped)
		LOG_WARN("memory snapshot of step %lld: the ring of %d samples overflowed, %lld "
		         "samples of the step are missing",
		         (long long)step, MEM_TIMELINE_CAP, (long long)d.dropped);
	d.s = copy;
	char dir[1100];
	snprintf(dir, sizeof(dir), "%s/iteration_%lld", tl_folder, (long long)step);
	int rc = tl_write(dir, &d, path_out, path_cap);
	free(copy);
	return rc;
}

void mem_timeline_alloc_failed(enum mem_cat cat, size_t bytes)
{
	if (!mem_timeline_on())
		return;
	struct tl_dump d = {.reason = "alloc_failure", .fail_cat = cat, .fail_bytes = bytes};
	struct tl_sample *copy = NULL;
	char label[TL_LABEL];
#pragma omp critical(mem_peak)
	{
		if (tl_ring) {
			int64_t cur[MEM_CAT_COUNT];
			for (int c = 0; c < MEM_CAT_COUNT; c++)
				cur[c] = mem_current((enum mem_cat)c);
			mem_timeline_sample_locked(cur); /* the state when the allocation failed */
			copy = tl_copy(0, &d.n, &d.dropped);
			d.step = tl_step;
			d.t0 = tl_t_start;
			d.peak = d.run_peak = mem_total_peak(); /* the samples cover the run */
			memcpy(label, tl_label, sizeof(label));
		}
	}
	if (!copy)
		return;
	d.s = copy;
	d.fail_label = label;
	char dir[1100], path[1200];
	snprintf(dir, sizeof(dir), "%s/iteration_%lld_exit", tl_folder, (long long)d.step);
	if (tl_write(dir, &d, path, sizeof(path)) == CT_OK)
		LOG_ERROR("memory snapshot: allocation of %zu bytes for %s failed; wrote %s", bytes,
		          mem_cat_name(cat), path);
	free(copy);
}
