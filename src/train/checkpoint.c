#define _GNU_SOURCE /* renameat2 (RENAME_EXCHANGE) */
#include "train/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/thread.h"
#include "base/timer.h"
#include "comm/watchdog.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "train/metrics.h"

/* ---------------------------------------------------------------- files */

static int fsync_path(const char *path)
{
	int fd = open(path, O_RDONLY);
	if (fd < 0 || fsync(fd) != 0) {
		LOG_ERROR("checkpoint: cannot fsync '%s': %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return CT_ERR_RUNTIME;
	}
	close(fd);
	return CT_OK;
}

static int rename_in_place(const char *from, const char *to)
{
	if (rename(from, to) != 0) {
		LOG_ERROR("checkpoint: cannot rename '%s' to '%s': %s", from, to, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	return CT_OK;
}

static int write_text_durable(const char *path, const char *text)
{
	char tmp[1100];
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f) {
		LOG_ERROR("checkpoint: cannot write '%s': %s", tmp, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	int ok = fputs(text, f) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
	ok = (fclose(f) == 0) && ok;
	if (!ok || rename(tmp, path) != 0) {
		LOG_ERROR("checkpoint: cannot write '%s': %s", path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	/* the rename lives in the directory: it is durable only once the directory is */
	char dir[1100];
	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	if (slash)
		*slash = '\0';
	return fsync_path(slash ? (dir[0] ? dir : "/") : ".");
}

static void remove_tree(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	char p[1200];
	while ((e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		unlink(p);
	}
	closedir(d);
	rmdir(dir);
}

/* ---------------------------------------------------------------- manifest */

/* The model's config in the manifest: the family's name and its own fields. */
static cJSON *model_json(const struct model_config *mc)
{
	const struct model_family *fam = model_family_of(mc->kind);
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "name", fam->name);
	if (fam->manifest_fields)
		fam->manifest_fields(mc, o);
	return o;
}

static void step_dir(char *out, size_t n, const char *root, int64_t step, const char *suffix)
{
	snprintf(out, n, "%s/step-%08lld%s", root, (long long)step, suffix);
}

struct file_sum {
	uint64_t hash;
	int64_t bytes;
	int64_t wrote; /* 1 if this rank wrote a file */
	int64_t rc;
};

static int save_rank_file(const char *path, const struct ckpt_tensor *t, int n, uint64_t *hash,
                          int64_t *bytes)
{
	struct st_file f;
	st_init(&f);
	char name[256];
	for (int i = 0; i < n; i++) {
		if (t[i].nrows == 0 || t[i].replica)
			continue;
		int64_t shape[2] = {t[i].nrows, ckpt_tensor_ncols(&t[i])};
		st_add(&f, t[i].name, ST_F32, t[i].ndim, shape, t[i].param);
		snprintf(name, sizeof(name), "%s.exp_avg", t[i].name);
		st_add(&f, name, ST_F32, t[i].ndim, shape, t[i].exp_avg);
		snprintf(name, sizeof(name), "%s.exp_avg_sq", t[i].name);
		st_add(&f, name, ST_F32, t[i].ndim, shape, t[i].exp_avg_sq);
	}
	int rc = st_write_hashed(&f, path, hash, bytes);
	st_free(&f);
	return rc;
}

static char *manifest_text(const struct model_config *cfg, const struct mesh *mesh,
                           const struct ckpt_tensor *t, int n, const struct ckpt_trainer_state *st,
                           const struct file_sum *sums, const int64_t *box,
                           const struct ckpt_extra *extra, const struct file_sum *extra_sums,
                           int n_extra)
{
	/* box: a world x n table of every rank's {row0, nrows, col0, ncols} (nrows 0: the rank
	 * writes none of that tensor) */
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "format", "ctitan-checkpoint");
	cJSON_AddNumberToObject(o, "version", CKPT_FORMAT_VERSION);
	cJSON_AddNumberToObject(o, "step", (double)st->step);
	cJSON_AddNumberToObject(o, "tokens_seen", (double)st->tokens_seen);
	cJSON_AddNumberToObject(o, "optimizer_step", (double)st->optimizer_step);
	cJSON_AddStringToObject(o, "data_state", st->data_state);
	cJSON_AddItemToObject(o, "model", model_json(cfg));
	cJSON *m = cJSON_AddObjectToObject(o, "mesh");
	cJSON_AddNumberToObject(m, "world", mesh->world);
	cJSON_AddNumberToObject(m, "pp", mesh->pp);
	cJSON_AddNumberToObject(m, "dp_replicate", mesh->dp_replicate);
	cJSON_AddNumberToObject(m, "dp_shard", mesh->dp_shard);
	cJSON_AddNumberToObject(m, "tp", mesh->tp);
	cJSON *files = cJSON_AddObjectToObject(o, "files");
	char fname[64], hex[32];
	for (int r = 0; r < mesh->world; r++) {
		if (!sums[r].wrote)
			continue;
		snprintf(fname, sizeof(fname), "rank-%05d.safetensors", r);
		cJSON *fo = cJSON_AddObjectToObject(files, fname);
		snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)sums[r].hash);
		cJSON_AddStringToObject(fo, "xxh3_64", hex);
		cJSON_AddNumberToObject(fo, "bytes", (double)sums[r].bytes);
	}
	for (int i = 0; i < n_extra; i++) {
		cJSON *fo = cJSON_AddObjectToObject(files, extra[i].name);
		snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)extra_sums[i].hash);
		cJSON_AddStringToObject(fo, "xxh3_64", hex);
		cJSON_AddNumberToObject(fo, "bytes", (double)extra_sums[i].bytes);
	}
	cJSON *tensors = cJSON_AddObjectToObject(o, "tensors");
	for (int i = 0; i < n; i++) {
		cJSON *to = cJSON_AddObjectToObject(tensors, t[i].name);
		cJSON *shape = cJSON_AddArrayToObject(to, "shape");
		cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].rows));
		if (t[i].ndim == 2)
			cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].cols));
		cJSON_AddStringToObject(to, "dtype", "F32");
		cJSON *pieces = cJSON_AddArrayToObject(to, "pieces");
		for (int r = 0; r < mesh->world; r++) {
			const int64_t *b = box + ((int64_t)r * n + i) * 4;
			int64_t r0 = b[0], nr = b[1], c0 = b[2], nc = b[3];
			if (!sums[r].wrote || nr == 0)
				continue;
			cJSON *p = cJSON_CreateObject();
			snprintf(fname, sizeof(fname), "rank-%05d.safetensors", r);
			cJSON_AddStringToObject(p, "file", fname);
			cJSON *rows = cJSON_AddArrayToObject(p, "rows");
			cJSON_AddItemToArray(rows, cJSON_CreateNumber((double)r0));
			cJSON_AddItemToArray(rows, cJSON_CreateNumber((double)(r0 + nr)));
			if (c0 != 0 || nc != t[i].cols) { /* a column piece (row-parallel TP) */
				cJSON *cols = cJSON_AddArrayToObject(p, "cols");
				cJSON_AddItemToArray(cols, cJSON_CreateNumber((double)c0));
				cJSON_AddItemToArray(cols, cJSON_CreateNumber((double)(c0 + nc)));
			}
			cJSON_AddItemToArray(pieces, p);
		}
	}
	char *text = cJSON_Print(o);
	cJSON_Delete(o);
	return text;
}

