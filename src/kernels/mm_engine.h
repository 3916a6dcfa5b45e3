/* kernels/mm_engine: every float matmul of the model goes through here, to the engine chosen at
 * run time: oneDNN (matmul primitives, created once per shape and cached; oneDNN picks AMX,
 * AVX512-BF16, AVX-512 or AVX2 by CPU features) or OpenBLAS (sgemm).
 *
 * Process-wide state, set once at start-up by the trainer (mm_engine_configure) and read by
 * every call: the engine (auto | onednn | openblas) and the compute dtype.
 *   - MM_F32: fp32 operands, fp32 accumulation.
 *   - MM_BF16: the operands are rounded to bf16 (round to nearest even) on the way in, products
 *     accumulate in fp32 and the output is fp32 (TorchTitan's mixed precision). oneDNN runs it
 *     on bf16 hardware (AMX, AVX512-BF16, or AVX-512 emulation); where it cannot (AVX2-only
 *     CPUs) and for OpenBLAS the rounded operands go through the fp32 kernel: a bf16 x bf16
 *     product is exact in fp32, so the numerics are the same, only slower (warned once).
 *   - auto: the first call of each shape (transposes, M, N, K, dtype, and whether it
 *     accumulates: beta 0 or not, timed with that beta) times both engines on that shape and
 *     keeps the faster; oneDNN is kept unless OpenBLAS is >= 15% faster, so the
 *     choice is stable between runs. For fp32 products whose B is not transposed (the
 *     backward's dx = dy W and dW = dy^T x) it also times oneDNN on a transposed copy of B
 *     (the forward's layout, whose kernel is up to ~25% faster at dx = dy W1 of the 125M
 *     model, copy included; products of >= 1 GFLOP, B up to 16 MiB) and keeps it when >= 10%
 *     faster. It also times oneDNN's second implementation of the product (oneDNN 2.6 on
 *     AVX-512 prefers its brgemm matmul; its jit sgemm, next in line, is 10-30% faster at
 *     several backward shapes of the 125M model here) and keeps it when >= 10% faster than
 *     oneDNN's first choice; where that is brgemm and the second the jit sgemm, the roles
 *     swap (brgemm must be >= 10% faster: at near-ties the jit sgemm made whole 125M steps
 *     2-9% faster on a Zen 5 EPYC). Use a forced engine (always oneDNN's first choice) for
 *     bitwise-reproducible reruns.
 * The environment variable CT_MATMUL_ENGINE (auto | onednn | openblas) overrides the config
 * (tests use it to force each engine in turn).
 *
 * Threading: callers are the compute thread only (never the comm thread, never inside an
 * OpenMP parallel region); calls are serialised by a mutex. oneDNN and OpenBLAS are both the
 * OpenMP (libgomp) builds, so they run on our OpenMP pool.
 */
#ifndef CT_KERNELS_MM_ENGINE_H
#define CT_KERNELS_MM_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

enum mm_engine { MM_ENGINE_AUTO, MM_ENGINE_ONEDNN, MM_ENGINE_OPENBLAS, MM_ENGINE_COUNT };
enum mm_dtype { MM_F32, MM_BF16, MM_DTYPE_COUNT };

/* 0 and *out set, or -1 for a name that is not an engine. */
int mm_engine_parse(const char *name, enum mm_engine *out);
const char *mm_engine_name(enum mm_engine e);
void mm_engine_configure(enum mm_engine e, enum mm_dtype dt);
enum mm_engine mm_engine_get(void);
enum mm_dtype mm_engine_dtype(void);

/* C(M,N) = op(A)(M,K) op(B)(K,N) + beta C, row-major; op(X) = X^T when tX. beta is 0 or 1. */
void mm_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
             const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* bf16 compute, "weights cast once per gather": [w, w + n) has a bf16 copy w16 of the same
 * layout holding exactly w's values rounded to bf16 (round to nearest even), so oneDNN bf16
 * matmuls reading w take the copy instead of rounding w on every call (FSDP adds one per
 * gathered bucket). Remove it before w's buffer is freed or reused; at most 64 at once. */
void mm_bf16_twin_add(const float *w, const uint16_t *w16, int64_t n);
void mm_bf16_twin_remove(const float *w);

/* bf16 compute, activations rounded once: x[0, n) feeds several matmuls before it changes (a
 * norm output feeding wq, wk and wv; an output gradient feeding dx and dW). mm_bf16_hold
 * rounds it to bf16 once into engine scratch and makes that its twin until
 * mm_bf16_release(x), so those matmuls read the same bf16 values they would each have rounded
 * themselves (bitwise the same products). x must not change while held. A no-op in fp32,
 * with the OpenBLAS engine forced, where oneDNN has said it cannot run bf16 (the operands then
 * go through fp32 kernels), and for x already covered by a twin (held by a caller, or a
 * weight): it returns whether it took a hold, and only the taker releases. At most MM_HOLDS
 * at once. */
