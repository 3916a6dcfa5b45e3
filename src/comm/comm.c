#include "comm/comm.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/log.h"
#include "comm/flight.h"
#include "comm/watchdog.h"

static int comm_rank_ = 0, comm_size_ = 1, comm_local_size_ = 1;
static int64_t comm_bytes_[COMM_KIND_COUNT]; /* atomic: the comm thread adds, others read */
/* MPI counts are int: no MPI call moves more than this many elements (a tunable so tests can
 * check the chunking with small buffers). */
static int64_t comm_max_count_ = (int64_t)1 << 30;

static MPI_Comm mpi_comm(const struct comm_group *g)
{
	return (MPI_Comm)(intptr_t)g->handle;
}

static void comm_abort_hook(void)
{
	MPI_Abort(MPI_COMM_WORLD, 1);
}

int comm_init(int *argc, char ***argv)
{
	int provided = 0;
	if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
		LOG_ERROR("MPI_Init_thread failed");
		return CT_ERR_RUNTIME;
	}
	MPI_Comm_rank(MPI_COMM_WORLD, &comm_rank_);
	MPI_Comm_size(MPI_COMM_WORLD, &comm_size_);
	log_set_rank(comm_rank_, comm_size_);
	if (provided < MPI_THREAD_MULTIPLE) {
		LOG_ERROR("the MPI library provides thread level %d; ctitan needs "
		          "MPI_THREAD_MULTIPLE (%d) for its communication thread",
		          provided, MPI_THREAD_MULTIPLE);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
	log_set_abort_hook(comm_abort_hook);
	/* Threads per rank: the cores of this node shared among its ranks. */
	MPI_Comm node;
	int local_size = 1;
	MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
	MPI_Comm_size(node, &local_size);
	MPI_Comm_free(&node);
	comm_local_size_ = local_size;
#ifdef _OPENMP
	if (!getenv("OMP_NUM_THREADS")) {
		long cores = sysconf(_SC_NPROCESSORS_ONLN);
		int threads = (int)(cores / local_size);
		omp_set_num_threads(threads < 1 ? 1 : threads);
	}
#endif
	return CT_OK;
}

void comm_finalize(void)
{
	comm_watchdog_stop();
	log_set_abort_hook(NULL);
	MPI_Finalize();
}

int comm_world_rank(void)
{
	return comm_rank_;
}
int comm_local_size(void)
{
	return comm_local_size_;
}
double comm_host_load(void)
{
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
#ifdef _OPENMP
	int threads = omp_get_max_threads();
#else
	int threads = 1;
#endif
	return cores > 0 ? (double)comm_local_size_ * threads / (double)cores : 1.0;
}
int comm_world_size(void)
{
	return comm_size_;
}

void comm_abort(int code)
{
	MPI_Abort(MPI_COMM_WORLD, code);
	abort();
}

/* ---------------------------------------------------------------- mesh */

/* Fill g from c and register it with the watchdog under a name and its world ranks. */
static void group_from(struct comm_group *g, MPI_Comm c, const char *name)
{
	g->handle = (void *)(intptr_t)c;
	MPI_Comm_rank(c, &g->rank);
	MPI_Comm_size(c, &g->size);
	int *mine = xcalloc((size_t)g->size, sizeof(int)),
	    *world = xcalloc((size_t)g->size, sizeof(int));
	MPI_Group cg, wg;
	MPI_Comm_group(c, &cg);
	MPI_Comm_group(MPI_COMM_WORLD, &wg);
	for (int i = 0; i < g->size; i++)
		mine[i] = i;
	MPI_Group_translate_ranks(cg, g->size, mine, wg, world);
	MPI_Group_free(&cg);
	MPI_Group_free(&wg);
	wd_group_add(g->handle, name, g->size, world);
	fr_group_add(g->handle, name, g->size, g->rank, world);
	free(mine);
	free(world);
}

/* Split the world keeping ranks that share every coordinate except those in `vary`
 * (coordinates pp, dp_replicate, dp_shard, cp, tp). */