static int step_of(const char *name, int64_t *step)
{
	char *end;
	if (strncmp(name, "step-", 5) != 0)
		return 0;
	long long v = strtoll(name + 5, &end, 10);
	if (*end || end == name + 5)
		return 0;
	*step = v;
	return 1;
}

static void prune(const char *root, int64_t keep)
{
	DIR *d = opendir(root);
	if (!d)
		return;
	int64_t steps[4096];
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) && n < 4096) {
		int64_t s;
		if (step_of(e->d_name, &s))
			steps[n++] = s;
	}
	closedir(d);
	for (int i = 0; i < n; i++) { /* delete every step with >= keep newer ones */
		int newer = 0;
		for (int j = 0; j < n; j++)
			newer += steps[j] > steps[i];
		if (newer >= keep) {
			char p[1100];
			step_dir(p, sizeof(p), root, steps[i], "");
			remove_tree(p);
		}
	}
}

/* Rank 0: the extra files, durable, with their checksums. */
static int save_extras(const char *dir, const struct ckpt_extra *extra, int n,
                       struct file_sum *sums)
{
	char path[1300];
	for (int i = 0; i < n; i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, extra[i].name);
		FILE *f = fopen(path, "wb");
		bool ok = f != NULL;
		if (ok) {
			size_t wrote = fwrite(extra[i].data, 1, extra[i].len, f);
			ok = wrote == extra[i].len && fflush(f) == 0 && fsync(fileno(f)) == 0;
		}
		if (f)
			ok = (fclose(f) == 0) && ok;
		if (!ok) {
			LOG_ERROR("checkpoint: cannot write '%s': %s", path, strerror(errno));
			return CT_ERR_RUNTIME;
		}
		sums[i].hash = XXH3_64bits(extra[i].data, extra[i].len);
		sums[i].bytes = (int64_t)extra[i].len;
	}
	return CT_OK;
}

