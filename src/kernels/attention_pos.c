/* Position-aware causal grouped-query attention: query rows and key rows at arbitrary global
 * positions, the building block of context parallelism (a rank's query shard against the keys
 * of one or all sequence shards, in any order, e.g. head-tail load balancing).
 *
 * Shapes: q(B,Tq,H,D) with positions qpos(Tq), k,v(B,Tk,KV,D) with positions kpos(Tk), the
 * same for every batch row; out(B,Tq,H,D), lse(B,H,Tq). Query i sees key j iff
 * kpos[j] <= qpos[i]. With s_ij = scale q_i.k_j (scale = 1/sqrt(D)):
 *   lse_i = log sum_{j visible} exp(s_ij),  out_i = sum_{j visible} exp(s_ij - lse_i) v_j;
 * a row that sees no key has lse_i = -inf and out_i = 0, so it is neutral in a merge.
 *
 * Partial results over disjoint key sets merge exactly with their statistics
 * (attention_merge): lse = log(e^lse_a + e^lse_b), out = e^(lse_a-lse) out_a + e^(lse_b-lse)
 * out_b, evaluated around the larger lse. The backward takes the FINAL (merged) out and lse,
 * so each key block's contribution to dq, dk, dv is exact on its own and blocks may be
 * processed in any order (ring attention's backward):
 *   p_ij = exp(s_ij - lse_i), D_i = dout_i.out_i, ds_ij = p_ij (dout_i.v_j - D_i),
 *   dv_j += sum_i p_ij dout_i, dq_i += scale sum_j ds_ij k_j, dk_j += scale sum_i ds_ij q_i.
 *
 * The forward and backward are the tiled kernel's (attention.c, whose tiles, micro-kernel
 * and threading they share: bitwise the same for any thread count), with a (query tile, key
 * tile) pair skipped, unmasked or masked by the positions instead of by the diagonal. This
 * file holds the merge.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kernels/kreal.h"

void KFN(attention_merge)(real *out, real *lse, const real *out_b, const real *lse_b, int64_t B,
                          int64_t T, int64_t H, int64_t D)
{
#pragma omp parallel for schedule(static)
	for (int64_t it = 0; it < B * H * T; it++) {
		const int64_t i = it % T, bh = it / T, h = bh % H, b = bh / H;
		const real la = lse[it], lb = lse_b[it];
		if (lb == -INFINITY)
			continue;
		real *o = out + ((b * T + i) * H + h) * D;
		const real *ob = out_b + ((b * T + i) * H + h) * D;
		if (la == -INFINITY) {
			memcpy(o, ob, (size_t)D * sizeof(real));
			lse[it] = lb;
			continue;
		}
		const real mx = la > lb ? la : lb;
		const real ea = KEXP(la - mx), eb = KEXP(lb - mx), sum = ea + eb;
		const real wa = ea / sum, wb = eb / sum;
		for (int64_t d = 0; d < D; d++)
			o[d] = wa * o[d] + wb * ob[d];
		lse[it] = mx + KLOG(sum);
	}
}
