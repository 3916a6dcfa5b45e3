/* tests/test_flight: the flight recorder (comm/flight.h) on 2-4 ranks.
 *
 * The ring keeps the last N entries of a group, oldest first, with consecutive sequence
 * numbers that are the same on every rank; collectives queued on the comm stream go from
 * scheduled to completed in both progress modes with the caller's label; point-to-point
 * transfers count their messages per peer; 0 entries records nothing but keeps counting; the
 * debug injection turns the chosen collective into a barrier; a dump is valid JSON holding the
 * ring; and dumps requested (as SIGUSR1 does) while two threads record are written by the
 * watchdog thread (`make tsan` runs this under ThreadSanitizer).
 *
 *   mpiexec -n 2..4 test_flight
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "comm/comm.h"
#include "comm/flight.h"
#include "comm/p2p.h"
#include "comm/stream.h"
#include "comm/watchdog.h"
#include "testutil.h"

static struct mesh mesh;
static char dir[64];

#define SNAP 64

/* The last n entries of the world group's ring (n <= SNAP) into e; returns how many. */
static int last_entries(struct fr_entry *e, int n, int64_t *last_seq)
{
	static struct fr_entry all[SNAP * 64];
	int k = comm_flight_snapshot(&mesh.world_group, all, SNAP * 64, last_seq);
	int from = k > n ? k - n : 0;
	for (int i = from; i < k; i++)
		e[i - from] = all[i];
	return k - from;
}

/* Every rank holds the same value: sum v_i = W v and sum v_i^2 = W v^2 hold together only
 * when every v_i = v. */
static bool same_everywhere(int64_t v)
{
	int64_t got[2] = {v, v * v};
	comm_all_reduce_i64(&mesh.world_group, got, 2);
	return got[0] == mesh.world * v && got[1] == mesh.world * v * v;
}

TEST_CASE(test_ring_wraps)
{
	int cap = 8 + (int)test_uniform(0, 8);
	comm_flight_configure(cap, NULL);
	int64_t before = 0;
	comm_flight_snapshot(&mesh.world_group, NULL, 0, &before);
	int n = cap + 5 + (int)test_uniform(0, 20);
	for (int i = 0; i < n; i++) {
		int64_t x = i;
		comm_label("flight %d", i);
		comm_all_reduce_i64(&mesh.world_group, &x, 1);
	}
	struct fr_entry e[SNAP];
	int64_t last = 0;
	int k = comm_flight_snapshot(&mesh.world_group, e, SNAP, &last);
	EXPECT(k == cap, "%d entries held, want the ring's %d", k, cap);
	EXPECT(last == before + n, "last seq %lld, want %lld", (long long)last,
	       (long long)(before + n));
	for (int j = 0; j < k; j++) {
		char want[32];
		snprintf(want, sizeof(want), "flight %d", n - k + j);
		EXPECT(e[j].seq == last - k + 1 + j, "entry %d: seq %lld, want %lld", j,
		       (long long)e[j].seq, (long long)(last - k + 1 + j));
		EXPECT(j == 0 || e[j].record == e[j - 1].record + 1, "entry %d: record %lld", j,
		       (long long)e[j].record);
		EXPECT(e[j].op == FR_ALL_REDUCE && e[j].dtype == FR_I64 && e[j].bytes == 8,
		       "entry %d: %s of %lld bytes (%s)", j, fr_op_name(e[j].op),
		       (long long)e[j].bytes, fr_dtype_name(e[j].dtype));
		EXPECT(e[j].state == FR_COMPLETED && e[j].t_started > 0 &&
		           e[j].t_completed >= e[j].t_started,
		       "entry %d: %s, started %g, completed %g", j, fr_state_name(e[j].state),
		       e[j].t_started, e[j].t_completed);
		EXPECT(strcmp(e[j].label, want) == 0, "entry %d: label '%s', want '%s'", j,
		       e[j].label, want);
	}
	EXPECT(same_everywhere(last), "rank %d: last seq %lld differs between ranks", mesh.rank,
	       (long long)last);
	comm_flight_configure(FR_DEFAULT_ENTRIES, NULL);
}

