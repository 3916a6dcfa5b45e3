#define _GNU_SOURCE
#include "base/cpu.h"

#include <cpuid.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"

static struct cpu_info g_cpu;
static int g_cpu_done;

static uint64_t cpu_xgetbv0(void)
{
	uint32_t lo, hi;
	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return ((uint64_t)hi << 32) | lo;
}

static double cpu_clock_sysfs(void)
{
	FILE *f = fopen("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "r");
	if (!f)
		return 0;
	long khz = 0;
	if (fscanf(f, "%ld", &khz) != 1)
		khz = 0;
	fclose(f);
	return (double)khz / 1e6;
}

/* The nominal clock from the invariant TSC (it ticks at the base frequency whether or not this
 * thread runs, so the figure holds on a loaded machine): ticks per wall second over 20 ms. */
static double cpu_clock_tsc(void)
{
	uint32_t a, b, cx, d;
	__cpuid(0x80000000, a, b, cx, d);
	if (a < 0x80000007)
		return 0;
	__cpuid(0x80000007, a, b, cx, d);
	if (!(d & (1u << 8)))
		return 0;
	double t0 = timer_now();
	uint64_t c0 = __builtin_ia32_rdtsc();
	while (timer_now() - t0 < 0.02)
		;
	uint64_t c1 = __builtin_ia32_rdtsc();
	double t1 = timer_now();
	return (double)(c1 - c0) / (t1 - t0) / 1e9;
}

/* The clock the core runs at now (turbo included): a chain of dependent adds runs one per
 * cycle on every x86 core we know, so adds / seconds is the clock. Short bursts (~0.25 ms), the
 * fastest of 40: on a loaded machine most bursts still run uninterrupted. */
static double cpu_clock_measured(void)
{
	double best = 0;
	for (int r = 0; r < 40; r++) {
		uint64_t x = 0, iters = 100000;
		double t = timer_now();
		for (uint64_t i = 0; i < iters; i++)
			__asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
			                 "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0"
			                 : "+r"(x));
		t = timer_now() - t;
		double ghz = (double)x / t / 1e9;
		if (ghz > best)
			best = ghz;
	}
	return best;
}

static void cpu_detect(struct cpu_info *c)
{
	uint32_t a, b, cx, d;
	memset(c, 0, sizeof(*c));
	__cpuid(0, a, b, cx, d);
	uint32_t max_leaf = a;
	memcpy(c->vendor, &b, 4);
	memcpy(c->vendor + 4, &d, 4);
	memcpy(c->vendor + 8, &cx, 4);
	__cpuid(1, a, b, cx, d);
	int fam = (a >> 8) & 0xf, mod = (a >> 4) & 0xf;
	if (fam == 0xf)
		fam += (a >> 20) & 0xff;
	if (fam >= 6)
		mod += ((a >> 16) & 0xf) << 4;
	c->family = fam;
	c->model = mod;
	bool osxsave = cx & (1u << 27), fma = cx & (1u << 12);
	uint64_t xcr0 = osxsave ? cpu_xgetbv0() : 0;
	bool os_ymm = (xcr0 & 0x6) == 0x6, os_zmm = (xcr0 & 0xe6) == 0xe6;
	bool os_amx = (xcr0 & 0x60000) == 0x60000;
	if (max_leaf >= 7) {
		__cpuid_count(7, 0, a, b, cx, d);
		c->avx2 = os_ymm && (b & (1u << 5)) && fma;
		c->fma = os_ymm && fma;
		/* F(16) DQ(17) BW(30) VL(31) */
		c->avx512 = os_zmm && (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) &&
		            (b & (1u << 31));
		c->amx_bf16 = os_amx && (d & (1u << 22)) && (d & (1u << 24));
		__cpuid_count(7, 1, a, b, cx, d);
		c->avx512_bf16 = c->avx512 && (a & (1u << 5));
	}
	__cpuid(0x80000000, a, b, cx, d);
	if (a >= 0x80000004) {
		uint32_t r[12];
		for (uint32_t i = 0; i < 3; i++)
			__cpuid(0x80000002 + i, r[4 * i], r[4 * i + 1], r[4 * i + 2], r[4 * i + 3]);
		memcpy(c->brand, r, 48);
		char *s = c->brand;
		while (*s == ' ')
			s++;
		memmove(c->brand, s, strlen(s) + 1);
		for (int64_t n = (int64_t)strlen(c->brand); n > 0 && c->brand[n - 1] == ' '; n--)
			c->brand[n - 1] = 0;
	}
	cpu_set_t set;
	c->cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;

	/* FLOP/cycle/core from the vector units. AVX-512: two 512-bit FMA pipes on Xeon Gold /
	 * Platinum and AMD Zen 5 (64 fp32 FLOP/cycle); Zen 4 runs AVX-512 on 256-bit pipes (32).
	 * AVX512-BF16 (vdpbf16ps) doubles the fp32 rate; AMX-BF16 does 1,024 per cycle. */
	bool amd = strcmp(c->vendor, "AuthenticAMD") == 0;
	if (c->avx512 && !(amd && c->family < 0x1a)) {
		c->fp32_flops_cycle = 64;
		c->fp32_isa = "AVX-512 (2 FMA units)";
	} else if (c->avx2 || c->avx512) {
		c->fp32_flops_cycle = 32;
		c->fp32_isa = c->avx512 ? "AVX-512 on 256-bit units" : "AVX2+FMA";
	} else {
		c->fp32_flops_cycle = 8;
		c->fp32_isa = "SSE";
	}
	if (c->amx_bf16) {
		c->bf16_flops_cycle = 1024;
		c->bf16_isa = "AMX-BF16";
	} else if (c->avx512_bf16) {
		c->bf16_flops_cycle = 2 * c->fp32_flops_cycle;
		c->bf16_isa = "AVX512-BF16";
	} else {
		c->bf16_flops_cycle = c->fp32_flops_cycle;
		c->bf16_isa = "no bf16 hardware (fp32 units)";
	}

}

