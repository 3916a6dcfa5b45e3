/* ctitan plot RUN_DIR [--out DIR] [--compare RUN_DIR2]
 *
 * Reads RUN_DIR/metrics.jsonl and writes loss.png (training and validation loss), lr.png,
 * tps.png (tokens/s per rank and MFU) and memory.png (peak RSS and tracked memory by
 * category) into --out (default RUN_DIR), drawn by gnuplot (Debian's gnuplot-nox) from a
 * data file written next to them. With --compare, loss.png draws both runs' training and
 * validation losses, each labelled with its directory (e.g. fp32 against bf16). Where the run
 * has memory snapshots (RUN_DIR/memory_snapshot, or --memory-snapshot DIR), also
 * memory_timeline.png (cli/plot_memory). A mixture of experts' run (records with
 * moe_load_max_mean) also gets balance.png, the worst layer's max/mean expert load per step
 * and summed over the last 100 steps (moe_load_max_mean_w100) (with --compare, both runs'). Prints the paths it wrote. */
#include "cli/plot_cmd.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "cli/plot_memory.h"
#include "train/metrics.h"

/* Columns of plot.dat, in order. */
static const char *const plot_cols[] = {"step",
                                        "loss",
                                        "validation_loss",
                                        "lr",
                                        "tps",
                                        "mfu",
                                        "memory_peak_rss_gib",
                                        "memory_params_bytes",
                                        "memory_optimizer_bytes",
                                        "memory_activations_bytes",
                                        "moe_load_max_mean",
                                        "moe_load_max_mean_w100"};
#define PLOT_NCOLS (int)(sizeof(plot_cols) / sizeof(plot_cols[0]))

/* metrics.jsonl -> whitespace-separated columns ("NaN" where a record lacks a field). */
static int write_data(const char *jsonl, const char *dat, int *rows, int *val_rows,
                      int *load_rows)
{
	FILE *in = fopen(jsonl, "r");
	if (!in) {
		LOG_ERROR("plot: cannot open '%s': %s", jsonl, strerror(errno));
		return CT_ERR_USAGE;
	}
	FILE *out = fopen(dat, "w");
	if (!out) {
		LOG_ERROR("plot: cannot write '%s': %s", dat, strerror(errno));
		fclose(in);
		return CT_ERR_RUNTIME;
	}
	char *line = NULL;
	size_t cap = 0;
	int lineno = 0, rc = CT_OK;
	*rows = *val_rows = *load_rows = 0;
	while (getline(&line, &cap, in) > 0) {
		lineno++;
		cJSON *o = cJSON_Parse(line);
		if (!cJSON_IsObject(o) || !cJSON_IsNumber(cJSON_GetObjectItem(o, "step"))) {
			LOG_ERROR("plot: %s:%d is not a metrics record", jsonl, lineno);
			cJSON_Delete(o);
			rc = CT_ERR_RUNTIME;
			break;
		}
		for (int c = 0; c < PLOT_NCOLS; c++) {
			const cJSON *v = cJSON_GetObjectItem(o, plot_cols[c]);
			if (cJSON_IsNumber(v))
				fprintf(out, "%s%.10g", c ? " " : "", v->valuedouble);
			else
				fprintf(out, "%sNaN", c ? " " : "");
		}
		fprintf(out, "\n");
		*val_rows += cJSON_IsNumber(cJSON_GetObjectItem(o, "validation_loss"));
		*load_rows += cJSON_IsNumber(cJSON_GetObjectItem(o, "moe_load_max_mean"));
		(*rows)++;
		cJSON_Delete(o);
	}
	free(line);
	fclose(in);
	if (fclose(out) != 0)
		rc = CT_ERR_RUNTIME;
	if (!rc && *rows == 0) {
		LOG_ERROR("plot: '%s' has no records", jsonl);
		rc = CT_ERR_USAGE;
	}
	return rc;
}

