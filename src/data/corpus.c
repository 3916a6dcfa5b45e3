#include "data/corpus.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>
#include <zstd.h>

#include "base/log.h"

#define CORPUS_CHUNK (1 << 20) /* bytes per read from a file */

enum corpus_codec { CORPUS_PLAIN, CORPUS_GZIP, CORPUS_ZSTD };

/* One open file as a stream of decompressed bytes. */
struct cfile {
	enum corpus_codec codec;
	const char *path;
	FILE *f;   /* plain and zstd */
	gzFile gz; /* gzip */
	ZSTD_DCtx *dctx;
	unsigned char *zin;
	ZSTD_inBuffer in;
	size_t zret;       /* last ZSTD_decompressStream result: 0 when a frame is complete */
	bool eof;          /* the compressed input is used up */
	int64_t disk_read; /* compressed (on-disk) bytes consumed */
};

struct corpus_file {
	char *path;
	bool jsonl;
	enum corpus_codec codec;
	int64_t disk_bytes;
};

struct corpus_source {
	struct corpus_options opt;
	struct corpus_file *files;
	int n_files, cur; /* cur: the open file, or the next to open */
	bool open;
	struct cfile cf;
	int pass;
	int64_t disk_done; /* disk bytes of the files finished in this pass */
	/* plain text: the whole (decompressed) file, and the start of the next document */
	char *text;
	size_t text_len, text_pos;
	bool text_done;
	/* JSON lines: read buffer, the current line, its number, its parsed object */
	char *rbuf;
	size_t rpos, rlen;
	char *line;
	size_t line_len, line_cap;
	int64_t line_no;
	cJSON *json;
	/* malformed lines skipped in pass 0, and the first one */
	int64_t bad;
	char *bad_file, *bad_reason;
	int64_t bad_line;
};

static bool ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);
	return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* ---- files as byte streams ---------------------------------------------------------------- */