static void mesh_split(const struct mesh *m, const int coord[5], const bool vary[5],
                       struct comm_group *g, const char *name)
{
	const int dims[5] = {m->pp, m->dp_replicate, m->dp_shard, m->cp, m->tp};
	int color = 0, key = 0;
	for (int d = 0; d < 5; d++) {
		if (vary[d])
			key = key * dims[d] + coord[d];
		else
			color = color * dims[d] + coord[d];
	}
	MPI_Comm c;
	MPI_Comm_split(MPI_COMM_WORLD, color, key, &c);
	group_from(g, c, name);
}

void comm_group_dup(const struct comm_group *g, struct comm_group *out)
{
	MPI_Comm c;
	MPI_Comm_dup((MPI_Comm)(intptr_t)g->handle, &c);
	group_from(out, c, "duplicate");
}

void comm_group_free(struct comm_group *g)
{
	MPI_Comm c = (MPI_Comm)(intptr_t)g->handle;
	if (c != MPI_COMM_NULL && c != MPI_COMM_WORLD) {
		wd_group_remove(g->handle);
		fr_group_remove(g->handle);
		MPI_Comm_free(&c);
	}
	g->handle = (void *)(intptr_t)MPI_COMM_NULL;
}

int mesh_build(struct mesh *m, int64_t pp, int64_t dp_replicate, int64_t dp_shard, int64_t tp)
{
	return mesh_build_cp(m, pp, dp_replicate, dp_shard, 1, tp);
}

int mesh_build_cp(struct mesh *m, int64_t pp, int64_t dp_replicate, int64_t dp_shard, int64_t cp,
                  int64_t tp)
{
	memset(m, 0, sizeof(*m));
	m->world = comm_size_;
	m->rank = comm_rank_;
	if (pp < 1 || dp_replicate < 1 || tp < 1 || cp < 1 || (dp_shard < 1 && dp_shard != -1)) {
		LOG_ERROR(
		    "parallelism: degrees must be >= 1 (data_parallel_shard_degree may be -1)");
		return CT_ERR_USAGE;
	}
	int64_t rest = pp * dp_replicate * cp * tp;
	if (dp_shard == -1) {
		if (m->world % rest) {
			if (cp > 1)
				LOG_ERROR("parallelism: world size %d is not divisible by pipeline "
				          "(%lld) x replicate (%lld) x context (%lld) x tensor (%lld) "
				          "degrees (parallelism.context_parallel_degree = %lld)",
				          m->world, (long long)pp, (long long)dp_replicate, (long long)cp,
				          (long long)tp, (long long)cp);
			else
				LOG_ERROR("parallelism: world size %d is not divisible by pipeline "
				          "(%lld) x replicate (%lld) x tensor (%lld) degrees",
				          m->world, (long long)pp, (long long)dp_replicate, (long long)tp);
			return CT_ERR_USAGE;
		}
		dp_shard = m->world / rest;
	}
	if (rest * dp_shard != m->world) {
		if (cp > 1)
			LOG_ERROR("parallelism: pipeline %lld x replicate %lld x shard %lld x context "
			          "%lld x tensor %lld = %lld ranks, but the world has %d "
			          "(parallelism.context_parallel_degree = %lld)",
			          (long long)pp, (long long)dp_replicate, (long long)dp_shard,
			          (long long)cp, (long long)tp, (long long)(rest * dp_shard), m->world,
			          (long long)cp);
		else
			LOG_ERROR("parallelism: pipeline %lld x replicate %lld x shard %lld x tensor "
			          "%lld = %lld ranks, but the world has %d",
			          (long long)pp, (long long)dp_replicate, (long long)dp_shard,
			          (long long)tp, (long long)(rest * dp_shard), m->world);
		return CT_ERR_USAGE;
	}
	m->pp = (int)pp;
	m->dp_replicate = (int)dp_replicate;
	m->dp_shard = (int)dp_shard;
	m->cp = (int)cp;
	m->tp = (int)tp;
	int r = m->rank;
	m->tp_rank = r % m->tp;
	r /= m->tp;
	m->cp_rank = r % m->cp;
	r /= m->cp;
	m->dp_shard_rank = r % m->dp_shard;
	r /= m->dp_shard;
	m->dp_replicate_rank = r % m->dp_replicate;
	m->pp_rank = r / m->dp_replicate;
	const int coord[5] = {m->pp_rank, m->dp_replicate_rank, m->dp_shard_rank, m->cp_rank,
	                      m->tp_rank};
	group_from(&m->world_group, MPI_COMM_WORLD, "world");
	mesh_split(m, coord, (const bool[5]){true, false, false, false, false}, &m->pp_group, "pp");
	mesh_split(m, coord, (const bool[5]){false, true, false, false, false},
	           &m->dp_replicate_group, "dp_replicate");
	mesh_split(m, coord, (const bool[5]){false, false, true, false, false}, &m->dp_shard_group,
	           "dp_shard");
	mesh_split(m, coord, (const bool[5]){false, false, false, false, true}, &m->tp_group, "tp");
	mesh_split(m, coord, (const bool[5]){false, true, true, false, false}, &m->dp_group, "dp");
	if (m->cp > 1) {
		mesh_split(m, coord, (const bool[5]){false, false, false, true, false}, &m->cp_group,
		           "cp");
		mesh_split(m, coord, (const bool[5]){false, false, true, true, false},
		           &m->shard_group, "dp_shard_cp");
		mesh_split(m, coord, (const bool[5]){false, true, true, true, false}, &m->loss_group,
		           "dp_cp");
	} else { /* the same ranks: the same communicators, so every cp = 1 layout keeps its bits */
		m->shard_group = m->dp_shard_group;
		m->loss_group = m->dp_group;
	}
	m->shard = m->shard_group.size;
	m->shard_rank = m->shard_group.rank;
	return CT_OK;
}

