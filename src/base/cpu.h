/* base/cpu: what this CPU can do, read from cpuid/xgetbv (never from a model-name table), and
 * the theoretical peak FLOP rate derived from it.
 *
 * cpu_info() fills a process-wide struct once (call it first from one thread: the engine's
 * start-up guard does). The peak is features x cores x clock; the clock comes from the
 * first of: /sys cpufreq cpuinfo_max_freq, cpuid leaf 0x16 (max MHz), a measured dependent
 * integer-add loop (one add per cycle: the running clock, turbo included; short bursts, the
 * fastest kept, so load does not bias it), else the invariant TSC's rate (the nominal clock);
 * the struct says which.
 */
#ifndef CT_BASE_CPU_H
#define CT_BASE_CPU_H

#include <stdbool.h>
#include <stdint.h>

struct cpu_info {
	char vendor[13];    /* "GenuineIntel", "AuthenticAMD", ... */
	char brand[49];     /* cpuid brand string, trimmed */
	int family, model;  /* display family / model */
	bool avx2, fma;     /* AVX2 + FMA3 with OS support for YMM state */
	bool avx512;        /* AVX-512 F+BW+VL+DQ with OS support for ZMM state */
	bool avx512_bf16;   /* vdpbf16ps */
	bool amx_bf16;      /* AMX tiles + bf16 with OS support for tile state (XCR0 17,18) */
	int64_t cores;      /* online logical CPUs this process may run on */
	double clock_ghz;         /* 0 until a peak is asked for */
	const char *clock_source; /* where clock_ghz came from */
	double fp32_flops_cycle;  /* per core: AVX-512 2 FMA 64, AVX2 32, ... */
	double bf16_flops_cycle;  /* per core: AMX 1024, AVX512-BF16 128, else = fp32 */
	const char *fp32_isa, *bf16_isa; /* what the per-cycle figures assume */
};

const struct cpu_info *cpu_info(void);
/* Theoretical peak of `threads` cores (clamped to the cores) for matmuls in fp32 or bf16,
 * FLOP/s. */
double cpu_peak_flops(bool bf16, int64_t threads);
/* One line: "<isa> <F> FLOP/cycle/core x <n> cores x <g> GHz (<clock source>)". */
void cpu_peak_describe(bool bf16, int64_t threads, char *buf, int64_t len);

#endif