static int cfile_open(struct cfile *c, const char *path, enum corpus_codec codec)
{
	memset(c, 0, sizeof(*c));
	c->codec = codec;
	c->path = path;
	if (codec == CORPUS_GZIP) {
		c->gz = gzopen(path, "rb");
		if (!c->gz) {
			LOG_ERROR("prepare: cannot open '%s': %s", path,
			          errno ? strerror(errno) : "out of memory");
			return CT_ERR_RUNTIME;
		}
		gzbuffer(c->gz, CORPUS_CHUNK);
		/* zlib passes non-gzip data through unchanged; a .gz file must be gzip */
		if (gzdirect(c->gz)) {
			LOG_ERROR("prepare: '%s': not gzip data (the name ends in .gz)", path);
			gzclose(c->gz);
			c->gz = NULL;
			return CT_ERR_RUNTIME;
		}
		return CT_OK;
	}
	c->f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
	if (!c->f) {
		LOG_ERROR("prepare: cannot open '%s': %s", path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	if (codec == CORPUS_ZSTD) {
		c->dctx = ZSTD_createDCtx();
		c->zin = malloc(ZSTD_DStreamInSize());
		CHECK(c->dctx && c->zin, "out of memory opening %s", path);
		c->in.src = c->zin;
	}
	return CT_OK;
}

static void cfile_close(struct cfile *c)
{
	if (c->gz)
		gzclose(c->gz);
	if (c->f && c->f != stdin)
		fclose(c->f);
	ZSTD_freeDCtx(c->dctx);
	free(c->zin);
	memset(c, 0, sizeof(*c));
}

static int cfile_read_zstd(struct cfile *c, void *buf, size_t cap, size_t *got)
{
	ZSTD_outBuffer out = {buf, cap, 0};
	while (out.pos == 0) {
		if (c->in.pos == c->in.size && !c->eof) {
			size_t n = fread(c->zin, 1, ZSTD_DStreamInSize(), c->f);
			if (ferror(c->f)) {
				LOG_ERROR("prepare: read error on '%s': %s", c->path,
				          strerror(errno));
				return CT_ERR_RUNTIME;
			}
			c->eof = n == 0;
			c->in.size = n;
			c->in.pos = 0;
			c->disk_read += (int64_t)n;
		}
		/* input used up: the end when the last frame is complete and flushed (0) */
		bool drained = c->eof && c->in.pos == c->in.size;
		if (drained && c->zret == 0)
			break;
		c->zret = ZSTD_decompressStream(c->dctx, &out, &c->in);
		if (ZSTD_isError(c->zret)) {
			LOG_ERROR("prepare: '%s': bad zstd data: %s", c->path,
			          ZSTD_getErrorName(c->zret));
			return CT_ERR_RUNTIME;
		}
		if (drained && out.pos == 0 && c->zret != 0) {
			LOG_ERROR(
			    "prepare: '%s': truncated zstd data (the last frame is incomplete)",
			    c->path);
			return CT_ERR_RUNTIME;
		}
	}
	*got = out.pos;
	return CT_OK;
}

/* Up to cap decompressed bytes into buf; *got == 0 at the end of the file. */
static int cfile_read(struct cfile *c, void *buf, size_t cap, size_t *got)
{
	*got = 0;
	if (c->codec == CORPUS_ZSTD)
		return cfile_read_zstd(c, buf, cap, got);
	if (c->codec == CORPUS_GZIP) {
		int n = gzread(c->gz, buf, (unsigned)(cap > INT32_MAX ? INT32_MAX : cap));
		int err;
		const char *msg = gzerror(c->gz, &err);
		/* a truncated stream ends with Z_BUF_ERROR ("unexpected end of file") */
		if (n < 0 || (err != Z_OK && n == 0)) {
			LOG_ERROR("prepare: '%s': bad gzip data: %s", c->path,
			          err == Z_ERRNO ? strerror(errno) : msg);
			return CT_ERR_RUNTIME;
		}
		c->disk_read = (int64_t)gzoffset(c->gz);
		*got = (size_t)n;
		return CT_OK;
	}
	size_t n = fread(buf, 1, cap, c->f);
	if (ferror(c->f)) {
		LOG_ERROR("prepare: read error on '%s': %s", c->path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	c->disk_read += (int64_t)n;
	*got = n;
	return CT_OK;
}

/* ---- the list of files ---------------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void add_file(struct corpus_source *s, const char *path, int64_t bytes)
{
	s->files = realloc(s->files, (size_t)(s->n_files + 1) * sizeof(*s->files));
	CHECK(s->files, "out of memory");
	struct corpus_file *f = &s->files[s->n_files++];
	f->path = xstrdup(path);
	f->disk_bytes = bytes;
	const char *name = path;
	f->codec = CORPUS_PLAIN;
	f->jsonl = ends_with(name, ".jsonl");
	if (ends_with(name, ".gz") || ends_with(name, ".zst")) {
		f->codec = ends_with(name, ".gz") ? CORPUS_GZIP : CORPUS_ZSTD;
		f->jsonl = ends_with(name, ".jsonl.gz") || ends_with(name, ".jsonl.zst");
	}
}

/* A file, or every regular file under a folder (sorted, recursively). */
static int add_path(struct corpus_source *s, const char *path)
{
	struct stat st;
	if (strcmp(path, "-") == 0) {
		add_file(s, path, 0);
		return CT_OK;
	}
	if (stat(path, &st) != 0) {
		LOG_ERROR("prepare: cannot open '%s': %s", path, strerror(errno));
		return CT_ERR_USAGE;
	}
	if (!S_ISDIR(st.st_mode)) {
		add_file(s, path, (int64_t)st.st_size);
		return CT_OK;
	}
	DIR *d = opendir(path);
	if (!d) {
		LOG_ERROR("prepare: cannot read folder '%s': %s", path, strerror(errno));
		return CT_ERR_USAGE;
	}
	char **names = NULL;
	size_t n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		names = realloc(names, (n + 1) * sizeof(char *));
		CHECK(names, "out of memory");
		size_t l = strlen(path) + strlen(e->d_name) + 2;
		names[n] = malloc(l);
		CHECK(names[n], "out of memory");
		snprintf(names[n++], l, "%s/%s", path, e->d_name);
	}
	closedir(d);
	qsort(names, n, sizeof(char *), cmp_str);
	int rc = CT_OK;
	for (size_t i = 0; i < n; i++) {
		if (!rc)
			rc = add_path(s, names[i]);
		free(names[i]);
	}
	free(names);
	return rc;
}

int corpus_source_open(struct corpus_source **out, const char *const *paths, int n,
                       const struct corpus_options *opt)
{
	*out = NULL;
	struct corpus_source *s = xcalloc(1, sizeof(*s));
	s->opt = *opt;
	if (!s->opt.text_field)
		s->opt.text_field = "text";
	for (int i = 0; i < n; i++) {
		int rc = add_path(s, paths[i]);
		if (rc) {
			corpus_source_free(s);
			return rc;
		}
	}
	*out = s;
	return CT_OK;
}

static void close_file(struct corpus_source *s)
{
	if (!s->open)
		return;
	s->disk_done += s->files[s->cur].disk_bytes;
	cfile_close(&s->cf);
	free(s->text);
	s->text = NULL;
	cJSON_Delete(s->json);
	s->json = NULL;
	s->open = false;
	s->cur++;
}

void corpus_source_free(struct corpus_source *s)
{
	if (!s)
		return;
	close_file(s);
	for (int i = 0; i < s->n_files; i++)
		free(s->files[i].path);
	free(s->files);
	free(s->rbuf);
	free(s->line);
	free(s->bad_file);
	free(s->bad_reason);
	free(s);
}

int corpus_source_rewind(struct corpus_source *s)
{
	if (corpus_source_has_stdin(s)) {
		LOG_ERROR("prepare: standard input cannot be read twice");
		return CT_ERR_USAGE;
	}
	close_file(s);
	s->cur = 0;
	s->disk_done = 0;
	s->pass++;
	return CT_OK;
}

int64_t corpus_source_disk_bytes(const struct corpus_source *s)
{
	int64_t b = 0;
	for (int i = 0; i < s->n_files; i++)
		b += s->files[i].disk_bytes;
	return b;
}

int64_t corpus_source_disk_read(const struct corpus_source *s)
{
	return s->disk_done + (s->open ? s->cf.disk_read : 0);
}

bool corpus_source_has_stdin(const struct corpus_source *s)
{
	for (int i = 0; i < s->n_files; i++)
		if (strcmp(s->files[i].path, "-") == 0)
			return true;
	return false;
}

int64_t corpus_source_bad(const struct corpus_source *s, const char **file, int64_t *line,
                          const char **reason)
{
	*file = s->bad_file;
	*line = s->bad_line;
	*reason = s->bad_reason;
	return s->bad;
}

/* ---- documents --------------------------------------------------------------------------------
 */

static int read_whole(struct corpus_source *s)
{
	size_t cap = CORPUS_CHUNK, n = 0, got;
	char *buf = malloc(cap);
	CHECK(buf, "out of memory");
	for (;;) {
		if (cap - n < CORPUS_CHUNK) {
			cap *= 2;
			buf = realloc(buf, cap);
			CHECK(buf, "out of memory reading %s", s->cf.path);
		}
		int rc = cfile_read(&s->cf, buf + n, cap - n, &got);
		if (rc) {
			free(buf);
			return rc;
		}
		if (got == 0)
			break;
		n += got;
	}
	s->text = buf;
	s->text_len = n;
	s->text_pos = 0;
	s->text_done = false;
	return CT_OK;
}

static int open_file(struct corpus_source *s)
{
	struct corpus_file *f = &s->files[s->cur];
	if (f->codec != CORPUS_PLAIN && f->disk_bytes == 0) {
		LOG_ERROR("prepare: '%s': empty file, not %s data", f->path,
		          f->codec == CORPUS_GZIP ? "gzip" : "zstd");
		return CT_ERR_RUNTIME;
	}
	int rc = cfile_open(&s->cf, f->path, f->codec);
	if (rc)
		return rc;
	s->open = true;
	s->line_no = 0;
	s->rpos = s->rlen = 0;
	return f->jsonl ? CT_OK : read_whole(s);
}

/* The next plain-text document of the open file; false when the file is used up. */
static bool next_text_doc(struct corpus_source *s, const char **text, size_t *len)
{
	if (s->text_done)
		return false;
	const char *sep = s->opt.sep;
	size_t sl = sep ? strlen(sep) : 0, start = s->text_pos;
	if (sl > 0) {
		for (size_t i = start; i + sl <= s->text_len; i++) {
			if (memcmp(s->text + i, sep, sl) == 0) {
				*text = s->text + start;
				*len = i - start;
				s->text_pos = i + sl;
				return true;
			}
		}
	}
	*text = s->text + start;
	*len = s->text_len - start;
	s->text_done = true;
	return true;
}

/* The next line of the open file into s->line (without '\n', NUL-terminated); false at the
 * end of the file. */
static int next_line(struct corpus_source *s, bool *got_line)
{
	*got_line = false;
	s->line_len = 0;
	bool any = false;
	if (!s->rbuf) {
		s->rbuf = malloc(CORPUS_CHUNK);
		CHECK(s->rbuf, "out of memory");
	}
	for (;;) {
		if (s->rpos == s->rlen) {
			size_t got;
			int rc = cfile_read(&s->cf, s->rbuf, CORPUS_CHUNK, &got);
			if (rc)
				return rc;
			if (got == 0)
				break;
			s->rpos = 0;
			s->rlen = got;
		}
		const char *p = s->rbuf + s->rpos;
		size_t avail = s->rlen - s->rpos;
		const char *nl = memchr(p, '\n', avail);
		size_t take = nl ? (size_t)(nl - p) : avail;
		if (s->line_len + take + 1 > s->line_cap) {
			s->line_cap = 2 * (s->line_len + take + 1);
			s->line = realloc(s->line, s->line_cap);
			CHECK(s->line, "out of memory reading %s", s->cf.path);
		}
		memcpy(s->line + s->line_len, p, take);
		s->line_len += take;
		s->rpos += take + (nl ? 1 : 0);
		any = true;
		if (nl)
			break;
	}
	if (!any)
		return CT_OK;
	if (s->line_len > 0 && s->line[s->line_len - 1] == '\r')
		s->line_len--;
	s->line[s->line_len] = 0;
	*got_line = true;
	return CT_OK;
}

static const char *json_type(const cJSON *v)
{
	if (cJSON_IsNumber(v))
		return "a number";
	if (cJSON_IsBool(v))
		return "a boolean";
	if (cJSON_IsNull(v))
		return "null";
	if (cJSON_IsArray(v))
		return "an array";
	if (cJSON_IsObject(v))
		return "an object";
	return "not a string";
}

/* Parse s->line; NULL and a reason in why[] when it is malformed. */
static const char *line_text(struct corpus_source *s, char *why, size_t why_len)
{
	const char *field = s->opt.text_field;
	cJSON_Delete(s->json);
	s->json = NULL;
	if (s->line_len == 0) {
		snprintf(why, why_len, "empty line");
		return NULL;
	}
	if (memchr(s->line, 0, s->line_len)) {
		snprintf(why, why_len, "a NUL byte in the line");
		return NULL;
	}
	const char *end = NULL;
	s->json = cJSON_ParseWithLengthOpts(s->line, s->line_len + 1, &end, 1);
	if (!s->json) {
		long at = end ? (long)(end - s->line) + 1 : 0;
		snprintf(why, why_len, "not JSON (parse error at column %ld)", at);
		return NULL;
	}
	if (!cJSON_IsObject(s->json)) {
		snprintf(why, why_len, "not a JSON object");
		return NULL;
	}
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(s->json, field);
	if (!v) {
		snprintf(why, why_len, "no field \"%s\"", field);
		return NULL;
	}
	if (!cJSON_IsString(v) || !v->valuestring) {
		snprintf(why, why_len, "field \"%s\" is %s, not a string", field, json_type(v));
		return NULL;
	}
	return v->valuestring;
}

static int bad_line(struct corpus_source *s, const char *why)
{
	const char *path = s->files[s->cur].path;
	if (!s->opt.skip_bad_lines) {
		LOG_ERROR("prepare: %s:%lld: malformed line: %s (--skip-bad-lines skips and counts "
		          "such lines)",
		          path, (long long)s->line_no, why);
		return CT_ERR_USAGE;
	}
	if (s->pass > 0)
		return CT_OK;
	if (s->bad++ == 0) {
		s->bad_file = xstrdup(path);
		s->bad_line = s->line_no;
		s->bad_reason = xstrdup(why);
	}
	return CT_OK;
}

int corpus_source_next(struct corpus_source *s, const char **text, size_t *len, bool *end)
{
	*end = false;
	for (;;) {
		if (!s->open) {
			if (s->cur == s->n_files) {
				*end = true;
				return CT_OK;
			}
			int rc = open_file(s);
			if (rc)
				return rc;
		}
		if (!s->files[s->cur].jsonl) {
			if (next_text_doc(s, text, len))
				return CT_OK;
			close_file(s);
			continue;
		}
		bool got;
		int rc = next_line(s, &got);
		if (rc)
			return rc;
		if (!got) {
			close_file(s);
			continue;
		}
		s->line_no++;
		char why[160];
		const char *t = line_text(s, why, sizeof(why));
		if (!t) {
			if ((rc = bad_line(s, why)))
				return rc;
			continue;
		}
		*text = t;
		*len = strlen(t);
		return CT_OK;
	}
}

/* ---- mixing --------------------------------------------------------------------------------- */

int corpus_mix_pick(const struct corpus_mix *m)
{
	int best = 0;
	for (int i = 1; i < m->n; i++) /* tokens_i / w_i < tokens_best / w_best */
		if ((double)m->tokens[i] * m->weight[best] < (double)m->tokens[best] * m->weight[i])
			best = i;
	return best;
}
