/* Pipeline schedules: generators, transfers, checker + unit-time simulation, printer, CSV. */
#include "schedule/pp_schedule.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/mem.h"

static const char *const kind_names[] = {"F",      "B",      "I",      "W",
                                         "SEND_F", "RECV_F", "SEND_B", "RECV_B"};
_Static_assert(sizeof(kind_names) / sizeof(kind_names[0]) == PP_KIND_COUNT, "kind names");

static const char *const style_names[] = {"GPipe", "1F1B", "Interleaved1F1B", "ZeroBubbleH1",
                                          "CSV"};
_Static_assert(sizeof(style_names) / sizeof(style_names[0]) == PP_STYLE_COUNT, "style names");

const char *pp_kind_name(enum pp_kind k)
{
	return k >= 0 && k < PP_KIND_COUNT ? kind_names[k] : "?";
}

const char *pp_style_name(enum pp_style s)
{
	return s >= 0 && s < PP_STYLE_COUNT ? style_names[s] : "?";
}

int pp_style_parse(const char *name, enum pp_style *out)
{
	for (int i = 0; i < PP_CSV; i++)
		if (strcasecmp(name, style_names[i]) == 0) {
			*out = (enum pp_style)i;
			return CT_OK;
		}
	if (strcasecmp(name, "ZBH1") == 0) {
		*out = PP_ZB_H1;
		return CT_OK;
	}
	LOG_ERROR("parallelism.pipeline_parallel_schedule: unknown schedule '%s' (GPipe, 1F1B, "
	          "Interleaved1F1B, ZeroBubbleH1; or set pipeline_parallel_schedule_csv)",
	          name);
	return CT_ERR_USAGE;
}

bool pp_style_interleaved(enum pp_style s)
{
	return s == PP_INTERLEAVED_1F1B || s == PP_CSV;
}

bool pp_style_split_backward(enum pp_style s)
{
	return s == PP_ZB_H1;
}

int pp_stage_rank(const struct pp_sched *s, int stage)
{
	return stage % s->p;
}

/* ---------------------------------------------------------------- building */

static void sched_init(struct pp_sched *s, enum pp_style style, int p, int v, int m)
{
	memset(s, 0, sizeof(*s));
	s->style = style;
	s->p = p;
	s->v = v;
	s->n_stages = p * v;
	s->n_micro = m;
	s->n = xcalloc((size_t)p, sizeof(int));
	s->cap = xcalloc((size_t)p, sizeof(int));
	s->a = xcalloc((size_t)p, sizeof(*s->a));
}

static void push(struct pp_sched *s, int r, enum pp_kind k, int stage, int micro)
{
	if (s->n[r] == s->cap[r]) {
		s->cap[r] = s->cap[r] ? 2 * s->cap[r] : 32;
		s->a[r] = realloc(s->a[r], (size_t)s->cap[r] * sizeof(**s->a));
		CHECK(s->a[r], "out of memory");
	}
	s->a[r][s->n[r]++] = (struct pp_action){k, stage, micro};
}

void pp_sched_free(struct pp_sched *s)
{
	for (int r = 0; s->a && r < s->p; r++)
		free(s->a[r]);
	free(s->a), free(s->n), free(s->cap);
	memset(s, 0, sizeof(*s));
}

static void gen_gpipe(struct pp_sched *s)
{
	for (int r = 0; r < s->p; r++) {
		for (int m = 0; m < s->n_micro; m++)
			push(s, r, PP_F, r, m);
		for (int m = 0; m < s->n_micro; m++)
			push(s, r, PP_B, r, m);
	}
}

static void gen_1f1b(struct pp_sched *s)
{
	int p = s->p, M = s->n_micro;
	for (int r = 0; r < p; r++) {
		int warm = p - 1 - r < M ? p - 1 - r : M;
		for (int m = 0; m < warm; m++)
			push(s, r, PP_F, r, m);
		for (int i = 0; i < M - warm; i++) {
			push(s, r, PP_F, r, warm + i);
			push(s, r, PP_B, r, i);
		}
		for (int m = M - warm; m < M; m++)
			push(s, r, PP_B, r, m);
	}
}

/* Megatron's interleaved order: forwards go through the rank's chunks in groups of p
 * micro-batches; backwards the same with the chunks reversed. */
