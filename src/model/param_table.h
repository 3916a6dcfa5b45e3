/* model/param_table: the flat parameter table every model family fills: one entry per tensor
 * (name, shape, offset in the flat buffer, FSDP unit, weight decay), grouped into units. */
#ifndef CT_MODEL_PARAM_TABLE_H
#define CT_MODEL_PARAM_TABLE_H

#include <stdbool.h>
#include <stdint.h>

#define PARAM_NAME_MAX 96

/* How a tensor starts: the family's table builder says it per tensor, and
 * param_table_init_range fills any range of the flat buffer from it. */
enum param_init_kind {
	PARAM_INIT_ZEROS,
	PARAM_INIT_ONES,
	PARAM_INIT_CONST,        /* a */
	PARAM_INIT_NORMAL,       /* N(0, a^2) */
	PARAM_INIT_TRUNC_NORMAL, /* N(0, a^2) cut at +-cut (absolute, as torch's trunc_normal_) */
	PARAM_INIT_UNIFORM,      /* U(-a, a) */
};

struct param_init {
	enum param_init_kind kind;
	double a, cut;
};

struct param_entry {
	char name[PARAM_NAME_MAX]; /* TorchTitan name, e.g. layers.3.attention.wq.weight */
	int ndim;
	int64_t shape[2];
	int64_t offset, numel; /* in elements, in the flat buffer */
	int unit;
	bool weight_decay; /* matrices only */
	struct param_init init;
	/* Tensor parallelism (tables built with tp_size > 1): how this local piece sits in the
	 * global tensor. tp_dim -1: replicated (norms); 0: rows [tp_start, tp_start + shape[0])
	 * of the global tensor (column-parallel wq/wk/wv/w1/w3, vocabulary-parallel embedding
	 * and output); 1: columns [tp_start, ...) (row-parallel wo/w2). tp_valid: how many of
	 * the local rows/columns exist globally (the vocabulary's last piece is zero-padded). */
	int tp_dim;
	int64_t tp_start, tp_valid, global_shape[2];
	/* Expert parallelism: a routed-expert tensor of which this rank holds its ep rank's
	 * experts, rows [tp_start, tp_start + shape[0]) of the global tensor (tp_dim 0, set by
	 * the family); FSDP shards it over what remains of the data group (the mesh's efsdp
	 * group), not the whole shard group. */
	bool expert;
	/* A matrix that is no linear layer a float8 converter swaps (Hyena's short filter taps
	 * and the tiny linears of its implicit filter MLP, set by the family): it stays in high
	 * precision under `[model] converters = ["float8"]` whatever filter_fqns says. */
	bool high_precision;
};

struct param_table {
	struct param_entry *p;
	int count;
	int n_units;         /* L + 2 */
	int64_t *unit_begin; /* n_units + 1 offsets */
	int64_t numel;       /* total parameters */
	int64_t numel_embedding;
	int tp_size, tp_rank; /* 1, 0: the global table (0, 0 left by a builder means the same) */
};

/* Appends a d0 x d1 tensor (d1 <= 0: a vector of d0) to unit `unit` at the end of the flat
 * buffer, initialised by `init`; weight decay when `decay` and it is a matrix. *cap is the
 * builder's capacity. The entry is replicated under tensor parallelism (tp_dim -1, global
 * shape = shape). */
void param_table_add(struct param_table *t, int *cap, const char *name, int unit, int64_t d0,
                     int64_t d1, bool decay, struct param_init init);
/* Fills out[0, n) with elements [first, first + n) of the flat buffer, each tensor from its
 * init and its own counter-based random stream (named after the tensor, indexed by element),
 * so any shard of any layout gets the same values as one rank. */
void param_table_init_range(const struct param_table *t, uint64_t seed, float *out, int64_t first,
                            int64_t n);
/* Elements [elem0, elem0 + cnt) of tensor p as its init makes them (its name's random
 * stream): for a family whose tensors are pieces of another's (Hyena's per-stream in_proj
 * keeps the values of safari's one in_proj, whatever the layout). */
void param_init_fill(const struct param_entry *p, uint64_t seed, float *dst, int64_t elem0,
                     int64_t cnt);
void param_table_free(struct param_table *t);
const struct param_entry *param_table_find(const struct param_table *t, const char *name);

#endif
