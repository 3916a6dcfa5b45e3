#include "comm/comm.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/log.h"

static int comm_rank_ = 0, comm_size_ = 1;
static int64_t comm_bytes_[COMM_KIND_COUNT];

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
	log_set_abort_hook(NULL);
	MPI_Finalize();
}

int comm_world_rank(void)
{
	return comm_rank_;
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

static void group_from(struct comm_group *g, MPI_Comm c)
{
	g->handle = (void *)(intptr_t)c;
	MPI_Comm_rank(c, &g->rank);
	MPI_Comm_size(c, &g->size);
}

/* Split the world keeping ranks that share every coordinate except those in `vary`. */
static void mesh_split(const struct mesh *m, const int coord[4], const bool vary[4],
                       struct comm_group *g)
{
	const int dims[4] = {m->pp, m->dp_replicate, m->dp_shard, m->tp};
	int color = 0, key = 0;
	for (int d = 0; d < 4; d++) {
		if (vary[d])
			key = key * dims[d] + coord[d];
		else
			color = color * dims[d] + coord[d];
	}
	MPI_Comm c;
	MPI_Comm_split(MPI_COMM_WORLD, color, key, &c);
	group_from(g, c);
}

void comm_group_dup(const struct comm_group *g, struct comm_group *out)
{
	MPI_Comm c;
	MPI_Comm_dup((MPI_Comm)(intptr_t)g->handle, &c);
	group_from(out, c);
}

void comm_group_free(struct comm_group *g)
{
	MPI_Comm c = (MPI_Comm)(intptr_t)g->handle;
	if (c != MPI_COMM_NULL && c != MPI_COMM_WORLD)
		MPI_Comm_free(&c);
	g->handle = (void *)(intptr_t)MPI_COMM_NULL;
}

int mesh_build(struct mesh *m, int64_t pp, int64_t dp_replicate, int64_t dp_shard, int64_t tp)
{
	memset(m, 0, sizeof(*m));
	m->world = comm_size_;
	m->rank = comm_rank_;
	if (pp < 1 || dp_replicate < 1 || tp < 1 || (dp_shard < 1 && dp_shard != -1)) {
		LOG_ERROR(
		    "parallelism: degrees must be >= 1 (data_parallel_shard_degree may be -1)");
		return CT_ERR_USAGE;
	}
	int64_t rest = pp * dp_replicate * tp;
	if (dp_shard == -1) {
		if (m->world % rest) {
			LOG_ERROR(
			    "parallelism: world size %d is not divisible by pipeline (%lld) x "
			    "replicate (%lld) x tensor (%lld) degrees",
			    m->world, (long long)pp, (long long)dp_replicate, (long long)tp);
			return CT_ERR_USAGE;
		}
		dp_shard = m->world / rest;
	}
	if (rest * dp_shard != m->world) {
		LOG_ERROR(
		    "parallelism: pipeline %lld x replicate %lld x shard %lld x tensor %lld = "
		    "%lld ranks, but the world has %d",
		    (long long)pp, (long long)dp_replicate, (long long)dp_shard, (long long)tp,
		    (long long)(rest * dp_shard), m->world);
		return CT_ERR_USAGE;
	}
	m->pp = (int)pp;
	m->dp_replicate = (int)dp_replicate;
	m->dp_shard = (int)dp_shard;
	m->tp = (int)tp;
	int r = m->rank;
	m->tp_rank = r % m->tp;
	r /= m->tp;
	m->dp_shard_rank = r % m->dp_shard;
	r /= m->dp_shard;
	m->dp_replicate_rank = r % m->dp_replicate;
	m->pp_rank = r / m->dp_replicate;
	const int coord[4] = {m->pp_rank, m->dp_replicate_rank, m->dp_shard_rank, m->tp_rank};
	group_from(&m->world_group, MPI_COMM_WORLD);
	mesh_split(m, coord, (const bool[4]){true, false, false, false}, &m->pp_group);
	mesh_split(m, coord, (const bool[4]){false, true, false, false}, &m->dp_replicate_group);
	mesh_split(m, coord, (const bool[4]){false, false, true, false}, &m->dp_shard_group);
	mesh_split(m, coord, (const bool[4]){false, false, false, true}, &m->tp_group);
	mesh_split(m, coord, (const bool[4]){false, true, true, false}, &m->dp_group);
	return CT_OK;
}

void mesh_free(struct mesh *m)
{
	struct comm_group *gs[] = {&m->pp_group, &m->dp_replicate_group, &m->dp_shard_group,
	                           &m->tp_group, &m->dp_group};
	for (size_t i = 0; i < sizeof(gs) / sizeof(gs[0]); i++) {
		if (!gs[i]->handle)
			continue;
		MPI_Comm c = mpi_comm(gs[i]);
		MPI_Comm_free(&c);
	}
	memset(m, 0, sizeof(*m));
}

/* ---------------------------------------------------------------- collectives */

/* MPI counts are int: large transfers go in pieces of at most 1 GiB. */
#define COMM_PIECE ((int64_t)1 << 30)

void comm_all_gather(const struct comm_group *g, const void *send, void *recv,
                     int64_t bytes_per_rank)
{
	__atomic_fetch_add(&comm_bytes_[COMM_ALL_GATHER], bytes_per_rank, __ATOMIC_RELAXED);
	if (g->size == 1) {
		if (send != recv)
			memcpy(recv, send, (size_t)bytes_per_rank);
		return;
	}
	if (bytes_per_rank <= COMM_PIECE) {
		MPI_Allgather(send, (int)bytes_per_rank, MPI_BYTE, recv, (int)bytes_per_rank,
		              MPI_BYTE, mpi_comm(g));
		return;
	}
	/* Rare huge case: gather pieces through a strided datatype-free loop. */
	char *tmp = malloc((size_t)COMM_PIECE * (size_t)g->size);
	CHECK(tmp, "out of memory");
	for (int64_t off = 0; off < bytes_per_rank; off += COMM_PIECE) {
		int64_t n = bytes_per_rank - off < COMM_PIECE ? bytes_per_rank - off : COMM_PIECE;
		MPI_Allgather((const char *)send + off, (int)n, MPI_BYTE, tmp, (int)n, MPI_BYTE,
		              mpi_comm(g));
		for (int r = 0; r < g->size; r++)
			memcpy((char *)recv + r * bytes_per_rank + off, tmp + r * n, (size_t)n);
	}
	free(tmp);
}

static void sendrecv_f32(const float *s, int to, float *r, int from, int64_t count, MPI_Comm c)
{
	for (int64_t off = 0; off < count; off += COMM_PIECE / 4) {
		int64_t n = count - off < COMM_PIECE / 4 ? count - off : COMM_PIECE / 4;
		MPI_Sendrecv(s + off, (int)n, MPI_FLOAT, to, 7, r + off, (int)n, MPI_FLOAT, from, 7,
		             c, MPI_STATUS_IGNORE);
	}
}

void comm_reduce_scatter_f32(const struct comm_group *g, const float *send, float *recv,
                             int64_t count, float *scratch)
{
	int n = g->size, r = g->rank;
	__atomic_fetch_add(&comm_bytes_[COMM_REDUCE_SCATTER], (int64_t)(n - 1) * count * 4,
	                   __ATOMIC_RELAXED);
	if (n == 1) {
		memcpy(recv, send, (size_t)count * sizeof(float));
		return;
	}
	/* Ring: in round k, rank r sends its running sum of chunk (r - k - 1) mod n to r+1 and
	 * receives chunk (r - k - 2) mod n from r-1, adding its own contribution. After n-1
	 * rounds, rank r holds the full sum of chunk r. Each chunk is summed in the same ring
	 * order on every run. */
	MPI_Comm c = mpi_comm(g);
	int next = (r + 1) % n, prev = (r + n - 1) % n;
	float *acc = scratch, *in = scratch + count;
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
	memcpy(recv, acc, (size_t)count * sizeof(float));
}

void comm_all_reduce_f32(const struct comm_group *g, float *buf, int64_t count)
{
	__atomic_fetch_add(&comm_bytes_[COMM_ALL_REDUCE], count * 4, __ATOMIC_RELAXED);
	if (g->size > 1)
		MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, mpi_comm(g));
}

