/* tests/test_comm: the comm layer's own tests (issue 16's defects), on 2-4 ranks.
 *
 * The MPI calls the comm layer makes are interposed here through MPI's profiling interface
 * (each MPI_X below forwards to PMPI_X), so the tests see every count passed to MPI: the
 * chunked collectives are checked to keep every call under the limit, and a count-only mode
 * runs a 2^31 + 12345-element all-reduce and all-gather over address space that is reserved
 * but never touched (no 8 GiB needed): the pieces must cover the buffer exactly, in order,
 * each a valid int.
 *
 *   mpiexec -n 2..4 test_comm                  the unit tests
 *   mpiexec -n 3 test_comm --hang R MODE S      rank R hangs outside any collective while the
 *                                              others run one (MODE = blocking | stream | p2p)
 *                                              or end (MODE = final: comm_finalize) with the
 *                                              watchdog at S seconds: tests/watchdog.sh
 *                                              checks the job ends, naming rank R
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/log.h"
#include "base/thread.h"
#include "comm/comm.h"
#include "comm/p2p.h"
#include "comm/stream.h"
#include "comm/watchdog.h"
#include "testutil.h"

static struct mesh mesh;
static uint64_t seed;

/* ---------------------------------------------------------------- MPI interposition */

static int64_t max_count; /* atomic: largest count passed to MPI since the last reset */
static bool dry;          /* count-only: check the pieces, move nothing */
static const char *dry_send, *dry_recv; /* where the next piece must start */
static int64_t dry_total, dry_calls, dry_bad;

static void note_count(int64_t n)
{
	int64_t cur = __atomic_load_n(&max_count, __ATOMIC_RELAXED);
	while (n > cur && !__atomic_compare_exchange_n(&max_count, &cur, n, false, __ATOMIC_RELAXED,
	                                               __ATOMIC_RELAXED))
		;
}

static void dry_piece(const void *send, void *recv, int count, int elem)
{
	dry_calls++;
	if (count <= 0 || (send && send != (const void *)dry_send) || recv != (void *)dry_recv)
		dry_bad++;
	dry_total += count;
	if (count > 0) {
		dry_send += (size_t)count * (size_t)elem;
		dry_recv += (size_t)count * (size_t)elem;
	}
}

int MPI_Allreduce(const void *s, void *r, int count, MPI_Datatype t, MPI_Op op, MPI_Comm c)
{
	note_count(count);
	if (dry) {
		int size;
		MPI_Type_size(t, &size);
		dry_piece(NULL, r, count, size);
		return MPI_SUCCESS;
	}
	return PMPI_Allreduce(s, r, count, t, op, c);
}

int MPI_Allgather(const void *s, int sc, MPI_Datatype st, void *r, int rc, MPI_Datatype rt,
                  MPI_Comm c)
{
	note_count(sc);
	if (dry) {
		dry_piece(s, r, sc, 1); /* bytes; the recv side moves by the same offset */
		return MPI_SUCCESS;
	}
	return PMPI_Allgather(s, sc, st, r, rc, rt, c);
}

int MPI_Sendrecv(const void *s, int sc, MPI_Datatype st, int to, int stag, void *r, int rc,
                 MPI_Datatype rt, int from, int rtag, MPI_Comm c, MPI_Status *status)
{
	note_count(sc);
	note_count(rc);
	return PMPI_Sendrecv(s, sc, st, to, stag, r, rc, rt, from, rtag, c, status);
}

/* ---------------------------------------------------------------- data */

/* An integer in [-500, 500) that every rank can compute for every rank: sums are exact. */
static int64_t val(int rank, int64_t i, int salt)
{
	uint64_t h = seed ^ ((uint64_t)rank << 40) ^ ((uint64_t)salt << 56) ^ (uint64_t)i;
	h ^= h >> 33, h *= 0xff51afd7ed558ccdull, h ^= h >> 33, h *= 0xc4ceb9fe1a85ec53ull;
	return (int64_t)((h >> 11) % 1000) - 500;
}

