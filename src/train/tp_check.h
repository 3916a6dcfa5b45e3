/* train/tp_check: whether a run configuration can use tensor parallelism, checked before the
 * mesh is built, with errors naming the key and the numbers. */
#ifndef CT_TRAIN_TP_CHECK_H
#define CT_TRAIN_TP_CHECK_H

#include "io/config.h"

/* CT_OK when parallelism.tensor_parallel_degree is 1, or when it is > 1 and the model and
 * the other settings support it; CT_ERR_USAGE otherwise. */
int tp_check_config(const struct ct_config *cfg);

#endif
