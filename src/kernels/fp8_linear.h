/* kernels/fp8_linear: fp8 casts with scales, and torchao's float8 linear recipes emulated on
 * the matmul engine.
 *
 * Scales (dynamic, per call, as torchao): scale = max_fp8 / max(amax, 1e-12) computed in
 * double and stored as float; the rowwise recipes round it down to a power of two
 * (torchao's round_scales_to_power_of_2). A tensor is cast as q = fp8(clamp(x * scale)) and
 * stands for q / scale.
 *
 * The linear y(N,OC) = x(N,C) w(OC,C)^T and its two backward matmuls, per recipe
 * (torchao's Float8LinearConfig.from_recipe_name):
 *   tensorwise: x, w in e4m3 and dy in e5m2, one scale per tensor, every matmul in fp8.
 *   rowwise:    everything e4m3, scales along each matmul's reduction dimension (per row of
 *               x and w for y; per row of dy and per column of w for dx; per column of dy
 *               and of x for dw), power-of-two scales.
 *   rowwise_with_gw_hp: y as rowwise; dx with dy per row and w tensorwise (e4m3); dw in high
 *               precision (the engine's dtype, like a plain linear).
 * No CPU we run on multiplies fp8: the quantised values are exact in bf16, so each fp8 matmul
 * runs through the engine (mm_gemm) with fp32 accumulation and the scales are applied to
 * the fp32 result - the numerics of torch._scaled_mm, at bf16 (or fp32) speed.
 *
 * Which weights are float8 linears is a process-wide registry keyed by the weight's address,
 * kept by the model layer as units are bound to parameters (model_bind_unit); matmul.c asks
 * it on every call. A weight can be *prepared*: its buffer already holds the fp8 values of a
 * tensorwise cast with a known scale (FSDP's fp8 all-gather delivers it so), and is then used
 * as is, never re-cast. Compute thread only.
 */
#ifndef CT_KERNELS_FP8_LINEAR_H
#define CT_KERNELS_FP8_LINEAR_H

#include <stdbool.h>
#include <stdint.h>

#include "base/fp8.h"

enum fp8_recipe { FP8_TENSORWISE, FP8_ROWWISE, FP8_ROWWISE_GW_HP, FP8_RECIPE_COUNT };

/* 0 and *out set, or -1 for a name that is not a recipe. */
int fp8_recipe_parse(const char *name, enum fp8_recipe *out);
const char *fp8_recipe_name(enum fp8_recipe r);

/* torchao's amax_to_scale. */
float fp8_scale_from_amax(double amax, enum fp8_fmt f, bool pow2);
float fp8_amax(const float *x, int64_t n);
/* amax of each row (out[rows]) / each column (out[cols]) of a row-major rows x cols block. */
void fp8_amax_rows(float *out, const float *x, int64_t rows, int64_t cols);
void fp8_amax_cols(float *out, const float *x, int64_t rows, int64_t cols);

/* Process-wide set-up: float8 linears on (recipe) or off; filter: comma-separated substrings
 * of module names (torchao's filter_fqns) whose linears stay high precision. */
void fp8_linear_configure(bool on, enum fp8_recipe r, const char *filter);
bool fp8_linear_enabled(void);
enum fp8_recipe fp8_linear_recipe(void);
/* Whether the linear whose weight is called `name` (e.g. layers.0.attention.wq.weight) is
 * converted: enabled and no filter entry is a substring of its module name. */
bool fp8_linear_wants(const char *name);

/* A weight that tensor parallelism slices: dim 0 (its rows, the output features: column
 * parallel) or 1 (its columns, the input features: row parallel) of the global weight is split
 * over a group of ranks, and max_f32(ctx, buf, n) replaces buf[0..n) by its elementwise
 * maximum over that group (collective: every rank of the group calls it in the same order).
 * A scale is the one a single rank would compute when every amax whose reduction runs along
 * a split dimension is reduced so: tensorwise amaxes of the weight always; of the input x (N,
 * C) and of each row of x and w when C is split (row parallel); of the output gradient dy (N,
 * OC), each row of dy and each column of w when OC is split (column parallel). Amaxes along
 * the tokens (the weight gradient's columns of x and dy) need none: tensor parallelism does
 * not split the tokens a matmul sees.
 *
 * Context parallelism does: each rank of its group holds a piece of every sequence of the
 * micro-batch, so a linear sees only this rank's tokens. tok_max_f32(tok_ctx, buf, n) is the
 * same maximum over that token group (NULL: the linear sees all the micro-batch's tokens).
 * The tensorwise amaxes of the activations (x, and dy) run along the tokens and are
 * max-reduced over it too (after the tp reduction where there is one); a weight is whole on
 * every rank of the token group and needs none. The per-token rows of the rowwise recipes are
 * whole on a rank; their weight gradient's per-column amaxes of x and dy run along the tokens
 * and are max-reduced over the token group too, so each rank's partial weight gradient (its
 * own tokens) is cast with the micro-batch's column scales, as one rank's is.
 * The kernel never names a collective; the model's groups (model/model_group.h) supply them. */
