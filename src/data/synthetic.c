#include "data/synthetic.h"

#include "base/rng.h"

void synthetic_batch(uint64_t seed, int64_t vocab, int64_t first_row, int64_t rows, int64_t T,
                     int32_t *inputs, int32_t *targets)
{
	static const uint64_t stream = 0x64617461ull; /* "data" */
	for (int64_t r = 0; r < rows; r++) {
		int32_t *in = inputs + r * T, *tg = targets + r * T;
		/* T+1 tokens; element j of the row drawn at counter row*(T+1)+j */
		uint64_t base = (uint64_t)(first_row + r) * (uint64_t)(T + 1);
		int32_t cur = (int32_t)rng_below(seed, stream, base, (uint64_t)vocab);
		for (int64_t j = 0; j < T; j++) {
			uint32_t w[4];
			rng_philox(seed, stream, base + (uint64_t)j + 1, 1, w);
			int32_t next = (w[0] % 10 != 0) ? (int32_t)((5 * (int64_t)cur + 3) % vocab)
			                                : (int32_t)(w[1] % (uint32_t)vocab);
			in[j] = cur;
			tg[j] = next;
			cur = next;
		}
	}
}
