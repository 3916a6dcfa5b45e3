/* comm: process groups, collectives and the device mesh, over MPI.
 *
 * Everything above this layer talks to `struct comm_group` and the comm_* functions, never to
 * MPI, so a second backend (NCCL) can slot in behind the same interface. One process is one
 * rank; without mpiexec the program runs as a world of one.
 *
 * Mesh: world = pp x dp_replicate x dp_shard x cp x tp, rank-major in that order (tp
 * innermost), one group per dimension built with MPI_Comm_split, plus the data-parallel group
 * dp_replicate x dp_shard (which samples a rank reads), FSDP's shard group dp_shard x cp
 * (parameters are sharded over both, as TorchTitan's dp_shard_cp) and the loss group
 * dp_replicate x dp_shard x cp (loss and token counts are reduced over it). With cp = 1 the
 * last two are the dp_shard and dp groups themselves.
 *
 * Every collective counts the bytes it moves per kind (comm_bytes), so tests can check, e.g.,
 * that a bf16 all-gather moves half the bytes of an fp32 one; runs under the watchdog
 * (comm/watchdog.h: a peer that hangs ends the job with a message, never a hang); and is split
 * into MPI calls of at most comm_set_max_count elements (MPI counts are int), with no staging
 * buffer: an all-gather's pieces land in place through a strided datatype.
 */
#ifndef CT_COMM_COMM_H
#define CT_COMM_COMM_H

#include <stdbool.h>
#include <stdint.h>

struct comm_group {
	void *handle; /* MPI_Comm */
	int rank, size;
};

enum comm_kind {
	COMM_ALL_GATHER,
	COMM_REDUCE_SCATTER,
	COMM_ALL_REDUCE,
	COMM_SENDRECV, /* one ring step: send to one peer, receive from another (comm/stream.h) */
	COMM_ALL_TO_ALL, /* expert parallelism's token dispatch and combine */
	COMM_KIND_COUNT
};

/* MPI_Init_thread with MPI_THREAD_MULTIPLE (fails clearly with less); sets the log rank, the
 * abort hook (MPI_Abort so one failing rank takes the job down), and OpenMP threads per rank
 * = cores / ranks on this node unless OMP_NUM_THREADS is set. */
int comm_init(int *argc, char ***argv);
void comm_finalize(void);
int comm_world_rank(void);
int comm_world_size(void);
/* Ranks of the world on this host (MPI's shared-memory split at comm_init). */
int comm_local_size(void);
/* This host's demand for cores when every rank of it computes: its ranks x this rank's
 * OpenMP threads / online cores (above 1 the ranks share cores). */
double comm_host_load(void);
/* Abort the whole job with an exit code (all ranks). */
_Noreturn void comm_abort(int code);

struct mesh {
	int world, rank;
	int pp, dp_replicate, dp_shard, cp, tp;                          /* degrees */
	int pp_rank, dp_replicate_rank, dp_shard_rank, cp_rank, tp_rank; /* coordinates */
	struct comm_group world_group, pp_group, dp_replicate_group, dp_shard_group, tp_group,
	    dp_group;
	struct comm_group cp_group; /* context parallelism (empty handle with cp = 1) */
	/* FSDP's shard group dp_shard x cp: its size and this rank's place in it */
	struct comm_group shard_group;
	int shard, shard_rank;
	struct comm_group loss_group; /* dp_replicate x dp_shard x cp */
	/* Expert parallelism (mesh_build_ep; ep = 1: none, both groups unset): the shard group
	 * viewed as efsdp x ep with ep innermost (TorchTitan's dp_shard_mod_ep x dp_shard_in_ep):
	 * ep_group = the ep neighbouring shard ranks that split the experts between them,
	 * efsdp_group = the shard ranks with the same ep rank (the same experts), over which
	 * FSDP shards those experts. */
	int ep, ep_rank;
	struct comm_group ep_group, efsdp_group;
};