/* 0 entries: nothing held, yet the numbers go on (a later ring starts where they are). */
TEST_CASE(test_ring_off)
{
	int64_t before = 0, after = 0, x = 1;
	comm_flight_configure(0, NULL);
	comm_flight_snapshot(&mesh.world_group, NULL, 0, &before);
	comm_all_reduce_i64(&mesh.world_group, &x, 1);
	comm_barrier(&mesh.world_group);
	struct fr_entry e[4];
	int k = comm_flight_snapshot(&mesh.world_group, e, 4, &after);
	EXPECT(k == 0, "%d entries held with the ring off", k);
	EXPECT(after == before + 2, "seq went %lld -> %lld over 2 collectives", (long long)before,
	       (long long)after);
	comm_flight_configure(FR_DEFAULT_ENTRIES, NULL);
	comm_barrier(&mesh.world_group);
	k = last_entries(e, 1, &after);
	EXPECT(k == 1 && e[0].seq == before + 3 && e[0].op == FR_BARRIER,
	       "after turning it on: %d entries, seq %lld (%s), want seq %lld barrier", k,
	       k ? (long long)e[0].seq : -1LL, k ? fr_op_name(e[0].op) : "-",
	       (long long)(before + 3));
}

/* Transfers: the n-th send to / receive from each peer, its tag, completed once tested.
 * Messages go both ways round the ring, so on 3+ ranks each rank talks to two peers and a
 * count per peer differs from a count per rank. */
TEST_CASE(test_p2p_entries)
{
	int W = mesh.world, r = mesh.rank, right = (r + 1) % W, left = (r + W - 1) % W;
	int m = 2 + (int)test_uniform(0, 4);
	static struct fr_entry e[SNAP * 64];
	int64_t seq0 = 0;
	/* messages so far, per (direction, peer): the last p2p_seq recorded */
	int64_t *sent = xcalloc((size_t)W, sizeof(int64_t)),
	        *recv = xcalloc((size_t)W, sizeof(int64_t));
	int k = comm_flight_snapshot(&mesh.world_group, e, SNAP * 64, &seq0);
	for (int i = 0; i < k; i++) {
		if (e[i].op == FR_SEND)
			sent[e[i].peer] = e[i].p2p_seq;
		if (e[i].op == FR_RECV)
			recv[e[i].peer] = e[i].p2p_seq;
	}
	struct {
		int op, peer, tag;
		int64_t n;
	} want[4 * 8];
	int nw = 0;
	for (int i = 0; i < m; i++) {
		float out[2] = {(float)(r * 100 + i), (float)(r * 100 + 50 + i)}, in[2] = {-1, -1};
		struct comm_p2p q[4];
		comm_p2p_irecv(&mesh.world_group, left, 40 + i, &in[0], sizeof(float), &q[0]);
		want[nw++] = (typeof(want[0])){FR_RECV, left, 40 + i, ++recv[left]};
		comm_p2p_irecv(&mesh.world_group, right, 60 + i, &in[1], sizeof(float), &q[1]);
		want[nw++] = (typeof(want[0])){FR_RECV, right, 60 + i, ++recv[right]};
		comm_p2p_isend(&mesh.world_group, right, 40 + i, &out[0], sizeof(float), &q[2]);
		want[nw++] = (typeof(want[0])){FR_SEND, right, 40 + i, ++sent[right]};
		comm_p2p_isend(&mesh.world_group, left, 60 + i, &out[1], sizeof(float), &q[3]);
		want[nw++] = (typeof(want[0])){FR_SEND, left, 60 + i, ++sent[left]};
		for (int j = 0; j < 4; j++)
			comm_p2p_wait(&q[j], 0, "test transfer");
		EXPECT(in[0] == (float)(left * 100 + i) && in[1] == (float)(right * 100 + 50 + i),
		       "message %d: got %g %g", i, in[0], in[1]);
	}
	int64_t seq1 = 0;
	k = last_entries(e, nw, &seq1);
	EXPECT(k == nw, "%d entries, want %d", k, nw);
	EXPECT(seq1 == seq0, "transfers moved the collective seq %lld -> %lld", (long long)seq0,
	       (long long)seq1);
	for (int i = 0; i < nw && k == nw; i++)
		EXPECT(e[i].op == want[i].op && e[i].peer == want[i].peer &&
		           e[i].tag == want[i].tag && e[i].p2p_seq == want[i].n &&
		           e[i].bytes == 4 && e[i].seq == 0 && e[i].state == FR_COMPLETED,
		       "transfer %d: %s peer %d tag %d n %lld %s, want %s peer %d tag %d n %lld", i,
		       fr_op_name(e[i].op), e[i].peer, e[i].tag, (long long)e[i].p2p_seq,
		       fr_state_name(e[i].state), fr_op_name(want[i].op), want[i].peer, want[i].tag,
		       (long long)want[i].n);
	free(sent);
	free(recv);
}