/* The last path component of a run directory (its label in a comparison). */
static const char *run_label(const char *dir, char *b, size_t cap)
{
	size_t n = strlen(dir);
	while (n > 1 && dir[n - 1] == '/')
		n--;
	size_t i = n;
	while (i > 0 && dir[i - 1] != '/')
		i--;
	snprintf(b, cap, "%.*s", (int)(n - i), dir + i);
	for (char *c = b; *c; c++) /* gnuplot's title is a quoted string */
		if (*c == '\'' || *c == '\\')
			*c = '_';
	return b;
}

/* loss.png with two runs: each run's training loss, and its validation loss if it has one. */
static void plot_compare_loss(FILE *gp, const char *out, const char *dat, const char *run,
                              int val_rows, const char *dat2, const char *other, int val_rows2)
{
	char la[256], lb[256];
	const char *a = run_label(run, la, sizeof(la)), *b = run_label(other, lb, sizeof(lb));
	fprintf(gp,
	        "set output '%s/loss.png'\nset title 'loss: %s vs %s'\nset ylabel 'nats/token'\n"
	        "plot '%s' using 1:2 with lines lw 2 lc 1 title '%s train', "
	        "'%s' using 1:2 with lines lw 2 lc 2 title '%s train'",
	        out, a, b, dat, a, dat2, b);
	if (val_rows)
		fprintf(gp,
		        ", '%s' using 1:3 with linespoints lw 2 lc 1 pt 7 title '%s validation'",
		        dat, a);
	if (val_rows2)
		fprintf(gp,
		        ", '%s' using 1:3 with linespoints lw 2 lc 2 pt 5 title '%s validation'",
		        dat2, b);
	fprintf(gp, "\n");
}