int mesh_build_ep(struct mesh *m, int64_t ep)
{
	if (ep <= 1)
		return CT_OK;
	if (m->shard % ep) {
		LOG_ERROR("parallelism.expert_parallel_degree = %lld does not divide the FSDP shard "
		          "group of %d ranks (data_parallel_shard_degree x context_parallel_degree)",
		          (long long)ep, m->shard);
		return CT_ERR_USAGE;
	}
	m->ep = (int)ep;
	m->ep_rank = m->shard_rank % m->ep;
	MPI_Comm c;
	MPI_Comm_split(mpi_comm(&m->shard_group), m->shard_rank / m->ep, m->ep_rank, &c);
	group_from(&m->ep_group, c, "ep");
	MPI_Comm_split(mpi_comm(&m->shard_group), m->ep_rank, m->shard_rank / m->ep, &c);
	group_from(&m->efsdp_group, c, "efsdp");
	return CT_OK;
}

void mesh_free(struct mesh *m)
{
	if (m->ep > 1) {
		comm_group_free(&m->ep_group);
		comm_group_free(&m->efsdp_group);
	}
	struct comm_group *gs[] = {&m->pp_group,  &m->dp_replicate_group, &m->dp_shard_group,
	                           &m->tp_group,  &m->dp_group,           &m->cp_group,
	                           &m->shard_group, &m->loss_group};
	const size_t n = m->cp > 1 ? 8 : 5; /* with cp = 1 the last three are aliases or empty */
	for (size_t i = 0; i < n; i++) {
		if (!gs[i]->handle)
			continue;
		MPI_Comm c = mpi_comm(gs[i]);
		wd_group_remove(gs[i]->handle);
		fr_group_remove(gs[i]->handle);
		MPI_Comm_free(&c);
	}
	memset(m, 0, sizeof(*m));
}

/* ---------------------------------------------------------------- collectives */

/* Every collective below: counted (atomically: the comm thread adds while the trainer reads),
 * watched (wd_enter/wd_leave) and recorded (comm/flight.h) between coll_begin and coll_end,
 * and split into MPI calls of at most comm_max_count_ elements (MPI counts are int; a 405B
 * block under HSDP is 3.2e9 floats). */

void comm_set_max_count(int64_t n)
{
	CHECK(n >= 1 && n <= INT_MAX, "comm: max count %lld out of range", (long long)n);
	comm_max_count_ = n;
}

static int64_t piece(int64_t left)
{
	return left < comm_max_count_ ? left : comm_max_count_;
}

