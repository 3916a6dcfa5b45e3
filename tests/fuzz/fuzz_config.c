/* tests/fuzz/fuzz_config: libFuzzer harness for io/config (not part of the CMake build).
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Isrc tests/fuzz/fuzz_config.c \
 *         src/io/config*.c src/base/log.c -lm -o /tmp/fuzz_config
 *   mkdir -p /tmp/fuzz_config_corpus
 *   /tmp/fuzz_config -max_total_time=60 -close_fd_mask=2 /tmp/fuzz_config_corpus
 *
 * (-close_fd_mask=2 silences the parser's error messages; crash reports still show.)
 *
 * The first byte picks what the rest is:
 *   even: a TOML document for config_load_string;
 *   odd:  an argv for config_apply_args, one argument per NUL-separated piece.
 * Besides "no crash, no leak, no undefined behaviour", it checks three properties:
 *   - a failed load leaves the config exactly as it was;
 *   - a successful load gives a config that config_print writes and config_load_string
 *     reads back to the identical struct;
 *   - config_validate never crashes on what a load produced.
 */
#include "io/config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_MAX_ARGS 64

static void fuzz_roundtrip(const struct ct_config *cfg)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		abort();
	config_print(cfg, f);
	fclose(f);
	struct ct_config back;
	config_defaults(&back);
	if (config_load_string(&back, text, len, "printed") != 0)
		__builtin_trap(); /* config_print wrote something we cannot read */
	if (memcmp(&back, cfg, sizeof(back)) != 0)
		__builtin_trap(); /* the round trip changed a value */
	free(text);
}

static int fuzz_args(struct ct_config *cfg, const uint8_t *data, size_t size)
{
	char *buf = malloc(size + 1);
	char *argv[FUZZ_MAX_ARGS];
	int argc = 0;
	if (!buf)
		abort();
	memcpy(buf, data, size);
	buf[size] = '\0';
	for (char *p = buf; p <= buf + size && argc < FUZZ_MAX_ARGS; p += strlen(p) + 1)
		argv[argc++] = p;
	int rc = config_apply_args(cfg, argc, argv);
	free(buf);
	return rc;
}

/* One added key of each type, so the path of added keys (config_add_keys) is fuzzed too. */
static const struct config_key_def fuzz_keys[] = {
    {.name = "fz_int", .type = CONFIG_INT, .def = "-1", CONFIG_UNSET_OR_GE(2), .help = "int"},
    {.name = "fz_float", .type = CONFIG_FLOAT, .def = "-1", CONFIG_UNSET_OR_GT(0), .help = "f"},
    {.name = "fz_str", .type = CONFIG_STRING, .def = "a", CONFIG_CHOICES("a", "b"), .help = "s"},
    {.name = "fz_bool", .type = CONFIG_BOOL, .def = "false", .help = "bool"},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ct_config cfg, before;
	if (size == 0)
		return 0;
	static bool added;
	if (!added) /* keys added as a layer above adds them (a model family's) */
		config_add_keys("model", fuzz_keys, sizeof(fuzz_keys) / sizeof(fuzz_keys[0]));
	added = true;
	config_defaults(&cfg);
	memcpy(&before, &cfg, sizeof(cfg));
	int rc = data[0] & 1 ? fuzz_args(&cfg, data + 1, size - 1)
	                     : config_load_string(&cfg, (const char *)data + 1, size - 1, "fuzz");
	if (rc != 0) {
		if (memcmp(&cfg, &before, sizeof(cfg)) != 0)
			__builtin_trap(); /* a failed load changed the config */
		return 0;
	}
	(void)config_validate(&cfg);
	fuzz_roundtrip(&cfg);
	return 0;
}
