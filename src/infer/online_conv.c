/* infer/online_conv: see online_conv.h. The engine is written once in online_conv_impl.h and
 * instantiated here for float (FFTW single precision) and double (FFTW double precision). */
#include "infer/online_conv.h"

#include <fftw3.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/log.h"

static const char *const oc_mode_names[] = {"lazy", "eager", "recompute", "flash"};
_Static_assert(sizeof(oc_mode_names) / sizeof(oc_mode_names[0]) == OC_MODE_COUNT,
               "one name per mode");

const char *oc_mode_name(enum oc_mode m)
{
	return m >= 0 && m < OC_MODE_COUNT ? oc_mode_names[m] : "?";
}

int oc_mode_parse(const char *s, enum oc_mode *m)
{
	for (int i = 0; i < OC_MODE_COUNT; i++)
		if (strcmp(s, oc_mode_names[i]) == 0) {
			*m = (enum oc_mode)i;
			return 0;
		}
	return -1;
}

#define OC_REAL       float
#define OC_S(name)    name##_f32
#define OC_FFTW(name) fftwf_##name
#include "infer/online_conv_impl.h"
#undef OC_REAL
#undef OC_S
#undef OC_FFTW

#define OC_REAL       double
#define OC_S(name)    name##_f64
#define OC_FFTW(name) fftw_##name
#include "infer/online_conv_impl.h"
#undef OC_REAL
#undef OC_S
#undef OC_FFTW
