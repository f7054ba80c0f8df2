/* control.c - faultfs's control socket: one command a line, one reply a
 * line (see usage() in faultfs.c), served on its own thread so that hung
 * FUSE calls never block it. */

#include "faultfs.h"
#include "thread.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

static int src_fd = -1;   /* SRC: `eio REL` is looked up here */
static int ctl_fd = -1;
static pthread_t ctl_tid;
static int ctl_started;

/* "EIO", "ENOTCONN", ... or a number: the errno, or -EINVAL. */
static int parse_errno(const char *s)
{
	char *end;
	long v = strtol(s, &end, 10);

	if (*s && !*end)
		return v > 0 && v < 4096 ? (int)v : -EINVAL;
	for (int e = 1; e < 200; e++) {
		const char *name = strerrorname_np(e);

		if (name && !strcmp(name, s))
			return e;
	}
	return -EINVAL;
}

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	*out = strtoull(s, &end, 10);
	return errno || *end ? -EINVAL : 0;
}

static void set_mode(enum mode m, int err)
{
	pthread_mutex_lock(&g.lock);
	g.mode = m;
	g.err = err;
	pthread_cond_broadcast(&g.cond); /* hung calls look again */
	pthread_mutex_unlock(&g.lock);
}

/* Carry out one command line; write the reply (no newline) to @out. */
static void command(char *line, char *out, size_t sz)
{
	static const char *const cmds[] = { "ok", "hang", "clear", "state", "fail", "latency",
					    "eio", "faildir", "notype", "closes", "cut" };
	static const int nargs[] = { 0, 0, 0, 0, 1, 1, 3, 2, 1, 1, 2 };
	char *save = NULL, *cmd = strtok_r(line, " \t", &save), *a[4] = {0};
	char *a1, *a2, *a3;
	uint64_t v1, v2;
	struct stat st;
	int e, n = 0;

	while (n < 4 && (a[n] = strtok_r(NULL, " \t", &save)))
		n++;
	a1 = a[0], a2 = a[1], a3 = a[2];
	for (e = 0; cmd && e < (int)(sizeof(cmds) / sizeof(*cmds)); e++)
		if (!strcmp(cmd, cmds[e]) && n != nargs[e]) {
			snprintf(out, sz, "error %s takes %d argument(s)", cmd, nargs[e]);
			return;
		}
	snprintf(out, sz, "ok");
	if (!cmd) {
		snprintf(out, sz, "error empty command");
	} else if (!strcmp(cmd, "ok") || !strcmp(cmd, "hang")) {
		set_mode(!strcmp(cmd, "ok") ? MODE_OK : MODE_HANG, 0);
	} else if (!strcmp(cmd, "fail")) {
		if ((e = parse_errno(a1)) < 0)
			snprintf(out, sz, "error fail needs an errno name or number");
		else
			set_mode(MODE_FAIL, e);
	} else if (!strcmp(cmd, "eio") || !strcmp(cmd, "cut")) {
		int cut = cmd[0] == 'c';

		if (parse_u64(a2, &v1) || (!cut && (parse_u64(a3, &v2) || v2 == 0))) {
			snprintf(out, sz, cut ? "error usage: cut REL OFF" :
				 "error usage: eio REL OFF LEN (LEN > 0)");
			return;
		}
		while (*a1 == '/')
			a1++;
		errno = 0;
		/* On the source itself: this thread never enters the mount. */
		if (fstatat(src_fd, a1, &st, 0) < 0 || !S_ISREG(st.st_mode)) {
			snprintf(out, sz, "error %s: %s", a1,
				 errno ? strerror(errno) : "not a regular file");
			return;
		}
		pthread_mutex_lock(&g.lock);
		if (g.n_eio < MAX_EIO)
			g.eio[g.n_eio++] = (struct eio_range){ st.st_dev, st.st_ino, v1,
							       cut ? 0 : v2, cut };
		else
			snprintf(out, sz, "error at most %d eio ranges and cuts", MAX_EIO);
		pthread_mutex_unlock(&g.lock);
	} else if (!strcmp(cmd, "faildir")) {
		while (*a1 == '/')
			a1++;
		errno = 0;
		if ((e = strcmp(a2, "hang") ? parse_errno(a2) : FAILDIR_HANG) == -EINVAL) {
			snprintf(out, sz, "error faildir needs an errno name or number, or hang");
			return;
		}
		if (fstatat(src_fd, *a1 ? a1 : ".", &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISDIR(st.st_mode)) {
			snprintf(out, sz, "error %s: %s", a1,
				 errno ? strerror(errno) : "not a directory");
			return;
		}
		pthread_mutex_lock(&g.lock);
		g.faildir_dev = st.st_dev;
		g.faildir_ino = st.st_ino;
		g.faildir_err = e;
		pthread_cond_broadcast(&g.cond); /* calls hung in a directory look again */
		pthread_mutex_unlock(&g.lock);
	} else if (!strcmp(cmd, "clear")) {
		pthread_mutex_lock(&g.lock);
		g.n_eio = 0;
		g.faildir_err = 0;
		pthread_cond_broadcast(&g.cond);
		pthread_mutex_unlock(&g.lock);
	} else if (!strcmp(cmd, "latency")) {
		if (parse_u64(a1, &v1) || v1 > 600000) {
			snprintf(out, sz, "error latency needs milliseconds (0-600000)");
			return;
		}
		pthread_mutex_lock(&g.lock);
		g.latency_ms = (unsigned)v1;
		pthread_cond_broadcast(&g.cond); /* calls waiting it out look again */
		pthread_mutex_unlock(&g.lock);
	} else if (!strcmp(cmd, "notype") || !strcmp(cmd, "closes")) {
		if (strcmp(a1, "0") && strcmp(a1, "1")) {
			snprintf(out, sz, "error %s takes 1 or 0", cmd);
			return;
		}
		pthread_mutex_lock(&g.lock);
		*(cmd[0] == 'n' ? &g.notype : &g.closes) = a1[0] == '1';
		pthread_mutex_unlock(&g.lock);
	} else if (!strcmp(cmd, "state")) {
		static const char *const names[] = { "ok", "hang", "fail" };

		pthread_mutex_lock(&g.lock);
		snprintf(out, sz, "{\"mode\": \"%s\", \"errno\": %d, \"hung\": %u, "
			 "\"hung_reads\": %u, \"calls\": %" PRIu64 ", \"reads\": %" PRIu64 ", \"read_bytes\": %" PRIu64
			 ", \"writes\": %" PRIu64 ", \"write_bytes\": %" PRIu64 ", \"latency_ms\": %u, "
			 "\"eio_ranges\": %u, \"faildir\": %d, \"rw\": %s}", names[g.mode], g.err,
			 g.hung, g.hung_reads, g.calls, g.reads, g.read_bytes, g.writes, g.write_bytes,
			 g.latency_ms, g.n_eio, g.faildir_err, rw ? "true" : "false");
		pthread_mutex_unlock(&g.lock);
	} else {
		snprintf(out, sz, "error unknown command %.64s", cmd);
	}
}

/* One client at a time: each command is instant.  A client that stalls
 * mid-line is dropped after 5 s (SO_RCVTIMEO). */
static void serve(int c)
{
	struct timeval tv = { 5, 0 };
	char buf[1024], reply[512];
	size_t have = 0;
	ssize_t n;

	setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	while ((n = recv(c, buf + have, sizeof(buf) - 1 - have, 0)) > 0) {
		char *nl;

		have += (size_t)n;
		buf[have] = '\0';
		while ((nl = strchr(buf, '\n'))) {
			*nl = '\0';
			if (nl > buf && nl[-1] == '\r')
				nl[-1] = '\0';
			command(buf, reply, sizeof(reply) - 1);
			strcat(reply, "\n");
			if (send(c, reply, strlen(reply), MSG_NOSIGNAL) < 0)
				return;
			have -= (size_t)(nl + 1 - buf);
			memmove(buf, nl + 1, have + 1);
		}
		if (have == sizeof(buf) - 1) {
			send(c, "error line too long\n", 20, MSG_NOSIGNAL);
			return;
		}
	}
	/* A last command without a newline still counts. */
	if (n == 0 && have) {
		command(buf, reply, sizeof(reply) - 1);
		strcat(reply, "\n");
		send(c, reply, strlen(reply), MSG_NOSIGNAL);
	}
}

static void *ctl_thread(void *arg)
{
	(void)arg;
	for (;;) {
		int c = accept4(ctl_fd, NULL, NULL, SOCK_CLOEXEC);

		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			return NULL; /* shut down at exit */
		}
		serve(c);
		close(c);
	}
}

int ctl_open(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct stat st;
	int fd;

	if (strlen(path) >= sizeof(a.sun_path))
		return -ENAMETOOLONG;
	strcpy(a.sun_path, path);
	/* A socket left by a killed faultfs (restore after vanish). */
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path);
	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 16) < 0) {
		int e = errno;

		close(fd);
		return -e;
	}
	ctl_fd = fd;
	return 0;
}

int ctl_start(int src)
{
	int r;

	src_fd = src;
	/* SIGTERM must reach the main thread: libfuse's loop waits there */
	if ((r = -thread_start(&ctl_tid, NULL, ctl_thread, NULL)) == 0)
		ctl_started = 1;
	return r;
}

void ctl_close(const char *path)
{
	if (ctl_fd < 0)
		return;
	shutdown(ctl_fd, SHUT_RDWR); /* wakes accept() */
	if (ctl_started)
		pthread_join(ctl_tid, NULL);
	ctl_started = 0;
	close(ctl_fd);
	ctl_fd = -1;
	unlink(path);
}
