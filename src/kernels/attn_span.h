/* kernels/attn_span: the span of positions of a tile of queries or keys, which the
 * position-aware attention kernels (attention.c, attention_bf16.c) use to skip a tile pair no
 * query of which sees a key, or to compute it unmasked. Included by kernel sources only. */
#ifndef CT_KERNELS_ATTN_SPAN_H
#define CT_KERNELS_ATTN_SPAN_H

#include <stdint.h>

struct pos_span {
	int64_t lo, hi;
};

static inline struct pos_span pos_span_of(const int64_t *pos, int64_t n)
{
	struct pos_span s = {INT64_MAX, INT64_MIN};
	for (int64_t i = 0; i < n; i++) {
		s.lo = pos[i] < s.lo ? pos[i] : s.lo;
		s.hi = pos[i] > s.hi ? pos[i] : s.hi;
	}
	return s;
}

#endif