static int64_t sum_over_ranks(int64_t i, int salt)
{
	int64_t s = 0;
	for (int r = 0; r < mesh.world; r++)
		s += val(r, i, salt);
	return s;
}

/* ---------------------------------------------------------------- chunking */

TEST_CASE(test_chunked_all_reduce)
{
	const int64_t counts[] = {1, 7, 8, 100, 1001};
	comm_set_max_count(7);
	for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
		int64_t n = counts[k];
		float *f = xcalloc((size_t)n, sizeof(float));
		double *d = xcalloc((size_t)n, sizeof(double));
		int64_t *q = xcalloc((size_t)n, sizeof(int64_t));
		for (int64_t i = 0; i < n; i++) {
			f[i] = (float)val(mesh.rank, i, 1);
			d[i] = (double)val(mesh.rank, i, 2);
			q[i] = val(mesh.rank, i, 3);
		}
		max_count = 0;
		comm_all_reduce_f32(&mesh.world_group, f, n);
		comm_all_reduce_f64(&mesh.world_group, d, n);
		comm_all_reduce_i64(&mesh.world_group, q, n);
		EXPECT(max_count >= 1 && max_count <= 7, "an MPI call carried %lld elements",
		       (long long)max_count);
		int64_t bad = 0;
		for (int64_t i = 0; i < n; i++)
			bad += f[i] != (float)sum_over_ranks(i, 1) ||
			       d[i] != (double)sum_over_ranks(i, 2) || q[i] != sum_over_ranks(i, 3);
		EXPECT(bad == 0, "count %lld: %lld wrong sums", (long long)n, (long long)bad);
		free(f), free(d), free(q);
	}
	comm_set_max_count((int64_t)1 << 30);
}

TEST_CASE(test_chunked_all_gather)
{
	const int64_t sizes[] = {1, 5, 6, 37};
	comm_set_max_count(5);
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		int64_t n = sizes[k], W = mesh.world;
		unsigned char *send = xcalloc((size_t)n, 1), *recv = xcalloc((size_t)(n * W), 1);
		for (int64_t i = 0; i < n; i++)
			send[i] = (unsigned char)val(mesh.rank, i, 4);
		max_count = 0;
		comm_all_gather(&mesh.world_group, send, recv, n);
		EXPECT(max_count >= 1 && max_count <= 5, "an MPI call carried %lld bytes",
		       (long long)max_count);
		int64_t bad = 0;
		for (int r = 0; r < W; r++)
			for (int64_t i = 0; i < n; i++)
				bad += recv[r * n + i] != (unsigned char)val(r, i, 4);
		EXPECT(bad == 0, "%lld bytes per rank: %lld wrong bytes", (long long)n,
		       (long long)bad);
		free(send), free(recv);
	}
	comm_set_max_count((int64_t)1 << 30);
}

TEST_CASE(test_chunked_reduce_scatter)
{
	int64_t n = 50, W = mesh.world;
	comm_set_max_count(7);
	float *send = xcalloc((size_t)(n * W), sizeof(float)),
	      *recv = xcalloc((size_t)n, sizeof(float));
	float *scratch = xcalloc((size_t)(2 * n), sizeof(float));
	for (int64_t i = 0; i < n * W; i++)
		send[i] = (float)val(mesh.rank, i, 5);
	max_count = 0;
	comm_reduce_scatter_f32(&mesh.world_group, send, recv, n, scratch);
	EXPECT(max_count >= 1 && max_count <= 7, "an MPI call carried %lld floats",
	       (long long)max_count);
	int64_t bad = 0;
	for (int64_t i = 0; i < n; i++)
		bad += recv[i] != (float)sum_over_ranks(mesh.rank * n + i, 5);
	EXPECT(bad == 0, "%lld wrong sums", (long long)bad);
	free(send), free(recv), free(scratch);
	comm_set_max_count((int64_t)1 << 30);
}