/* The save protocol, collective over g (the world, or a duplicate of it for the background
 * writer). */
static int save_on(const struct comm_group *g, const char *root, const struct model_config *cfg,
                   const struct mesh *mesh, const struct ckpt_tensor *t, int n,
                   const struct ckpt_trainer_state *st, const struct ckpt_extra *extra, int n_extra,
                   int64_t keep_latest_k)
{
	char tmp[1100], final[1100], path[1200];
	step_dir(tmp, sizeof(tmp), root, st->step, ".tmp");
	step_dir(final, sizeof(final), root, st->step, "");
	comm_context("checkpoint save of step %lld", (long long)st->step);
	int64_t rc = CT_OK;
	if (mesh->rank == 0) {
		rc = metrics_mkdirs(root);
		remove_tree(tmp); /* leftovers of a crashed save */
		if (!rc && mkdir(tmp, 0755) != 0) {
			LOG_ERROR("checkpoint: cannot create '%s': %s", tmp, strerror(errno));
			rc = CT_ERR_RUNTIME;
		}
	}
	comm_label("folder created?");
	comm_all_reduce_i64(g, &rc, 1);
	if (rc) {
		comm_context_clear();
		return CT_ERR_RUNTIME;
	}

	/* every rank of replica 0 writes its rows */
	struct file_sum mine = {0, 0, mesh->dp_replicate_rank == 0, CT_OK};
	if (mine.wrote) {
		snprintf(path, sizeof(path), "%s/rank-%05d.safetensors", tmp, mesh->rank);
		mine.rc = save_rank_file(path, t, n, &mine.hash, &mine.bytes);
	}
	struct file_sum *sums = xcalloc((size_t)mesh->world, sizeof(*sums));
	comm_label("file checksums");
	comm_all_gather(g, &mine, sums, sizeof(mine));
	int64_t *box = xcalloc((size_t)mesh->world * (size_t)n * 4, sizeof(int64_t));
	int64_t *mine_box = xcalloc((size_t)n * 4, sizeof(int64_t));
	for (int i = 0; i < n; i++) {
		mine_box[4 * i] = t[i].row0;
		mine_box[4 * i + 1] = t[i].replica ? 0 : t[i].nrows;
		mine_box[4 * i + 2] = t[i].ncols > 0 ? t[i].col0 : 0;
		mine_box[4 * i + 3] = ckpt_tensor_ncols(&t[i]);
	}
	comm_label("row and column ranges");
	comm_all_gather(g, mine_box, box, n * 4 * (int64_t)sizeof(int64_t));
	rc = CT_OK;
	for (int r = 0; r < mesh->world; r++)
		if (sums[r].rc)
			rc = CT_ERR_RUNTIME;
	struct file_sum *extra_sums = xcalloc((size_t)n_extra + 1, sizeof(*extra_sums));
	if (mesh->rank == 0 && !rc)
		rc = save_extras(tmp, extra, n_extra, extra_sums);
	if (mesh->rank == 0 && !rc) {
		/* The manifest is what makes a folder a checkpoint. It is written under a
		 * pending name, so a save killed before the folder's rename leaves no .tmp folder
		 * that looks complete, and gets its name in the final folder. */
		char *text =
		    manifest_text(cfg, mesh, t, n, st, sums, box, extra, extra_sums, n_extra);
		char pending[1200];
		snprintf(pending, sizeof(pending), "%s/manifest.pending", tmp);
		rc = write_text_durable(pending, text);
		free(text);
		bool exchange = !rc && access(final, F_OK) == 0;
		if (exchange) {
			/* an older save of the same step (e.g. one that failed to load): swap
			 * the two atomically, so the step never goes missing, then drop it */
			snprintf(path, sizeof(path), "%s/manifest.json", tmp);
			rc = rename_in_place(pending, path);
			if (!rc)
				rc = fsync_path(tmp);
			if (!rc &&
			    renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) != 0) {
				LOG_ERROR("checkpoint: cannot replace '%s': %s", final,
				          strerror(errno));
				rc = CT_ERR_RUNTIME;
			} else if (!rc) {
				remove_tree(tmp);
			}
		} else if (!rc) {
			rc = fsync_path(tmp);
			if (!rc && rename(tmp, final) != 0) {
				LOG_ERROR("checkpoint: cannot rename '%s' to '%s': %s", tmp, final,
				          strerror(errno));
				rc = CT_ERR_RUNTIME;
			}
			char from[1200];
			snprintf(from, sizeof(from), "%s/manifest.pending", final);
			snprintf(path, sizeof(path), "%s/manifest.json", final);
			if (!rc)
				rc = rename_in_place(from, path);
			if (!rc)
				rc = fsync_path(final);
		}
		if (!rc)
			rc = fsync_path(root);
		if (!rc) {
			char latest[1100], num[32];
			snprintf(latest, sizeof(latest), "%s/latest", root);
			snprintf(num, sizeof(num), "%lld\n", (long long)st->step);
			rc = write_text_durable(latest, num);
		}
		if (!rc && keep_latest_k > 0)
			prune(root, keep_latest_k);
		if (rc)
			remove_tree(tmp);
	}
	comm_label("manifest written?");
	comm_all_reduce_i64(g, &rc, 1);
	comm_context_clear();
	free(sums), free(box), free(mine_box), free(extra_sums);
	if (!rc)
		LOG_INFO("checkpoint: saved step %lld to %s", (long long)st->step, final);
	return rc ? CT_ERR_RUNTIME : CT_OK;
}

