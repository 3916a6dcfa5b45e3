/* train/tp_check: whether a run configuration can use tensor parallelism, checked before the
 * mesh is built, with errors naming the key and the numbers. */
#ifndef CT_TRAIN_TP_CHECK_H
#define CT_TRAIN_TP_CHECK_H

#include <stdint.h>

#include "io/config.h"

/* CT_OK when parallelism.tensor_parallel_degree is 1, or when it is > 1 and the model and
 * the other settings support it; CT_ERR_USAGE otherwise. */
int tp_check_config(const struct ct_config *cfg);
/* The same for context parallelism (parallelism.context_parallel_degree): the family must
 * support it and training.seq_len must split into the balancer's chunks. */
int cp_check_config(const struct ct_config *cfg);
/* The same for expert parallelism (parallelism.expert_parallel_degree): the family must have
 * routed experts, ep must divide the FSDP shard degree (ep borrows from dp_shard), and
 * context and tensor parallelism are not yet combined with it (pipeline parallelism is). */
int ep_check_config(const struct ct_config *cfg);
/* ep divides the FSDP shard degree (CT_ERR_USAGE naming both); ctitan plan's check too. */
int ep_check_shard(int64_t ep, int64_t shard);

#endif