static void interleaved_at(const struct pp_sched *s, int r, int k, bool fwd, int *stage, int *mb)
{
	int p = s->p, v = s->v;
	int chunk = (k % (p * v)) / p;
	if (!fwd)
		chunk = v - 1 - chunk;
	*stage = chunk * p + r;
	*mb = (k / (p * v)) * p + k % p;
}

static void gen_interleaved(struct pp_sched *s)
{
	int p = s->p, v = s->v, total = s->n_micro * v;
	for (int r = 0; r < p; r++) {
		int warm = (p - r - 1) * 2 + (v - 1) * p;
		if (s->n_micro == p || warm > total)
			warm = total;
		int st, mb;
		for (int k = 0; k < warm; k++) {
			interleaved_at(s, r, k, true, &st, &mb);
			push(s, r, PP_F, st, mb);
		}
		for (int i = 0; i < total - warm; i++) {
			interleaved_at(s, r, warm + i, true, &st, &mb);
			push(s, r, PP_F, st, mb);
			interleaved_at(s, r, i, false, &st, &mb);
			push(s, r, PP_B, st, mb);
		}
		for (int k = total - warm; k < total; k++) {
			interleaved_at(s, r, k, false, &st, &mb);
			push(s, r, PP_B, st, mb);
		}
	}
}

/* ZB-H1 by list scheduling over unit-time F, I, W: each time unit every rank runs, in this
 * priority, the next input-gradient backward whose output gradient has arrived, else the
 * next forward if its input has arrived, fewer than p - r micro-batches wait for their
 * input-gradient backward (1F1B's rule) and at most p hold activations for a pending
 * weight-gradient backward, else the oldest deferred weight-gradient backward. Reaches the
 * ZB-H1 bubble (p-1)(T_F + T_I - T_W) = p - 1 time units with at most p + 1 micro-batches'
 * activations in flight per rank (the last one only what its W needs). */
static void gen_zbh1(struct pp_sched *s)
{
	int p = s->p, M = s->n_micro;
	int64_t *f_end = xcalloc((size_t)(p * M), sizeof(int64_t));
	int64_t *i_end = xcalloc((size_t)(p * M), sizeof(int64_t));
	int *nf = xcalloc((size_t)p, sizeof(int)), *ni = xcalloc((size_t)p, sizeof(int));
	int *nw = xcalloc((size_t)p, sizeof(int));
	for (int64_t i = 0; i < p * M; i++)
		f_end[i] = i_end[i] = INT64_MAX;
	int done = 0;
	for (int64_t t = 0; done < p; t++) {
		done = 0;
		for (int r = 0; r < p; r++) {
			int f = nf[r], i = ni[r];
			bool i_ok = i < f && f_end[r * M + i] <= t &&
			            (r == p - 1 || i_end[(r + 1) * M + i] <= t);
			bool f_ok = f < M && (r == 0 || f_end[(r - 1) * M + f] <= t) &&
			            f - i < p - r && f - nw[r] <= p;
			if (i_ok) {
				push(s, r, PP_I, r, i);
				i_end[r * M + i] = t + 1;
				ni[r]++;
			} else if (f_ok) {
				push(s, r, PP_F, r, f);
				f_end[r * M + f] = t + 1;
				nf[r]++;
			} else if (nw[r] < ni[r]) {
				push(s, r, PP_W, r, nw[r]);
				nw[r]++;
			}
			done += nw[r] == M;
		}
	}
	free(f_end), free(i_end), free(nf), free(ni), free(nw);
}

/* The degrees every schedule needs positive (CT_ERR_USAGE naming them). */
static int check_degrees(int p, int v, int m)
{
	if (p < 1 || v < 1 || m < 1) {
		LOG_ERROR("parallelism: pipeline degree %d, stages per rank %d and micro-batches %d "
		          "must be positive",
		          p, v, m);
		return CT_ERR_USAGE;
	}
	return CT_OK;
}