void comm_all_reduce_f64(const struct comm_group *g, double *buf, int64_t count)
{
	__atomic_fetch_add(&comm_bytes_[COMM_ALL_REDUCE], count * 8, __ATOMIC_RELAXED);
	if (g->size > 1)
		MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_DOUBLE, MPI_SUM, mpi_comm(g));
}

void comm_all_reduce_i64(const struct comm_group *g, int64_t *buf, int64_t count)
{
	__atomic_fetch_add(&comm_bytes_[COMM_ALL_REDUCE], count * 8, __ATOMIC_RELAXED);
	if (g->size > 1)
		MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_INT64_T, MPI_SUM, mpi_comm(g));
}

/* Tensor parallelism: the per-row maxima of a vocabulary-parallel softmax. */
void comm_all_reduce_max_f32(const struct comm_group *g, float *buf, int64_t count)
{
	__atomic_fetch_add(&comm_bytes_[COMM_ALL_REDUCE], count * 4, __ATOMIC_RELAXED);
	if (g->size > 1)
		MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_MAX, mpi_comm(g));
}

void comm_barrier(const struct comm_group *g)
{
	if (g->size > 1)
		MPI_Barrier(mpi_comm(g));
}

int64_t comm_bytes(enum comm_kind kind)
{
	return comm_bytes_[kind];
}

void comm_reset_bytes(void)
{
	memset(comm_bytes_, 0, sizeof(comm_bytes_));
}
