/* train/checkpoint: distributed checkpoints that reshard on load.
 *
 * Layout: <root>/step-NNNNNNNN/ holds one safetensors file per writing rank
 * (rank-RRRRR.safetensors: for each tensor the row range this rank owns, plus its AdamW
 * moments as "<name>.exp_avg" / "<name>.exp_avg_sq") and manifest.json: format version, model
 * shape, mesh, trainer state, and for every tensor its global shape and which file holds which
 * row range, and an xxHash64 checksum and size per file. Under HSDP only replica 0 writes.
 *
 * Saving writes into step-NNNNNNNN.tmp/, fsyncs every file and the folder, renames it into
 * place, fsyncs the root, then replaces <root>/latest (write, fsync, rename): a crash at any
 * point leaves either the previous checkpoints or a complete new one, never a half one that
 * looks complete. keep_latest_k > 0 prunes older step folders after a successful save.
 *
 * Loading works on any number of ranks and any layout: each rank reads exactly the row ranges
 * it now owns, from whichever files hold them, and verifies each file's checksum first.
 *
 * Under tensor parallelism a rank holds a rectangle of the global tensor: a row range of its
 * rows (column-parallel and vocabulary pieces, cut by FSDP) or a column range of every row
 * (row-parallel wo/w2, also cut by FSDP's rows). The manifest then gives a piece "cols" beside
 * "rows" (absent: every column). The vocabulary's zero padding is never saved; a tensor
 * replicated over the TP group (the norms) is written by its TP rank 0 only. Any layout loads
 * any other: tp=2 x dp_shard=2 on 1 rank, on dp_shard=4, on tp=4, and back.
 */
#ifndef CT_TRAIN_CHECKPOINT_H
#define CT_TRAIN_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "model/model.h"

#define CKPT_FORMAT_VERSION 1

/* What this rank holds of one tensor: rows [row0, row0 + nrows) x columns [col0, col0 + ncols)
 * of a (rows x cols) tensor, stored row-major (nrows x ncols). ncols 0 means every column
 * (col0 0). `replica`: another rank holds and saves the same piece (a TP-replicated tensor on
 * a TP rank > 0): loading fills it, saving skips it. */
struct ckpt_tensor {
	const char *name;
	int ndim; /* 1 or 2 */
	int64_t rows, cols;
	int64_t row0, nrows;
	float *param, *exp_avg, *exp_avg_sq; /* nrows * ncols each; loading skips NULL moments */
	int64_t col0, ncols;
	bool replica;
};

/* The columns a ckpt_tensor holds (its ncols, or every column). */
static inline int64_t ckpt_tensor_ncols(const struct ckpt_tensor *t)
{
	return t->ncols > 0 ? t->ncols : t->cols;
}

struct ckpt_trainer_state {
	int64_t step;        /* optimizer steps completed */
	int64_t tokens_seen; /* all ranks */
	int64_t optimizer_step;
	char
	    data_state[256]; /* the data loader's position, JSON text ("" when derived from step) */
};

/* A small file stored with the checkpoint by rank 0 (its config, its tokenizer), listed with a
 * checksum in the manifest, so that generate and export need nothing else. */
struct ckpt_extra {
	const char *name; /* file name inside the step folder */
	const void *data;
	size_t len;
};

/* A parsed and validated manifest.json. Every tensor's pieces are sorted (by row, then
 * column), do not overlap and cover its rows x columns exactly; every piece names a file listed (with a checksum) in `files`; file
 * names are plain names inside the step folder. */
struct ckpt_mfile {
	char name[64];
	uint64_t xxh3;
	int64_t bytes;
};
struct ckpt_piece {
	int file; /* index into files */
	int64_t row0, row1;
	int64_t col0, col1; /* [0, cols) unless the manifest names "cols" */
};
struct ckpt_mtensor {
	char *name;
	int ndim;
	int64_t rows, cols;
	struct ckpt_piece *pieces;
	int n_pieces;
};
struct ckpt_manifest {
	int64_t version;
	struct ckpt_trainer_state st;
	void *model; /* cJSON object: the model config as saved */
	int64_t world, pp, dp_replicate, dp_shard, tp;
	struct ckpt_mfile *files;
	int n_files;
	struct ckpt_mtensor *tensors;
	int n_tensors;
};

