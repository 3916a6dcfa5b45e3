/* model/model_hf: a family's Hugging Face interop (model_family.hf, families with export_hf):
 * each table tensor's Hugging Face name and layout, config.json, and reading an HF folder into
 * the family's table layout — what `ctitan export` and checkpoint.initial_load_in_hf use
 * without naming the family. */
#ifndef CT_MODEL_MODEL_HF_H
#define CT_MODEL_MODEL_HF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct model_config;
struct param_entry;
struct param_table;

struct model_hf_ops {
	/* Entry e of the whole-model table as Hugging Face stores it: its name into name (n
	 * bytes) and *data: src (e's values) as they are, or rewritten into tmp (e->numel
	 * floats), e.g. permuted rows; *ndim and shape (set to e's by the caller) may be
	 * changed to another shape of the same size, or to a larger one whose values go on past
	 * e's into the entries after it, adjacent in the flat buffer (one HF tensor that the
	 * family's table holds as several, e.g. Hyena's per-stream in_proj); those entries then
	 * return true with an empty name (nothing of their own to write). false: HF holds no
	 * tensor of that name; its values are then in what extra writes (e.g. MoE's grouped
	 * experts, one HF tensor per expert). */
	bool (*tensor)(const struct model_config *c, const struct param_entry *e, const float *src,
	               float *tmp, char *name, size_t n, const float **data, int *ndim,
	               int64_t *shape);
	/* Tensors the format holds besides the table's (NULL: none): the i-th into name, its
	 * shape and *data (malloc'd, the caller frees), false past the last; params are the
	 * whole model's (table layout), e.g. for a tied weight's copy or one expert's rows;
	 * state the model's state outside the table (model_ops.state's n_state doubles, e.g.
	 * MoE's balancing bias; NULL, 0: the checkpoint holds none). */
	bool (*extra)(const struct model_config *c, const struct param_table *t,
	              const float *params, const double *state, int64_t n_state, int i, char *name,
	              size_t n, int *ndim, int64_t *shape, float **data);
	/* config.json text (malloc'd) */
	char *(*config_json)(const struct model_config *c);
	/* Read an HF folder into params (layout of t, the whole model's table) and, for a family
	 * with model state, into state (n_state doubles, model_ops.state's layout; NULL, 0:
	 * none); CT_OK or an error code with a message naming the file, key or tensor. */
	int (*load)(const char *dir, const struct model_config *c, const struct param_table *t,
	            float *params, double *state, int64_t n_state);
};

/* The family's interop (NULL: it has none; callers refuse, naming what is not supported). */
const struct model_hf_ops *model_hf_of(const struct model_config *c);
/* The calls of the family's model_hf_ops (it must have one). */
bool model_hf_tensor(const struct model_config *c, const struct param_entry *e, const float *src,
                     float *tmp, char *name, size_t n, const float **data, int *ndim,
                     int64_t *shape);
bool model_hf_extra(const struct model_config *c, const struct param_table *t,
                    const float *params, const double *state, int64_t n_state, int i,
                    char *name, size_t n, int *ndim, int64_t *shape, float **data);
char *model_hf_config_json(const struct model_config *c);
int model_hf_load(const char *dir, const struct model_config *c, const struct param_table *t,
                  float *params, double *state, int64_t n_state);

/* RoPE's row order of a q or k projection (heads x D rows of `cols`): ctitan rotates
 * interleaved pairs (2i, 2i+1) of each head, Hugging Face's rotate_half the halves
 * (i, D/2 + i). to_hf: ctitan's rows `in` -> HF's `out`; false: back. */
void model_hf_permute_rope_rows(const float *in, float *out, int64_t heads, int64_t D,
                                int64_t cols, bool to_hf);

#endif