/* The comm stream: numbered when queued, started and completed on the thread that runs it,
 * with the op's label; a ring step's transfers carry its label too. */
TEST_CASE(test_stream_entries)
{
	for (int mode = 0; mode < STREAM_MODE_COUNT; mode++) {
		struct comm_stream *s = comm_stream_create((enum stream_mode)mode, 60);
		int32_t mine = mesh.rank, *all = xcalloc((size_t)mesh.world, sizeof(int32_t));
		int m = 3 + (int)test_uniform(0, 5);
		int64_t seq0 = 0;
		struct fr_entry e[SNAP];
		last_entries(e, 0, &seq0);
		for (int i = 0; i < m; i++) {
			char what[32];
			snprintf(what, sizeof(what), "flight gather %d", i);
			struct comm_op op = {.kind = COMM_ALL_GATHER,
			                     .group = &mesh.world_group,
			                     .send = &mine,
			                     .recv = all,
			                     .count = 4,
			                     .what = what};
			comm_stream_enqueue(s, &op);
		}
		int32_t back = -1;
		struct comm_op ring = {.kind = COMM_SENDRECV,
		                       .group = &mesh.world_group,
		                       .send = &mine,
		                       .recv = &back,
		                       .count = 4,
		                       .what = "flight ring step",
		                       .to = (mesh.rank + 1) % mesh.world,
		                       .from = (mesh.rank + mesh.world - 1) % mesh.world,
		                       .tag = 77};
		comm_stream_enqueue(s, &ring);
		comm_stream_sync(s);
		int64_t seq1 = 0;
		int k = last_entries(e, m + 2, &seq1);
		EXPECT(k == m + 2 && seq1 == seq0 + m, "mode %d: %d entries, seq %lld -> %lld",
		       mode, k, (long long)seq0, (long long)seq1);
		for (int i = 0; i < m && k == m + 2; i++) {
			char want[32];
			snprintf(want, sizeof(want), "flight gather %d", i);
			EXPECT(e[i].seq == seq0 + 1 + i && e[i].op == FR_ALL_GATHER &&
			           e[i].bytes == 4 && strcmp(e[i].label, want) == 0,
			       "mode %d entry %d: seq %lld %s %lld bytes '%s'", mode, i,
			       (long long)e[i].seq, fr_op_name(e[i].op), (long long)e[i].bytes,
			       e[i].label);
			EXPECT(e[i].state == FR_COMPLETED && e[i].t_scheduled > 0 &&
			           e[i].t_scheduled <= e[i].t_started &&
			           e[i].t_started <= e[i].t_completed,
			       "mode %d entry %d: %s, times %g %g %g", mode, i,
			       fr_state_name(e[i].state), e[i].t_scheduled, e[i].t_started,
			       e[i].t_completed);
		}
		for (int i = m; i < m + 2 && k == m + 2; i++)
			EXPECT((e[i].op == FR_SEND || e[i].op == FR_RECV) && e[i].tag == 77 &&
			           strcmp(e[i].label, "flight ring step") == 0 &&
			           e[i].state == FR_COMPLETED,
			       "mode %d entry %d: %s tag %d '%s' %s", mode, i, fr_op_name(e[i].op),
			       e[i].tag, e[i].label, fr_state_name(e[i].state));
		EXPECT(back == (mesh.rank + mesh.world - 1) % mesh.world, "ring step got %d", back);
		comm_stream_destroy(s);
		free(all);
	}
}