/* A float whose sum with others depends on the order: val() scaled by 2^-30 .. 2^9. */
static float val_f(int rank, int64_t i)
{
	return ldexpf((float)val(rank, i, 6), (int)(val(rank, i, 7) + 500) % 40 - 30);
}

/* On a power-of-two group every element is summed in one pairwise tree over ranks in order,
 * ((g0 + g1) + (g2 + g3)), whatever chunk it is in (comm.h): what lets one process reproduce
 * N ranks bitwise (tests/test_fsdp.c --bf16-compute). Checked bitwise against that tree
 * computed here; the left fold ((g0 + g1) + g2) + g3 must differ somewhere, or the values
 * would not tell orders apart. */
TEST_CASE(test_reduce_scatter_tree_order)
{
	int64_t n = 4099, W = mesh.world;
	if (W & (W - 1))
		return;
	float *send = xcalloc((size_t)(n * W), sizeof(float)),
	      *recv = xcalloc((size_t)n, sizeof(float));
	float *scratch = xcalloc((size_t)(2 * n), sizeof(float)),
	      *g = xcalloc((size_t)W, sizeof(float));
	for (int64_t i = 0; i < n * W; i++)
		send[i] = val_f(mesh.rank, i);
	comm_reduce_scatter_f32(&mesh.world_group, send, recv, n, scratch);
	int64_t bad = 0, fold_differs = 0;
	for (int64_t i = 0; i < n; i++) {
		int64_t e = mesh.rank * n + i;
		float fold = 0;
		for (int r = 0; r < W; r++)
			g[r] = val_f(r, e), fold = r ? fold + g[r] : g[r];
		for (int w = 1; w < W; w <<= 1)
			for (int r = 0; r + w < W; r += 2 * w)
				g[r] = g[r] + g[r + w];
		bad += memcmp(&recv[i], &g[0], sizeof(float)) != 0;
		fold_differs += fold != g[0];
	}
	EXPECT(bad == 0, "%lld of %lld sums not the pairwise tree's", (long long)bad, (long long)n);
	if (W >= 4) {
		comm_all_reduce_i64(&mesh.world_group, &fold_differs, 1);
		EXPECT(fold_differs > 0, "the values do not tell summation orders apart");
	}
	free(send), free(recv), free(scratch), free(g);
}