int pp_sched_generate(struct pp_sched *s, enum pp_style style, int p, int v, int m)
{
	memset(s, 0, sizeof(*s));
	if (check_degrees(p, v, m))
		return CT_ERR_USAGE;
	if (v != 1 && !pp_style_interleaved(style)) {
		LOG_ERROR("parallelism.pipeline_parallel_schedule: %s runs one stage per rank, but "
		          "the layers per stage make %d stages per rank (use Interleaved1F1B)",
		          pp_style_name(style), v);
		return CT_ERR_USAGE;
	}
	if (style == PP_INTERLEAVED_1F1B && m % p != 0) {
		LOG_ERROR("parallelism.pipeline_parallel_microbatch_size: Interleaved1F1B needs a "
		          "micro-batch count that is a multiple of the pipeline degree %d, not %d",
		          p, m);
		return CT_ERR_USAGE;
	}
	CHECK(style != PP_CSV, "CSV schedules are read, not generated");
	sched_init(s, style, p, v, m);
	switch (style) {
	case PP_GPIPE: gen_gpipe(s); break;
	case PP_1F1B: gen_1f1b(s); break;
	case PP_INTERLEAVED_1F1B: gen_interleaved(s); break;
	case PP_ZB_H1: gen_zbh1(s); break;
	default: break;
	}
	pp_sched_add_comms(s);
	return CT_OK;
}

int pp_sched_forward_only(struct pp_sched *s, enum pp_style style, int p, int v, int m)
{
	memset(s, 0, sizeof(*s));
	if (check_degrees(p, v, m))
		return CT_ERR_USAGE;
	sched_init(s, style, p, v, m);
	s->forward_only = true;
	for (int r = 0; r < p; r++)
		for (int mb = 0; mb < m; mb++)
			for (int c = 0; c < v; c++)
				push(s, r, PP_F, c * p + r, mb);
	pp_sched_add_comms(s);
	return CT_OK;
}

bool pp_sched_has_comms(const struct pp_sched *s)
{
	for (int r = 0; r < s->p; r++)
		for (int i = 0; i < s->n[r]; i++)
			if (s->a[r][i].kind >= PP_SEND_F)
				return true;
	return false;
}

void pp_sched_add_comms(struct pp_sched *s)
{
	if (pp_sched_has_comms(s))
		return;
	for (int r = 0; r < s->p; r++) {
		struct pp_action *old = s->a[r];
		int n = s->n[r];
		s->a[r] = NULL;
		s->n[r] = s->cap[r] = 0;
		for (int i = 0; i < n; i++) {
			struct pp_action a = old[i];
			bool has_prev = a.stage > 0 && pp_stage_rank(s, a.stage - 1) != r;
			bool has_next =
			    a.stage < s->n_stages - 1 && pp_stage_rank(s, a.stage + 1) != r;
			if (a.kind == PP_F && has_prev)
				push(s, r, PP_RECV_F, a.stage, a.micro);
			if ((a.kind == PP_B || a.kind == PP_I) && has_next)
				push(s, r, PP_RECV_B, a.stage, a.micro);
			push(s, r, a.kind, a.stage, a.micro);
			if (a.kind == PP_F && has_next)
				push(s, r, PP_SEND_F, a.stage, a.micro);
			if ((a.kind == PP_B || a.kind == PP_I) && has_prev)
				push(s, r, PP_SEND_B, a.stage, a.micro);
		}
		free(old);
	}
}

/* ---------------------------------------------------------------- checking */

void pp_action_str(const struct pp_action *a, char *buf, size_t size)
{
	snprintf(buf, size, "%d%s%d", a->stage, pp_kind_name(a->kind), a->micro);
}

#define FAIL(...)                                                                                  \
	do {                                                                                       \
		if (why)                                                                           \
			snprintf(why, why_size, __VA_ARGS__);                                      \
		goto out;                                                                          \
	} while (0)

/* Per (kind, stage, micro): how often it occurs and at which position of its rank's list. */
struct occ {
	int count, pos;
};

static int key(const struct pp_sched *s, enum pp_kind k, int stage, int micro)
{
	return ((int)k * s->n_stages + stage) * s->n_micro + micro;
}