int ckpt_save(const char *root, const struct model_config *cfg, const struct mesh *mesh,
              const struct ckpt_tensor *t, int n, const struct ckpt_trainer_state *st,
              const struct ckpt_extra *extra, int n_extra, int64_t keep_latest_k)
{
	return save_on(&mesh->world_group, root, cfg, mesh, t, n, st, extra, n_extra,
	               keep_latest_k);
}

/* ---------------------------------------------------------------- asynchronous saves */

struct ckpt_async {
	const struct mesh *mesh;
	struct comm_group group; /* MPI_Comm_dup of the world: the writer's collectives */
	pthread_t thread;
	bool running;
	int rc; /* result of the last finished save */
	/* the snapshot: one staging buffer (MEM_CHECKPOINT), tensors pointing into it */
	float *buf;
	int64_t buf_floats;
	struct ckpt_tensor *t;
	int n;
	struct ckpt_extra *extra;
	int n_extra;
	struct ckpt_trainer_state st;
	struct model_config cfg;
	char root[1100];
	int64_t keep;
};

struct ckpt_async *ckpt_async_new(const struct mesh *mesh)
{
	struct ckpt_async *a = xcalloc(1, sizeof(*a));
	a->mesh = mesh;
	comm_group_dup(&mesh->world_group, &a->group);
	return a;
}

void ckpt_async_reserve(struct ckpt_async *a, int64_t floats)
{
	if (floats <= a->buf_floats)
		return;
	mem_free(MEM_CHECKPOINT, a->buf, (size_t)a->buf_floats * sizeof(float));
	a->buf = mem_alloc(MEM_CHECKPOINT, (size_t)floats * sizeof(float));
	memset(a->buf, 0, (size_t)floats * sizeof(float)); /* fault the pages in now */
	a->buf_floats = floats;
}

static void *async_main(void *arg)
{
	struct ckpt_async *a = arg;
	/* The writer yields to training: at the lowest priority it runs on the cycles the step
	 * leaves idle, instead of preempting a compute thread (which stalls every OpenMP barrier
	 * of the step). Linux applies a thread id's nice value to that thread alone. */
	if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19) != 0)
		LOG_DEBUG("checkpoint: cannot lower the writer's priority: %s", strerror(errno));
	double t0 = timer_now();
	a->rc = save_on(&a->group, a->root, &a->cfg, a->mesh, a->t, a->n, &a->st, a->extra,
	                a->n_extra, a->keep);
	if (!a->rc)
		LOG_INFO("checkpoint: step %lld written in the background in %.2f s",
		         (long long)a->st.step, timer_now() - t0);
	return NULL;
}

