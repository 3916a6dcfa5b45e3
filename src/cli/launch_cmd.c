#define _GNU_SOURCE
#include "cli/launch_cmd.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LAUNCH_MAX_HOSTS     1024
#define LAUNCH_PROBE_SECONDS 15.0
/* After a rank printed a watchdog abort: MPI_Abort's own clean-up gets this long before the
 * supervisor ends the job (over a cut link mpiexec would wait for TCP keepalive, ~20 s). */
#define LAUNCH_ABORT_GRACE 2.0
/* Every rank on this host has ended but mpiexec still runs: it waits for a host it cannot
 * reach (a rank's death there, a link down). A normal end takes milliseconds. */
#define LAUNCH_ORPHAN_GRACE 5.0
#define LAUNCH_TERM_SECONDS 2.0 /* SIGTERM, then SIGKILL */
#define LAUNCH_LINE         4096

struct launch_host {
	char name[256];
	int slots;
};

struct launch_opts {
	const char *hostfile, *net;
	int nproc; /* -n; 0: the hostfile's slots */
	bool elastic;
	int min, max, restarts;
	char **cmd;
	int ncmd;
};

static volatile sig_atomic_t launch_signal;

static void launch_on_signal(int sig)
{
	launch_signal = sig;
}

static double launch_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void launch_sleep(double s)
{
	struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
	nanosleep(&ts, NULL); /* a signal cuts it short: the callers look at launch_signal */
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fprintf(stderr, "ctitan launch: %s\n", buf);
	fflush(stderr);
}

static void launch_usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: ctitan launch [-n N] [--hostfile FILE] [--net CIDR]\n"
	    "         [--nnodes MIN:MAX] [--max-restarts K] [--] COMMAND [ARGS...]\n\n"
	    "Runs COMMAND on MPI ranks through OpenMPI's mpiexec and supervises the job.\n"
	    "  -n N              ranks (default: the slots of the hostfile's hosts)\n"
	    "  --hostfile FILE   hosts, one a line: \"HOST slots=K\" (OpenMPI's format);\n"
	    "                    with more than one, shared memory inside a host and TCP\n"
	    "                    between hosts\n"
	    "  --net CIDR        MPI's TCP traffic (and OpenMPI's daemons') on that network only\n"
	    "  --nnodes MIN:MAX  elastic: run on the hosts that answer (at most MAX, at least\n"
	    "                    MIN), each with its slots as ranks; after a failure probe them\n"
	    "                    again and restart (fewer hosts after a loss, more when one is\n"
	    "                    back); COMMAND must resume from its checkpoints\n"
	    "  --max-restarts K  restarts before giving up (default 3 with --nnodes, else 0)\n\n"
	    "A job ends as a whole: a rank's watchdog abort or a host that cannot be reached ends\n"
	    "mpiexec and every process it started here. Exit 2 (bad usage) is never retried.\n"
	    "Hosts other than this one are probed and reached through OMPI_MCA_plm_rsh_agent\n"
	    "(default: ssh -o BatchMode=yes -o ConnectTimeout=5). The attempt number is in\n"
	    "CT_RESTART_COUNT. OMPI_MCA_* settings already in the environment are kept.\n");
}

/* ---------------------------------------------------------------- arguments and hosts */

static bool launch_int(const char *s, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < 0 || v > INT_MAX)
		return false;
	*out = (int)v;
	return true;
}

