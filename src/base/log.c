#include "base/log.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static int log_rank;
static int log_world = 1;
static enum log_level log_level = LOG_INFO;
static void (*log_abort_hook)(void);

static const char *const log_level_names[] = {"debug", "info", "warning", "error"};
_Static_assert(sizeof(log_level_names) / sizeof(log_level_names[0]) == LOG_LEVEL_COUNT,
               "one name per log level");

void log_set_rank(int rank, int world)
{
	log_rank = rank;
	log_world = world;
}

void log_set_level(enum log_level level)
{
	log_level = level;
}
enum log_level log_get_level(void)
{
	return log_level;
}
void log_set_abort_hook(void (*hook)(void))
{
	log_abort_hook = hook;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
	if (level < log_level)
		return;
	/* Info goes to stdout from rank 0 only; warnings and errors to stderr from every rank,
	 * prefixed with the rank when there is more than one. */
	if (level <= LOG_INFO && log_rank != 0)
		return;
	FILE *f = level >= LOG_WARN ? stderr : stdout;
	char buf[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (level >= LOG_WARN) {
		if (log_world > 1)
			fprintf(f, "[rank %d] %s: %s\n", log_rank, log_level_names[level], buf);
		else
			fprintf(f, "%s: %s\n", log_level_names[level], buf);
	} else {
		fprintf(f, "%s\n", buf);
	}
	fflush(f);
}

void log_fatal(const char *file, int line, const char *fmt, ...)
{
	char buf[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fprintf(stderr, "[rank %d] fatal: %s:%d: %s\n", log_rank, file, line, buf);
	fflush(stderr);
	if (log_abort_hook)
		log_abort_hook();
	abort();
}

void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);
	CHECK(p, "out of memory allocating %zu x %zu bytes", n, size);
	return p;
}

char *xstrdup(const char *s)
{
	char *p = strdup(s);
	CHECK(p, "out of memory");
	return p;
}
