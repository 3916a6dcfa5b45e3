/* io/file: a whole (small or checkpoint-sized) file in memory, read once.
 *
 * io_read_file mallocs size + 1 bytes (NUL-terminated, so text can be parsed in place) and
 * reports the size. It logs nothing: on failure it returns CT_ERR_RUNTIME with errno set, and
 * the caller names the file in its own words. The caller frees *data. */
#ifndef CT_IO_FILE_H
#define CT_IO_FILE_H

#include <stddef.h>

int io_read_file(const char *path, char **data, size_t *len);

#endif
