/* train/ckpt_manifest: parsing and validating a checkpoint's manifest.json (declared in
 * train/checkpoint.h). Kept apart from the collective save/load code so the libFuzzer harness
 * (tests/fuzz/fuzz_checkpoint.c) can exercise it without MPI. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "train/checkpoint.h"

/* A JSON number that is an integer in [lo, hi]. */
static bool json_int_in(const cJSON *x, int64_t lo, int64_t hi, int64_t *v)
{
	if (!cJSON_IsNumber(x))
		return false;
	double d = x->valuedouble;
	if (!(d >= (double)lo && d <= (double)hi) || d != (double)(int64_t)d)
		return false;
	*v = (int64_t)d;
	return true;
}

#define CKPT_MAX_INT ((int64_t)1 << 53)

/* A file name the manifest may name: no path separators, no dot-files, short. */
static bool plain_name(const char *s)
{
	size_t n = strlen(s);
	return n > 0 && n < 64 && s[0] != '.' && !strchr(s, '/') && !strchr(s, '\\');
}

static int piece_cmp(const void *a, const void *b)
{
	const struct ckpt_piece *x = a, *y = b;
	if (x->row0 != y->row0)
		return (x->row0 > y->row0) - (x->row0 < y->row0);
	return (x->col0 > y->col0) - (x->col0 < y->col0);
}

/* Do the (sorted, in-bounds) pieces cover rows x cols exactly once? No two overlap and their
 * areas add up to the whole. Sorted by first row, a piece can only overlap the later pieces
 * that start above its last row, so the search stops there. */
static bool pieces_tile(const struct ckpt_piece *pc, int n, int64_t rows, int64_t cols)
{
	int64_t area = 0, total = rows * cols;
	for (int i = 0; i < n; i++) {
		area += (pc[i].row1 - pc[i].row0) * (pc[i].col1 - pc[i].col0);
		if (area > total)
			return false;
		for (int j = i + 1; j < n && pc[j].row0 < pc[i].row1; j++)
			if (pc[j].col0 < pc[i].col1 && pc[i].col0 < pc[j].col1)
				return false;
	}
	return area == total;
}

