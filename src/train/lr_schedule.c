#include "train/lr_schedule.h"

#include <math.h>
#include <string.h>

#include "base/log.h"

static const char *const lr_decay_names[] = {"linear", "sqrt", "cosine"};
_Static_assert(sizeof(lr_decay_names) / sizeof(lr_decay_names[0]) == LR_DECAY_COUNT,
               "one name per decay type");

int lr_schedule_init(struct lr_schedule *s, double lr, int64_t warmup_steps, double decay_ratio,
                     const char *decay_type, double min_lr_factor, int64_t total_steps)
{
	memset(s, 0, sizeof(*s));
	int type = -1;
	for (int i = 0; i < LR_DECAY_COUNT; i++)
		if (strcmp(decay_type, lr_decay_names[i]) == 0)
			type = i;
	if (type < 0) {
		LOG_ERROR("lr_scheduler.decay_type: unknown '%s' (linear, sqrt or cosine)",
		          decay_type);
		return CT_ERR_USAGE;
	}
	s->type = (enum lr_decay)type;
	s->lr = lr;
	s->min_lr_factor = min_lr_factor;
	s->warmup = warmup_steps < total_steps ? warmup_steps : total_steps;
	if (decay_ratio >= 0)
		s->decay = (int64_t)llrint((double)total_steps *
		                           decay_ratio); /* half to even, as Python round() */
	else
		s->decay = total_steps - s->warmup;
	if (s->warmup + s->decay > total_steps)
		s->decay = total_steps - s->warmup;
	s->stable = total_steps - s->warmup - s->decay;
	return CT_OK;
}

double lr_schedule_at(const struct lr_schedule *s, int64_t step)
{
	int64_t k = step + 1;
	double f;
	if (k <= s->warmup) {
		f = (double)k / (double)s->warmup;
	} else if (k <= s->warmup + s->stable || s->decay == 0) {
		f = 1.0;
	} else {
		double p = (double)(k - s->warmup - s->stable) / (double)s->decay;
		p = p > 1.0 ? 1.0 : p;
		switch (s->type) {
		case LR_DECAY_SQRT:
			f = 1.0 - sqrt(p);
			break;
		case LR_DECAY_COSINE:
			f = 0.5 * (1.0 + cos(M_PI * p));
			break;
		default:
			f = 1.0 - p;
			break;
		}
		f = s->min_lr_factor + (1.0 - s->min_lr_factor) * f;
	}
	return s->lr * f;
}
