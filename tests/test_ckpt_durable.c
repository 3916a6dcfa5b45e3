/* tests/test_ckpt_durable: a checkpoint save makes its renames durable.
 *
 * rename() and fsync() are interposed (the test executable's definitions win over libc's for
 * the library code linked into it) and logged; after ckpt_save, the log must show the root
 * folder fsynced after `latest` was renamed into place (the rename lives in the directory and
 * is lost on a crash until the directory is synced), and the step folder's rename followed by
 * a root fsync too. Both a synchronous and an asynchronous (writer thread) save.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "comm/comm.h"
#include "model/llama/llama.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "testutil.h"

#define LOG_MAX 256

struct event {
	char kind; /* 'r' rename (target path), 'f' fsync of a directory (inode) */
	char path[512];
	ino_t ino;
};

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static struct event events[LOG_MAX];
static int n_events;

static void log_event(char kind, const char *path, ino_t ino)
{
	pthread_mutex_lock(&log_mu);
	if (n_events < LOG_MAX) {
		events[n_events].kind = kind;
		snprintf(events[n_events].path, sizeof(events[n_events].path), "%s",
		         path ? path : "");
		events[n_events].ino = ino;
		n_events++;
	}
	pthread_mutex_unlock(&log_mu);
}

int rename(const char *from, const char *to)
{
	int (*real)(const char *, const char *) =
	    (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
	int rc = real(from, to);
	if (rc == 0)
		log_event('r', to, 0);
	return rc;
}

int fsync(int fd)
{
	int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
	struct stat st;
	if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode))
		log_event('f', NULL, st.st_ino);
	return real(fd);
}

/* Index of the last rename onto `path`, or -1. */
static int last_rename(const char *path)
{
	int at = -1;
	for (int i = 0; i < n_events; i++)
		if (events[i].kind == 'r' && strcmp(events[i].path, path) == 0)
			at = i;
	return at;
}

static bool dir_synced_after(int at, const char *dir)
{
	struct stat st;
	if (at < 0 || stat(dir, &st) != 0)
		return false;
	for (int i = at + 1; i < n_events; i++)
		if (events[i].kind == 'f' && events[i].ino == st.st_ino)
			return true;
	return false;
}

static struct mesh mesh;

static void save(bool async, const char *root, int64_t step)
{
	struct model_config cfg;
	memset(&cfg, 0, sizeof(cfg));
	struct llama_config *lc = llama_cfg_init(&cfg);
	llama_config_preset(lc, "debugmodel");
	llama_config_finish(lc);
	float w[6] = {1, 2, 3, 4, 5, 6}, m[6] = {0}, v[6] = {0};
	struct ckpt_tensor t = {.name = "tok_embeddings.weight",
	                        .ndim = 2,
	                        .rows = 2,
	                        .cols = 3,
	                        .row0 = 0,
	                        .nrows = 2,
	                        .param = w,
	                        .exp_avg = m,
	                        .exp_avg_sq = v};
	struct ckpt_trainer_state st = {.step = step};
	n_events = 0;
	int rc;
	if (async) {
		struct ckpt_async *a = ckpt_async_new(&mesh);
		rc = ckpt_async_save(a, root, &cfg, &t, 1, &st, NULL, 0, 0);
		if (rc == CT_OK)
			rc = ckpt_async_wait(a);
		ckpt_async_free(a);
	} else {
		rc = ckpt_save(root, &cfg, &mesh, &t, 1, &st, NULL, 0, 0);
	}
	EXPECT(rc == CT_OK, "ckpt_save into %s", root);
	char latest[600], folder[600];
	snprintf(latest, sizeof(latest), "%s/latest", root);
	snprintf(folder, sizeof(folder), "%s/step-%08lld", root, (long long)step);
	EXPECT(dir_synced_after(last_rename(latest), root),
	       "%s: '%s' renamed into place (event %d of %d) but %s not fsynced after it",
	       async ? "async" : "sync", latest, last_rename(latest), n_events, root);
	EXPECT(dir_synced_after(last_rename(folder), root),
	       "%s: '%s' renamed but %s not fsynced after it", async ? "async" : "sync", folder,
	       root);
}

TEST_CASE(test_save_syncs_directories)
{
	char root[] = "/tmp/ct_durable_XXXXXX";
	EXPECT(mkdtemp(root), "mkdtemp");
	save(false, root, 3);
	save(true, root, 4);
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	EXPECT(system(cmd) == 0, "cleanup");
}

int main(int argc, char **argv)
{
	CHECK(comm_init(&argc, &argv) == CT_OK, "comm init");
	CHECK(mesh_build(&mesh, 1, 1, -1, 1) == CT_OK, "mesh");
	RUN(test_save_syncs_directories);
	int rc = test_summary();
	mesh_free(&mesh);
	comm_finalize();
	return rc;
}