static int launch_parse(int argc, char **argv, struct launch_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->restarts = -1;
	int i = 0;
	for (; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--") == 0) {
			i++;
			break;
		}
		if (a[0] != '-')
			break;
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			launch_usage(stdout);
			return -1;
		}
		if (i + 1 >= argc) {
			say("option %s needs a value", a);
			return 2;
		}
		const char *v = argv[++i];
		if (strcmp(a, "-n") == 0 || strcmp(a, "--nproc") == 0) {
			if (!launch_int(v, &o->nproc) || o->nproc < 1) {
				say("-n: a positive number of ranks, not '%s'", v);
				return 2;
			}
		} else if (strcmp(a, "--hostfile") == 0) {
			o->hostfile = v;
		} else if (strcmp(a, "--net") == 0) {
			o->net = v;
		} else if (strcmp(a, "--max-restarts") == 0) {
			if (!launch_int(v, &o->restarts)) {
				say("--max-restarts: a number >= 0, not '%s'", v);
				return 2;
			}
		} else if (strcmp(a, "--nnodes") == 0) {
			char lo[32] = "", *colon = strchr(v, ':');
			const char *hi = colon ? colon + 1 : v;
			snprintf(lo, sizeof(lo), "%.*s", colon ? (int)(colon - v) : (int)strlen(v),
			         v);
			if (!launch_int(lo, &o->min) || !launch_int(hi, &o->max) || o->min < 1 ||
			    o->max < o->min) {
				say("--nnodes %s: need MIN:MAX with 1 <= MIN <= MAX", v);
				return 2;
			}
			o->elastic = true;
		} else {
			say("unknown option '%s' (see ctitan launch --help)", a);
			return 2;
		}
	}
	o->cmd = argv + i;
	o->ncmd = argc - i;
	if (o->ncmd < 1) {
		say("no COMMAND to run (see ctitan launch --help)");
		return 2;
	}
	if (!o->hostfile && !o->nproc) {
		say("need -n N or --hostfile FILE");
		return 2;
	}
	if (o->elastic && o->nproc && o->hostfile) {
		say("--nnodes takes the ranks from the hostfile's slots; -n %d does not apply",
		    o->nproc);
		return 2;
	}
	if (o->restarts < 0)
		o->restarts = o->elastic ? 3 : 0;
	return 0;
}

static bool launch_host_name_ok(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
		      (*s >= '0' && *s <= '9') || strchr(".-_:[]", *s)))
			return false;
	return true;
}

/* Reads "HOST [slots=K] ..." lines (# comments); a host listed twice gets the slots added. */
static int launch_read_hosts(const char *path, struct launch_host *h, int *n)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		say("--hostfile: cannot read '%s': %s", path, strerror(errno));
		return 2;
	}
	char line[1024];
	int ln = 0;
	*n = 0;
	while (fgets(line, sizeof(line), f)) {
		ln++;
		char *hash = strchr(line, '#');
		if (hash)
			*hash = '\0';
		char *save = NULL, *name = strtok_r(line, " \t\r\n", &save);
		if (!name)
			continue;
		int slots = 1;
		for (char *t; (t = strtok_r(NULL, " \t\r\n", &save));)
			if (strncmp(t, "slots=", 6) == 0 &&
			    (!launch_int(t + 6, &slots) || slots < 1)) {
				say("hostfile '%s' line %d: slots must be a positive number, not "
				    "'%s'",
				    path, ln, t + 6);
				fclose(f);
				return 2;
			}
		if (!launch_host_name_ok(name) || strlen(name) >= sizeof(h->name)) {
			say("hostfile '%s' line %d: '%s' is not a host name", path, ln, name);
			fclose(f);
			return 2;
		}
		int k = 0;
		while (k < *n && strcmp(h[k].name, name) != 0)
			k++;
		if (k == *n) {
			if (*n == LAUNCH_MAX_HOSTS) {
				say("hostfile '%s': more than %d hosts", path, LAUNCH_MAX_HOSTS);
				fclose(f);
				return 2;
			}
			snprintf(h[k].name, sizeof(h[k].name), "%s", name);
			h[k].slots = 0;
			(*n)++;
		}
		h[k].slots += slots;
	}
	fclose(f);
	if (!*n) {
		say("hostfile '%s' names no host", path);
		return 2;
	}
	return 0;
}