struct fp8_slice {
	int dim; /* -1: not split (max_f32 unused) */
	void (*max_f32)(void *ctx, float *buf, int64_t n);
	void *ctx;
	void (*tok_max_f32)(void *tok_ctx, float *buf, int64_t n);
	void *tok_ctx;
};

/* The registry. Unit u's float8 weights live in the buffer at `base`: unit_is says whether
 * the registry already holds u at that base; clear drops u's entries; add registers one
 * rows x cols weight (slice NULL: whole, as on one rank). */
bool fp8_linear_unit_is(int u, const float *base);
void fp8_linear_unit_clear(int u);
void fp8_linear_unit_set(int u, const float *base);
void fp8_linear_add(int u, const float *w, int64_t rows, int64_t cols,
                    const struct fp8_slice *slice);
bool fp8_linear_is(const float *w);
/* The buffer of w now holds fp8 values (of a tensorwise e4m3 cast with `scale`). */
void fp8_linear_set_prepared(const float *w, float scale);

/* Row blocks (async tensor parallelism). Async TP multiplies a gathered activation block by
 * block as the blocks arrive, and computes the partial sums beside a reduce-scatter ring one
 * block of rows at a time; on different ranks the same step holds different blocks. A scale
 * whose amax runs along the rows (tensorwise; the rowwise weight gradient's per-column
 * scales) must still be the whole operand's, one across a split dimension the group's, and
 * no collective may run inside a ring step. So around a ring the caller opens a scope and
 * declares the operands its linears will see in row blocks, with what this rank holds of
 * them; the amaxes one rank would compute are taken (and max-reduced over the group) there,
 * once, and the linears inside use them. Inside a scope a float8 linear on an undeclared
 * activation, or one that would need a collective, stops the run (a bug, not an input).
 *
 *   fp8_block_begin() / fp8_block_end(): the scope (no nesting).
 *   fp8_block_operand(full, rows, cols, held, held_rows, split, red): the linears will see row
 *     blocks of full (rows x cols, row-major). split = FP8_SPLIT_ROWS: the rows are divided
 *     over red's group and this rank holds held (held_rows of them: its token shard, gathered
 *     into full during the ring); FP8_SPLIT_COLS: the columns are (this rank's features), held
 *     is full itself with all its rows. red: the group's max (fp8_slice; dim unused), and
 *     the token group's (tok_max_f32, may be NULL) for the tensorwise amax.
 *   fp8_block_weight(w): a registered float8 weight's amaxes taken now, with its own
 *     reduction (fp8_slice), for the linears inside.
 * The results equal those of one call on the whole operand: the same scales cast every block,
 * and the fp8 values of a row do not depend on the block it is cast in. */
enum fp8_split { FP8_SPLIT_ROWS, FP8_SPLIT_COLS };
#define FP8_BLOCK_MAX 8
void fp8_block_begin(void);
void fp8_block_operand(const float *full, int64_t rows, int64_t cols, const float *held,
                       int64_t held_rows, enum fp8_split split, const struct fp8_slice *red);
void fp8_block_weight(const float *w);
void fp8_block_end(void);
bool fp8_block_active(void);
/* The tensorwise amax taken for the declared operand `full` (a gather's fp8 wire casts the
 * shard with it). */
float fp8_block_amax(const float *full);

/* The float8 versions of matmul_forward / matmul_backward (kernels.h): same arguments and
 * accumulation rules (forward adds into out when `accumulate`; backward adds into dw, and
 * into dinp when dinp_acc, else overwrites it: matmul_backward_set). */
void fp8_linear_forward(float *out, const float *inp, const float *w, int64_t N, int64_t C,
                        int64_t OC, int accumulate);
void fp8_linear_backward(float *dinp, float *dw, const float *dout, const float *inp,
                         const float *w, int64_t N, int64_t C, int64_t OC, int dinp_acc);

#endif