const struct cpu_info *cpu_info(void)
{
	if (!__atomic_load_n(&g_cpu_done, __ATOMIC_ACQUIRE)) {
		struct cpu_info c;
		cpu_detect(&c);
		g_cpu = c;
		__atomic_store_n(&g_cpu_done, 1, __ATOMIC_RELEASE);
	}
	return &g_cpu;
}

/* The clock is found only when a peak is asked for (the measured loop takes ~50 ms). */
static void cpu_clock(struct cpu_info *c)
{
	if (c->clock_ghz > 0)
		return;
	uint32_t a, b, cx, d;
	__cpuid(0, a, b, cx, d);
	c->clock_ghz = cpu_clock_sysfs();
	c->clock_source = "sysfs cpuinfo_max_freq";
	if (c->clock_ghz <= 0 && a >= 0x16) {
		__cpuid(0x16, a, b, cx, d);
		c->clock_ghz = (double)(b & 0xffff) / 1e3;
		c->clock_source = "cpuid 0x16 max MHz";
	}
	if (c->clock_ghz <= 0) {
		/* the running clock, unless preemption spoilt every burst: then the nominal one */
		double run = cpu_clock_measured(), tsc = cpu_clock_tsc();
		c->clock_ghz = run > 0.9 * tsc ? run : tsc;
		c->clock_source = run > 0.9 * tsc ? "measured: dependent-add loop, turbo included"
		                                  : "invariant TSC rate (nominal)";
	}
}

static int64_t cpu_clamp_threads(const struct cpu_info *c, int64_t threads)
{
	return threads < 1 ? 1 : (threads > c->cores ? c->cores : threads);
}

double cpu_peak_flops(bool bf16, int64_t threads)
{
	cpu_info();
	struct cpu_info *c = &g_cpu;
	cpu_clock(c);
	return (bf16 ? c->bf16_flops_cycle : c->fp32_flops_cycle) *
	       (double)cpu_clamp_threads(c, threads) * c->clock_ghz * 1e9;
}

void cpu_peak_describe(bool bf16, int64_t threads, char *buf, int64_t len)
{
	cpu_info();
	struct cpu_info *c = &g_cpu;
	cpu_clock(c);
	snprintf(buf, (size_t)len, "%s %s: %.0f FLOP/cycle/core x %lld cores x %.2f GHz (%s)",
	         bf16 ? "bf16" : "fp32", bf16 ? c->bf16_isa : c->fp32_isa,
	         bf16 ? c->bf16_flops_cycle : c->fp32_flops_cycle,
	         (long long)cpu_clamp_threads(c, threads), c->clock_ghz, c->clock_source);
}
