/* kernels: forward and backward of every op of the model, on raw pointers and explicit sizes.
 *
 * Each kernel is written once over the type `real` (see kernels/kreal.h) and compiled twice:
 * `_f32` (float, what the model runs) and `_f64` (double, what the finite-difference tests
 * check). Conventions, as in llm.c:
 *   - shapes are row-major and written next to every pointer; N = B*T tokens, C = model dim,
 *     H query heads, KV key/value heads, D = head dim, V = vocab;
 *   - linear weights are stored (out, in), like torch.nn.Linear: y = x W^T;
 *   - backward ACCUMULATES into every gradient it produces (callers zero them first), except
 *     rope_backward, which rotates its gradient in place;
 *   - kernels never allocate in their hot loops; scratch comes from the caller or the stack.
 * Threading: kernels parallelise with OpenMP over independent rows/heads and call the
 * OpenMP build of OpenBLAS, so one thread pool serves both (no oversubscription).
 */
#ifndef CT_KERNELS_H
#define CT_KERNELS_H

#include <stdint.h>

/* Largest head dim the attention kernel supports (Llama 3 uses 64 and 128). */
#define ATTN_MAX_HEAD_DIM 256

#define KERNELS_DECLARE(real, S)                                                                   \
	/* out(N,C) = wte[tokens[n]] */                                                            \
	void embedding_forward##S(real *out, const int32_t *tokens, const real *wte, int64_t N,    \
	                          int64_t C);                                                      \
	/* dwte(V,C) += scatter of dout(N,C) by token */                                           \
	void embedding_backward##S(real *dwte, const real *dout, const int32_t *tokens, int64_t N, \
	                           int64_t C);                                                     \
	/* out(N,C) = x / sqrt(mean(x^2) + eps) * w; rstd(N) saved for backward */                 \
	void rmsnorm_forward##S(real *out, real *rstd, const real *x, const real *w, int64_t N,    \
	                        int64_t C, double eps);                                            \
	void rmsnorm_backward##S(real *dx, real *dw, const real *dout, const real *x,              \
	                         const real *w, const real *rstd, int64_t N, int64_t C);           \
	/* out(N,OC) = inp(N,C) w(OC,C)^T  (beta=1 adds into out when accumulate != 0) */          \
	void matmul_forward##S(real *out, const real *inp, const real *w, int64_t N, int64_t C,    \
	                       int64_t OC, int accumulate);                                        \
	/* dinp(N,C) += dout w ; dw(OC,C) += dout^T inp ; either may be NULL */                    \
	void matmul_backward##S(real *dinp, real *dw, const real *dout, const real *inp,           \
	                        const real *w, int64_t N, int64_t C, int64_t OC);                  \
	/* the same with dinp overwritten: dinp = dout w (beta 0, no zeroing pass before it) */   \
	void matmul_backward_set##S(real *dinp, real *dw, const real *dout, const real *inp,       \
	                            const real *w, int64_t N, int64_t C, int64_t OC);              \
	/* In place on x(B,T,NH,D): rotate pairs (x[2i], x[2i+1]) of position t by angle t*f_i.    \
	 * cos_tab/sin_tab are (T, D/2). */                                                        \
	void rope_forward##S(real *x, const real *cos_tab, const real *sin_tab, int64_t B,         \
	                     int64_t T, int64_t NH, int64_t D);                                    \
	/* In place on dx: the transpose (inverse) rotation. */                                    \
	void rope_backward##S(real *dx, const real *cos_tab, const real *sin_tab, int64_t B,       \
	                      int64_t T, int64_t NH, int64_t D);                                   \
	/* out(n) = silu(a) * b, silu(a) = a * sigmoid(a); backward overwrites da and db */        \
	void swiglu_forward##S(real *out, const real *a, const real *b, int64_t n);                \
	void swiglu_backward##S(real *da, real *db, const real *dout, const real *a,               \
	                        const real *b, int64_t n);                                         \
	/* Causal grouped-query attention, tiled with an online softmax.                           \
	 * q(B,T,H,D) k,v(B,T,KV,D) -> out(B,T,H,D), lse(B,H,T) = log-sum-exp of each row of       \
	 * scaled scores (the only per-row statistic saved). Scale = 1/sqrt(D). H % KV == 0. */    \
	void attention_forward##S(real *out, real *lse, const real *q, const real *k,              \
	                          const real *v, int64_t B, int64_t T, int64_t H, int64_t KV,      \
	                          int64_t D);                                                      \
	/* Accumulates dq(B,T,H,D), dk, dv(B,T,KV,D), recomputing scores tile by tile. */          \
	void attention_backward##S(real *dq, real *dk, real *dv, const real *dout,                 \
	                           const real *out, const real *lse, const real *q, const real *k, \
	                           const real *v, int64_t B, int64_t T, int64_t H, int64_t KV,     \
	                           int64_t D);                                                     \
	/* Causal GQA attention at global positions (kernels/attention_pos.c): q(B,Tq,H,D) at      \
	 * qpos(Tq), k,v(B,Tk,KV,D) at kpos(Tk); query i sees key j iff kpos[j] <= qpos[i].        \
	 * out(B,Tq,H,D), lse(B,H,Tq); a row that sees no key gets lse -inf and out 0.            \
	 * Partials over disjoint key sets merge exactly with attention_merge (into out, lse).     \
	 * The backward takes the final (merged) out and lse and accumulates one key set's share. */\
	void attention_pos_forward##S(real *out, real *lse, const real *q, const int64_t *qpos,    \
	                              const real *k, const real *v, const int64_t *kpos,           \
	                              int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t KV,    \
	                              int64_t D);                                                  \
	void attention_merge##S(real *out, real *lse, const real *out_b, const real *lse_b,        \
	                        int64_t B, int64_t T, int64_t H, int64_t D);                       \
	void attention_pos_backward##S(real *dq, real *dk, real *dv, const real *dout,             \
	                               const real *out, const real *lse, const real *q,            \
	                               const int64_t *qpos, const real *k, const real *v,          \
	                               const int64_t *kpos, int64_t B, int64_t Tq, int64_t Tk,     \
	                               int64_t H, int64_t KV, int64_t D);                          \
	/* dsum(B,H,T)[b][h][t] = dout(B,T,H,D)[b][t][h] . out[b][t][h], the backward's D_t: an    \
	 * orphaned omp for (call it inside a parallel region, every thread; or serially)         \
	 */                                                                                        \
	void attention_row_dots##S(real *dsum, const real *dout, const real *out, int64_t B,       \
	                           int64_t T, int64_t H, int64_t D);                               \
	/* Fused output projection + cross-entropy, chunked so the (N,V) logits never exist.       \
	 * x(N,C), w(V,C), targets(N) (ignore_index skipped). Returns the SUM of token losses      \
	 * and sets *n_valid. If dx or dw is non-NULL, accumulates d(loss_sum * dscale) into       \
	 * them. scratch holds chunk*V reals. */                                                   \
	double cross_entropy_fused##S(real *dx, real *dw, const real *x, const real *w,            \
	                              const int32_t *targets, int64_t N, int64_t C, int64_t V,     \
	                              int32_t ignore_index, double dscale, real *scratch,          \
	                              int64_t chunk, int64_t *n_valid);

KERNELS_DECLARE(float, _f32)
KERNELS_DECLARE(double, _f64)

/* AdamW step on a flat slice (PyTorch's formulation, so results match torch.optim.AdamW):
 *   p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *   p -= (lr / (1-b1^t)) * m / (sqrt(v)/sqrt(1-b2^t) + eps),  with g = grad * gscale. */
void adamw_update(float *p, const float *grad, float *m, float *v, int64_t n, double lr,
                  double beta1, double beta2, double eps, double weight_decay, int64_t t,
                  double gscale);
/* Sum of squares of x (double accumulation, fixed order: deterministic). */
double sumsq_f32(const float *x, int64_t n);

#endif