/* Address space only: pages are never touched, so no memory is used. */
static void *reserve(size_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
	               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

TEST_CASE(test_count_only_beyond_int)
{
	const int64_t n = ((int64_t)1 << 31) + 12345; /* 3 pieces of at most 2^30 */
	float *buf = reserve((size_t)n * sizeof(float));
	EXPECT(buf, "cannot reserve %lld floats of address space", (long long)n);
	if (buf) {
		dry = true, dry_send = NULL, dry_recv = (const char *)buf;
		dry_total = dry_calls = dry_bad = 0;
		comm_all_reduce_f32(&mesh.world_group, buf, n);
		dry = false;
		EXPECT(dry_bad == 0 && dry_total == n && dry_calls == 3,
		       "all-reduce of %lld floats: %lld pieces (%lld bad) covering %lld elements",
		       (long long)n, (long long)dry_calls, (long long)dry_bad,
		       (long long)dry_total);
		munmap(buf, (size_t)n * sizeof(float));
	}
	char *send = reserve((size_t)n), *recv = reserve((size_t)n * (size_t)mesh.world);
	EXPECT(send && recv, "cannot reserve address space");
	if (send && recv) {
		dry = true, dry_send = send, dry_recv = recv;
		dry_total = dry_calls = dry_bad = 0;
		comm_all_gather(&mesh.world_group, send, recv, n);
		dry = false;
		EXPECT(dry_bad == 0 && dry_total == n && dry_calls == 3,
		       "all-gather of %lld bytes per rank: %lld pieces (%lld bad) covering %lld",
		       (long long)n, (long long)dry_calls, (long long)dry_bad,
		       (long long)dry_total);
	}
	if (send)
		munmap(send, (size_t)n);
	if (recv)
		munmap(recv, (size_t)n * (size_t)mesh.world);
}

/* ---------------------------------------------------------------- the stream */

/* Enqueue with the label in a buffer that is overwritten right after (as a caller's stack
 * frame is, fsdp.c's `char what[64]`). */
static int64_t enqueue_gather(struct comm_stream *s, int b, const void *send, void *recv)
{
	static char what[64];
	snprintf(what, sizeof(what), "all-gather of bucket %d", b);
	struct comm_op op = {.kind = COMM_ALL_GATHER,
	                     .group = &mesh.world_group,
	                     .send = send,
	                     .recv = recv,
	                     .count = 4,
	                     .scratch = NULL,
	                     .what = what};
	int64_t t = comm_stream_enqueue(s, &op);
	memset(what, 'x', sizeof(what) - 1);
	return t;
}

TEST_CASE(test_label_outlives_caller)
{
	for (int mode = 0; mode < STREAM_MODE_COUNT; mode++) {
		struct comm_stream *s = comm_stream_create((enum stream_mode)mode, 60);
		int32_t mine = mesh.rank;
		int32_t *all = xcalloc((size_t)mesh.world, sizeof(int32_t));
		int64_t t = enqueue_gather(s, 3, &mine, all);
		const char *w = comm_stream_op_label(s, t);
		EXPECT(w && strcmp(w, "all-gather of bucket 3") == 0, "mode %d: label '%s'", mode,
		       w ? w : "(null)");
		comm_stream_sync(s);
		w = comm_stream_op_label(s, t);
		EXPECT(w && strcmp(w, "all-gather of bucket 3") == 0,
		       "mode %d: label after completion '%s'", mode, w ? w : "(null)");
		for (int r = 0; r < mesh.world; r++)
			EXPECT(all[r] == r, "mode %d: gathered %d from rank %d", mode, all[r], r);
		comm_stream_destroy(s);
		free(all);
	}
}

/* The threads of this process named `name`; sigblk: the SigBlk mask of the last one. */
static int threads_named(const char *name, unsigned long long *sigblk)
{
	DIR *d = opendir("/proc/self/task");
	int count = 0;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char path[300], line[256] = "";
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		if (!fgets(line, sizeof(line), f))
			line[0] = '\0';
		fclose(f);
		line[strcspn(line, "\n")] = '\0';
		if (strcmp(line, name) != 0)
			continue;
		count++;
		snprintf(path, sizeof(path), "/proc/self/task/%s/status", e->d_name);
		f = fopen(path, "r");
		while (f && fgets(line, sizeof(line), f))
			if (strncmp(line, "SigBlk:", 7) == 0)
				*sigblk = strtoull(line + 7, NULL, 16);
		if (f)
			fclose(f);
	}
	if (d)
		closedir(d);
	return count;
}

static bool blocks(unsigned long long mask, int sig)
{
	return (mask >> (sig - 1)) & 1;
}

/* The comm thread runs alone (no OpenMP team beside the compute team) and takes no signal. */
/* A ring of SENDRECV ops on the stream (async TP's ring steps): in both modes, after
 * world - 1 steps every rank holds every rank's block, each moved one hop per step, while the
 * caller writes into other memory meanwhile; with a simulated link each step lasts at least
 * its bytes over it. */