/* dp_shard = -1 fills the rest of the world. CT_ERR_USAGE if the degrees do not multiply to
 * the world size (message names them). mesh_build is mesh_build_cp with cp = 1. */
int mesh_build(struct mesh *m, int64_t pp, int64_t dp_replicate, int64_t dp_shard, int64_t tp);
int mesh_build_cp(struct mesh *m, int64_t pp, int64_t dp_replicate, int64_t dp_shard, int64_t cp,
                  int64_t tp);
/* Expert parallelism of degree ep over the shard group (after mesh_build_cp): ep must divide
 * the shard group's size (CT_ERR_USAGE otherwise). ep = 1 does nothing. */
int mesh_build_ep(struct mesh *m, int64_t ep);
void mesh_free(struct mesh *m);

/* A second communicator over the same ranks (MPI_Comm_dup), for collectives issued from
 * another thread (e.g. a background checkpoint writer) so they never interleave with the
 * training step's. Collective over g. */
void comm_group_dup(const struct comm_group *g, struct comm_group *out);
void comm_group_free(struct comm_group *g);

/* Blocking collectives on a group. Buffers are this process's memory. */
void comm_all_gather(const struct comm_group *g, const void *send, void *recv,
                     int64_t bytes_per_rank);
/* recv[count] = sum over ranks of send[rank * count .. +count] (float), over point-to-point
 * messages (faster than OpenMPI's reduce_scatter on shared memory), in a fixed summation
 * order, so reruns are bitwise identical. On a power-of-two group (recursive halving) every
 * element is summed in one pairwise tree over ranks in order, ((g0 + g1) + (g2 + g3)), the
 * same for every chunk, so one process that sums per-rank gradients that way reproduces N
 * ranks bitwise; other sizes use a ring (each chunk summed from a different starting rank).
 * send is the working buffer: its contents may be overwritten. recv (count floats) and
 * scratch (count floats) must not overlap send or each other. */
void comm_reduce_scatter_f32(const struct comm_group *g, float *send, float *recv, int64_t count,
                             float *scratch /* count floats */);
void comm_all_reduce_f32(const struct comm_group *g, float *buf, int64_t count);
void comm_all_reduce_f64(const struct comm_group *g, double *buf, int64_t count);
void comm_all_reduce_i64(const struct comm_group *g, int64_t *buf, int64_t count);
/* Element-wise maximum (tensor parallelism's vocabulary-parallel softmax). */
void comm_all_reduce_max_f32(const struct comm_group *g, float *buf, int64_t count);
/* recv = the blocks every rank sent to this one, in rank order: rank q's block of
 * send_bytes[q] bytes goes to rank q, whose block from this rank is recv_bytes[this rank] long
 * (the caller knows the sizes: expert parallelism exchanges its counts first); blocks lie
 * contiguously in send and recv in rank order. Each count must fit an int. */
void comm_all_to_all_v(const struct comm_group *g, const void *send, const int64_t *send_bytes,
                       void *recv, const int64_t *recv_bytes);
void comm_barrier(const struct comm_group *g);
/* Return once every rank of g has called it, sleeping (not spinning) while it waits: MPI's
 * blocking calls busy-poll, so a collective whose peers are late burns a core for as long as
 * they are. The comm thread calls this before each collective, so the core it shares with
 * compute is not taken while a peer catches up (a short sleep between tests bounds the added
 * latency to ~0.1 ms). */
void comm_arrive(const struct comm_group *g);

/* Largest element count one MPI call carries (default 2^30; 1 .. INT_MAX). Tests lower it to
 * check the chunking on small buffers. Not thread-safe: set it before collectives run. */
void comm_set_max_count(int64_t n);

/* Bytes this rank sent into collectives of a kind since start (or the last reset). */
int64_t comm_bytes(enum comm_kind kind);
void comm_reset_bytes(void);

#endif