/* Every rank skips the same collective (so nothing hangs): each issues a barrier in its
 * place, the buffer is left alone, and the entry says barrier. */
TEST_CASE(test_skip_collective)
{
	int64_t last = 0;
	struct fr_entry e[2];
	last_entries(e, 0, &last);
	comm_flight_skip_collective(mesh.rank, "world", last + 2);
	int64_t a = 5, b = 7;
	comm_all_reduce_i64(&mesh.world_group, &a, 1);
	comm_all_reduce_i64(&mesh.world_group, &b, 1); /* the skipped one */
	comm_flight_skip_collective(-1, NULL, 0);
	int k = last_entries(e, 2, NULL);
	EXPECT(a == 5 * mesh.world && b == 7, "sums %lld %lld (the second must be left alone)",
	       (long long)a, (long long)b);
	EXPECT(k == 2 && e[0].op == FR_ALL_REDUCE && e[1].op == FR_BARRIER && e[1].bytes == 0 &&
	           e[1].seq == last + 2 && strstr(e[1].label, "debug.skip_collective"),
	       "entries: %s, %s seq %lld '%s'", k ? fr_op_name(e[0].op) : "-",
	       k > 1 ? fr_op_name(e[1].op) : "-", k > 1 ? (long long)e[1].seq : -1LL,
	       k > 1 ? e[1].label : "");
}

static cJSON *read_dump(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	static char buf[1 << 22];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	return cJSON_Parse(buf);
}

static const cJSON *dump_group(const cJSON *d, const char *name)
{
	const cJSON *g;
	cJSON_ArrayForEach (g, cJSON_GetObjectItem(d, "groups")) {
		if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(g, "name")), name) == 0)
			return g;
	}
	return NULL;
}

/* A dump: valid JSON naming the rank, the reason, the world group's ring and its counts. */
TEST_CASE(test_dump)
{
	int cap = 4 + (int)test_uniform(0, 6);
	comm_flight_configure(cap, dir);
	for (int i = 0; i < cap + 3; i++)
		comm_barrier(&mesh.world_group);
	int64_t last = 0;
	struct fr_entry e[1];
	last_entries(e, 0, &last);
	EXPECT(comm_flight_dump("unit test \"dump\"") == CT_OK, "dump");
	const char *path = comm_flight_dump_path();
	char want[128], tmp[160];
	snprintf(want, sizeof(want), "%s/comm_traces/rank_%d.json", dir, mesh.rank);
	snprintf(tmp, sizeof(tmp), "%s.tmp", want);
	EXPECT(strcmp(path, want) == 0, "path %s, want %s", path, want);
	EXPECT(access(tmp, F_OK) != 0, "%s left behind", tmp);
	cJSON *d = read_dump(want);
	EXPECT(d, "%s: not JSON", want);
	if (d) {
		const cJSON *g = dump_group(d, "world");
		const cJSON *es = g ? cJSON_GetObjectItem(g, "entries") : NULL;
		EXPECT(cJSON_GetNumberValue(cJSON_GetObjectItem(d, "rank")) == mesh.rank &&
		           cJSON_GetNumberValue(cJSON_GetObjectItem(d, "world_size")) == mesh.world,
		       "rank / world");
		EXPECT(strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(d, "reason")),
		              "unit test \"dump\"") == 0,
		       "reason");
		EXPECT(g && cJSON_GetArraySize(cJSON_GetObjectItem(g, "ranks")) == mesh.world &&
		           cJSON_GetNumberValue(cJSON_GetObjectItem(g, "last_seq")) == last,
		       "world group: members, last_seq %lld", (long long)last);
		EXPECT(cJSON_GetArraySize(es) == cap, "%d entries, want %d", cJSON_GetArraySize(es),
		       cap);
		const cJSON *tail = cJSON_GetArrayItem(es, cJSON_GetArraySize(es) - 1);
		EXPECT(tail && cJSON_GetNumberValue(cJSON_GetObjectItem(tail, "seq")) == last &&
		           strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(tail, "op")),
		                  "barrier") == 0 &&
		           strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(tail, "state")),
		                  "completed") == 0,
		       "newest entry");
		EXPECT(!dump_group(d, "pp") || mesh.world == 1, "a group of one is in the dump");
	}
	cJSON_Delete(d);
	unlink(want);
	comm_flight_configure(FR_DEFAULT_ENTRIES, NULL);
}

