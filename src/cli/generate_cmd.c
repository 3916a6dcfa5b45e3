/* ctitan generate CONFIG [--section.key=value ...] [--prompt-ids 1,2,3] [--max-new-tokens N]
 *                 [--temperature X] [--top-k K] [--seed S] [--mixer-mode M] [--model-kind K]
 * Loads the model's newest (or checkpoint.load_step) checkpoint from
 * <job.dump_folder>/<checkpoint.folder> on one process, with any number of ranks having saved
 * it, and generates with the decoder of the model's family (infer/generator: Llama with a
 * KV cache, Hyena with an online long convolution). The config ([model] name) says which. */
#include "cli/generate_cmd.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "comm/comm.h"
#include "data/tokenizer.h"
#include "infer/generator.h"
#include "infer/online_conv.h"
#include "io/config.h"
#include "train/checkpoint.h"
#include "train/model_spec.h"
#include "train/trainer.h"

struct gen_args {
	const char *prompt_ids, *prompt;
	const char *checkpoint; /* a step folder, or a checkpoint folder (its newest step) */
	const char *root;       /* resolved from checkpoint: the checkpoint folder ... */
	int64_t step;           /* ... and the step (-1: newest) */
	struct gen_opts o;
	const char *model_kind; /* NULL, or what the user expects the checkpoint to hold */
	struct generator_opts x; /* --mixer-mode, --flash-threshold (long convolutions) */
};

static void gen_usage(FILE *f)
{
	char kinds[128];
	generator_names(kinds, sizeof(kinds), " | ");
	fprintf(f,
	        "usage: ctitan generate CONFIG.toml [--section.key=value ...] [options]\n"
	        "       ctitan generate --checkpoint DIR [--section.key=value ...] [options]\n\n"
	        "Samples from the newest checkpoint in <job.dump_folder>/<checkpoint.folder>\n"
	        "(or checkpoint.load_step).\n\n"
	        "options:\n"
	        "  --checkpoint DIR      a step-NNNNNNNN folder, or a folder of them (newest);\n"
	        "                        its config.toml and tokenizer.model are used\n"
	        "  --prompt TEXT         text to continue (needs a tokenizer)\n"
	        "  --prompt-ids IDS      comma-separated token ids to start from\n"
	        "  --max-new-tokens N    tokens to generate (default 64; also --max-tokens)\n"
	        "  --temperature X       0 = greedy (default 0.8)\n"
	        "  --top-k K             sample among the K most likely, 0 = all (default 40)\n"
	        "  --top-p P             then among the most likely up to mass P (default 1)\n"
	        "  --seed S              sampling seed (default 0)\n"
	        "  --model-kind K        %s: fail unless the checkpoint holds that\n"
	        "                        family (its config's [model] name decides)\n"
	        "  --mixer-mode M        Hyena long convolutions: lazy | eager | recompute |\n"
	        "                        flash (default; all give the same logits)\n"
	        "  --flash-threshold T   Hyena flash: tiles up to T wide as direct sums\n"
	        "                        (default 32)\n",
	        kinds);
}

/* Split argv into generate options and config overrides (kept in place, compacted). */
static int parse_gen_args(int *argc, char **argv, struct gen_args *a)
{
	int out = 0;
	for (int i = 0; i < *argc; i++) {
		const char *k = argv[i];
		bool mine = strcmp(k, "--prompt-ids") == 0 || strcmp(k, "--prompt") == 0 ||
		            strcmp(k, "--checkpoint") == 0 || strcmp(k, "--top-p") == 0 ||
		            strcmp(k, "--max-tokens") == 0 || strcmp(k, "--max-new-tokens") == 0 ||
		            strcmp(k, "--temperature") == 0 || strcmp(k, "--top-k") == 0 ||
		            strcmp(k, "--seed") == 0 || strcmp(k, "--model-kind") == 0 ||
		            strcmp(k, "--mixer-mode") == 0 || strcmp(k, "--flash-threshold") == 0;
		if (!mine) {
			argv[out++] = argv[i];
			continue;
		}
		if (i + 1 >= *argc) {
			LOG_ERROR("%s: missing value", k);
			return CT_ERR_USAGE;
		}
		const char *v = argv[++i];
		char *end;
		if (strcmp(k, "--prompt-ids") == 0) {
			a->prompt_ids = v;
			continue;
		}
		if (strcmp(k, "--prompt") == 0) {
			a->prompt = v;
			continue;
		}
		if (strcmp(k, "--checkpoint") == 0) {
			a->checkpoint = v;
			continue;
		}
		if (strcmp(k, "--model-kind") == 0) {
			const struct generator *gen = generator_of(v);
			if (!gen) {
				char kinds[128];
				generator_names(kinds, sizeof(kinds), " or ");
				LOG_ERROR("--model-kind: '%s' is not %s", v, kinds);
				return CT_ERR_USAGE;
			}
			a->model_kind = gen->family;
			continue;
		}
		if (strcmp(k, "--mixer-mode") == 0) {
			enum oc_mode m;
			if (oc_mode_parse(v, &m)) {
				LOG_ERROR(
				    "--mixer-mode: '%s' is not lazy, eager, recompute or flash", v);
				return CT_ERR_USAGE;
			}
			a->x.mixer_mode = v;
			continue;
		}
		bool integer = strcmp(k, "--temperature") != 0 && strcmp(k, "--top-p") != 0;
		if (integer) { /* counts and the seed: whole numbers, exactly */
			errno = 0;
			unsigned long long u = strtoull(v, &end, 10);
			bool is_seed = strcmp(k, "--seed") == 0;
			if (*end || end == v || v[0] == '-' || v[0] == '+' || errno == ERANGE ||
			    (!is_seed && u > (unsigned long long)INT32_MAX)) {
				LOG_ERROR("%s: expected a whole number in 0..%s, got '%s'", k,
				          is_seed ? "2^64-1" : "2^31-1", v);
				return CT_ERR_USAGE;
			}
			if (strcmp(k, "--max-new-tokens") == 0 || strcmp(k, "--max-tokens") == 0)
				a->o.max_new_tokens = (int64_t)u;
			else if (strcmp(k, "--top-k") == 0)
				a->o.top_k = (int64_t)u;
			else if (strcmp(k, "--flash-threshold") == 0)
				a->x.flash_thr = (int64_t)u;
			else
				a->o.seed = (uint64_t)u;
			continue;
		}
		double x = strtod(v, &end);
		bool top_p = strcmp(k, "--top-p") == 0;
		if (*end || end == v || !isfinite(x) || x < 0 || (top_p && !(x > 0 && x <= 1))) {
			LOG_ERROR("%s: expected %s, got '%s'", k,
			          top_p ? "a number in (0, 1]" : "a finite non-negative number", v);
			return CT_ERR_USAGE;
		}
		if (top_p)
			a->o.top_p = x;
		else
			a->o.temperature = x;
	}
	*argc = out;
	return CT_OK;
}