static void async_release_extras(struct ckpt_async *a)
{
	for (int i = 0; i < a->n_extra; i++)
		free((void *)a->extra[i].data);
	free(a->extra);
	a->extra = NULL;
	a->n_extra = 0;
}

int ckpt_async_wait(struct ckpt_async *a)
{
	if (!a || !a->running)
		return a ? a->rc : CT_OK;
	pthread_join(a->thread, NULL);
	a->running = false;
	async_release_extras(a);
	return a->rc;
}

int ckpt_async_save(struct ckpt_async *a, const char *root, const struct model_config *cfg,
                    const struct ckpt_tensor *t, int n, const struct ckpt_trainer_state *st,
                    const struct ckpt_extra *extra, int n_extra, int64_t keep_latest_k)
{
	int rc = ckpt_async_wait(a);
	if (rc)
		return rc; /* the previous background save failed: say so before going on */
	int64_t need = 0;
	for (int i = 0; i < n; i++)
		need += 3 * t[i].nrows * ckpt_tensor_ncols(&t[i]);
	ckpt_async_reserve(a, need); /* once: the shapes do not change during a run */
	if (a->n != n) {
		free(a->t);
		a->t = xcalloc((size_t)n + 1, sizeof(*a->t));
		a->n = n;
	}
	float *p = a->buf;
	for (int i = 0; i < n; i++) {
		size_t k = (size_t)(t[i].nrows * ckpt_tensor_ncols(&t[i]));
		a->t[i] = t[i];
		a->t[i].param = p, p += k;
		a->t[i].exp_avg = p, p += k;
		a->t[i].exp_avg_sq = p, p += k;
		if (k == 0)
			continue;
		memcpy(a->t[i].param, t[i].param, k * sizeof(float));
		memcpy(a->t[i].exp_avg, t[i].exp_avg, k * sizeof(float));
		memcpy(a->t[i].exp_avg_sq, t[i].exp_avg_sq, k * sizeof(float));
	}
	a->extra = xcalloc((size_t)n_extra + 1, sizeof(*a->extra));
	for (int i = 0; i < n_extra; i++) {
		void *d = malloc(extra[i].len + 1);
		CHECK(d, "out of memory");
		memcpy(d, extra[i].data, extra[i].len);
		a->extra[i] = (struct ckpt_extra){extra[i].name, d, extra[i].len};
	}
	a->n_extra = n_extra;
	a->st = *st;
	a->cfg = *cfg;
	snprintf(a->root, sizeof(a->root), "%s", root);
	a->keep = keep_latest_k;
	a->rc = CT_OK;
	CHECK(thread_start(&a->thread, "ct-ckpt", async_main, a) == 0,
	      "cannot start the checkpoint writer thread");
	a->running = true;
	return CT_OK;
}

void ckpt_async_free(struct ckpt_async *a)
{
	if (!a)
		return;
	ckpt_async_wait(a);
	comm_group_free(&a->group);
	mem_free(MEM_CHECKPOINT, a->buf, (size_t)a->buf_floats * sizeof(float));
	free(a->t);
	free(a);
}

/* ---------------------------------------------------------------- load */

int ckpt_find(const char *root, int64_t want, int64_t *step)
{
	char p[1200];
	*step = -1;
	if (want >= 0) {
		step_dir(p, sizeof(p), root, want, "/manifest.json");
		if (access(p, R_OK) != 0) {
			LOG_ERROR(
			    "checkpoint.load_step: no complete checkpoint of step %lld in '%s'",
			    (long long)want, root);
			return CT_ERR_USAGE;
		}
		*step = want;
		return CT_OK;
	}
	/* newest step folder with a manifest ('latest' names it, but a folder is the truth) */
	DIR *d = opendir(root);
	if (!d)
		return CT_OK;
	struct dirent *e;
	while ((e = readdir(d))) {
		int64_t s;
		if (!step_of(e->d_name, &s) || s <= *step)
			continue;
		step_dir(p, sizeof(p), root, s, "/manifest.json");
		if (access(p, R_OK) == 0)
			*step = s;
	}
	closedir(d);
	return CT_OK;
}