/* OpenMPI's settings for this project; values already in the environment win. */
static void launch_environment(const struct launch_opts *o, int hosts)
{
	setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
	setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
	setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
	setenv("OMPI_MCA_pml", "ob1", 0);
	setenv("OMPI_MCA_hwloc_base_binding_policy", "none", 0);
	if (hosts > 1) {
		setenv("OMPI_MCA_btl", "self,vader,tcp", 0);
		setenv("OMPI_MCA_plm_rsh_no_tree_spawn", "1", 0);
		/* a daemon cut off from mpiexec is declared lost after ~20 s, not after OpenMPI's
		 * default of minutes, so a remote daemon whose link is down ends its ranks */
		setenv("OMPI_MCA_oob_tcp_keepalive_time", "10", 0);
		setenv("OMPI_MCA_oob_tcp_keepalive_intvl", "2", 0);
		setenv("OMPI_MCA_oob_tcp_keepalive_probes", "5", 0);
		if (o->net) {
			setenv("OMPI_MCA_btl_tcp_if_include", o->net, 0);
			setenv("OMPI_MCA_oob_tcp_if_include", o->net, 0);
		}
	}
	setenv("OMPI_MCA_btl", "self,vader", 0);
}

static bool launch_is_here(const char *host)
{
	char me[256] = "";
	gethostname(me, sizeof(me) - 1);
	return strcmp(host, "localhost") == 0 || strcmp(host, "127.0.0.1") == 0 ||
	       strcmp(host, me) == 0;
}

/* Whether `AGENT HOST true` succeeds within LAUNCH_PROBE_SECONDS (this host: always). */
static bool launch_probe(const char *agent, const char *host)
{
	if (launch_is_here(host))
		return true;
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), "exec %s \"$1\" true", agent);
	pid_t pid = fork();
	if (pid < 0)
		return false;
	if (pid == 0) {
		setsid();
		int null = open("/dev/null", O_RDWR);
		dup2(null, 0), dup2(null, 1), dup2(null, 2);
		execl("/bin/sh", "sh", "-c", cmd, "sh", host, (char *)NULL);
		_exit(127);
	}
	int st = 0;
	double t0 = launch_now();
	while (waitpid(pid, &st, WNOHANG) == 0) {
		if (launch_now() - t0 > LAUNCH_PROBE_SECONDS || launch_signal) {
			kill(-pid, SIGKILL);
			waitpid(pid, &st, 0);
			return false;
		}
		launch_sleep(0.05);
	}
	return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* ---------------------------------------------------------------- the job's processes */

/* Processes of session `sid` (or, with sid 0, none) plus our own children other than `keep`,
 * zombies left out: the job's processes on this host. Returns how many; `ranks` counts the
 * MPI ranks among them. With `sig`, sends it to each. */
static int launch_sweep(pid_t sid, pid_t keep, int sig, int *ranks)
{
	DIR *d = opendir("/proc");
	int n = 0, r = 0;
	if (!d)
		return 0;
	pid_t me = getpid();
	for (struct dirent *e; (e = readdir(d));) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (*end || pid <= 1 || pid == me || pid == keep)
			continue;
		char path[64], buf[512];
		snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
		int fd = open(path, O_RDONLY);
		if (fd < 0)
			continue;
		ssize_t len = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (len <= 0)
			continue;
		buf[len] = '\0';
		char *p = strrchr(buf, ')'), state = 0;
		int ppid = 0, pgrp = 0, sess = 0;
		if (!p || sscanf(p + 1, " %c %d %d %d", &state, &ppid, &pgrp, &sess) != 4)
			continue;
		if (state == 'Z' || !((sid && sess == sid) || ppid == me))
			continue;
		n++;
		/* a rank: OpenMPI puts its rank in the environment */
		snprintf(path, sizeof(path), "/proc/%ld/environ", pid);
		FILE *f = fopen(path, "r");
		if (f) {
			char env[4096];
			size_t got;
			bool found = false;
			while (!found && (got = fread(env, 1, sizeof(env) - 1, f)) > 0) {
				env[got] = '\0';
				for (size_t k = 0; k < got; k += strlen(env + k) + 1)
					if (strncmp(env + k, "OMPI_COMM_WORLD_RANK=", 21) == 0)
						found = true;
			}
			fclose(f);
			r += found;
		}
		if (sig)
			kill((pid_t)pid, sig);
	}
	closedir(d);
	if (ranks)
		*ranks = r;
	return n;
}