static void count_bytes(enum comm_kind kind, int64_t bytes)
{
	__atomic_fetch_add(&comm_bytes_[kind], bytes, __ATOMIC_RELAXED);
}

/* A collective in progress: its watchdog slot and flight recorder entry. */
struct coll {
	int slot;
	int64_t fr;
};

/* Enter a collective on g (kind, count and unit as the watchdog names it; op, dt and bytes
 * per rank as the flight recorder does). Returns false when debug.skip_collective made this
 * rank issue a barrier in its place (run here: the job hangs on it and the watchdog ends it);
 * the caller then returns without its own MPI call. */
static bool coll_begin(struct coll *c, const struct comm_group *g, const char *kind,
                       const char *unit, int64_t count, enum fr_op op, enum fr_dtype dt,
                       int64_t bytes)
{
	char label[FR_LABEL];
	wd_label_text(label, sizeof(label));
	bool skip = false;
	c->fr = fr_start(g->handle, op, dt, bytes, label, &skip);
	if (skip) {
		char what[160];
		snprintf(what, sizeof(what),
		         "ranks (debug.skip_collective: in place of %s of %lld %s)", kind,
		         (long long)count, unit);
		LOG_WARN("debug.skip_collective: a barrier in place of %s of %lld %s (%s)", kind,
		         (long long)count, unit, label);
		int slot = wd_enter("barrier", what, g->handle, g->size);
		MPI_Barrier(mpi_comm(g));
		wd_leave(slot);
		fr_complete(c->fr);
		return false;
	}
	c->slot = wd_enter(kind, unit, g->handle, count);
	return true;
}

static void coll_end(const struct coll *c)
{
	wd_leave(c->slot);
	fr_complete(c->fr);
}

void comm_all_gather(const struct comm_group *g, const void *send, void *recv,
                     int64_t bytes_per_rank)
{
	count_bytes(COMM_ALL_GATHER, bytes_per_rank);
	if (g->size == 1) {
		if (send != recv)
			memcpy(recv, send, (size_t)bytes_per_rank);
		return;
	}
	struct coll c;
	if (!coll_begin(&c, g, "all-gather", "bytes per rank", bytes_per_rank, FR_ALL_GATHER, FR_U8,
	                bytes_per_rank))
		return;
	if (bytes_per_rank <= comm_max_count_) {
		MPI_Allgather(send, (int)bytes_per_rank, MPI_BYTE, recv, (int)bytes_per_rank,
		              MPI_BYTE, mpi_comm(g));
		coll_end(&c);
		return;
	}
	/* Piece by piece straight into place, no staging buffer: rank r's piece at byte off
	 * lands at recv + r * bytes_per_rank + off, which is one element of a type of n bytes
	 * resized to an extent of bytes_per_rank. */
	for (int64_t off = 0; off < bytes_per_rank; off += comm_max_count_) {
		int64_t n = piece(bytes_per_rank - off);
		MPI_Datatype run, strided;
		MPI_Type_contiguous((int)n, MPI_BYTE, &run);
		MPI_Type_create_resized(run, 0, (MPI_Aint)bytes_per_rank, &strided);
		MPI_Type_commit(&strided);
		MPI_Allgather((const char *)send + off, (int)n, MPI_BYTE, (char *)recv + off, 1,
		              strided, mpi_comm(g));
		MPI_Type_free(&strided);
		MPI_Type_free(&run);
	}
	coll_end(&c);
}

static void sendrecv_f32(const float *s, int to, float *r, int from, int64_t count, MPI_Comm c)
{
	for (int64_t off = 0; off < count; off += comm_max_count_) {
		int64_t n = piece(count - off);
		MPI_Sendrecv(s + off, (int)n, MPI_FLOAT, to, 7, r + off, (int)n, MPI_FLOAT, from, 7,
		             c, MPI_STATUS_IGNORE);
	}
}

/* Ring (any group size): in round k, rank r sends its running sum of chunk (r - k - 1) mod n
 * to r+1 and receives chunk (r - k - 2) mod n from r-1, adding its own contribution. After
 * n-1 rounds rank r holds the full sum of chunk r. Chunk c is summed in the ring order
 * starting at rank c+1, the same on every run but different from chunk to chunk. The running
 * sum lives in recv, the chunk received in scratch. */