static int parse_tensor(struct ckpt_manifest *m, struct ckpt_mtensor *t, const cJSON *to,
                        const char *path)
{
	const cJSON *shape = cJSON_GetObjectItemCaseSensitive(to, "shape");
	const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(to, "dtype");
	const cJSON *pieces = cJSON_GetObjectItemCaseSensitive(to, "pieces");
	int nd = cJSON_GetArraySize(shape);
	t->ndim = nd;
	t->cols = 1;
	if (!cJSON_IsArray(shape) || nd < 1 || nd > 2 ||
	    !json_int_in(cJSON_GetArrayItem(shape, 0), 1, CKPT_MAX_INT, &t->rows) ||
	    (nd == 2 && !json_int_in(cJSON_GetArrayItem(shape, 1), 1, CKPT_MAX_INT, &t->cols)) ||
	    t->rows > CKPT_MAX_INT / t->cols) {
		LOG_ERROR("checkpoint: '%s': tensor '%s' has a malformed shape", path, t->name);
		return CT_ERR_RUNTIME;
	}
	if (!cJSON_IsString(dtype) || strcmp(dtype->valuestring, "F32") != 0) {
		LOG_ERROR("checkpoint: '%s': tensor '%s' has a missing or unsupported dtype", path,
		          t->name);
		return CT_ERR_RUNTIME;
	}
	if (!cJSON_IsArray(pieces)) {
		LOG_ERROR("checkpoint: '%s': tensor '%s' has no pieces", path, t->name);
		return CT_ERR_RUNTIME;
	}
	t->pieces = xcalloc((size_t)cJSON_GetArraySize(pieces) + 1, sizeof(*t->pieces));
	const cJSON *p;
	cJSON_ArrayForEach (p, pieces) {
		const cJSON *fn = cJSON_GetObjectItemCaseSensitive(p, "file");
		const cJSON *rr = cJSON_GetObjectItemCaseSensitive(p, "rows");
		const cJSON *cc = cJSON_GetObjectItemCaseSensitive(p, "cols");
		struct ckpt_piece *pc = &t->pieces[t->n_pieces];
		pc->file = -1;
		pc->col0 = 0;
		pc->col1 = t->cols;
		for (int f = 0; cJSON_IsString(fn) && f < m->n_files; f++)
			if (strcmp(m->files[f].name, fn->valuestring) == 0)
				pc->file = f;
		if (pc->file < 0 || !cJSON_IsArray(rr) || cJSON_GetArraySize(rr) != 2 ||
		    !json_int_in(cJSON_GetArrayItem(rr, 0), 0, t->rows, &pc->row0) ||
		    !json_int_in(cJSON_GetArrayItem(rr, 1), pc->row0 + 1, t->rows, &pc->row1) ||
		    (cc && (!cJSON_IsArray(cc) || cJSON_GetArraySize(cc) != 2 ||
		            !json_int_in(cJSON_GetArrayItem(cc, 0), 0, t->cols, &pc->col0) ||
		            !json_int_in(cJSON_GetArrayItem(cc, 1), pc->col0 + 1, t->cols,
		                         &pc->col1)))) {
			LOG_ERROR("checkpoint: '%s': tensor '%s' has a malformed piece (unknown "
			          "file or bad row or column range)",
			          path, t->name);
			return CT_ERR_RUNTIME;
		}
		t->n_pieces++;
	}
	qsort(t->pieces, (size_t)t->n_pieces, sizeof(*t->pieces), piece_cmp);
	if (!pieces_tile(t->pieces, t->n_pieces, t->rows, t->cols)) {
		LOG_ERROR("checkpoint: '%s': the pieces of tensor '%s' do not cover its %lld x "
		          "%lld elements exactly once",
		          path, t->name, (long long)t->rows, (long long)t->cols);
		return CT_ERR_RUNTIME;
	}
	return CT_OK;
}