static int parse_ids(const char *s, int64_t vocab, int32_t **ids, int64_t *n)
{
	*n = 0;
	*ids = xcalloc(strlen(s) + 1, sizeof(int32_t));
	const char *p = s;
	while (*p) {
		char *end;
		long v = strtol(p, &end, 10);
		if (end == p || v < 0 || v >= vocab || (*end && *end != ',')) {
			LOG_ERROR(
			    "--prompt-ids: '%s' is not a list of ids below the vocabulary (%lld)",
			    s, (long long)vocab);
			return CT_ERR_USAGE;
		}
		(*ids)[(*n)++] = (int32_t)v;
		p = *end ? end + 1 : end;
	}
	return *n ? CT_OK : CT_ERR_USAGE;
}

static int generate_run(const struct ct_config *cfg, const struct gen_args *a)
{
	struct model_config spec;
	int rc = model_spec_from_config(cfg, &spec);
	if (rc)
		return rc;
	if (a->model_kind && strcmp(a->model_kind, model_kind_name(spec.kind)) != 0) {
		LOG_ERROR("--model-kind %s: the checkpoint's config holds a %s model",
		          a->model_kind, model_kind_name(spec.kind));
		return CT_ERR_USAGE;
	}
	const struct generator *gen = generator_of(model_kind_name(spec.kind));
	if (!gen) {
		LOG_ERROR("generate: model.name = \"%s\": not yet supported (no decoder)",
		          model_kind_name(spec.kind));
		return CT_ERR_USAGE;
	}
	if (!gen->mixer_opts && (a->x.mixer_mode || a->x.flash_thr >= 0)) {
		LOG_ERROR("--mixer-mode / --flash-threshold: only for Hyena models (this is %s)",
		          model_kind_name(spec.kind));
		return CT_ERR_USAGE;
	}
	const int64_t vocab = model_config_vocab(&spec);
	struct param_table t;
	rc = model_table_build(&t, &spec);
	if (rc)
		return rc;
	float *params = mem_alloc(MEM_PARAMS, (size_t)t.numel * sizeof(float));
	char root[1100];
	int64_t step = a->step;
	if (a->root)
		snprintf(root, sizeof(root), "%s", a->root);
	else
		snprintf(root, sizeof(root), "%s/%s", cfg->job.dump_folder, cfg->checkpoint.folder);
	int32_t *prompt = NULL, *out = NULL;
	if (step < 0)
		rc = ckpt_find(root, a->root ? -1 : cfg->checkpoint.load_step, &step);
	if (!rc && step < 0) {
		LOG_ERROR("generate: no checkpoint in '%s' (train with --checkpoint.enable=true)",
		          root);
		rc = CT_ERR_USAGE;
	}
	if (!rc)
		rc = ckpt_load_params(root, step, &spec, &t, params);
	int64_t n_prompt = 0;
	struct tok_tokenizer *tok = NULL;
	struct tok_ids ids = {0};
	struct tok_bytes text = {0};
	if (!rc && cfg->model.tokenizer_path[0])
		rc = tok_load(&tok, cfg->model.tokenizer_path);
	if (!rc && a->prompt && !tok) {
		LOG_ERROR("--prompt needs model.tokenizer_path (or use --prompt-ids)");
		rc = CT_ERR_USAGE;
	}
	if (!rc && a->prompt) {
		/* a document starts with <|begin_of_text|>, as in training */
		int32_t bos = tok_special_id(tok, "<|begin_of_text|>");
		if (bos >= 0) {
			ids.v = xcalloc(1, sizeof(int32_t));
			ids.v[0] = bos;
			ids.n = ids.cap = 1;
		}
		rc = tok_encode(tok, a->prompt, strlen(a->prompt), &ids);
		prompt = ids.v;
		n_prompt = ids.n;
		ids.v = NULL;
	} else if (!rc) {
		int32_t bos = tok ? tok_special_id(tok, "<|begin_of_text|>") : -1;
		char dflt[16];
		snprintf(dflt, sizeof(dflt), "%d", bos >= 0 ? bos : 0);
		rc = parse_ids(a->prompt_ids ? a->prompt_ids : dflt, vocab, &prompt, &n_prompt);
	}
	if (!rc && n_prompt == 0) {
		LOG_ERROR("generate: empty prompt");
		rc = CT_ERR_USAGE;
	}
	if (!rc) {
		struct gen_opts o = a->o;
		o.stop_id = tok ? tok_special_id(tok, "<|end_of_text|>") : -1;
		out = xcalloc((size_t)o.max_new_tokens + 1, sizeof(int32_t));
		int64_t n = 0;
		rc = gen->generate(&spec, &t, params, prompt, n_prompt, &o, &a->x, out, &n);
		if (rc) {
			/* nothing generated */
		} else if (tok) {
			/* print the text; special tokens (BOS/EOS) are not shown */
			for (int64_t i = 0; i < n_prompt + n; i++) {
				int32_t id = i < n_prompt ? prompt[i] : out[i - n_prompt];
				if (id < tok_n_vocab(tok))
					rc = rc ? rc : tok_decode(tok, &id, 1, &text);
			}
			fwrite(text.v, 1, text.n, stdout);
			printf("\n");
		} else {
			printf("prompt:");
			for (int64_t i = 0; i < n_prompt; i++)
				printf(" %d", prompt[i]);
			printf("\ngenerated:");
			for (int64_t i = 0; i < n; i++)
				printf(" %d", out[i]);
			printf("\n");
		}
	}
	tok_ids_free(&ids);
	tok_bytes_free(&text);
	if (tok)
		tok_free(tok);
	free(prompt), free(out);
	mem_free(MEM_PARAMS, params, (size_t)t.numel * sizeof(float));
	param_table_free(&t);
	return rc;
}

