#include "train/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/log.h"
#include "io/safetensors.h"
#include "train/metrics.h"

/* ---------------------------------------------------------------- files */

/* xxHash64 (XXH3) of a whole file, streamed; size in *bytes. */
static int file_hash(const char *path, uint64_t *hash, int64_t *bytes)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		LOG_ERROR("checkpoint: cannot open '%s': %s", path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	XXH3_state_t *st = XXH3_createState();
	CHECK(st, "out of memory");
	XXH3_64bits_reset(st);
	size_t cap = 4 << 20, n;
	char *buf = malloc(cap);
	CHECK(buf, "out of memory");
	*bytes = 0;
	while ((n = fread(buf, 1, cap, f)) > 0) {
		XXH3_64bits_update(st, buf, n);
		*bytes += (int64_t)n;
	}
	int rc = ferror(f) ? CT_ERR_RUNTIME : CT_OK;
	if (rc)
		LOG_ERROR("checkpoint: read error on '%s'", path);
	*hash = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	free(buf);
	fclose(f);
	return rc;
}

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
	return CT_OK;
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

static char *read_text(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *s = malloc((size_t)(n < 0 ? 0 : n) + 1);
	CHECK(s, "out of memory");
	size_t got = fread(s, 1, (size_t)(n < 0 ? 0 : n), f);
	s[got] = 0;
	fclose(f);
	return s;
}

/* ---------------------------------------------------------------- manifest */

static cJSON *model_json(const struct model_config *mc)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "name", model_kind_name(mc->kind));
	if (mc->kind == MODEL_HYENA) {
		const struct hyena_config *c = &mc->hyena;
		cJSON_AddStringToObject(o, "flavor", c->flavor);
		cJSON_AddNumberToObject(o, "dim", (double)c->dim);
		cJSON_AddNumberToObject(o, "n_layers", (double)c->n_layers);
		cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab_size);
		cJSON_AddNumberToObject(o, "order", (double)c->order);
		cJSON_AddNumberToObject(o, "filter_order", (double)c->filter_order);
		cJSON_AddNumberToObject(o, "emb_dim", (double)c->emb_dim);
		cJSON_AddNumberToObject(o, "ffn_hidden", (double)c->ffn_hidden);
		cJSON_AddNumberToObject(o, "l_max", (double)c->l_max);
		cJSON_AddNumberToObject(o, "sin_freq", c->sin_freq);
		cJSON_AddNumberToObject(o, "norm_eps", c->norm_eps);
		return o;
	}
	const struct llama_config *c = &mc->llama;
	cJSON_AddStringToObject(o, "flavor", c->flavor);
	cJSON_AddNumberToObject(o, "dim", (double)c->dim);
	cJSON_AddNumberToObject(o, "n_layers", (double)c->n_layers);
	cJSON_AddNumberToObject(o, "n_heads", (double)c->n_heads);
	cJSON_AddNumberToObject(o, "n_kv_heads", (double)c->n_kv_heads);
	cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab_size);
	cJSON_AddNumberToObject(o, "ffn_hidden", (double)c->ffn_hidden);
	cJSON_AddNumberToObject(o, "norm_eps", c->norm_eps);
	cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta);
	cJSON_AddBoolToObject(o, "rope_scaling", c->rope_scaling);
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

static int save_rank_file(const char *path, const struct ckpt_tensor *t, int n)
{
	struct st_file f;
	st_init(&f);
	char name[256];
	for (int i = 0; i < n; i++) {
		if (t[i].nrows == 0)
			continue;
		int64_t shape[2] = {t[i].nrows, t[i].cols};
		st_add(&f, t[i].name, ST_F32, t[i].ndim, shape, t[i].param);
		snprintf(name, sizeof(name), "%s.exp_avg", t[i].name);
		st_add(&f, name, ST_F32, t[i].ndim, shape, t[i].exp_avg);
		snprintf(name, sizeof(name), "%s.exp_avg_sq", t[i].name);
		st_add(&f, name, ST_F32, t[i].ndim, shape, t[i].exp_avg_sq);
	}
	int rc = st_write(&f, path);
	st_free(&f);
	return rc;
}

