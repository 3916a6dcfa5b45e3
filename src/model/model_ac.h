/* model/model_ac: the activation-checkpointing modes, one enum for the models (what a block
 * saves, model/llama.h says per mode) and for the schedule (where RECOMPUTE nodes go). */
#ifndef CT_MODEL_MODEL_AC_H
#define CT_MODEL_MODEL_AC_H

#include <stdbool.h>

/* MODEL_AC_LAYER is TorchTitan's per-layer selective checkpointing (mode = "selective",
 * selective_ac_option = "N"): full checkpointing on every N-th block, none on the others. N
 * (`every`) travels beside the mode wherever the mode does; the modes of single blocks are
 * the other four, and model_ac_block turns the policy into one of them. */
enum model_ac {
	MODEL_AC_NONE,
	MODEL_AC_FFN,
	MODEL_AC_SELECTIVE,
	MODEL_AC_FULL,
	MODEL_AC_LAYER,
	MODEL_AC_COUNT
};

/* The mode of block l (0-based) under ac. MODEL_AC_LAYER: FULL when (l + 1) % every == 0,
 * else NONE. TorchTitan counts the blocks it wraps from 1 (N = 2: blocks 1, 3, 5, ...);
 * ctitan counts the model's blocks, so the same blocks are checkpointed on every layout
 * (TorchTitan's counter is per process, and under PP starts again on each stage). */
static inline enum model_ac model_ac_block(enum model_ac ac, int every, int l)
{
	if (ac != MODEL_AC_LAYER)
		return ac;
	return every > 0 && (l + 1) % every == 0 ? MODEL_AC_FULL : MODEL_AC_NONE;
}

/* Whether block l's activations are dropped in forward and re-derived by a recompute pass. */
static inline bool model_ac_block_recomputes(enum model_ac ac, int every, int l)
{
	enum model_ac b = model_ac_block(ac, every, l);
	return b == MODEL_AC_SELECTIVE || b == MODEL_AC_FULL;
}

#endif