TEST_CASE(test_stream_sendrecv_ring)
{
	int W = mesh.world, R = mesh.rank;
	const int64_t n = 4096; /* floats per block */
	float *full = calloc((size_t)(W * n), sizeof(float));
	for (int mode = 0; mode < STREAM_MODE_COUNT; mode++) {
		struct comm_stream *s = comm_stream_create((enum stream_mode)mode, 60);
		comm_stream_simulate(s, 1.0, 0.0); /* 1 Gbit/s: 16 KiB takes >= 131 us */
		memset(full, 0, (size_t)(W * n) * sizeof(float));
		for (int64_t j = 0; j < n; j++)
			full[R * n + j] = (float)(R * 100000 + j);
		double slowest = 1e30;
		for (int k = 0; k < W - 1; k++) {
			int have = (R - k + W) % W, next = (R - k - 1 + W) % W;
			struct comm_op op = {.kind = COMM_SENDRECV,
			                     .group = &mesh.world_group,
			                     .send = full + have * n,
			                     .recv = full + next * n,
			                     .count = n * (int64_t)sizeof(float),
			                     .what = "ring step",
			                     .to = (R + 1) % W,
			                     .from = (R + W - 1) % W,
			                     .tag = 0x5470 + k};
			int64_t t = comm_stream_enqueue(s, &op);
			comm_stream_wait(s, t);
			double t0, t1;
			comm_stream_op_times(s, t, &t0, &t1, NULL);
			slowest = t1 - t0 < slowest ? t1 - t0 : slowest;
		}
		int64_t bad = 0;
		for (int r = 0; r < W; r++)
			for (int64_t j = 0; j < n; j++)
				bad += full[r * n + j] != (float)(r * 100000 + j);
		EXPECT(bad == 0, "mode %d: %lld elements wrong after the ring", mode,
		       (long long)bad);
		EXPECT(W < 2 || slowest >= 0.9 * (double)(n * 4) * 8 / 1e9,
		       "mode %d: a ring step of %lld bytes took %.1f us on a 1 Gbit/s link", mode,
		       (long long)(n * 4), slowest * 1e6);
		comm_stream_destroy(s);
	}
	free(full);
}

/* A collective whose peer is late: the comm thread sleeps until the group has arrived
 * (comm_arrive) instead of busy-polling inside MPI on a core compute needs. The last rank
 * enqueues 300 ms late; the others' comm threads must spend well under that in CPU (a thread
 * polling in MPI spends all of it), and the gathered data must be right. */
TEST_CASE(test_late_peer_costs_no_cpu)
{
	struct comm_stream *s = comm_stream_create(STREAM_THREAD, 60);
	int64_t W = mesh.world, n = 1 << 16;
	int32_t *send = xcalloc((size_t)n, sizeof(int32_t)),
	        *recv = xcalloc((size_t)(n * W), sizeof(int32_t));
	for (int64_t i = 0; i < n; i++)
		send[i] = (int32_t)(mesh.rank * 1000003 + i);
	struct comm_op op = {.kind = COMM_ALL_GATHER,
	                     .group = &mesh.world_group,
	                     .send = send,
	                     .recv = recv,
	                     .count = n * 4,
	                     .scratch = NULL,
	                     .what = "all-gather beside a late peer"};
	comm_barrier(&mesh.world_group);
	if (mesh.rank == W - 1)
		usleep(300000);
	int64_t t = comm_stream_enqueue(s, &op);
	comm_stream_wait(s, t);
	double t0, t1, cpu;
	comm_stream_op_times(s, t, &t0, &t1, &cpu);
	if (mesh.rank != W - 1)
		EXPECT(cpu < 0.1 && t1 - t0 > 0.2,
		       "rank %d's comm thread spent %.3f s of CPU in %.3f s waiting for a peer "
		       "300 ms late (polling instead of sleeping?)",
		       mesh.rank, cpu, t1 - t0);
	int bad = 0;
	for (int64_t r = 0; r < W; r++)
		for (int64_t i = 0; i < n; i++)
			bad += recv[r * n + i] != (int32_t)(r * 1000003 + i);
	EXPECT(bad == 0, "%d gathered values wrong", bad);
	comm_stream_destroy(s);
	free(send), free(recv);
}