static char *manifest_text(const struct model_config *cfg, const struct mesh *mesh,
                           const struct ckpt_tensor *t, int n, const struct ckpt_trainer_state *st,
                           const struct file_sum *sums, const int64_t *rows0, const int64_t *nrows,
                           const struct ckpt_extra *extra, const struct file_sum *extra_sums,
                           int n_extra)
{
	/* rows0/nrows: world x n tables of every rank's row ranges */
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
			int64_t nr = nrows[(int64_t)r * n + i], r0 = rows0[(int64_t)r * n + i];
			if (!sums[r].wrote || nr == 0)
				continue;
			cJSON *p = cJSON_CreateObject();
			snprintf(fname, sizeof(fname), "rank-%05d.safetensors", r);
			cJSON_AddStringToObject(p, "file", fname);
			cJSON *rows = cJSON_AddArrayToObject(p, "rows");
			cJSON_AddItemToArray(rows, cJSON_CreateNumber((double)r0));
			cJSON_AddItemToArray(rows, cJSON_CreateNumber((double)(r0 + nr)));
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

int ckpt_save(const char *root, const struct model_config *cfg, const struct mesh *mesh,
              const struct ckpt_tensor *t, int n, const struct ckpt_trainer_state *st,
              const struct ckpt_extra *extra, int n_extra, int64_t keep_latest_k)
{
	char tmp[1100], final[1100], path[1200];
	step_dir(tmp, sizeof(tmp), root, st->step, ".tmp");
	step_dir(final, sizeof(final), root, st->step, "");
	int64_t rc = CT_OK;
	if (mesh->rank == 0) {
		rc = metrics_mkdirs(root);
		remove_tree(tmp); /* leftovers of a crashed save */
		if (!rc && mkdir(tmp, 0755) != 0) {
			LOG_ERROR("checkpoint: cannot create '%s': %s", tmp, strerror(errno));
			rc = CT_ERR_RUNTIME;
		}
	}
	comm_all_reduce_i64(&mesh->world_group, &rc, 1);
	if (rc)
		return CT_ERR_RUNTIME;

	/* every rank of replica 0 writes its rows */
	struct file_sum mine = {0, 0, mesh->dp_replicate_rank == 0, CT_OK};
	if (mine.wrote) {
		snprintf(path, sizeof(path), "%s/rank-%05d.safetensors", tmp, mesh->rank);
		mine.rc = save_rank_file(path, t, n);
		if (!mine.rc)
			mine.rc = file_hash(path, &mine.hash, &mine.bytes);
	}
	struct file_sum *sums = xcalloc((size_t)mesh->world, sizeof(*sums));
	comm_all_gather(&mesh->world_group, &mine, sums, sizeof(mine));
	int64_t *r0 = xcalloc((size_t)mesh->world * (size_t)n, sizeof(int64_t));
	int64_t *nr = xcalloc((size_t)mesh->world * (size_t)n, sizeof(int64_t));
	int64_t *my0 = xcalloc((size_t)n, sizeof(int64_t)),
	        *myn = xcalloc((size_t)n, sizeof(int64_t));
	for (int i = 0; i < n; i++) {
		my0[i] = t[i].row0;
		myn[i] = t[i].nrows;
	}
	comm_all_gather(&mesh->world_group, my0, r0, n * (int64_t)sizeof(int64_t));
	comm_all_gather(&mesh->world_group, myn, nr, n * (int64_t)sizeof(int64_t));
	rc = CT_OK;
	for (int r = 0; r < mesh->world; r++)
		if (sums[r].rc)
			rc = CT_ERR_RUNTIME;
	struct file_sum *extra_sums = xcalloc((size_t)n_extra + 1, sizeof(*extra_sums));
	if (mesh->rank == 0 && !rc)
		rc = save_extras(tmp, extra, n_extra, extra_sums);
	if (mesh->rank == 0 && !rc) {
		char *text =
		    manifest_text(cfg, mesh, t, n, st, sums, r0, nr, extra, extra_sums, n_extra);
		snprintf(path, sizeof(path), "%s/manifest.json", tmp);
		rc = write_text_durable(path, text);
		free(text);
		if (!rc)
			rc = fsync_path(tmp);
		if (!rc) {
			remove_tree(final); /* an older save of the same step */
			if (rename(tmp, final) != 0) {
				LOG_ERROR("checkpoint: cannot rename '%s' to '%s': %s", tmp, final,
				          strerror(errno));
				rc = CT_ERR_RUNTIME;
			}
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
	comm_all_reduce_i64(&mesh->world_group, &rc, 1);
	free(sums), free(r0), free(nr), free(my0), free(myn), free(extra_sums);
	if (!rc)
		LOG_INFO("checkpoint: saved step %lld to %s", (long long)st->step, final);
	return rc ? CT_ERR_RUNTIME : CT_OK;
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

static int json_int(const cJSON *o, const char *key, int64_t *v)
{
	const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!cJSON_IsNumber(x))
		return CT_ERR_RUNTIME;
	*v = (int64_t)x->valuedouble;
	return CT_OK;
}

struct open_file {
	char name[64];
	struct st_file st;
};

/* Open (once) and verify a checkpoint file named in the manifest. */
static struct st_file *get_file(struct open_file *cache, int *ncache, const char *dir,
                                const cJSON *files, const char *name)
{
	for (int i = 0; i < *ncache; i++)
		if (strcmp(cache[i].name, name) == 0)
			return &cache[i].st;
	const cJSON *fo = cJSON_GetObjectItemCaseSensitive(files, name);
	const cJSON *hx = cJSON_GetObjectItemCaseSensitive(fo, "xxh3_64");
	char path[1300];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (!cJSON_IsString(hx)) {
		LOG_ERROR("checkpoint: manifest has no checksum for '%s'", path);
		return NULL;
	}
	uint64_t h;
	int64_t bytes;
	if (file_hash(path, &h, &bytes))
		return NULL;
	char hex[32];
	snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)h);
	if (strcmp(hex, hx->valuestring) != 0) {
		LOG_ERROR("checkpoint: '%s' is corrupted (xxh3 %s, manifest says %s)", path, hex,
		          hx->valuestring);
		return NULL;
	}
	struct open_file *of = &cache[(*ncache)++];
	snprintf(of->name, sizeof(of->name), "%s", name);
	if (st_read(&of->st, path)) {
		(*ncache)--;
		return NULL;
	}
	return &of->st;
}

static int load_tensor(const struct ckpt_tensor *t, const cJSON *to, const char *dir,
                       const cJSON *files, struct open_file *cache, int *ncache)
{
	const cJSON *shape = cJSON_GetObjectItemCaseSensitive(to, "shape");
	int64_t rows = (int64_t)cJSON_GetArrayItem(shape, 0)->valuedouble;
	int64_t cols = t->ndim == 2 && cJSON_GetArraySize(shape) == 2
	                   ? (int64_t)cJSON_GetArrayItem(shape, 1)->valuedouble
	                   : 1;
	if (rows != t->rows || cols != t->cols || cJSON_GetArraySize(shape) != t->ndim) {
		LOG_ERROR(
		    "checkpoint: tensor '%s' has shape [%lld, %lld] in the checkpoint, the model "
		    "has [%lld, %lld]",
		    t->name, (long long)rows, (long long)cols, (long long)t->rows,
		    (long long)t->cols);
		return CT_ERR_USAGE;
	}
	int64_t covered = 0, lo = t->row0, hi = t->row0 + t->nrows;
	const cJSON *p;
	cJSON_ArrayForEach (p, cJSON_GetObjectItemCaseSensitive(to, "pieces")) {
		const cJSON *fn = cJSON_GetObjectItemCaseSensitive(p, "file");
		const cJSON *rr = cJSON_GetObjectItemCaseSensitive(p, "rows");
		if (!cJSON_IsString(fn) || cJSON_GetArraySize(rr) != 2)
			return CT_ERR_RUNTIME;
		int64_t a = (int64_t)cJSON_GetArrayItem(rr, 0)->valuedouble;
		int64_t b = (int64_t)cJSON_GetArrayItem(rr, 1)->valuedouble;
		int64_t x0 = a > lo ? a : lo, x1 = b < hi ? b : hi;
		if (x0 >= x1)
			continue;
		struct st_file *f = get_file(cache, ncache, dir, files, fn->valuestring);
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
			if (!s || s->dtype != ST_F32 || s->shape[0] != b - a ||
			    (s->end - s->begin) != (b - a) * cols * 4) {
				LOG_ERROR("checkpoint: %s lacks tensor '%s' rows [%lld, %lld)",
				          fn->valuestring, name, (long long)a, (long long)b);
				return CT_ERR_RUNTIME;
			}
			memcpy(dst[k] + (x0 - lo) * cols, (const float *)s->data + (x0 - a) * cols,
			       (size_t)((x1 - x0) * cols) * sizeof(float));
		}
		covered += x1 - x0;
	}
	if (covered != t->nrows) {
		LOG_ERROR("checkpoint: rows [%lld, %lld) of '%s' are not all in the checkpoint",
		          (long long)lo, (long long)hi, t->name);
		return CT_ERR_RUNTIME;
	}
	return CT_OK;
}