#define MM_HOLDS 4
bool mm_bf16_hold(const float *x, int64_t n);
void mm_bf16_release(const float *x);
/* Elements rounded by mm_bf16_hold and by per-call operand rounding so far (for tests and
 * logs: how much rounding the holds saved). */
void mm_bf16_round_totals(int64_t *held, int64_t *per_call);

/* Shapes auto runs as oneDNN on a transposed copy of B (for logs and tests; the environment
 * variable CT_MATMUL_FORCE_BT=1 makes auto choose it wherever it applies, for tests). */
int mm_engine_bt_shapes(void);
/* Shapes auto runs on oneDNN's second implementation (CT_MATMUL_FORCE_IMPL=1 makes auto choose
 * it wherever oneDNN offers one, for tests). */
int mm_engine_alt_impl_shapes(void);

/* auto's choices kept across runs of one job: mm_engine_choices_write writes a line naming this
 * CPU (brand string and features) and one line per shape auto has chosen (sizes, transposes,
 * dtype, accumulating, engine, B transposed, oneDNN implementation); mm_engine_choices_read
 * takes the shapes of such a file as already chosen, when it was written on the same CPU, so a
 * resumed run computes with the kernels of the run it resumes instead of timing them again
 * (and maybe choosing, on a loaded machine, differently). Returns the shapes taken; 0 for a file of
 * another CPU or of an older format (v1, shapes keyed without beta); -1 for a malformed one
 * (nothing taken). */
#include <stdio.h>
int mm_engine_choices_write(FILE *f);
int mm_engine_choices_read(FILE *f);

/* FLOPs and seconds of every mm_gemm call so far (the engine's rate at the model's shapes). */
void mm_engine_totals(double *flops, double *seconds);
/* Logs (INFO) the engine, dtype, oneDNN's ISA, and per shape the engine kept and GFLOP/s. */
void mm_engine_log_summary(void);
/* oneDNN's ISA on this CPU, e.g. "avx512_core_bf16", and what it runs bf16 matmuls with:
 * its implementation name ("brg:avx512_core_amx") or "none (bf16-rounded fp32)". */
const char *mm_onednn_isa(void);
const char *mm_onednn_bf16_impl(void);
/* oneDNN's name of the implementation the last mm_onednn_gemm call ran ("gemm:jit", ...). */
const char *mm_onednn_last_impl(void);
/* The OpenBLAS kernel in use ("Haswell", "Cooperlake", ...). */
const char *mm_openblas_core(void);
/* The CPU-table guard's decision (run before main, see mm_engine.c): the kernel to force when
 * OpenBLAS picked the generic `current` one on a CPU with AVX2/AVX-512, else NULL. */
struct cpu_info;
const char *mm_openblas_wanted_core(const struct cpu_info *c, const char *current);

/* Products whose M (vary_k false) or K (true) changes from call to call (an expert's token
 * count in grouped MoE matmuls): one primitive with that size, and the leading dimensions,
 * given at run time. Returns as mm_onednn_gemm (impl 0). */
int mm_onednn_gemm_ragged(enum mm_dtype dt, bool vary_k, bool ta, bool tb, int64_t M, int64_t N,
                          int64_t K, const void *A, int64_t lda, const void *B, int64_t ldb,
                          float beta, float *C, int64_t ldc);
/* Ragged products: between mm_engine_ragged(true) and (false) every mm_gemm has a token
 * dimension that changes from call to call (grouped expert matmuls: M, or K when A is
 * transposed, as in dW = dy^T x). auto neither times nor tracks them size by size (each new
 * size would be tuned, and would create a oneDNN primitive); they run on one oneDNN primitive
 * per (transposes, dtype, the two fixed sizes) with the token count and the leading
 * dimensions given at run time (OpenBLAS where oneDNN cannot, or when OpenBLAS is forced). The
 * choice depends on the call site only, so runs stay reproducible. Compute thread only. */
void mm_engine_ragged(bool on);
/* Families run as ragged so far (for logs and tests). */
int mm_engine_ragged_families(void);

/* Lower level, for the engine layer and its tests. impl: 0 for oneDNN's own first choice of
 * implementation, k >= 1 for the k-th other non-reference one it offers. Return 0; -1 when
 * oneDNN cannot run this dtype (or has no such implementation) here, -2 when its primitive
 * cache is full (the caller falls back to OpenBLAS). A and B must already be bf16 for
 * MM_BF16. */
int mm_onednn_gemm(enum mm_dtype dt, int impl, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   const void *A, int64_t lda, const void *B, int64_t ldb, float beta, float *C,
                   int64_t ldc);

#endif
