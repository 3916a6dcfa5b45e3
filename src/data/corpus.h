/* data/corpus: documents read from text corpora, for `ctitan prepare`; and the interleave of
 * several corpora by weight.
 *
 * A source is a list of paths read one after another: files, folders (every regular file under
 * it whose name does not start with '.', recursively, in strcmp order of the full paths) and
 * "-" (standard input, plain text). Each file's format follows its name:
 *   *.jsonl, *.jsonl.gz, *.jsonl.zst   JSON lines: every line is one JSON object and one
 *                                      document, the value of its string field `text_field`
 *   *.gz, *.zst                        plain text, gzip- (zlib) or zstd- (libzstd) compressed
 *   anything else                      plain text
 * Plain text is cut into documents at every occurrence of `sep` (NULL or "": the whole file is
 * one document); the separator is not applied inside JSON lines. Documents may be empty.
 *
 * Malformed JSON lines (not JSON, not an object, no such field, the field not a string, an
 * empty line, a NUL byte) are never dropped silently: by default the first one is an error
 * naming file:line and the reason (CT_ERR_USAGE: the input is the user's to fix); with
 * skip_bad_lines they are skipped and counted, and corpus_source_bad() tells how many and
 * which came first, for the caller to report. A file that cannot be read, or compressed data
 * that is corrupt, truncated or not of its suffix's format, is CT_ERR_RUNTIME naming the file.
 *
 * Ownership: a source owns its copies of the paths, its open file and its buffers; the text
 * corpus_source_next returns lives in the source until the next call.
 */
#ifndef CT_DATA_CORPUS_H
#define CT_DATA_CORPUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct corpus_options {
	const char *sep;        /* plain-text document separator; NULL or "": one per file */
	const char *text_field; /* JSON lines: the document's field (NULL: "text") */
	bool skip_bad_lines;    /* skip and count malformed JSON lines instead of failing */
};

struct corpus_source;

/* Expand paths[0..n) (folders walked) into a source. CT_ERR_USAGE names a path that does not
 * exist or cannot be listed. *out is NULL on failure. */
int corpus_source_open(struct corpus_source **out, const char *const *paths, int n,
                       const struct corpus_options *opt);
void corpus_source_free(struct corpus_source *s);

/* The next document: *end false and text[0..*len) (valid until the next call), or *end true
 * when every file has been read. An error leaves the source unusable except for free. */
int corpus_source_next(struct corpus_source *s, const char **text, size_t *len, bool *end);
/* Start again from the first file (another pass). CT_ERR_USAGE for standard input. */
int corpus_source_rewind(struct corpus_source *s);

/* Bytes on disk of every file (standard input counts 0), and of what has been read so far
 * in this pass (compressed bytes for compressed files): a progress measure. */
int64_t corpus_source_disk_bytes(const struct corpus_source *s);
int64_t corpus_source_disk_read(const struct corpus_source *s);
bool corpus_source_has_stdin(const struct corpus_source *s);
/* Malformed JSON lines skipped in the first pass, and the first one: file, 1-based line number
 * and reason (NULL / 0 / NULL when there was none). */
int64_t corpus_source_bad(const struct corpus_source *s, const char **file, int64_t *line,
                          const char **reason);

/* Interleave by weight. Sources get shares w_i / sum(w) of the output's tokens: the next
 * document always comes from the source furthest below its share, the smallest
 * tokens_i / w_i (ties: the lowest index). Then, at every point of the output (T tokens, L
 * the longest document's tokens) each source holds at most w_i T + L and at least
 * w_i T - (n - 1) L tokens: within one document of its share when n = 2. Deterministic: no
 * seed, the order is a function of the weights and the documents' token counts. */
struct corpus_mix {
	int n;
	const double *weight; /* n, each > 0 */
	int64_t *tokens;      /* n: tokens taken from each source so far (the caller adds) */
};
int corpus_mix_pick(const struct corpus_mix *m);

#endif
