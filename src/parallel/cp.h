/* parallel/cp: context parallelism's token layout — which tokens of each sequence a cp rank
 * holds. The sequence of T tokens is split over cp ranks of Tl = T/cp tokens each; `order`
 * (T entries, rank-major) lists them: rank r holds the tokens at global positions
 * order[r*Tl .. (r+1)*Tl). Inputs, labels and RoPE positions all follow it, so every
 * token-local op (norms, matmuls, the loss) needs nothing else, and the loss summed over the
 * cp ranks is the sequence's.
 *   headtail (TorchTitan's _HeadTailLoadBalancer): 2cp chunks of T/(2cp), rank r holds
 *     chunks r and 2cp-1-r, so every rank's causal attention does the same work (for 8
 *     tokens on 2 ranks: [0,1,6,7 | 2,3,4,5]);
 *   none: rank r holds the r-th contiguous T/cp (the last rank attends to the most keys).
 */
#ifndef CT_PARALLEL_CP_H
#define CT_PARALLEL_CP_H

#include <stdint.h>

enum cp_balancer { CP_BALANCE_HEADTAIL, CP_BALANCE_NONE };

/* "headtail" | "none"; CT_ERR_USAGE (message naming the key) otherwise */
int cp_balancer_parse(const char *name, enum cp_balancer *out);
/* What T must be a multiple of: 2cp (headtail) or cp (none). */
int64_t cp_seq_divisor(int cp, enum cp_balancer b);
/* order (T) as above; T a multiple of cp_seq_divisor */
void cp_token_order(int64_t *order, int64_t T, int cp, enum cp_balancer b);
/* dst(B, Tl) = src(B, T) at the positions mine(Tl): this rank's tokens of each sequence */
void cp_take_tokens(int32_t *dst, const int32_t *src, const int64_t *mine, int64_t B, int64_t T,
                    int64_t Tl);

#endif