TEST_CASE(test_comm_thread_quiet)
{
	struct comm_stream *s = comm_stream_create(STREAM_THREAD, 60);
	int64_t n = 4096, W = mesh.world;
	float *send = xcalloc((size_t)(n * W), sizeof(float)),
	      *recv = xcalloc((size_t)n, sizeof(float));
	float *scratch = xcalloc((size_t)(2 * n), sizeof(float));
	struct comm_op op = {.kind = COMM_REDUCE_SCATTER,
	                     .group = &mesh.world_group,
	                     .send = send,
	                     .recv = recv,
	                     .count = n,
	                     .scratch = scratch,
	                     .what = "rs"};
	comm_stream_wait(s, comm_stream_enqueue(s, &op)); /* its sum loop is an omp parallel for */
	unsigned long long mask = 0;
	int k = threads_named("ct-comm", &mask);
	EXPECT(k == 1, "%d threads named ct-comm (an OpenMP team on the comm thread?)", k);
	EXPECT(blocks(mask, SIGTERM) && blocks(mask, SIGINT) && blocks(mask, SIGUSR1) &&
	           !blocks(mask, SIGSEGV),
	       "comm thread's signal mask %llx", mask);
	comm_stream_destroy(s);
	free(send), free(recv), free(scratch);
}

static int helper_go, helper_started; /* atomic */

static void *helper_main(void *arg)
{
	(void)arg;
	__atomic_store_n(&helper_started, 1, __ATOMIC_RELEASE);
	while (!__atomic_load_n(&helper_go, __ATOMIC_ACQUIRE))
		usleep(1000);
	return NULL;
}