/* Reap whatever children ended (we are their subreaper); returns mpiexec's status once. */
static bool launch_reap(pid_t mp, int *status)
{
	bool got = false;
	for (;;) {
		int st;
		pid_t p = waitpid(-1, &st, WNOHANG);
		if (p <= 0)
			return got;
		if (p == mp)
			*status = st, got = true;
	}
}

/* Output of the job: forwarded as it comes; whole lines scanned for a watchdog abort. */
struct launch_stream {
	int fd, out;
	char line[LAUNCH_LINE];
	size_t len;
};

static bool launch_line_aborts(const char *s)
{
	return (strstr(s, "watchdog:") && strstr(s, "aborting the job")) ||
	       strstr(s, "MPI_ABORT was invoked");
}

/* Returns true when a line announcing an abort went by. */
static bool launch_forward(struct launch_stream *s)
{
	char buf[8192];
	ssize_t n = read(s->fd, buf, sizeof(buf));
	if (n <= 0) {
		if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
			close(s->fd);
			s->fd = -1;
		}
		return false;
	}
	for (ssize_t off = 0; off < n;) {
		ssize_t w = write(s->out, buf + off, (size_t)(n - off));
		if (w <= 0)
			break;
		off += w;
	}
	bool hit = false;
	for (ssize_t i = 0; i < n; i++) {
		if (buf[i] == '\n' || s->len == sizeof(s->line) - 1) {
			s->line[s->len] = '\0';
			hit |= launch_line_aborts(s->line);
			s->len = 0;
			if (buf[i] == '\n')
				continue;
		}
		s->line[s->len++] = buf[i];
	}
	return hit;
}

/* One run of mpiexec; returns its exit code (128 + signal when killed; 1 when the
 * supervisor had to end it). Leaves no process of the job behind on this host. */