/* The action a needs done earlier on its own rank (-1 none); returns how many (<= 1). */
static bool local_dep(const struct pp_sched *s, const struct pp_action *a, struct pp_action *dep,
                      bool split)
{
	int r = pp_stage_rank(s, a->stage), S = s->n_stages;
	enum pp_kind bk = split ? PP_I : PP_B;
	switch (a->kind) {
	case PP_F:
		if (a->stage == 0)
			return false;
		*dep = pp_stage_rank(s, a->stage - 1) == r
		           ? (struct pp_action){PP_F, a->stage - 1, a->micro}
		           : (struct pp_action){PP_RECV_F, a->stage, a->micro};
		return true;
	case PP_B:
	case PP_I:
		if (a->stage == S - 1)
			*dep = (struct pp_action){PP_F, a->stage, a->micro};
		else if (pp_stage_rank(s, a->stage + 1) == r)
			*dep = (struct pp_action){bk, a->stage + 1, a->micro};
		else
			*dep = (struct pp_action){PP_RECV_B, a->stage, a->micro};
		return true;
	case PP_W: *dep = (struct pp_action){PP_I, a->stage, a->micro}; return true;
	case PP_SEND_F: *dep = (struct pp_action){PP_F, a->stage, a->micro}; return true;
	case PP_SEND_B: *dep = (struct pp_action){bk, a->stage, a->micro}; return true;
	default: return false;
	}
}

static double unit_duration(enum pp_kind k)
{
	return k == PP_F || k == PP_I || k == PP_W ? 1 : (k == PP_B ? 2 : 0);
}

/* The send that a receive waits for. */
static struct pp_action partner(const struct pp_action *a)
{
	switch (a->kind) {
	case PP_SEND_F: return (struct pp_action){PP_RECV_F, a->stage + 1, a->micro};
	case PP_RECV_F: return (struct pp_action){PP_SEND_F, a->stage - 1, a->micro};
	case PP_SEND_B: return (struct pp_action){PP_RECV_B, a->stage - 1, a->micro};
	default: return (struct pp_action){PP_SEND_B, a->stage + 1, a->micro};
	}
}

/* Event-driven: each rank runs its list in order; compute takes its duration, a send is
 * instantaneous, a receive completes xfer after its send. */
static bool simulate(const struct pp_sched *s, const double *dur, double xfer, struct pp_sim *sim,
                     char *why, size_t why_size)
{
	int p = s->p, S = s->n_stages, M = s->n_micro;
	bool ok = false;
	double *sent = xcalloc((size_t)(PP_KIND_COUNT * S * M), sizeof(double));
	int *pc = xcalloc((size_t)p, sizeof(int)), *inflight = xcalloc((size_t)p, sizeof(int));
	double *free_at = xcalloc((size_t)p, sizeof(double));
	for (int i = 0; i < PP_KIND_COUNT * S * M; i++)
		sent[i] = -1;
	sim->makespan = 0;
	for (double t = 0;;) {
		bool progress = true;
		while (progress) {
			progress = false;
			for (int r = 0; r < p; r++) {
				while (free_at[r] <= t && pc[r] < s->n[r]) {
					const struct pp_action *a = &s->a[r][pc[r]];
					if (a->kind == PP_RECV_F || a->kind == PP_RECV_B) {
						struct pp_action q = partner(a);
						double at = sent[key(s, q.kind, q.stage, q.micro)];
						if (at < 0 || at + xfer > t)
							break;
					} else if (a->kind == PP_SEND_F || a->kind == PP_SEND_B) {
						sent[key(s, a->kind, a->stage, a->micro)] = t;
					} else {
						double d = dur ? dur[a->stage * PP_KIND_COUNT + a->kind]
						               : unit_duration(a->kind);
						free_at[r] = t + d;
						sim->busy[r] += d;
						if (a->kind == PP_F) {
							inflight[r]++;
							if (inflight[r] > sim->peak_inflight[r])
								sim->peak_inflight[r] = inflight[r];
						} else if (a->kind == PP_B || a->kind == PP_W) {
							inflight[r]--;
						}
					}
					pc[r]++;
					progress = true;
				}
			}
		}
		double next = INFINITY;
		bool all_done = true;
		for (int r = 0; r < p; r++) {
			if (free_at[r] > t && free_at[r] < next)
				next = free_at[r];
			all_done &= pc[r] == s->n[r];
			if (pc[r] < s->n[r] && free_at[r] <= t) { /* blocked in a receive */
				struct pp_action q = partner(&s->a[r][pc[r]]);
				double at = sent[key(s, q.kind, q.stage, q.micro)];
				if (at >= 0 && at + xfer > t && at + xfer < next)
					next = at + xfer;
			}
		}
		if (all_done) {
			for (int r = 0; r < p; r++)
				if (free_at[r] > sim->makespan)
					sim->makespan = free_at[r];
			break;
		}
		if (next == INFINITY) {
			char buf[32];
			int r = 0;
			while (pc[r] == s->n[r])
				r++;
			pp_action_str(&s->a[r][pc[r]], buf, sizeof(buf));
			FAIL("deadlock at time %g: rank %d waits in %s (action %d) for a send "
			     "that never comes",
			     t, r, buf, pc[r]);
		}
		t = next;
	}
	sim->bubble = 0;
	for (int r = 0; r < p; r++) {
		double idle = sim->makespan > 0 ? (sim->makespan - sim->busy[r]) / sim->makespan : 0;
		if (idle > sim->bubble)
			sim->bubble = idle;
	}
	ok = true;
out:
	free(sent), free(pc), free(inflight), free(free_at);
	return ok;
}

