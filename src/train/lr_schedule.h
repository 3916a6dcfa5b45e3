/* train/lr_schedule: TorchTitan's warmup-stable-decay learning-rate multiplier.
 *
 * With s = step + 1 (1-based optimizer step):
 *   warmup  (s <= W):        f = s / W
 *   stable  (s <= W + S):    f = 1
 *   decay   (p = (s-W-S)/D): f = 1 - p | 1 - sqrt(p) | (1 + cos(pi p))/2, then
 *                            f = min_lr_factor + (1 - min_lr_factor) f
 * W is clipped to the total steps; D = round(total * decay_ratio) (or total - W when the
 * ratio is unset), clipped so W + D <= total; S = total - W - D.
 */
#ifndef CT_TRAIN_LR_SCHEDULE_H
#define CT_TRAIN_LR_SCHEDULE_H

#include <stdint.h>

enum lr_decay { LR_DECAY_LINEAR, LR_DECAY_SQRT, LR_DECAY_COSINE, LR_DECAY_COUNT };

struct lr_schedule {
	double lr, min_lr_factor;
	int64_t warmup, stable, decay;
	enum lr_decay type;
};

/* decay_ratio < 0 means unset. Returns CT_ERR_USAGE for an unknown decay type. */
int lr_schedule_init(struct lr_schedule *s, double lr, int64_t warmup_steps, double decay_ratio,
                     const char *decay_type, double min_lr_factor, int64_t total_steps);
/* Learning rate for 0-based optimizer step `step`. */
double lr_schedule_at(const struct lr_schedule *s, int64_t step);

#endif