int cmd_plot(int argc, char **argv)
{
	const char *run = NULL, *out = NULL, *other = NULL, *snap = NULL;
	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			printf("usage: ctitan plot RUN_DIR [--out DIR] [--compare RUN_DIR2] "
			       "[--memory-snapshot DIR]\n\n"
			       "Writes loss.png, lr.png, tps.png and memory.png from "
			       "RUN_DIR/metrics.jsonl (needs gnuplot).\n"
			       "--compare RUN_DIR2: loss.png also draws RUN_DIR2's losses.\n"
			       "balance.png: a mixture of experts' worst-layer max/mean expert load "
			       "(both runs with --compare).\n"
			       "memory_timeline.png: rank 0's tracked memory by category over the "
			       "last step\n"
			       "  with a memory snapshot in DIR (default RUN_DIR/memory_snapshot, "
			       "profiling.save_memory_snapshot_folder).\n");
			return 0;
		}
		if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
			out = argv[++i];
		else if (strcmp(argv[i], "--compare") == 0 && i + 1 < argc)
			other = argv[++i];
		else if (strcmp(argv[i], "--memory-snapshot") == 0 && i + 1 < argc)
			snap = argv[++i];
		else if (!run && strncmp(argv[i], "--", 2) != 0)
			run = argv[i];
		else {
			fprintf(stderr, "ctitan plot: unexpected argument '%s'\n", argv[i]);
			return 2;
		}
	}
	if (!run) {
		fprintf(stderr, "usage: ctitan plot RUN_DIR [--out DIR] [--compare RUN_DIR2] "
		                "[--memory-snapshot DIR]\n");
		return 2;
	}
	out = out ? out : run;
	if (metrics_mkdirs(out))
		return 1;
	char jsonl[1100], dat[1100], dat2[1100], snap_dir[1100], timeline[1200] = "";
	snprintf(jsonl, sizeof(jsonl), "%s/metrics.jsonl", run);
	snprintf(dat, sizeof(dat), "%s/plot.dat", out);
	int rows, val_rows, rows2 = 0, val_rows2 = 0, load_rows, load_rows2 = 0;
	int rc = write_data(jsonl, dat, &rows, &val_rows, &load_rows);
	if (!rc && other) {
		snprintf(jsonl, sizeof(jsonl), "%s/metrics.jsonl", other);
		snprintf(dat2, sizeof(dat2), "%s/plot-compare.dat", out);
		rc = write_data(jsonl, dat2, &rows2, &val_rows2, &load_rows2);
	}
	if (rc)
		return ct_exit_code(rc);
	FILE *gp = popen("gnuplot", "w");
	if (!gp) {
		LOG_ERROR("plot: cannot run gnuplot (install Debian's gnuplot-nox)");
		return 1;
	}
	/* one chart per file; columns are 1-based in plot_cols order */
	fprintf(gp, "set terminal pngcairo size 900,500 font ',11'\n"
	            "set grid\nset key top right\nset xlabel 'step'\n"
	            "set datafile missing 'NaN'\n");
	if (other)
		plot_compare_loss(gp, out, dat, run, val_rows, dat2, other, val_rows2);
	else
		fprintf(gp,
		        "set output '%s/loss.png'\nset title 'loss'\nset ylabel 'nats/token'\n"
		        "plot '%s' using 1:2 with lines lw 2 title 'train'%s\n",
		        out, dat,
		        val_rows ? ", '' using 1:3 with linespoints lw 2 pt 7 title 'validation'"
		                 : "");
	fprintf(gp,
	        "set output '%s/lr.png'\nset title 'learning rate'\nset ylabel 'lr'\n"
	        "plot '%s' using 1:4 with lines lw 2 notitle\n",
	        out, dat);
	fprintf(gp,
	        "set output '%s/tps.png'\nset title 'throughput'\nset ylabel 'tokens/s per rank'\n"
	        "set y2label 'MFU %%'\nset y2tics\n"
	        "plot '%s' using 1:5 with lines lw 2 title 'tokens/s', "
	        "'' using 1:6 axes x1y2 with lines lw 2 title 'MFU %%'\n"
	        "unset y2tics\nunset y2label\n",
	        out, dat);
	fprintf(gp,
	        "set output '%s/memory.png'\nset title 'memory (rank 0)'\nset ylabel 'GiB'\n"
	        "plot '%s' using 1:7 with lines lw 2 title 'peak RSS', "
	        "'' using 1:($8/2**30) with lines title 'params', "
	        "'' using 1:($9/2**30) with lines title 'optimizer', "
	        "'' using 1:($10/2**30) with lines title 'activations'\n",
	        out, dat);
	if (load_rows) { /* a mixture of experts: the worst layer's max / mean expert load */
		char la[256], lb[256];
		fprintf(gp,
		        "set output '%s/balance.png'\nset title 'expert load balance (worst "
		        "layer)'\nset ylabel 'max / mean tokens per expert'\n"
		        "plot '%s' using 1:11 with lines lw 2 title '%s, per step' noenhanced, "
		        "'' using 1:12 with lines lw 2 dt 2 title '%s, over the last 100 steps' "
		        "noenhanced",
		        out, dat, run_label(run, la, sizeof(la)), la);
		if (load_rows2)
			fprintf(gp,
			        ", '%s' using 1:11 with lines lw 2 title '%s, per step' noenhanced, '' "
			        "using 1:12 with lines lw 2 dt 2 title '%s, over the last 100 steps' "
			        "noenhanced",
			        dat2, run_label(other, lb, sizeof(lb)), lb);
		fprintf(gp, "\n");
	}
	if (!snap) {
		snprintf(snap_dir, sizeof(snap_dir), "%s/memory_snapshot", run);
		snap = snap_dir;
	}
	int drawn = plot_memory_timeline(gp, snap, out, timeline, sizeof(timeline));
	if (pclose(gp) != 0) {
		LOG_ERROR("plot: gnuplot failed (is Debian's gnuplot-nox installed?)");
		return 1;
	}
	static const char *const names[] = {"loss", "lr", "tps", "memory"};
	for (int i = 0; i < 4; i++)
		printf("%s/%s.png\n", out, names[i]);
	if (load_rows)
		printf("%s/balance.png\n", out);
	if (drawn > 0)
		printf("%s\n", timeline);
	return drawn < 0 ? ct_exit_code(drawn) : 0;
}