static int launch_attempt(const struct launch_opts *o, const char *hostfile, int ranks)
{
	char nbuf[16];
	snprintf(nbuf, sizeof(nbuf), "%d", ranks);
	char **argv = calloc((size_t)o->ncmd + 10, sizeof(char *));
	int a = 0;
	argv[a++] = "mpiexec";
	if (hostfile) {
		argv[a++] = "--hostfile";
		argv[a++] = (char *)hostfile;
	}
	argv[a++] = "-n";
	argv[a++] = nbuf;
	argv[a++] = "-x";
	argv[a++] = "CT_RESTART_COUNT";
	for (int i = 0; i < o->ncmd; i++)
		argv[a++] = o->cmd[i];
	argv[a] = NULL;

	int out[2], err[2];
	if (pipe(out) || pipe(err)) {
		say("pipe: %s", strerror(errno));
		free(argv);
		return 1;
	}
	fflush(stdout), fflush(stderr);
	pid_t mp = fork();
	if (mp < 0) {
		say("fork: %s", strerror(errno));
		free(argv);
		return 1;
	}
	if (mp == 0) {
		/* its own session: OpenMPI's clean-up signals mpiexec's process group, which must
		 * not hold the supervisor; the session id marks every process of the job here */
		setsid();
		int null = open("/dev/null", O_RDONLY);
		dup2(null, 0);
		dup2(out[1], 1), dup2(err[1], 2);
		close(out[0]), close(out[1]), close(err[0]), close(err[1]), close(null);
		execvp("mpiexec", argv);
		fprintf(stderr, "ctitan launch: cannot run mpiexec: %s\n", strerror(errno));
		_exit(127);
	}
	free(argv);
	close(out[1]), close(err[1]);
	struct launch_stream s[2] = {{.fd = out[0], .out = 1}, {.fd = err[0], .out = 2}};

	int status = 0, rc = -1;
	bool done = false, seen = false, ended_by_us = false;
	double t_abort = -1, t_last_rank = 0, t_term = -1, t_end = -1;
	while (!done || s[0].fd >= 0 || s[1].fd >= 0) {
		struct pollfd pf[2] = {{s[0].fd, POLLIN, 0}, {s[1].fd, POLLIN, 0}};
		int pr = poll(pf, 2, 100);
		for (int k = 0; k < 2 && pr > 0; k++)
			if (s[k].fd >= 0 && (pf[k].revents & (POLLIN | POLLHUP | POLLERR)) &&
			    launch_forward(&s[k]) && t_abort < 0)
				t_abort = launch_now();
		double now = launch_now();
		if (!done && launch_reap(mp, &status)) {
			done = true;
			t_end = now;
			/* whatever it leaves (agents, daemons, ranks in their own groups) ends now
			 */
			launch_sweep(mp, 0, SIGTERM, NULL);
		}
		int r = 0, alive = launch_sweep(mp, mp, 0, &r);
		if (r)
			seen = true, t_last_rank = now;
		if (!done && t_term < 0) {
			const char *why = NULL;
			if (launch_signal)
				why = "the supervisor was told to stop";
			else if (t_abort >= 0 && now - t_abort > LAUNCH_ABORT_GRACE)
				why = "a rank aborted the job (see its message above) and mpiexec "
				      "still runs";
			else if (seen && !r && now - t_last_rank > LAUNCH_ORPHAN_GRACE)
				why = "every rank on this host has ended but mpiexec still waits "
				      "(a host cut off?)";
			if (why) {
				say("%s; ending mpiexec and every process it started here", why);
				launch_sweep(mp, 0, SIGTERM, NULL);
				kill(mp, SIGTERM);
				t_term = now;
				ended_by_us = !launch_signal;
			}
		}
		if (t_term >= 0 && !done && now - t_term > LAUNCH_TERM_SECONDS) {
			launch_sweep(mp, 0, SIGKILL, NULL);
			kill(mp, SIGKILL);
		}
		if (done && alive && now - t_end > LAUNCH_TERM_SECONDS)
			launch_sweep(mp, 0, SIGKILL, NULL);
		if (done && !alive && now - t_end > 1.0)
			break; /* every process gone; a pipe still open has no writer here */
	}
	for (int k = 0; k < 2; k++)
		if (s[k].fd >= 0)
			close(s[k].fd);
	if (WIFEXITED(status))
		rc = WEXITSTATUS(status);
	else if (WIFSIGNALED(status))
		rc = 128 + WTERMSIG(status);
	if (ended_by_us && (rc == 0 || rc > 128))
		rc = 1; /* the job failed; how mpiexec took its end does not matter */
	return rc;
}

/* ---------------------------------------------------------------- the supervisor */

static int launch_write_hosts(const char *path, const struct launch_host *h, int n)
{
	FILE *f = fopen(path, "w");
	if (!f) {
		say("cannot write '%s': %s", path, strerror(errno));
		return 1;
	}
	for (int i = 0; i < n; i++)
		fprintf(f, "%s slots=%d\n", h[i].name, h[i].slots);
	return fclose(f) ? 1 : 0;
}