bool pp_sched_simulate(const struct pp_sched *s, const double *dur, double xfer_s,
                       struct pp_sim *sim, char *why, size_t why_size)
{
	memset(sim, 0, sizeof(*sim));
	sim->busy = xcalloc((size_t)s->p, sizeof(double));
	sim->peak_inflight = xcalloc((size_t)s->p, sizeof(int));
	if (simulate(s, dur, xfer_s, sim, why, why_size))
		return true;
	pp_sim_free(sim);
	return false;
}

bool pp_sched_check(const struct pp_sched *s, struct pp_sim *sim_out, char *why, size_t why_size)
{
	int p = s->p, S = s->n_stages, M = s->n_micro;
	bool ok = false, split = false, any_b = false;
	struct occ *occ = xcalloc((size_t)(PP_KIND_COUNT * S * M), sizeof(*occ));
	struct pp_sim sim = {0};
	char buf[32], buf2[32];
	for (int r = 0; r < p; r++)
		for (int i = 0; i < s->n[r]; i++) {
			const struct pp_action *a = &s->a[r][i];
			pp_action_str(a, buf, sizeof(buf));
			if (a->kind < 0 || a->kind >= PP_KIND_COUNT || a->stage < 0 ||
			    a->stage >= S || a->micro < 0 || a->micro >= M)
				FAIL("rank %d action %d (%s): stage or micro-batch out of range "
				     "(%d stages, %d micro-batches)",
				     r, i, buf, S, M);
			if (pp_stage_rank(s, a->stage) != r)
				FAIL("rank %d action %d (%s): stage %d runs on rank %d", r, i, buf,
				     a->stage, pp_stage_rank(s, a->stage));
			struct occ *o = &occ[key(s, a->kind, a->stage, a->micro)];
			if (o->count++)
				FAIL("rank %d action %d (%s) occurs twice", r, i, buf);
			o->pos = i;
			split |= a->kind == PP_I || a->kind == PP_W;
			any_b |= a->kind == PP_B || (s->forward_only && a->kind >= PP_SEND_B);
			bool cross_next = a->stage < S - 1 && pp_stage_rank(s, a->stage + 1) != r;
			bool cross_prev = a->stage > 0 && pp_stage_rank(s, a->stage - 1) != r;
			if ((a->kind == PP_SEND_F && !cross_next) ||
			    (a->kind == PP_RECV_B && !cross_next) ||
			    (a->kind == PP_RECV_F && !cross_prev) ||
			    (a->kind == PP_SEND_B && !cross_prev))
				FAIL("rank %d action %d (%s): no neighbouring stage on another rank "
				     "to talk to",
				     r, i, buf);
		}
	if (split && any_b)
		FAIL("mixes full backward (B) with split backward (I/W)");
	if (s->forward_only && (split || any_b))
		FAIL("a forward-only schedule runs a backward");
	/* every compute once; every transfer matched */
	for (int st = 0; st < S; st++)
		for (int m = 0; m < M; m++) {
			int r = pp_stage_rank(s, st);
			const enum pp_kind need[3] = {PP_F, split ? PP_I : PP_B, PP_W};
			int n_need = s->forward_only ? 1 : (split ? 3 : 2);
			for (int k = 0; k < n_need; k++)
				if (occ[key(s, need[k], st, m)].count != 1)
					FAIL("rank %d never runs %d%s%d", r, st,
					     pp_kind_name(need[k]), m);
			for (int k = PP_SEND_F; k <= (s->forward_only ? PP_RECV_F : PP_RECV_B); k++) {
				bool cross = (k == PP_SEND_F || k == PP_RECV_B)
				                 ? st < S - 1 && pp_stage_rank(s, st + 1) != r
				                 : st > 0 && pp_stage_rank(s, st - 1) != r;
				struct pp_action a = {(enum pp_kind)k, st, m};
				struct pp_action q = partner(&a);
				pp_action_str(&a, buf, sizeof(buf));
				pp_action_str(&q, buf2, sizeof(buf2));
				int have = occ[key(s, a.kind, st, m)].count;
				if (cross && have && !occ[key(s, q.kind, q.stage, q.micro)].count)
					FAIL("unmatched %s: rank %d's %s has no %s on rank %d",
					     k == PP_SEND_F || k == PP_SEND_B ? "send" : "receive", r,
					     buf, buf2, pp_stage_rank(s, q.stage));
				bool is_recv = k == PP_RECV_F || k == PP_RECV_B;
				if (cross && !have && is_recv &&
				    occ[key(s, q.kind, q.stage, q.micro)].count)
					FAIL("unmatched send: rank %d's %s has no %s on rank %d",
					     pp_stage_rank(s, q.stage), buf2, buf, r);
				if (cross && !have)
					FAIL("rank %d has no %s (the transfer between stages %d and "
					     "%d)",
					     r, buf, st, q.stage);
			}
		}
	/* dependencies in program order on each rank */
	for (int r = 0; r < p; r++)
		for (int i = 0; i < s->n[r]; i++) {
			struct pp_action dep;
			if (!local_dep(s, &s->a[r][i], &dep, split))
				continue;
			const struct occ *o = &occ[key(s, dep.kind, dep.stage, dep.micro)];
			if (o->count && pp_stage_rank(s, dep.stage) == r && o->pos < i)
				continue;
			pp_action_str(&s->a[r][i], buf, sizeof(buf));
			pp_action_str(&dep, buf2, sizeof(buf2));
			FAIL("rank %d action %d (%s) comes before %s, which it needs", r, i, buf,
			     buf2);
		}
	ok = pp_sched_simulate(s, NULL, 0, &sim, why, why_size);
out:
	free(occ);
	if (ok && sim_out)
		*sim_out = sim;
	else
		pp_sim_free(&sim);
	return ok;
}

