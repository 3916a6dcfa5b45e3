/* base/bf16: bfloat16 <-> float conversion (round to nearest even; NaN stays NaN). */
#ifndef CT_BASE_BF16_H
#define CT_BASE_BF16_H

#include <stdint.h>
#include <string.h>

static inline uint16_t bf16_from_f32(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

static inline float bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

#endif
