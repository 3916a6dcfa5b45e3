/* schedule/sched_trace: Chrome trace JSON from the executor's records. */
#include "schedule/sched_trace.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"

static void event(FILE *f, bool *first, const char *name, const char *cat, int pid, int tid,
                  double t0, double t1, const char *args)
{
	fprintf(f,
	        "%s\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,"
	        "\"ts\":%.3f,\"dur\":%.3f,\"args\":{%s}}",
	        *first ? "" : ",", name, cat, pid, tid, t0 * 1e6, (t1 - t0) * 1e6, args);
	*first = false;
}

int sched_trace_write(const char *path, const struct sched *s, const struct sched_record *rec,
                      int rank, double t_base)
{
	FILE *f = fopen(path, "w");
	if (!f) {
		LOG_ERROR("cannot write trace '%s': %s", path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	bool first = true;
	fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
	fprintf(f,
	        "\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":"
	        "\"rank %d\"}},",
	        rank, rank);
	fprintf(f,
	        "\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,\"args\":{"
	        "\"name\":\"compute\"}},",
	        rank);
	fprintf(f,
	        "\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":2,\"args\":{"
	        "\"name\":\"comm\"}}",
	        rank);
	first = false;
	for (int i = 0; i < s->n_nodes; i++) {
		const struct sched_node *n = &s->nodes[i];
		const struct sched_record *r = &rec[i];
		char name[64], args[512] = "", bucket[256] = "";
		sched_node_label(s, i, name, sizeof(name));
		if (n->bucket >= 0)
			sched_bucket_name(s, n->bucket, bucket, sizeof(bucket));
		snprintf(args, sizeof(args), "\"node\":%d,\"micro\":%d", i, n->micro);
		bool coll = n->kind == SCHED_ALL_GATHER || n->kind == SCHED_REDUCE_SCATTER;
		if (n->bucket >= 0)
			snprintf(args + strlen(args), sizeof(args) - strlen(args),
			         ",\"bucket\":%d,\"units\":\"%s\"", n->bucket, bucket);
		if (coll)
			snprintf(args + strlen(args), sizeof(args) - strlen(args),
			         ",\"bytes\":%lld,\"ticket\":%lld", (long long)r->bytes,
			         (long long)r->ticket);
		bool tp = n->kind == SCHED_TP_ALL_GATHER || n->kind == SCHED_TP_REDUCE_SCATTER;
		bool cp = n->kind == SCHED_CP_ALL_GATHER || n->kind == SCHED_CP_REDUCE_SCATTER ||
		          n->kind == SCHED_CP_RING;
		bool ep = n->kind == SCHED_EP_ALL_TO_ALL || n->kind == SCHED_EP_WAIT;
		if (tp || cp || ep) { /* TP, CP: on the compute thread, it blocks it (a ring with
		                         the compute beside its steps inside); EP: blocking, or
		                         posted to its stream and completed by its EP-WAIT */
			const struct model_coll_desc *c = &sched_node_prog(s, n)->c[n->seg];
			snprintf(args + strlen(args), sizeof(args) - strlen(args),
			         ",\"unit\":%d,\"bytes\":%lld%s%s", n->unit, (long long)r->bytes,
			         c->ring ? ",\"ring\":true" : "", c->post ? ",\"posted\":true" : "");
		}
		bool p2p = n->kind == SCHED_PP_SEND || n->kind == SCHED_PP_RECV;
		if (sched_kind_pp(n->kind) ||
		    (n->kind == SCHED_WAIT && sched_kind_pp(n->wait_kind)))
			snprintf(args + strlen(args), sizeof(args) - strlen(args), ",\"stage\":%d",
			         n->stage);
		if (p2p) /* posted here, completed by its WAIT */
			snprintf(args + strlen(args), sizeof(args) - strlen(args), ",\"bytes\":%lld",
			         (long long)r->bytes);
		const char *cat = coll                    ? "issue"
		                  : tp                    ? "tp"
		                  : cp                    ? "cp"
		                  : ep                    ? "ep"
		                  : p2p                   ? "p2p"
		                  : n->kind == SCHED_WAIT ? "wait"
		                  : n->kind == SCHED_FREE ? "free"
		                                          : "compute";
		event(f, &first, name, cat, rank, 1, r->t0 - t_base, r->t1 - t_base, args);
		if (coll && r->comm_t1 > 0)
			event(f, &first,
			      n->kind == SCHED_ALL_GATHER ? "all-gather" : "reduce-scatter", "comm",
			      rank, 2, r->comm_t0 - t_base, r->comm_t1 - t_base, args);
	}
	fprintf(f, "\n]}\n");
	if (fclose(f) != 0) {
		LOG_ERROR("cannot write trace '%s': %s", path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	return CT_OK;
}
