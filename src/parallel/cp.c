/* Context parallelism's token layout (parallel/cp.h). */
#include "parallel/cp.h"

#include <string.h>

#include "base/log.h"

int cp_balancer_parse(const char *name, enum cp_balancer *out)
{
	if (strcmp(name, "headtail") == 0)
		*out = CP_BALANCE_HEADTAIL;
	else if (strcmp(name, "none") == 0)
		*out = CP_BALANCE_NONE;
	else {
		LOG_ERROR("parallelism.context_parallel_load_balancer: unknown '%s' (headtail, none)",
		          name);
		return CT_ERR_USAGE;
	}
	return CT_OK;
}

int64_t cp_seq_divisor(int cp, enum cp_balancer b)
{
	return b == CP_BALANCE_HEADTAIL ? 2 * (int64_t)cp : cp;
}

void cp_token_order(int64_t *order, int64_t T, int cp, enum cp_balancer b)
{
	CHECK(cp >= 1 && T % cp_seq_divisor(cp, b) == 0, "cp: %lld tokens over %d ranks",
	      (long long)T, cp);
	int64_t n = 0;
	if (b == CP_BALANCE_NONE) {
		for (int64_t t = 0; t < T; t++)
			order[t] = t;
		return;
	}
	const int64_t c = T / (2 * cp);
	for (int r = 0; r < cp; r++) {
		for (int64_t t = 0; t < c; t++)
			order[n++] = r * c + t;
		for (int64_t t = 0; t < c; t++)
			order[n++] = (2 * (int64_t)cp - 1 - r) * c + t;
	}
}

void cp_take_tokens(int32_t *dst, const int32_t *src, const int64_t *mine, int64_t B, int64_t T,
                    int64_t Tl)
{
	for (int64_t b = 0; b < B; b++)
		for (int64_t t = 0; t < Tl; t++)
			dst[b * Tl + t] = src[b * T + mine[t]];
}
