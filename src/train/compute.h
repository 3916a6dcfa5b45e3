/* train/compute: the run's compute set-up: the matmul engine and dtype from the config
 * ([compute] matmul_engine, training.mixed_precision_param), and the theoretical peak FLOP/s
 * the MFU is measured against. Used by the trainer and `ctitan plan`. */
#ifndef CT_TRAIN_COMPUTE_H
#define CT_TRAIN_COMPUTE_H

#include <stdbool.h>
#include <stdint.h>

#include "io/config.h"

struct model;

/* True when matmuls compute on bf16 operands: training.mixed_precision_param = bfloat16, or
 * auto on a CPU with bf16 matmul hardware (AVX512-BF16 or AMX). */
bool compute_bf16(const struct ct_config *cfg);
/* model.converters holds "float8" / and the fp8 all-gather is on. */
bool compute_float8(const struct ct_config *cfg);
bool compute_fp8_all_gather(const struct ct_config *cfg);
/* What compute_setup sets from the config (tests set it directly): with the fp8 all-gather,
 * compute_bind_bf16_params leaves the float8 weights in fp32, so 1 rank casts them to fp8
 * from the same fp32 values FSDP's gather casts. */
void compute_set_fp8_all_gather(bool on);
/* Configures the engine layer for this process, and the float8 linears (kernels/fp8_linear.h:
 * recipe, filter; CT_ERR_USAGE naming the key for what float8 does not support); logs it (with `log` set) and warns once when
 * bf16 runs without bf16 hardware. CT_ERR_USAGE naming the key for an unknown engine. */
int compute_setup(const struct ct_config *cfg, bool log);
/* Theoretical peak of this rank (its OpenMP threads) for the compute dtype, or
 * metrics.peak_tflops when set; `why` gets how it was derived. */
double compute_peak_flops(const struct ct_config *cfg, char *why, int64_t len);

/* Single-rank bf16 compute: `on` rounds the parameters to bf16 into a copy (allocated once)
 * and binds every unit to it, as FSDP's bf16 all-gather does for sharded runs, so 1 rank
 * computes what N ranks compute; the fp32 master weights stay in m->params for the optimizer.
 * `off` binds the units back to m->params. */
void compute_bind_bf16_params(struct model *m, bool on);

#endif
