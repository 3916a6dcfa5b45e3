/* bench/bench_comm: all-gather and reduce-scatter bus bandwidth of the comm layer.
 *
 *   mpiexec -n N build/bench/bench_comm [MAX_MIB]
 *
 * For payloads of 1 MiB .. MAX_MIB (default 64) per rank, the median of 5 timed runs (after
 * one warm-up) of comm_all_gather and comm_reduce_scatter_f32 on the world. Bus bandwidth
 * follows NCCL's definition: (N - 1) / N x total bytes / time, where total = N x per-rank
 * payload, i.e. what each rank's link carries in a ring. bench/multihost.sh runs it on one
 * host (shared memory) and across two network-namespace hosts (TCP) and prints the ratio.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/timer.h"
#include "comm/comm.h"

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	CHECK(comm_init(&argc, &argv) == CT_OK, "comm init");
	struct mesh m;
	CHECK(mesh_build(&m, 1, 1, -1, 1) == CT_OK, "mesh");
	int64_t max_mib = argc > 1 ? atoll(argv[1]) : 64, N = m.world;
	int64_t max_bytes = max_mib << 20;
	float *send = xcalloc((size_t)(max_bytes / 4 * N), sizeof(float));
	float *recv = xcalloc((size_t)(max_bytes / 4 * N), sizeof(float));
	float *scratch = xcalloc((size_t)(2 * max_bytes / 4), sizeof(float));
	if (m.rank == 0)
		printf("ranks %lld\n%10s %14s %14s\n", (long long)N, "MiB/rank",
		       "all-gather GB/s", "red-scat GB/s");
	for (int64_t mib = 1; mib <= max_mib; mib *= 4) {
		int64_t bytes = mib << 20;
		double t[2][5];
		for (int k = 0; k < 2; k++)
			for (int r = -1; r < 5; r++) {
				comm_barrier(&m.world_group);
				double t0 = timer_now();
				if (k == 0)
					comm_all_gather(&m.world_group, send, recv, bytes);
				else
					comm_reduce_scatter_f32(&m.world_group, send, recv, bytes / 4,
					                        scratch);
				double dt = timer_now() - t0;
				comm_all_reduce_f64(&m.world_group, &dt, 1); /* mean over ranks */
				if (r >= 0)
					t[k][r] = dt / (double)N;
			}
		qsort(t[0], 5, sizeof(double), cmp);
		qsort(t[1], 5, sizeof(double), cmp);
		double bus = (double)(N - 1) / (double)N * (double)(bytes * N);
		if (m.rank == 0)
			printf("%10lld %14.3f %14.3f\n", (long long)mib, bus / t[0][2] / 1e9,
			       bus / t[1][2] / 1e9);
	}
	free(send), free(recv), free(scratch);
	mesh_free(&m);
	comm_finalize();
	return 0;
}