int cmd_generate(int argc, char **argv)
{
	for (int i = 0; i < argc; i++)
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			gen_usage(stdout);
			return 0;
		}
	struct gen_args a = {.step = -1,
	                     .x = {.flash_thr = -1},
	                     .o = {.max_new_tokens = 64,
	                           .temperature = 0.8,
	                           .top_k = 40,
	                           .top_p = 1.0,
	                           .seed = 0,
	                           .stop_id = -1}};
	/* CONFIG.toml is optional with --checkpoint (the checkpoint carries its config) */
	const char *config_path = argc >= 1 && strncmp(argv[0], "--", 2) != 0 ? argv[0] : NULL;
	int first = config_path ? 1 : 0, n = argc - first;
	int rc = parse_gen_args(&n, argv + first, &a);
	if (!rc && !config_path && !a.checkpoint) {
		gen_usage(stderr);
		return 2;
	}
	struct ct_config cfg;
	config_defaults(&cfg);
	char root[1100], stepdir[1200], path[CONFIG_STR_MAX];
	if (!rc && a.checkpoint) {
		rc = ckpt_resolve(a.checkpoint, root, sizeof(root), &a.step);
		a.root = root;
		snprintf(stepdir, sizeof(stepdir), "%s/step-%08lld", root, (long long)a.step);
	}
	if (!rc && config_path) {
		rc = config_load_file(&cfg, config_path);
	} else if (!rc) {
		if (snprintf(path, sizeof(path), "%s/config.toml", stepdir) >= (int)sizeof(path)) {
			LOG_ERROR("--checkpoint: path too long");
			rc = CT_ERR_USAGE;
		} else {
			rc = config_load_file(&cfg, path);
		}
	}
	if (!rc && a.checkpoint) {
		int len = snprintf(path, sizeof(path), "%s/tokenizer.model", stepdir);
		if (len < (int)sizeof(path) && access(path, R_OK) == 0) /* the checkpoint's copy */
			memcpy(cfg.model.tokenizer_path, path, (size_t)len + 1);
	}
	if (!rc)
		rc = config_apply_args(&cfg, n, argv + first);
	if (!rc)
		rc = config_validate(&cfg);
	if (!rc) {
		rc = comm_init(&argc, &argv);
		if (!rc) {
			rc = generate_run(&cfg, &a);
			comm_finalize();
		}
	}
	return ct_exit_code(rc);
}
