/* data/synthetic: seeded token sequences with a learnable rule, for `training.dataset =
 * "synthetic"` and tests. Row r (a global row index) is a pure function of (seed, r): from a
 * random first token, next = (5*cur + 3) mod V with probability 0.9, else uniform. So batches
 * do not depend on the number of ranks, and a model that learns the rule drives the loss far
 * below ln V. */
#ifndef CT_DATA_SYNTHETIC_H
#define CT_DATA_SYNTHETIC_H

#include <stdint.h>

/* Inputs and targets (rows x T) of global rows first_row .. first_row + rows. */
void synthetic_batch(uint64_t seed, int64_t vocab, int64_t first_row, int64_t rows, int64_t T,
                     int32_t *inputs, int32_t *targets);

#endif