static void reduce_scatter_ring(const struct comm_group *g, const float *send, float *recv,
                                int64_t count, float *scratch)
{
	int n = g->size, r = g->rank;
	MPI_Comm c = mpi_comm(g);
	int next = (r + 1) % n, prev = (r + n - 1) % n;
	float *acc = recv, *in = scratch;
	int chunk = (r + n - 1) % n;
	memcpy(acc, send + (int64_t)chunk * count, (size_t)count * sizeof(float));
	for (int k = 0; k < n - 1; k++) {
		sendrecv_f32(acc, next, in, prev, count, c);
		chunk = (chunk + n - 1) % n;
		const float *mine = send + (int64_t)chunk * count;
#pragma omp parallel for simd schedule(static)
		for (int64_t i = 0; i < count; i++)
			acc[i] = in[i] + mine[i];
	}
}

/* Recursive halving (group size a power of two), in place in buf: in round k rank r pairs
 * with r ^ 2^k, sends it the chunks whose bit k differs from r's and adds the partner's copy
 * of the chunks it keeps. Both partners compute x + y = y + x, so after round k every kept
 * chunk holds the sum over its block of 2^(k+1) consecutive ranks, and the final value of
 * every chunk is the same pairwise tree over ranks in order, e.g. ((g0 + g1) + (g2 + g3)):
 * the order does not depend on the chunk, so a single process can reproduce it exactly.
 * Bytes sent per rank: (n-1) x count, as in the ring; log2(n) rounds. */
static void reduce_scatter_tree(const struct comm_group *g, float *buf, float *recv, int64_t count,
                                float *in)
{
	int n = g->size, r = g->rank;
	MPI_Comm c = mpi_comm(g);
	for (int bit = 1; bit < n; bit <<= 1) {
		int partner = r ^ bit;
		/* live chunks agree with r below `bit`; bit `bit` says whether one goes or stays */
		for (int q = 0; q < n; q++) {
			if ((q & (bit - 1)) != (r & (bit - 1)) || (q & bit) != (r & bit))
				continue;
			int give = q ^ bit; /* the partner's counterpart of kept chunk q */
			float *mine = buf + (int64_t)q * count;
			sendrecv_f32(buf + (int64_t)give * count, partner, in, partner, count, c);
#pragma omp parallel for simd schedule(static)
			for (int64_t i = 0; i < count; i++)
				mine[i] = mine[i] + in[i];
		}
	}
	memcpy(recv, buf + (int64_t)r * count, (size_t)count * sizeof(float));
}

void comm_reduce_scatter_f32(const struct comm_group *g, float *send, float *recv, int64_t count,
                             float *scratch)
{
	int n = g->size;
	count_bytes(COMM_REDUCE_SCATTER, (int64_t)(n - 1) * count * 4);
	if (n == 1) {
		memcpy(recv, send, (size_t)count * sizeof(float));
		return;
	}
	struct coll c;
	if (!coll_begin(&c, g, "reduce-scatter", "floats per rank", count, FR_REDUCE_SCATTER,
	                FR_F32, count * 4))
		return;
	if ((n & (n - 1)) == 0)
		reduce_scatter_tree(g, send, recv, count, scratch);
	else
		reduce_scatter_ring(g, send, recv, count, scratch);
	coll_end(&c);
}

/* In-place sum over the group, at most comm_max_count_ elements per MPI call. */
static void all_reduce(const struct comm_group *g, void *buf, int64_t count, size_t elem,
                       MPI_Datatype type, const char *unit, enum fr_dtype dt)
{
	count_bytes(COMM_ALL_REDUCE, count * (int64_t)elem);
	if (g->size == 1)
		return;
	struct coll c;
	if (!coll_begin(&c, g, "all-reduce", unit, count, FR_ALL_REDUCE, dt, count * (int64_t)elem))
		return;
	for (int64_t off = 0; off < count; off += comm_max_count_)
		MPI_Allreduce(MPI_IN_PLACE, (char *)buf + (size_t)off * elem,
		              (int)piece(count - off), type, MPI_SUM, mpi_comm(g));
	coll_end(&c);
}