int ckpt_load(const char *root, int64_t step, const struct model_config *cfg,
              const struct mesh *mesh, struct ckpt_tensor *t, int n, struct ckpt_trainer_state *st)
{
	char dir[1100], path[1200];
	step_dir(dir, sizeof(dir), root, step, "");
	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	int64_t rc = CT_OK;
	char *text = read_text(path);
	cJSON *man = text ? cJSON_Parse(text) : NULL;
	free(text);
	const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(man, "tensors");
	const cJSON *files = cJSON_GetObjectItemCaseSensitive(man, "files");
	int64_t version = 0;
	if (!cJSON_IsObject(tensors) || !cJSON_IsObject(files) ||
	    json_int(man, "version", &version) || json_int(man, "step", &st->step) ||
	    json_int(man, "tokens_seen", &st->tokens_seen) ||
	    json_int(man, "optimizer_step", &st->optimizer_step)) {
		LOG_ERROR("checkpoint: '%s' is missing or malformed", path);
		rc = CT_ERR_RUNTIME;
	} else if (version != CKPT_FORMAT_VERSION) {
		LOG_ERROR("checkpoint: '%s' has format version %lld, this build reads %d", path,
		          (long long)version, CKPT_FORMAT_VERSION);
		rc = CT_ERR_RUNTIME;
	}
	if (!rc) {
		const cJSON *ds = cJSON_GetObjectItemCaseSensitive(man, "data_state");
		snprintf(st->data_state, sizeof(st->data_state), "%s",
		         cJSON_IsString(ds) ? ds->valuestring : "");
	}
	/* the family must match (manifests without a name are Llama's) */
	const cJSON *mname = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(man, "model"), "name");
	const char *saved = cJSON_IsString(mname) ? mname->valuestring : "llama3";
	if (!rc && cfg && strcmp(saved, model_kind_name(cfg->kind)) != 0) {
		LOG_ERROR("checkpoint: '%s' holds a %s model, not %s", path, saved,
		          model_kind_name(cfg->kind));
		rc = CT_ERR_RUNTIME;
	}
	struct open_file *cache =
	    xcalloc((size_t)(files ? cJSON_GetArraySize(files) : 0) + 1, sizeof(*cache));
	int ncache = 0;
	for (int i = 0; !rc && i < n; i++) {
		const cJSON *to = cJSON_GetObjectItemCaseSensitive(tensors, t[i].name);
		if (!to) {
			LOG_ERROR("checkpoint: '%s' has no tensor '%s'", path, t[i].name);
			rc = CT_ERR_RUNTIME;
			break;
		}
		rc = load_tensor(&t[i], to, dir, files, cache, &ncache);
	}
	for (int i = 0; i < ncache; i++)
		st_free(&cache[i].st);
	free(cache);
	cJSON_Delete(man);
	int64_t any = rc ? 1 : 0;
	comm_all_reduce_i64(&mesh->world_group, &any, 1);
	if (any)
		return rc ? (int)rc : CT_ERR_RUNTIME;
	LOG_INFO("checkpoint: loaded step %lld from %s", (long long)st->step, dir);
	return CT_OK;
}

int ckpt_load_params(const char *root, int64_t step, const struct model_config *cfg,
                     const struct llama_table *t, float *params)
{
	struct ckpt_tensor *ct = xcalloc((size_t)t->count, sizeof(*ct));
	for (int i = 0; i < t->count; i++) {
		const struct llama_param *p = &t->p[i];
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
