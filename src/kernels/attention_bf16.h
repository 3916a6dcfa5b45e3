/* kernels/attention_bf16: causal GQA attention with bf16 operands and fp32 accumulation, on
 * AVX512-BF16 dot products (vdpbf16ps), for bf16 compute (mm_engine's MM_BF16). The same
 * maths, shapes, outputs and statistics as kernels.h's attention_* (out and lse in fp32, the
 * online softmax and every statistic in fp32); what is rounded to bf16 is what FlashAttention-2
 * rounds under bf16: q, k, v and dout as they enter the products, and the probability and
 * score-gradient tiles (p, ds) as they enter theirs.
 *
 * Chosen at run time: attention_bf16_usable(D) says whether this CPU has AVX512-BF16 (cpuid,
 * base/cpu) and D suits the kernel (a multiple of 16); the environment variable CT_ATTENTION
 * = f32 turns it off (tests and benchmarks compare both). Where it is not usable, the
 * attention_mixed_* entries run the fp32 kernels, so AVX2-only CPUs keep the fp32 path.
 * Results are bitwise the same for any number of threads (every output element is summed in a
 * fixed order), as for the fp32 kernels. */
#ifndef CT_KERNELS_ATTENTION_BF16_H
#define CT_KERNELS_ATTENTION_BF16_H

#include <stdbool.h>
#include <stdint.h>

bool attention_bf16_usable(int64_t D);

/* The kernels.h attention_* contracts, with bf16 products (callers check usable first). */
void attention_bf16_forward(float *out, float *lse, const float *q, const float *k,
                            const float *v, int64_t B, int64_t T, int64_t H, int64_t KV,
                            int64_t D);
void attention_bf16_backward(float *dq, float *dk, float *dv, const float *dout,
                             const float *out, const float *lse, const float *q, const float *k,
                             const float *v, int64_t B, int64_t T, int64_t H, int64_t KV,
                             int64_t D);
void attention_bf16_pos_forward(float *out, float *lse, const float *q, const int64_t *qpos,
                                const float *k, const float *v, const int64_t *kpos, int64_t B,
                                int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t D);
void attention_bf16_pos_backward(float *dq, float *dk, float *dv, const float *dout,
                                 const float *out, const float *lse, const float *q,
                                 const int64_t *qpos, const float *k, const float *v,
                                 const int64_t *kpos, int64_t B, int64_t Tq, int64_t Tk,
                                 int64_t H, int64_t KV, int64_t D);

/* The softmax tiles' exponential, for tests: x[j] = exp(x[j] - m) over one 64-float tile row
 * (the forward's step), returning the row's sum. Callers check usable first. */
float attention_bf16_row_exp(float *x, float m);

/* What the model calls: the bf16 kernel when the matmul compute dtype is bf16 and it is usable
 * for D (every head dim from 16 up: attention_bf16.c says what was measured), else the fp32
 * kernel (kernels.h). */
bool attention_mixed_is_bf16(int64_t D);
void attention_mixed_forward(float *out, float *lse, const float *q, const float *k,
                             const float *v, int64_t B, int64_t T, int64_t H, int64_t KV,
                             int64_t D);
void attention_mixed_backward(float *dq, float *dk, float *dv, const float *dout,
                              const float *out, const float *lse, const float *q,
                              const float *k, const float *v, int64_t B, int64_t T, int64_t H,
                              int64_t KV, int64_t D);
void attention_mixed_pos_forward(float *out, float *lse, const float *q, const int64_t *qpos,
                                 const float *k, const float *v, const int64_t *kpos,
                                 int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t KV,
                                 int64_t D);
void attention_mixed_pos_backward(float *dq, float *dk, float *dv, const float *dout,
                                  const float *out, const float *lse, const float *q,
                                  const int64_t *qpos, const float *k, const float *v,
                                  const int64_t *kpos, int64_t B, int64_t Tq, int64_t Tk,
                                  int64_t H, int64_t KV, int64_t D);
/* "bf16 (AVX512-BF16)" or "fp32", for the logs and benchmarks. */
const char *attention_mixed_name(int64_t D);
/* Logs (INFO) the kernel the last attention_mixed_*_forward ran and its head dim, if any. */
void attention_mixed_log_summary(void);

#endif
