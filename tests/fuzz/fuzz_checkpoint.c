/* tests/fuzz/fuzz_checkpoint: libFuzzer harness for the checkpoint readers: the manifest parser
 * (train/ckpt_manifest.c) and the safetensors reader (io/safetensors.c). Not part of the CMake
 * build; tests/fuzz/smoke.sh builds and runs it briefly.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Wno-unknown-pragmas -Isrc \
 *         tests/fuzz/fuzz_checkpoint.c src/train/ckpt_manifest.c src/io/safetensors.c src/io/file.c \
 *         src/base/log.c -lcjson -lxxhash -lm -o /tmp/fuzz_checkpoint
 *   mkdir -p /tmp/fuzz_checkpoint_corpus
 *   /tmp/fuzz_checkpoint -max_total_time=600 -close_fd_mask=2 /tmp/fuzz_checkpoint_corpus
 *
 * The first byte picks what the rest is:
 *   even: manifest.json text. When it parses, every tensor's pieces must be sorted, name a
 *     listed file and tile [0, rows) x [0, cols) exactly (row pieces, and the column pieces of
 *     tensor-parallel checkpoints), and numbers must be in range.
 *   odd: a safetensors file image. When it parses, every tensor's bytes must lie inside the
 *     data section, match dtype x shape, and not overlap another tensor's.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "train/checkpoint.h"

#define FUZZ_ASSERT(cond)                                                                          \
	do {                                                                                       \
		if (!(cond))                                                                       \
			__builtin_trap();                                                          \
	} while (0)

static void fuzz_manifest(const uint8_t *data, size_t size)
{
	struct ckpt_manifest m;
	if (ckpt_manifest_parse(&m, (const char *)data, size, "fuzz/manifest.json"))
		return;
	FUZZ_ASSERT(m.version == CKPT_FORMAT_VERSION && m.model && m.world >= 1);
	for (int i = 0; i < m.n_files; i++)
		FUZZ_ASSERT(m.files[i].name[0] && !strchr(m.files[i].name, '/'));
	for (int i = 0; i < m.n_tensors; i++) {
		const struct ckpt_mtensor *t = &m.tensors[i];
		FUZZ_ASSERT(ckpt_manifest_tensor(&m, t->name) == t);
		FUZZ_ASSERT(t->ndim >= 1 && t->ndim <= 2 && t->rows >= 1 && t->cols >= 1);
		int64_t area = 0;
		for (int k = 0; k < t->n_pieces; k++) {
			const struct ckpt_piece *pc = &t->pieces[k];
			FUZZ_ASSERT(pc->file >= 0 && pc->file < m.n_files);
			FUZZ_ASSERT(pc->row0 >= 0 && pc->row0 < pc->row1 && pc->row1 <= t->rows);
			FUZZ_ASSERT(pc->col0 >= 0 && pc->col0 < pc->col1 && pc->col1 <= t->cols);
			FUZZ_ASSERT(k == 0 || pc->row0 > pc[-1].row0 ||
			            (pc->row0 == pc[-1].row0 && pc->col0 > pc[-1].col0));
			area += (pc->row1 - pc->row0) * (pc->col1 - pc->col0);
		}
		FUZZ_ASSERT(area == t->rows * t->cols);
		if (t->rows * t->cols <= 1 << 16) { /* small: count every element's pieces */
			unsigned char *seen = calloc((size_t)(t->rows * t->cols), 1);
			for (int k = 0; seen && k < t->n_pieces; k++)
				for (int64_t r = t->pieces[k].row0; r < t->pieces[k].row1; r++)
					for (int64_t c = t->pieces[k].col0; c < t->pieces[k].col1; c++)
						FUZZ_ASSERT(seen[r * t->cols + c]++ == 0);
			free(seen);
		}
	}
	ckpt_manifest_free(&m);
}

static void fuzz_safetensors(const uint8_t *data, size_t size)
{
	void *blob = malloc(size + 1);
	if (!blob)
		abort();
	memcpy(blob, data, size);
	struct st_file f;
	if (st_parse(&f, blob, (int64_t)size, "fuzz.safetensors"))
		return; /* st_parse freed blob */
	int64_t data_len = (int64_t)size - f.data_offset;
	FUZZ_ASSERT(f.data_offset >= 8 && data_len >= 0);
	for (int i = 0; i < f.count; i++) {
		const struct st_tensor *t = &f.t[i];
		int64_t n = st_dtype_size(t->dtype);
		for (int d = 0; d < t->ndim; d++)
			n *= t->shape[d];
		FUZZ_ASSERT(t->begin >= 0 && t->end - t->begin == n && t->end <= data_len);
		FUZZ_ASSERT(st_find(&f, t->name) == t);
		for (int j = 0; j < i; j++) {
			const struct st_tensor *u = &f.t[j];
			FUZZ_ASSERT(t->end <= u->begin || u->end <= t->begin || n == 0 ||
			            u->begin == u->end);
		}
		/* every byte is readable */
		volatile uint8_t sink = 0;
		for (int64_t b = 0; b < n; b += 4096)
			sink ^= ((const uint8_t *)t->data)[b];
		(void)sink;
	}
	st_free(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	if (data[0] & 1)
		fuzz_safetensors(data + 1, size - 1);
	else
		fuzz_manifest(data + 1, size - 1);
	return 0;
}