int ckpt_resolve(const char *path, char *root, size_t root_size, int64_t *step)
{
	char probe[1200];
	snprintf(probe, sizeof(probe), "%s/manifest.json", path);
	if (access(probe, R_OK) == 0) {
		snprintf(root, root_size, "%s", path);
		char *slash = strrchr(root, '/');
		const char *base = slash ? slash + 1 : root;
		long long s;
		if (sscanf(base, "step-%lld", &s) != 1) {
			LOG_ERROR("checkpoint: '%s' is not a step-NNNNNNNN folder", path);
			return CT_ERR_USAGE;
		}
		if (slash)
			*slash = 0;
		else
			snprintf(root, root_size, ".");
		*step = s;
		return CT_OK;
	}
	snprintf(root, root_size, "%s", path);
	int rc = ckpt_find(root, -1, step);
	if (!rc && *step < 0) {
		LOG_ERROR("checkpoint: no checkpoint in '%s'", path);
		rc = CT_ERR_USAGE;
	}
	return rc;
}

int ckpt_list(const char *root, int64_t *steps, int max)
{
	int n = 0;
	DIR *d = opendir(root);
	if (!d)
		return 0;
	struct dirent *e;
	char p[1200];
	while ((e = readdir(d)) && n < max) {
		int64_t s;
		if (!step_of(e->d_name, &s))
			continue;
		step_dir(p, sizeof(p), root, s, "/manifest.json");
		if (access(p, R_OK) == 0)
			steps[n++] = s;
	}
	closedir(d);
	for (int i = 1; i < n; i++) /* insertion sort, newest first */
		for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
			int64_t t = steps[j];
			steps[j] = steps[j - 1];
			steps[j - 1] = t;
		}
	return n;
}

/* ---------------------------------------------------------------- load */

/* The checkpoint's model must be this run's model: every field this build writes must be
 * present with the same value (the flavor name is only a label). */
static int check_model(const struct ckpt_manifest *m, const struct model_config *cfg,
                       const char *path)
{
	/* the family first (manifests without a name are Llama's) */
	const cJSON *mname = cJSON_GetObjectItemCaseSensitive(m->model, "name");
	const char *saved = cJSON_IsString(mname) ? mname->valuestring : "llama3";
	if (strcmp(saved, model_kind_name(cfg->kind)) != 0) {
		LOG_ERROR("checkpoint: '%s' holds a %s model, not %s", path, saved,
		          model_kind_name(cfg->kind));
		return CT_ERR_RUNTIME;
	}
	cJSON *want = model_json(cfg);
	int rc = CT_OK;
	const cJSON *w;
	cJSON_ArrayForEach (w, want) {
		if (strcmp(w->string, "flavor") == 0 || strcmp(w->string, "name") == 0)
			continue;
		const cJSON *got = cJSON_GetObjectItemCaseSensitive(m->model, w->string);
		if (!got || !cJSON_Compare(got, w, 1)) {
			char *a = got ? cJSON_PrintUnformatted(got) : NULL;
			char *b = cJSON_PrintUnformatted(w);
			LOG_ERROR("checkpoint: '%s' is of another model: model.%s is %s in the "
			          "checkpoint, %s in this run",
			          path, w->string, a ? a : "missing", b);
			free(a);
			free(b);
			rc = CT_ERR_RUNTIME;
			break;
		}
	}
	cJSON_Delete(want);
	return rc;
}

struct open_file {
	struct st_file st;
	bool open, bad;
};

/* Open (once) and verify a checkpoint file named in the manifest: it is read once, and its
 * size, checksum and safetensors header are checked on those bytes. */
static struct st_file *get_file(struct open_file *cache, const struct ckpt_manifest *m,
                                const char *dir, int fi)
{
	struct open_file *of = &cache[fi];
	if (of->open)
		return &of->st;
	if (of->bad)
		return NULL;
	of->bad = true;
	const struct ckpt_mfile *mf = &m->files[fi];
	char path[1300];
	snprintf(path, sizeof(path), "%s/%s", dir, mf->name);
	char *blob;
	size_t bytes;
	if (io_read_file(path, &blob, &bytes)) {
		LOG_ERROR("checkpoint: cannot open '%s': %s", path, strerror(errno));
		return NULL;
	}
	if ((int64_t)bytes != mf->bytes) {
		LOG_ERROR("checkpoint: '%s' is truncated or extended (%lld bytes, manifest says "
		          "%lld)",
		          path, (long long)bytes, (long long)mf->bytes);
		free(blob);
		return NULL;
	}
	uint64_t h = XXH3_64bits(blob, bytes);
	if (h != mf->xxh3) {
		LOG_ERROR("checkpoint: '%s' is corrupted (xxh3 %016llx, manifest says %016llx)",
		          path, (unsigned long long)h, (unsigned long long)mf->xxh3);
		free(blob);
		return NULL;
	}
	if (st_parse(&of->st, blob, (int64_t)bytes, path)) /* owns blob from here */
		return NULL;
	of->open = true;
	of->bad = false;
	return &of->st;
}