int ckpt_manifest_parse(struct ckpt_manifest *m, const char *text, size_t len, const char *path)
{
	memset(m, 0, sizeof(*m));
	cJSON *o = cJSON_ParseWithLength(text, len);
	const cJSON *format = cJSON_GetObjectItemCaseSensitive(o, "format");
	const cJSON *files = cJSON_GetObjectItemCaseSensitive(o, "files");
	const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(o, "tensors");
	const cJSON *mesh = cJSON_GetObjectItemCaseSensitive(o, "mesh");
	const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model");
	const cJSON *ds = cJSON_GetObjectItemCaseSensitive(o, "data_state");
	int rc = CT_ERR_RUNTIME;
	if (!cJSON_IsObject(o) || !cJSON_IsString(format) ||
	    strcmp(format->valuestring, "ctitan-checkpoint") != 0 ||
	    !json_int_in(cJSON_GetObjectItemCaseSensitive(o, "version"), 0, CKPT_MAX_INT,
	                 &m->version)) {
		LOG_ERROR("checkpoint: '%s' is missing or malformed (not a ctitan manifest)", path);
		goto out;
	}
	if (m->version != CKPT_FORMAT_VERSION) {
		LOG_ERROR("checkpoint: '%s' has format version %lld, this build reads %d", path,
		          (long long)m->version, CKPT_FORMAT_VERSION);
		goto out;
	}
	const char *bad = NULL;
	if (!json_int_in(cJSON_GetObjectItemCaseSensitive(o, "step"), 0, CKPT_MAX_INT, &m->st.step))
		bad = "step";
	else if (!json_int_in(cJSON_GetObjectItemCaseSensitive(o, "tokens_seen"), 0, CKPT_MAX_INT,
	                      &m->st.tokens_seen))
		bad = "tokens_seen";
	else if (!json_int_in(cJSON_GetObjectItemCaseSensitive(o, "optimizer_step"), 0,
	                      CKPT_MAX_INT, &m->st.optimizer_step))
		bad = "optimizer_step";
	else if (ds && (!cJSON_IsString(ds) || strlen(ds->valuestring) >= sizeof(m->st.data_state)))
		bad = "data_state";
	else if (!cJSON_IsObject(model))
		bad = "model";
	else if (!cJSON_IsObject(mesh) ||
	         !json_int_in(cJSON_GetObjectItemCaseSensitive(mesh, "world"), 1, 1 << 24,
	                      &m->world) ||
	         !json_int_in(cJSON_GetObjectItemCaseSensitive(mesh, "pp"), 1, 1 << 24, &m->pp) ||
	         !json_int_in(cJSON_GetObjectItemCaseSensitive(mesh, "dp_replicate"), 1, 1 << 24,
	                      &m->dp_replicate) ||
	         !json_int_in(cJSON_GetObjectItemCaseSensitive(mesh, "dp_shard"), 1, 1 << 24,
	                      &m->dp_shard) ||
	         !json_int_in(cJSON_GetObjectItemCaseSensitive(mesh, "tp"), 1, 1 << 24, &m->tp))
		bad = "mesh";
	else if (!cJSON_IsObject(files))
		bad = "files";
	else if (!cJSON_IsObject(tensors))
		bad = "tensors";
	if (bad) {
		LOG_ERROR("checkpoint: '%s': key '%s' is missing or malformed", path, bad);
		goto out;
	}
	if (ds)
		snprintf(m->st.data_state, sizeof(m->st.data_state), "%s", ds->valuestring);
	m->model = cJSON_Duplicate(model, 1);
	m->files = xcalloc((size_t)cJSON_GetArraySize(files) + 1, sizeof(*m->files));
	const cJSON *fo;
	cJSON_ArrayForEach (fo, files) {
		struct ckpt_mfile *f = &m->files[m->n_files];
		const cJSON *hx = cJSON_GetObjectItemCaseSensitive(fo, "xxh3_64");
		char *end = NULL;
		bool ok = plain_name(fo->string) && cJSON_IsString(hx) &&
		          strlen(hx->valuestring) == 16 &&
		          json_int_in(cJSON_GetObjectItemCaseSensitive(fo, "bytes"), 0,
		                      CKPT_MAX_INT, &f->bytes);
		if (ok) {
			f->xxh3 = strtoull(hx->valuestring, &end, 16);
			ok = end && *end == 0;
		}
		for (int i = 0; ok && i < m->n_files; i++)
			ok = strcmp(m->files[i].name, fo->string) != 0;
		if (!ok) {
			LOG_ERROR("checkpoint: '%s': file entry '%s' is malformed", path,
			          fo->string);
			goto out;
		}
		snprintf(f->name, sizeof(f->name), "%s", fo->string);
		m->n_files++;
	}
	m->tensors = xcalloc((size_t)cJSON_GetArraySize(tensors) + 1, sizeof(*m->tensors));
	const cJSON *to;
	cJSON_ArrayForEach (to, tensors) {
		struct ckpt_mtensor *t = &m->tensors[m->n_tensors++];
		t->name = xstrdup(to->string);
		if (ckpt_manifest_tensor(m, t->name) != t) {
			LOG_ERROR("checkpoint: '%s': tensor '%s' appears twice", path, t->name);
			goto out;
		}
		if (parse_tensor(m, t, to, path))
			goto out;
	}
	rc = CT_OK;
out:
	cJSON_Delete(o);
	if (rc)
		ckpt_manifest_free(m);
	return rc;
}

const struct ckpt_mtensor *ckpt_manifest_tensor(const struct ckpt_manifest *m, const char *name)
{
	for (int i = 0; i < m->n_tensors; i++)
		if (strcmp(m->tensors[i].name, name) == 0)
			return &m->tensors[i];
	return NULL;
}

void ckpt_manifest_free(struct ckpt_manifest *m)
{
	for (int i = 0; i < m->n_tensors; i++) {
		free(m->tensors[i].name);
		free(m->tensors[i].pieces);
	}
	free(m->tensors);
	free(m->files);
	cJSON_Delete(m->model);
	memset(m, 0, sizeof(*m));
}
