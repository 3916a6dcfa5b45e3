/* kernels/kreal.h: the `real` type a kernel source is compiled for. Included only by kernel
 * .c files; CMake compiles each of them twice, once with -DKERNELS_F64. */
#ifndef CT_KERNELS_KREAL_H
#define CT_KERNELS_KREAL_H

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/kernels.h"

#ifdef KERNELS_F64
typedef double real;
#define KFN(name) name##_f64
#define KGEMM     cblas_dgemm
#define KEXP(x)   exp(x)
#define KLOG(x)   log(x)
#define KSQRT(x)  sqrt(x)
#else
typedef float real;
#define KFN(name) name##_f32
#define KGEMM     cblas_sgemm
#define KEXP(x)   kexpf(x)
#define KLOG(x)   logf(x)
#define KSQRT(x)  sqrtf(x)
#endif

/* expf that GCC and clang vectorise inside loops: Cody-Waite range reduction to
 * r in [-ln2/2, ln2/2], a degree-6 polynomial (Taylor; max relative error ~2e-7, close to
 * float rounding), and 2^n built in the exponent bits. Inputs below -87 flush to 0, which
 * is what softmax needs for masked scores (-inf). */
static inline float kexpf(float x)
{
	x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
	float n = __builtin_roundf(x * 1.44269504088896341f);
	float r = x - n * 0.693359375f;
	r = r + n * 2.12194440e-4f;
	float p = 1.0f / 720.0f;
	p = p * r + 1.0f / 120.0f;
	p = p * r + 1.0f / 24.0f;
	p = p * r + 1.0f / 6.0f;
	p = p * r + 0.5f;
	p = p * r + 1.0f;
	p = p * r + 1.0f;
	union {
		float f;
		uint32_t u;
	} s;
	/* unsigned shift: a NaN input (whose n converts to garbage) must stay NaN through p,
	 * not be undefined behaviour here */
	s.u = (uint32_t)((int32_t)n + 127) << 23;
	float y = p * s.f;
	return x <= -87.0f ? 0.0f : y;
}

#endif
