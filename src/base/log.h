/* base/log: logging, invariant checks and error codes.
 *
 * Two error paths only (STYLE.md rule 4):
 *   - CHECK(cond, fmt, ...): a broken invariant. Prints rank, file:line and the message, then
 *     aborts the whole job (MPI_Abort once comm exists, abort() before).
 *   - recoverable failures return a negative ct_err code after logging a message that names
 *     the file, key or tensor involved; callers propagate it up to main(), which maps it to an
 *     exit code with ct_exit_code (CT_ERR_USAGE -> 2, anything else -> 1).
 */
#ifndef CT_BASE_LOG_H
#define CT_BASE_LOG_H

#include <stdbool.h>
#include <stdio.h>

enum ct_err {
	CT_OK = 0,
	CT_ERR_RUNTIME = -1, /* I/O failure, bad file, numeric failure: exit 1 */
	CT_ERR_USAGE = -2,   /* bad command line or configuration: exit 2 */
};

/* The process exit code of a ct_err: 0, 2 for CT_ERR_USAGE, 1 for anything else. */
static inline int ct_exit_code(int rc)
{
	return rc == CT_OK ? 0 : (rc == CT_ERR_USAGE ? 2 : 1);
}

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_LEVEL_COUNT };

/* The rank shown in every message; set once by the comm layer (0 when single-process). */
void log_set_rank(int rank, int world);
void log_set_level(enum log_level level);
/* Called by CHECK before aborting, e.g. to MPI_Abort the job; NULL means abort(). */
void log_set_abort_hook(void (*hook)(void));
enum log_level log_get_level(void);

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
_Noreturn void log_fatal(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define LOG_DEBUG(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define LOG_INFO(...)  log_msg(LOG_INFO, __VA_ARGS__)
#define LOG_WARN(...)  log_msg(LOG_WARN, __VA_ARGS__)
#define LOG_ERROR(...) log_msg(LOG_ERROR, __VA_ARGS__)

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond))                                                                       \
			log_fatal(__FILE__, __LINE__, __VA_ARGS__);                                \
	} while (0)

/* Allocation that never returns NULL: out of memory is fatal. Zero-filled. */
void *xcalloc(size_t n, size_t size);
char *xstrdup(const char *s);

#endif