static int load_tensor(const struct ckpt_tensor *t, const struct ckpt_mtensor *mt,
                       const struct ckpt_manifest *m, const char *dir, struct open_file *cache)
{
	if (mt->rows != t->rows || mt->cols != t->cols || mt->ndim != t->ndim) {
		LOG_ERROR(
		    "checkpoint: tensor '%s' has shape [%lld, %lld] in the checkpoint, the model "
		    "has [%lld, %lld]",
		    t->name, (long long)mt->rows, (long long)mt->cols, (long long)t->rows,
		    (long long)t->cols);
		return CT_ERR_RUNTIME;
	}
	/* this rank's rectangle [lo, hi) x [c_lo, c_hi); a piece's [a, b) x [pc->col0, col1) */
	int64_t lo = t->row0, hi = t->row0 + t->nrows, ncols = ckpt_tensor_ncols(t);
	int64_t c_lo = t->ncols > 0 ? t->col0 : 0, c_hi = c_lo + ncols;
	for (int i = 0; i < mt->n_pieces; i++) {
		const struct ckpt_piece *pc = &mt->pieces[i];
		int64_t a = pc->row0, b = pc->row1, pcols = pc->col1 - pc->col0;
		int64_t x0 = a > lo ? a : lo, x1 = b < hi ? b : hi;
		int64_t y0 = pc->col0 > c_lo ? pc->col0 : c_lo,
		        y1 = pc->col1 < c_hi ? pc->col1 : c_hi;
		if (x0 >= x1 || y0 >= y1)
			continue;
		const char *fname = m->files[pc->file].name;
		struct st_file *f = get_file(cache, m, dir, pc->file);
		if (!f)
			return CT_ERR_RUNTIME;
		const char *suffix[3] = {"", ".exp_avg", ".exp_avg_sq"};
		float *dst[3] = {t->param, t->exp_avg, t->exp_avg_sq};
		for (int k = 0; k < 3; k++) {
			if (!dst[k]) /* e.g. generation loads parameters only */
				continue;
			char name[256];
			snprintf(name, sizeof(name), "%s%s", t->name, suffix[k]);
			const struct st_tensor *s = st_find(f, name);
			if (!s || s->dtype != ST_F32 || s->ndim != t->ndim ||
			    s->shape[0] != b - a || (s->end - s->begin) != (b - a) * pcols * 4) {
				LOG_ERROR(
				    "checkpoint: %s/%s lacks tensor '%s' rows [%lld, %lld) as "
				    "the manifest says",
				    dir, fname, name, (long long)a, (long long)b);
				return CT_ERR_RUNTIME;
			}
			const float *src = (const float *)s->data;
			if (pcols == ncols && y1 - y0 == ncols) { /* whole rows: one copy */
				memcpy(dst[k] + (x0 - lo) * ncols, src + (x0 - a) * pcols,
				       (size_t)((x1 - x0) * ncols) * sizeof(float));
				continue;
			}
			for (int64_t r = x0; r < x1; r++)
				memcpy(dst[k] + (r - lo) * ncols + (y0 - c_lo),
				       src + (r - a) * pcols + (y0 - pc->col0),
				       (size_t)(y1 - y0) * sizeof(float));
		}
	}
	return CT_OK;
}