/* Parse manifest text (len bytes, not necessarily NUL-terminated). `path` names it in errors.
 * CT_OK, or CT_ERR_RUNTIME with a message naming the path and the key or tensor at fault. */
int ckpt_manifest_parse(struct ckpt_manifest *m, const char *text, size_t len, const char *path);
const struct ckpt_mtensor *ckpt_manifest_tensor(const struct ckpt_manifest *m, const char *name);
void ckpt_manifest_free(struct ckpt_manifest *m);

/* Save a checkpoint of `step`. Collective over mesh->world_group. Returns CT_OK or an error
 * (the previous checkpoints are untouched on error). */
int ckpt_save(const char *root, const struct model_config *cfg, const struct mesh *mesh,
              const struct ckpt_tensor *t, int n, const struct ckpt_trainer_state *st,
              const struct ckpt_extra *extra, int n_extra, int64_t keep_latest_k);

/* Asynchronous saves (checkpoint.async_mode = "async"): ckpt_async_save snapshots the tensors
 * and extras into a staging buffer owned by the writer (allocated once, MEM_CHECKPOINT) and
 * returns; a background thread then runs the same protocol as ckpt_save over a duplicate of
 * the world communicator, so training continues and collectives never interleave. At most one
 * save is in flight: the next ckpt_async_save, ckpt_async_wait or ckpt_async_free waits for it.
 * Collective (every rank calls them at the same steps). A failed background save is returned
 * by the next call. */
struct ckpt_async;
struct ckpt_async *ckpt_async_new(const struct mesh *mesh);
int ckpt_async_save(struct ckpt_async *a, const char *root, const struct model_config *cfg,
                    const struct ckpt_tensor *t, int n, const struct ckpt_trainer_state *st,
                    const struct ckpt_extra *extra, int n_extra, int64_t keep_latest_k);
int ckpt_async_wait(struct ckpt_async *a);
/* Allocate (and touch) the staging buffer ahead of the first save: params + 2 moments. */
void ckpt_async_reserve(struct ckpt_async *a, int64_t floats);
void ckpt_async_free(struct ckpt_async *a);

/* Find the step to load: `want` >= 0 exactly that step; -1 the newest complete checkpoint.
 * Sets *step = -1 (and returns CT_OK) when there is none. */
int ckpt_find(const char *root, int64_t want, int64_t *step);

/* Steps of every checkpoint folder with a manifest in root, newest first; returns how many
 * (at most max). */
int ckpt_list(const char *root, int64_t *steps, int max);

/* A path given by a user: a step-NNNNNNNN folder (its parent is the root), or a folder of step
 * folders (the newest complete one). CT_ERR_USAGE naming the path when there is none. */
int ckpt_resolve(const char *path, char *root, size_t root_size, int64_t *step);

/* Load checkpoint `step` into the tensors (each rank its rows). Collective. The model shape
 * must match the saved one (errors name the tensor). */
/* An extra file of checkpoint `step` (struct ckpt_extra) into *data (malloc'd, *len bytes),
 * its checksum checked against the manifest's. CT_OK; 1 when the manifest does not list it
 * (a checkpoint saved without it); CT_ERR_RUNTIME with a message naming the file. */
int ckpt_read_extra(const char *root, int64_t step, const char *name, char **data, size_t *len);
/* The extra file that holds the model's state outside the parameter table (model_ops.state:
 * MoE's balancing bias): raw doubles in the host's order, written by the trainer, read by
 * the trainer and by `ctitan export`. */
#define CKPT_MODEL_STATE_FILE "model_state.bin"

int ckpt_load(const char *root, int64_t step, const struct model_config *cfg,
              const struct mesh *mesh, struct ckpt_tensor *t, int n, struct ckpt_trainer_state *st);

/* On a single process: every parameter of checkpoint `step` (whatever rank count saved it) into
 * a flat buffer in table layout; no optimizer moments. For generate and export. */
int ckpt_load_params(const char *root, int64_t step, const struct model_config *cfg,
                     const struct param_table *t, float *params);

#endif
