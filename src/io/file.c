#include "io/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

#include "base/log.h"

int io_read_file(const char *path, char **data, size_t *len)
{
	*data = NULL;
	*len = 0;
	FILE *f = fopen(path, "rb");
	if (!f)
		return CT_ERR_RUNTIME;
	off_t n = -1;
	if (fseeko(f, 0, SEEK_END) == 0)
		n = ftello(f);
	if (n < 0 || fseeko(f, 0, SEEK_SET) != 0) {
		int e = errno;
		fclose(f);
		errno = e ? e : EIO;
		return CT_ERR_RUNTIME;
	}
	char *buf = malloc((size_t)n + 1);
	CHECK(buf, "out of memory reading %s (%lld bytes)", path, (long long)n);
	size_t got = fread(buf, 1, (size_t)n, f);
	int bad = ferror(f);
	fclose(f);
	if (bad || got != (size_t)n) {
		free(buf);
		errno = EIO;
		return CT_ERR_RUNTIME;
	}
	buf[got] = 0;
	*data = buf;
	*len = got;
	return CT_OK;
}
