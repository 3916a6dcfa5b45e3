#include "cli/plot_memory.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "io/file.h"

/* FOLDER/iteration_<step>[_exit]: the highest step, an _exit folder winning a tie. */
static bool find_snapshot(const char *folder, char *path, size_t cap)
{
	DIR *d = opendir(folder);
	if (!d)
		return false;
	long long best = -1;
	bool best_exit = false;
	char name[512] = "";
	for (struct dirent *e; (e = readdir(d));) {
		long long step;
		int n = 0;
		if (sscanf(e->d_name, "iteration_%lld%n", &step, &n) != 1 || step < 0)
			continue;
		bool is_exit = strcmp(e->d_name + n, "_exit") == 0;
		if (e->d_name[n] && !is_exit)
			continue;
		if (step > best || (step == best && is_exit && !best_exit)) {
			best = step;
			best_exit = is_exit;
			snprintf(name, sizeof(name), "%s", e->d_name);
		}
	}
	closedir(d);
	if (best < 0)
		return false;
	snprintf(path, cap, "%s/%s/rank0_memory_snapshot.json", folder, name);
	return true;
}

/* gnuplot's titles are single-quoted strings */
static void put_title(FILE *gp, const char *s)
{
	for (; *s; s++)
		fputc(*s == '\'' || *s == '\\' ? '_' : *s, gp);
}

static int bad_snapshot(const char *path, const char *what)
{
	LOG_ERROR("plot: %s: %s", path, what);
	return CT_ERR_RUNTIME;
}

int plot_memory_timeline(FILE *gp, const char *folder, const char *out, char *png, size_t cap)
{
	char path[1200], dat[1200];
	if (!find_snapshot(folder, path, sizeof(path)))
		return 0;
	char *text;
	size_t len;
	if (io_read_file(path, &text, &len) != CT_OK) {
		LOG_ERROR("plot: cannot read '%s': %s", path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	cJSON *js = cJSON_Parse(text);
	free(text);
	const cJSON *cats = cJSON_GetObjectItem(js, "categories");
	const cJSON *samples = cJSON_GetObjectItem(js, "samples");
	const cJSON *step = cJSON_GetObjectItem(js, "step");
	int nc = cJSON_GetArraySize(cats);
	int rc = CT_OK;
	if (!cJSON_IsArray(cats) || nc < 1 || !cJSON_IsArray(samples) ||
	    cJSON_GetArraySize(samples) < 1 || !cJSON_IsNumber(step)) {
		rc = bad_snapshot(path, "not a memory snapshot");
		goto out;
	}
	/* columns: t, then the running sums of the categories (the stack's upper edges) */
	bool *used = calloc((size_t)nc, sizeof(bool));
	double *sum = calloc((size_t)nc, sizeof(double));
	snprintf(dat, sizeof(dat), "%s/memory_timeline.dat", out);
	FILE *f = fopen(dat, "w");
	CHECK(used && sum, "out of memory");
	if (!f) {
		LOG_ERROR("plot: cannot write '%s': %s", dat, strerror(errno));
		rc = CT_ERR_RUNTIME;
		goto out_free;
	}
	double peak = -1, peak_t = 0, t_first = 0, t_last = 0;
	bool any = false;
	const char *peak_node = "";
	const cJSON *s;
	cJSON_ArrayForEach(s, samples)
	{
		const cJSON *t = cJSON_GetObjectItem(s, "t"), *b = cJSON_GetObjectItem(s, "bytes");
		const cJSON *node = cJSON_GetObjectItem(s, "node");
		if (!cJSON_IsNumber(t) || !cJSON_IsArray(b) || cJSON_GetArraySize(b) != nc) {
			rc = bad_snapshot(path, "a sample without t or a byte count per category");
			break;
		}
		double acc = 0;
		for (int c = 0; c < nc; c++) {
			double v = cJSON_GetArrayItem(b, c)->valuedouble;
			used[c] |= v > 0;
			acc += v / (1024.0 * 1024.0 * 1024.0);
			sum[c] = acc;
		}
		t_first = any ? t_first : t->valuedouble;
		t_last = t->valuedouble;
		any = true;
		if (acc > peak) {
			peak = acc;
			peak_t = t->valuedouble;
			peak_node = cJSON_IsString(node) ? node->valuestring : "";
		}
		fprintf(f, "%.9f", t->valuedouble);
		for (int c = 0; c < nc; c++)
			fprintf(f, " %.9g", sum[c]);
		fprintf(f, "\n");
	}
	if (fclose(f) != 0 && !rc)
		rc = bad_snapshot(dat, "write failed");
	if (rc)
		goto out_free;
	const cJSON *reason = cJSON_GetObjectItem(js, "reason");
	bool failed = cJSON_IsString(reason) && strcmp(reason->valuestring, "alloc_failure") == 0;
	snprintf(png, cap, "%s/memory_timeline.png", out);
	long long st = (long long)step->valuedouble;
	char what[64];
	if (failed && st == 0)
		snprintf(what, sizeof(what), "allocation failure during setup");
	else
		snprintf(what, sizeof(what), "%s %lld", failed ? "allocation failure in step" : "step",
		         st);
	fprintf(gp,
	        "set output '%s'\nset title 'tracked memory by category, rank 0, %s'\n"
	        "set xlabel '%s'\nset ylabel 'GiB'\nset key outside right noenhanced\n"
	        "set yrange [0:%.9g]\n",
	        png, what, failed ? "seconds since recording began" : "seconds into the step",
	        peak > 0 ? 1.15 * peak : 1.0);
	fprintf(gp, "set label 1 'peak %.3f GiB: ", peak);
	put_title(gp, peak_node);
	bool right_half = peak_t > 0.5 * (t_first + t_last); /* keep the label inside */
	fprintf(gp, "' at %.9f,%.9g point pt 7 %s noenhanced\nplot ", peak_t, peak,
	        right_half ? "right offset -1,0.7" : "offset 1,0.7");
	static const char *const colors[10] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
	                                       "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
	                                       "#bcbd22", "#17becf"};
	/* from the top of the stack down, each category's area covers those below it */
	bool first = true;
	for (int c = nc - 1; c >= 0; c--) {
		if (!used[c])
			continue;
		fprintf(gp, "%s'%s' using 1:%d with fillsteps fs solid 0.85 lc rgb '%s' title '",
		        first ? "" : ", ", dat, c + 2, colors[c % 10]);
		put_title(gp, cJSON_GetArrayItem(cats, c)->valuestring);
		fprintf(gp, "'");
		first = false;
	}
	if (first) /* nothing tracked at all */
		fprintf(gp, "'%s' using 1:%d with steps notitle", dat, nc + 1);
	fprintf(gp, "\nunset label 1\nset key inside top right enhanced\nset yrange [*:*]\n"
	            "set xlabel 'step'\n");
	rc = 1;
out_free:
	free(used);
	free(sum);
out:
	cJSON_Delete(js);
	return rc;
}