static int launch_run(const struct launch_opts *o, struct launch_host *hosts, int nhosts,
                      const char *tmpdir)
{
	const char *agent = getenv("OMPI_MCA_plm_rsh_agent");
	if (!agent || !*agent)
		agent = "ssh -o BatchMode=yes -o ConnectTimeout=5";
	struct launch_host *up = calloc((size_t)nhosts + 1, sizeof(*up));
	char hostfile[PATH_MAX];
	snprintf(hostfile, sizeof(hostfile), "%s/hosts", tmpdir);
	int rc = 1;
	for (int attempt = 0;; attempt++) {
		/* the hosts that answer now, in hostfile order, at most MAX */
		int nup = 0, ranks = 0;
		for (int i = 0; i < nhosts && (!o->elastic || nup < o->max); i++) {
			if (!o->hostfile || launch_probe(agent, hosts[i].name)) {
				up[nup++] = hosts[i];
				ranks += hosts[i].slots;
			} else if (o->elastic) {
				say("host %s does not answer (%s %s true); leaving it out",
				    hosts[i].name, agent, hosts[i].name);
			} else {
				say("host %s of hostfile '%s' does not answer (%s %s true); not "
				    "starting",
				    hosts[i].name, o->hostfile, agent, hosts[i].name);
				rc = 1;
				goto out;
			}
			if (launch_signal)
				break;
		}
		if (launch_signal) {
			rc = 128 + launch_signal;
			goto out;
		}
		if (o->elastic && nup < o->min) {
			say("only %d of the %d host(s) of '%s' answer, fewer than MIN = %d "
			    "(--nnodes "
			    "%d:%d); giving up",
			    nup, nhosts, o->hostfile ? o->hostfile : "this host", o->min, o->min,
			    o->max);
			rc = 1;
			goto out;
		}
		if (o->nproc && !o->elastic)
			ranks = o->nproc;
		if (o->hostfile && launch_write_hosts(hostfile, up, nup)) {
			rc = 1;
			goto out;
		}
		char count[16];
		snprintf(count, sizeof(count), "%d", attempt);
		setenv("CT_RESTART_COUNT", count, 1);
		if (o->elastic || attempt)
			say("attempt %d: %d ranks on %d host(s)", attempt, ranks, nup);
		rc = launch_attempt(o, o->hostfile ? hostfile : NULL, ranks);
		if (launch_signal) {
			rc = 128 + launch_signal;
			goto out;
		}
		if (rc == 0)
			goto out;
		if (rc == 2) {
			say("the job exited with 2 (bad usage or configuration): not restarting");
			goto out;
		}
		if (attempt >= o->restarts) {
			if (o->restarts)
				say("the job failed (exit %d) and the restart limit "
				    "(--max-restarts %d) "
				    "is reached; giving up",
				    rc, o->restarts);
			goto out;
		}
		say("the job failed (exit %d); restart %d of %d from the newest checkpoint", rc,
		    attempt + 1, o->restarts);
		launch_sleep(1.0);
	}
out:
	free(up);
	return rc;
}

int cmd_launch(int argc, char **argv)
{
	struct launch_opts o;
	int rc = launch_parse(argc, argv, &o);
	if (rc)
		return rc < 0 ? 0 : rc;
	struct launch_host *hosts = calloc(LAUNCH_MAX_HOSTS, sizeof(*hosts));
	int nhosts = 1;
	if (o.hostfile) {
		rc = launch_read_hosts(o.hostfile, hosts, &nhosts);
		if (rc)
			goto out_hosts;
	} else {
		snprintf(hosts[0].name, sizeof(hosts[0].name), "localhost");
		hosts[0].slots = o.nproc;
	}
	if (o.elastic && o.min > nhosts) {
		say("--nnodes %d:%d: %s lists %d host(s), fewer than MIN = %d", o.min, o.max,
		    o.hostfile ? o.hostfile : "no hostfile: this host alone", nhosts, o.min);
		rc = 2;
		goto out_hosts;
	}
	launch_environment(&o, nhosts);
	if (nhosts > 1)
		say("%s%d hosts listed, transport %s%s%s", o.elastic ? "elastic, " : "", nhosts,
		    getenv("OMPI_MCA_btl"), o.net ? " on " : "", o.net ? o.net : "");

	char tmpdir[] = "/tmp/ctitan-launch-XXXXXX";
	if (!mkdtemp(tmpdir)) {
		say("mkdtemp: %s", strerror(errno));
		rc = 1;
		goto out_hosts;
	}
	/* orphans of the job (a daemon whose parent died) become our children, so they are
	 * seen, ended and reaped too */
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	struct sigaction sa = {0};
	sa.sa_handler = launch_on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	rc = launch_run(&o, hosts, nhosts, tmpdir);
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/hosts", tmpdir);
	unlink(path);
	rmdir(tmpdir);
out_hosts:
	free(hosts);
	return rc;
}