void pp_sim_free(struct pp_sim *sim)
{
	free(sim->busy), free(sim->peak_inflight);
	memset(sim, 0, sizeof(*sim));
}

double pp_bubble_theory(enum pp_style style, int p, int v, int m)
{
	switch (style) {
	case PP_INTERLEAVED_1F1B: return (double)(p - 1) / (double)(v * m + p - 1);
	case PP_ZB_H1: return (double)(p - 1) / (double)(3 * m + p - 1);
	default: return (double)(p - 1) / (double)(m + p - 1);
	}
}

/* ---------------------------------------------------------------- printing and CSV */

void pp_sched_print(const struct pp_sched *s, FILE *f)
{
	char buf[32];
	fprintf(f, "pipeline schedule %s: %d ranks, %d stages, %d micro-batches\n",
	        pp_style_name(s->style), s->p, s->n_stages, s->n_micro);
	for (int r = 0; r < s->p; r++) {
		fprintf(f, "  rank %d:", r);
		for (int i = 0; i < s->n[r]; i++) {
			pp_action_str(&s->a[r][i], buf, sizeof(buf));
			fprintf(f, " %s", buf);
		}
		fprintf(f, "\n");
	}
}

int pp_sched_write_csv(const struct pp_sched *s, const char *path)
{
	FILE *f = fopen(path, "w");
	if (!f) {
		LOG_ERROR("cannot write '%s': %s", path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	char buf[32];
	for (int r = 0; r < s->p; r++) {
		for (int i = 0; i < s->n[r]; i++) {
			pp_action_str(&s->a[r][i], buf, sizeof(buf));
			fprintf(f, "%s%s", i ? "," : "", buf);
		}
		fprintf(f, "\n");
	}
	return fclose(f) == 0 ? CT_OK : CT_ERR_RUNTIME;
}

/* "12SEND_F3" -> action; false if malformed. */
static bool parse_cell(const char *c, struct pp_action *a)
{
	if (!isdigit((unsigned char)*c))
		return false;
	char *end;
	long st = strtol(c, &end, 10);
	int k = -1;
	size_t best = 0;
	for (int i = 0; i < PP_KIND_COUNT; i++) {
		size_t len = strlen(kind_names[i]);
		if (len > best && strncmp(end, kind_names[i], len) == 0) {
			k = i;
			best = len;
		}
	}
	if (k < 0 || !isdigit((unsigned char)end[best]))
		return false;
	char *end2;
	long mb = strtol(end + best, &end2, 10);
	if (*end2 || st > 1000000 || mb > 1000000)
		return false;
	*a = (struct pp_action){(enum pp_kind)k, (int)st, (int)mb};
	return true;
}

int pp_sched_read_csv(struct pp_sched *s, const char *path, int p, int m)
{
	memset(s, 0, sizeof(*s));
	const char *key_name = "parallelism.pipeline_parallel_schedule_csv";
	FILE *f = fopen(path, "r");
	if (!f) {
		LOG_ERROR("%s: cannot read '%s': %s", key_name, path, strerror(errno));
		return CT_ERR_USAGE;
	}
	struct pp_sched tmp;
	sched_init(&tmp, PP_CSV, p, 1, m);
	char line[65536];
	int row = 0, max_stage = -1, max_micro = -1, rc = CT_ERR_USAGE;
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\r\n")] = 0;
		bool blank = true;
		for (char *c = line; *c; c++)
			blank &= isspace((unsigned char)*c) != 0;
		if (blank)
			continue;
		if (row >= p) {
			LOG_ERROR("%s: '%s' has more rows than the %d pipeline ranks", key_name,
			          path, p);
			goto out;
		}
		int col = 0;
		for (char *save = NULL, *cell = strtok_r(line, ",", &save); cell;
		     cell = strtok_r(NULL, ",", &save), col++) {
			while (isspace((unsigned char)*cell))
				cell++;
			for (char *e = cell + strlen(cell); e > cell && isspace((unsigned char)e[-1]);)
				*--e = 0;
			if (!*cell)
				continue;
			struct pp_action a;
			if (!parse_cell(cell, &a)) {
				LOG_ERROR("%s: '%s' row %d cell %d: '%s' is not an action like "
				          "0F1, 1B0, 2I1, 2W1, 0SEND_F1, 1RECV_F1",
				          key_name, path, row + 1, col + 1, cell);
				goto out;
			}
			max_stage = a.stage > max_stage ? a.stage : max_stage;
			max_micro = a.micro > max_micro ? a.micro : max_micro;
			push(&tmp, row, a.kind, a.stage, a.micro);
		}
		row++;
	}
	if (row != p || max_stage < 0) {
		LOG_ERROR("%s: '%s' has %d rows of actions; the pipeline has %d ranks", key_name,
		          path, row, p);
		goto out;
	}
	if ((max_stage + 1) % p) {
		LOG_ERROR("%s: '%s' uses %d stages, not a multiple of the %d pipeline ranks",
		          key_name, path, max_stage + 1, p);
		goto out;
	}
	if (max_micro + 1 != m) {
		LOG_ERROR("%s: '%s' runs %d micro-batches; the step has %d "
		          "(parallelism.pipeline_parallel_microbatch_size)",
		          key_name, path, max_micro + 1, m);
		goto out;
	}
	tmp.v = (max_stage + 1) / p;
	tmp.n_stages = max_stage + 1;
	pp_sched_add_comms(&tmp);
	char why[256];
	if (!pp_sched_check(&tmp, NULL, why, sizeof(why))) {
		LOG_ERROR("%s: '%s': %s", key_name, path, why);
		goto out;
	}
	*s = tmp;
	memset(&tmp, 0, sizeof(tmp));
	rc = CT_OK;
out:
	fclose(f);
	if (rc)
		pp_sched_free(&tmp);
	return rc;
}