/* thread_start (the checkpoint writer's and the watchdog's too) masks signals. */
TEST_CASE(test_thread_start_masks)
{
	pthread_t t;
	EXPECT(thread_start(&t, "ct-test", helper_main, NULL) == 0, "thread_start");
	/* (glibc blocks everything in a new thread until it starts running: wait for that) */
	while (!__atomic_load_n(&helper_started, __ATOMIC_ACQUIRE))
		usleep(1000);
	unsigned long long mask = 0;
	int k = threads_named("ct-test", &mask);
	EXPECT(k == 1 && blocks(mask, SIGTERM) && blocks(mask, SIGINT) && blocks(mask, SIGHUP) &&
	           !blocks(mask, SIGSEGV) && !blocks(mask, SIGBUS),
	       "helper thread: %d found, mask %llx", k, mask);
	__atomic_store_n(&helper_go, 1, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
}

/* An all-gather of every rank's 4-byte id over the world. */
static struct comm_op gather_ranks(const int32_t *mine, int32_t *all, const char *what)
{
	return (struct comm_op){.kind = COMM_ALL_GATHER,
	                        .group = &mesh.world_group,
	                        .send = mine,
	                        .recv = all,
	                        .count = 4,
	                        .what = what};
}

/* The trainer reads and resets the counters while the comm thread adds to them (run under
 * ThreadSanitizer by `make tsan`). */
TEST_CASE(test_counters_concurrent)
{
	struct comm_stream *s = comm_stream_create(STREAM_THREAD, 60);
	comm_reset_bytes();
	int32_t mine = mesh.rank, *all = xcalloc((size_t)mesh.world, sizeof(int32_t));
	struct comm_op op = gather_ranks(&mine, all, "counter");
	int64_t last = 0, backwards = 0;
	for (int i = 0; i < 200; i++) {
		comm_stream_enqueue(s, &op);
		int64_t b = comm_bytes(COMM_ALL_GATHER);
		backwards += b < last;
		last = b;
		if (i % 50 == 49)
			comm_stream_sync(s);
	}
	comm_stream_sync(s);
	EXPECT(backwards == 0, "the counter went backwards %lld times", (long long)backwards);
	EXPECT(comm_bytes(COMM_ALL_GATHER) == 200 * 4, "counted %lld bytes, want 800",
	       (long long)comm_bytes(COMM_ALL_GATHER));
	comm_reset_bytes();
	EXPECT(comm_bytes(COMM_ALL_GATHER) == 0, "reset");
	comm_stream_destroy(s);
	free(all);
}

/* The watchdog thread runs beside collectives on two threads without firing (and, under
 * ThreadSanitizer, without races on its tables). */
TEST_CASE(test_watchdog_quiet)
{
	comm_watchdog_start(60);
	struct comm_stream *s = comm_stream_create(STREAM_THREAD, 60);
	struct comm_group dup;
	comm_group_dup(&mesh.world_group, &dup); /* the main thread's collectives go here */
	int32_t mine = mesh.rank, *all = xcalloc((size_t)mesh.world, sizeof(int32_t));
	struct comm_op op = gather_ranks(&mine, all, "quiet");
	int64_t bad = 0;
	for (int i = 0; i < 100; i++) {
		comm_watchdog_set_step(i);
		comm_stream_enqueue(s, &op);
		int64_t x = 1;
		comm_label("quiet %d", i);
		comm_all_reduce_i64(&dup, &x, 1);
		bad += x != mesh.world;
	}
	comm_stream_sync(s);
	EXPECT(bad == 0, "%lld wrong sums", (long long)bad);
	comm_stream_destroy(s);
	comm_group_free(&dup);
	comm_watchdog_stop();
	free(all);
}

/* ---------------------------------------------------------------- hang mode */

static int hang(int who, const char *mode, double timeout)
{
	comm_watchdog_start(timeout);
	comm_watchdog_set_step(7);
	if (mesh.rank == who) {
		fprintf(stderr, "rank %d: hanging outside any collective\n", who);
		sleep(120);
		return 1;
	}
	if (strcmp(mode, "final") == 0) {
		/* rank `who` is late for the end: the others must not wait in MPI_Finalize */
		mesh_free(&mesh);
		comm_finalize();
	} else if (strcmp(mode, "p2p") == 0) { /* a pipeline neighbour that never sends */
		float x = 0;
		struct comm_p2p r;
		comm_p2p_irecv(&mesh.world_group, who, 5, &x, sizeof(x), &r);
		int token = comm_p2p_watch(&mesh.world_group, who, "test receive of an activation");
		comm_p2p_wait(&r, 0, "test receive");
		comm_p2p_unwatch(token);
	} else if (strcmp(mode, "stream") == 0) {
		struct comm_stream *s = comm_stream_create(STREAM_THREAD, timeout);
		int32_t mine = mesh.rank, *all = xcalloc((size_t)mesh.world, sizeof(int32_t));
		comm_stream_wait(s, enqueue_gather(s, 3, &mine, all));
	} else {
		double x = 1;
		comm_context("checkpoint save of step 7");
		comm_label("clip: gradient sum of squares");
		comm_all_reduce_f64(&mesh.world_group, &x, 1);
	}
	fprintf(stderr, "rank %d: the collective completed without rank %d?\n", mesh.rank, who);
	return 1;
}

int main(int argc, char **argv)
{
	CHECK(comm_init(&argc, &argv) == CT_OK, "comm init");
	CHECK(mesh_build(&mesh, 1, 1, -1, 1) == CT_OK, "mesh");
	if (argc == 5 && strcmp(argv[1], "--hang") == 0)
		return hang(atoi(argv[2]), argv[3], atof(argv[4]));
	/* rank 0's seed for all ranks */
	int64_t s = mesh.rank == 0 ? (int64_t)test_seed() : 0;
	comm_all_reduce_i64(&mesh.world_group, &s, 1);
	seed = (uint64_t)s;
	RUN(test_chunked_all_reduce);
	RUN(test_chunked_all_gather);
	RUN(test_chunked_reduce_scatter);
	RUN(test_reduce_scatter_tree_order);
	RUN(test_count_only_beyond_int);
	RUN(test_label_outlives_caller);
	RUN(test_stream_sendrecv_ring);
	RUN(test_late_peer_costs_no_cpu);
	RUN(test_comm_thread_quiet);
	RUN(test_thread_start_masks);
	RUN(test_counters_concurrent);
	RUN(test_watchdog_quiet);
	/* every rank's verdict counts */
	int64_t failed = test_summary() != 0;
	comm_all_reduce_i64(&mesh.world_group, &failed, 1);
	if (mesh.rank == 0 && failed)
		fprintf(stderr, "%lld rank(s) failed\n", (long long)failed);
	mesh_free(&mesh);
	comm_finalize();
	return failed ? 1 : 0;
}
