/* model/model_ac: the activation-checkpointing modes, one enum for the models (what a block
 * saves, model/llama.h says per mode) and for the schedule (where RECOMPUTE nodes go). */
#ifndef CT_MODEL_MODEL_AC_H
#define CT_MODEL_MODEL_AC_H

enum model_ac { MODEL_AC_NONE, MODEL_AC_FFN, MODEL_AC_SELECTIVE, MODEL_AC_FULL, MODEL_AC_COUNT };

#endif