int ckpt_read_extra(const char *root, int64_t step, const char *name, char **data, size_t *len)
{
	char dir[1100], path[1200];
	step_dir(dir, sizeof(dir), root, step, "");
	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	*data = NULL;
	*len = 0;
	size_t mlen = 0;
	char *text = NULL;
	if (io_read_file(path, &text, &mlen)) {
		LOG_ERROR("checkpoint: '%s' is missing or malformed (%s)", path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	struct ckpt_manifest m;
	memset(&m, 0, sizeof(m));
	int rc = ckpt_manifest_parse(&m, text, mlen, path);
	free(text);
	const struct ckpt_mfile *f = NULL;
	for (int i = 0; !rc && i < m.n_files; i++)
		if (strcmp(m.files[i].name, name) == 0)
			f = &m.files[i];
	if (!rc && !f)
		rc = 1;
	if (!rc) {
		snprintf(path, sizeof(path), "%s/%s", dir, name);
		if (io_read_file(path, data, len) || (int64_t)*len != f->bytes ||
		    XXH3_64bits(*data, *len) != f->xxh3) {
			LOG_ERROR("checkpoint: '%s' is missing or does not match the manifest's "
			          "size and checksum",
			          path);
			free(*data);
			*data = NULL;
			rc = CT_ERR_RUNTIME;
		}
	}
	ckpt_manifest_free(&m);
	return rc;
}

int ckpt_load(const char *root, int64_t step, const struct model_config *cfg,
              const struct mesh *mesh, struct ckpt_tensor *t, int n, struct ckpt_trainer_state *st)
{
	char dir[1100], path[1200];
	step_dir(dir, sizeof(dir), root, step, "");
	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	int64_t rc = CT_OK;
	size_t len = 0;
	char *text = NULL;
	io_read_file(path, &text, &len);
	struct ckpt_manifest m;
	memset(&m, 0, sizeof(m));
	if (!text) {
		LOG_ERROR("checkpoint: '%s' is missing or malformed (%s)", path, strerror(errno));
		rc = CT_ERR_RUNTIME;
	} else {
		rc = ckpt_manifest_parse(&m, text, len, path);
	}
	free(text);
	if (!rc)
		rc = check_model(&m, cfg, path);
	if (!rc)
		*st = m.st;
	struct open_file *cache = xcalloc((size_t)m.n_files + 1, sizeof(*cache));
	for (int i = 0; !rc && i < n; i++) {
		const struct ckpt_mtensor *mt = ckpt_manifest_tensor(&m, t[i].name);
		/* a tensor the family split since the checkpoint was written (model.h,
		 * tensor_group): its rows of the older whole tensor */
		const struct model_family *fam = mt ? NULL : model_family_of(cfg->kind);
		char group[PARAM_NAME_MAX];
		int piece = 0, g = fam && fam->tensor_group
		                       ? fam->tensor_group(cfg, t[i].name, group, sizeof(group), &piece)
		                       : 1;
		const struct ckpt_mtensor *gm = g > 1 ? ckpt_manifest_tensor(&m, group) : NULL;
		if (gm) {
			struct ckpt_tensor whole = t[i];
			whole.name = group;
			whole.rows = t[i].rows * g;
			whole.row0 = (int64_t)piece * t[i].rows + t[i].row0;
			rc = load_tensor(&whole, gm, &m, dir, cache);
			continue;
		}
		if (!mt) {
			LOG_ERROR("checkpoint: '%s' has no tensor '%s'", path, t[i].name);
			rc = CT_ERR_RUNTIME;
			break;
		}
		rc = load_tensor(&t[i], mt, &m, dir, cache);
	}
	for (int i = 0; i < m.n_files; i++)
		if (cache[i].open)
			st_free(&cache[i].st);
	free(cache);
	ckpt_manifest_free(&m);
	int64_t any = rc ? 1 : 0;
	comm_label("checkpoint load of step %lld: every rank read its rows?", (long long)step);
	comm_all_reduce_i64(&mesh->world_group, &any, 1);
	if (any)
		return rc ? (int)rc : CT_ERR_RUNTIME;
	LOG_INFO("checkpoint: loaded step %lld from %s", (long long)st->step, dir);
	return CT_OK;
}

int ckpt_load_params(const char *root, int64_t step, const struct model_config *cfg,
                     const struct param_table *t, float *params)
{
	struct ckpt_tensor *ct = xcalloc((size_t)t->count, sizeof(*ct));
	for (int i = 0; i < t->count; i++) {
		const struct param_entry *p = &t->p[i];
		ct[i] = (struct ckpt_tensor){.name = p->name,
		                             .ndim = p->ndim,
		                             .rows = p->shape[0],
		                             .cols = p->numel / p->shape[0],
		                             .row0 = 0,
		                             .nrows = p->shape[0],
		                             .param = params + p->offset};
	}
	struct mesh mesh;
	struct ckpt_trainer_state st;
	int rc = mesh_build(&mesh, 1, 1, 1, 1);
	if (!rc) {
		rc = ckpt_load(root, step, cfg, &mesh, ct, t->count, &st);
		mesh_free(&mesh);
	}
	free(ct);
	return rc;
}