void comm_all_reduce_f32(const struct comm_group *g, float *buf, int64_t count)
{
	all_reduce(g, buf, count, sizeof(float), MPI_FLOAT, "floats", FR_F32);
}

void comm_all_reduce_f64(const struct comm_group *g, double *buf, int64_t count)
{
	all_reduce(g, buf, count, sizeof(double), MPI_DOUBLE, "doubles", FR_F64);
}

void comm_all_reduce_i64(const struct comm_group *g, int64_t *buf, int64_t count)
{
	all_reduce(g, buf, count, sizeof(int64_t), MPI_INT64_T, "int64s", FR_I64);
}

/* Tensor parallelism: the per-row maxima of a vocabulary-parallel softmax. */
void comm_all_reduce_max_f32(const struct comm_group *g, float *buf, int64_t count)
{
	count_bytes(COMM_ALL_REDUCE, count * 4);
	if (g->size == 1)
		return;
	struct coll c;
	if (!coll_begin(&c, g, "all-reduce (max)", "floats", count, FR_ALL_REDUCE_MAX, FR_F32,
	                count * 4))
		return;
	for (int64_t off = 0; off < count; off += comm_max_count_)
		MPI_Allreduce(MPI_IN_PLACE, buf + off, (int)piece(count - off), MPI_FLOAT, MPI_MAX,
		              mpi_comm(g));
	coll_end(&c);
}

void comm_all_to_all_v(const struct comm_group *g, const void *send, const int64_t *send_bytes,
                       void *recv, const int64_t *recv_bytes)
{
	int n = g->size;
	int64_t sent = 0, got = 0;
	for (int q = 0; q < n; q++)
		sent += send_bytes[q], got += recv_bytes[q];
	count_bytes(COMM_ALL_TO_ALL, sent);
	if (n == 1) {
		if (send != recv)
			memcpy(recv, send, (size_t)sent);
		return;
	}
	CHECK(sent <= INT_MAX && got <= INT_MAX,
	      "all-to-all: %lld / %lld bytes do not fit an MPI count", (long long)sent,
	      (long long)got);
	int *cnt = xcalloc((size_t)(4 * n), sizeof(int));
	int *sc = cnt, *sd = cnt + n, *rc = cnt + 2 * n, *rd = cnt + 3 * n;
	for (int q = 0, so = 0, ro = 0; q < n; q++) {
		sc[q] = (int)send_bytes[q], sd[q] = so, so += sc[q];
		rc[q] = (int)recv_bytes[q], rd[q] = ro, ro += rc[q];
	}
	struct coll c;
	if (coll_begin(&c, g, "all-to-all", "bytes sent", sent, FR_ALL_TO_ALL, FR_U8, sent)) {
		MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, mpi_comm(g));
		coll_end(&c);
	}
	free(cnt);
}

void comm_barrier(const struct comm_group *g)
{
	if (g->size == 1)
		return;
	struct coll c;
	if (!coll_begin(&c, g, "barrier", "ranks", g->size, FR_BARRIER, FR_NO_DTYPE, 0))
		return;
	MPI_Barrier(mpi_comm(g));
	coll_end(&c);
}

void comm_arrive(const struct comm_group *g)
{
	if (g->size == 1)
		return;
	int slot = wd_enter("arrival barrier", "ranks", g->handle, g->size);
	MPI_Request req;
	MPI_Ibarrier(mpi_comm(g), &req);
	long ns = 5000; /* sleeps 5, 10, 20 .. 80 us between tests */
	for (int done = 0;;) {
		MPI_Test(&req, &done, MPI_STATUS_IGNORE);
		if (done)
			break;
		struct timespec ts = {0, ns};
		nanosleep(&ts, NULL);
		ns = ns < 80000 ? 2 * ns : ns;
	}
	wd_leave(slot);
}

int64_t comm_bytes(enum comm_kind kind)
{
	return __atomic_load_n(&comm_bytes_[kind], __ATOMIC_RELAXED);
}

void comm_reset_bytes(void)
{
	for (int k = 0; k < COMM_KIND_COUNT; k++)
		__atomic_store_n(&comm_bytes_[k], 0, __ATOMIC_RELAXED);
}