/* Dumps asked for (the SIGUSR1 path) are written by the watchdog thread while the comm
 * thread and this thread record (ThreadSanitizer checks the locking). */
TEST_CASE(test_dump_while_recording)
{
	comm_flight_configure(16, dir);
	char path[128];
	snprintf(path, sizeof(path), "%s/comm_traces/rank_%d.json", dir, mesh.rank);
	unlink(path);
	comm_watchdog_start(60);
	struct comm_stream *s = comm_stream_create(STREAM_THREAD, 60);
	struct comm_group dup;
	comm_group_dup(&mesh.world_group, &dup);
	int32_t mine = mesh.rank, *all = xcalloc((size_t)mesh.world, sizeof(int32_t));
	for (int i = 0; i < 200; i++) {
		struct comm_op op = {.kind = COMM_ALL_GATHER,
		                     .group = &mesh.world_group,
		                     .send = &mine,
		                     .recv = all,
		                     .count = 4,
		                     .what = "flight concurrent"};
		comm_stream_enqueue(s, &op);
		int64_t x = 1;
		comm_all_reduce_i64(&dup, &x, 1);
		if (i % 20 == 0)
			comm_flight_request_dump();
		if (i % 50 == 49)
			comm_stream_sync(s);
	}
	comm_stream_sync(s);
	comm_flight_request_dump();
	/* the watchdog polls every 0.1 s; a dump asked for by an earlier test may land first (its
	 * file exists before this test's groups are in one), so wait for a dump that has them */
	bool groups = false;
	for (int n = 0; n < 200 && !groups; n++) {
		cJSON *d = access(path, F_OK) == 0 ? read_dump(path) : NULL;
		groups = d && dump_group(d, "world") && dump_group(d, "duplicate");
		cJSON_Delete(d);
		if (!groups)
			usleep(50000);
	}
	EXPECT(access(path, F_OK) == 0, "no dump at %s", path);
	EXPECT(groups, "%s: no dump with the world and duplicate groups", path);
	comm_stream_destroy(s);
	comm_group_free(&dup);
	comm_watchdog_stop();
	free(all);
	comm_flight_configure(FR_DEFAULT_ENTRIES, NULL);
}

int main(int argc, char **argv)
{
	CHECK(comm_init(&argc, &argv) == CT_OK, "comm init");
	CHECK(mesh_build(&mesh, 1, 1, -1, 1) == CT_OK, "mesh");
	test_seed_all(&mesh.world_group);
	snprintf(dir, sizeof(dir), "/tmp/ct-flight-XXXXXX");
	if (mesh.rank == 0)
		CHECK(mkdtemp(dir), "mkdtemp");
	char names[64 * 16];
	CHECK(mesh.world <= 16, "up to 16 ranks");
	comm_all_gather(&mesh.world_group, dir, names, 64);
	memcpy(dir, names, 64); /* rank 0's folder */
	RUN(test_ring_wraps);
	RUN(test_ring_off);
	RUN(test_p2p_entries);
	RUN(test_stream_entries);
	RUN(test_skip_collective);
	RUN(test_dump);
	RUN(test_dump_while_recording);
	comm_barrier(&mesh.world_group);
	if (mesh.rank == 0) {
		char cmd[128];
		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		CHECK(system(cmd) == 0, "%s", cmd);
	}
	int rc = test_summary_all(&mesh.world_group);
	mesh_free(&mesh);
	comm_finalize();
	return rc;
}
