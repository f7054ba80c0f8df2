/* ctl_conn.c - one request/reply exchange with the wfs control socket; see
 * ctl_conn.h. */
#include "clock.h"
#include "ctl_conn.h"
#include "ctl_fmt.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <libgen.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int connect_path(int fd, const char *path);

/* The state letter of process @pid in /proc/PID/stat ('T': stopped), or 0. */
static char proc_state(pid_t pid)
{
	char path[64], buf[512], *paren;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* "PID (COMM) S ...": COMM may hold anything, the last ')' ends it */
	paren = strrchr(buf, ')');
	return paren && paren[1] == ' ' ? paren[2] : 0;
}

/* Say on stderr that @what did not answer within @c's timeout -- with the
 * daemon's state when its pid (@pid > 0) is known: stopped, or running --
 * and remember it in @c->timed_out. */
static void report_timeout(struct ctl_conn *c, const char *cmd, const char *what, pid_t pid)
{
	char why[128] = "is it stopped or hung?";
	char st = pid > 0 ? proc_state(pid) : 0;

	c->timed_out = true;
	if (st == 'T' || st == 't')
		snprintf(why, sizeof(why), "it is stopped (pid %d: SIGSTOP, or a debugger); "
			 "kill -CONT %d resumes it", (int)pid, (int)pid);
	else if (st)
		snprintf(why, sizeof(why), "it is running (pid %d) but busy or hung", (int)pid);
	fprintf(stderr, "wfsctl: %s%s%s did not answer within %u s: %s (--timeout SECONDS "
		"changes the limit)\n", cmd ? cmd : "", cmd ? ": " : "", what, c->timeout_s, why);
}

struct ctl_watchdog {
	pthread_mutex_t lock;
	pthread_cond_t cond;     /* CLOCK_MONOTONIC: disarmed */
	pthread_t thread;
	bool armed;              /* under lock */
	struct timespec until;   /* CLOCK_MONOTONIC */
	struct ctl_conn *conn;
	char what[PATH_MAX + 64];
};

static void *dog_run(void *arg)
{
	struct ctl_watchdog *dog = arg;
	int r = 0;

	pthread_mutex_lock(&dog->lock);
	while (dog->armed && r != ETIMEDOUT)
		r = pthread_cond_timedwait(&dog->cond, &dog->lock, &dog->until);
	if (dog->armed) {
		/* the main thread waits in the kernel for the FUSE daemon:
		 * only the end of the process gets it out */
		report_timeout(dog->conn, NULL, dog->what, 0);
		_exit(CTL_EXIT_TIMEOUT);
	}
	pthread_mutex_unlock(&dog->lock);
	return NULL;
}

static void dog_free(struct ctl_watchdog *dog)
{
	pthread_cond_destroy(&dog->cond);
	pthread_mutex_destroy(&dog->lock);
	free(dog);
}

int ctl_watchdog_arm(struct ctl_conn *c, const char *path)
{
	struct ctl_watchdog *dog;
	pthread_condattr_t attr;
	int r;

	if (!c->timeout_s)
		return 0;
	if (!(dog = calloc(1, sizeof(*dog))))
		return -ENOMEM;
	if ((r = pthread_condattr_init(&attr))) {
		free(dog);
		return -r;
	}
	r = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	if (!r)
		r = pthread_cond_init(&dog->cond, &attr);
	pthread_condattr_destroy(&attr);
	if (r) {
		free(dog);
		return -r;
	}
	dog->lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
	dog->armed = true;
	dog->conn = c;
	snprintf(dog->what, sizeof(dog->what), "the daemon of the wfs mount at %s", path);
	clock_gettime(CLOCK_MONOTONIC, &dog->until);
	dog->until.tv_sec += c->timeout_s;
	if ((r = pthread_create(&dog->thread, NULL, dog_run, dog))) {
		dog_free(dog);
		return -r;
	}
	c->dog = dog;
	return 0;
}

void ctl_watchdog_disarm(struct ctl_conn *c)
{
	struct ctl_watchdog *dog = c->dog;

	if (!dog)
		return;
	pthread_mutex_lock(&dog->lock);
	dog->armed = false;
	pthread_cond_signal(&dog->cond);
	pthread_mutex_unlock(&dog->lock);
	pthread_join(dog->thread, NULL);
	dog_free(dog);
	c->dog = NULL;
}

/* The pid of the daemon at @sock: the one that made the socket, if it is
 * still there (wfs makes it before it goes into the background), else
 * the one LOCAL_STORE/wfs.lock next to it names; 0: unknown. */
static pid_t daemon_pid(const struct ctl_conn *c, const char *sock)
{
	const char *slash = strrchr(sock, '/');
	char path[PATH_MAX + 16], buf[32];
	ssize_t n;
	int fd;

	if (c->peer_pid > 0 && proc_state(c->peer_pid))
		return c->peer_pid;
	snprintf(path, sizeof(path), "%.*s/wfs.lock", slash ? (int)(slash - sock) : 1,
		 slash ? sock : ".");
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	return (pid_t)atoi(buf);
}

/* Milliseconds left before @deadline for poll(2): -1 with no deadline (< 0). */
static int ms_left(int64_t deadline)
{
	int64_t left = deadline - mono_ms();

	if (deadline < 0)
		return -1;
	return left <= 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left;
}

/* Wait until @fd is ready for @events, by @deadline: 0, -ETIMEDOUT. */
static int wait_ready(int fd, short events, int64_t deadline)
{
	for (;;) {
		struct pollfd p = { .fd = fd, .events = events };
		int n = poll(&p, 1, ms_left(deadline));

		if (n > 0)
			return 0;
		if (n == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
}

/* connect(2) by @deadline: a unix socket's connect waits while the
 * listener's backlog is full (a stopped daemon accepts nothing), for as
 * long as SO_SNDTIMEO says, then fails with EAGAIN. */
static int connect_by(int fd, const char *path, int64_t deadline)
{
	int left = ms_left(deadline), r;

	if (left >= 0) {
		struct timeval tv = { left / 1000, (left % 1000) * 1000 };

		if (!left)
			return -ETIMEDOUT;
		if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)))
			return -errno;
	}
	r = connect_path(fd, path);
	return r == -EAGAIN && left >= 0 ? -ETIMEDOUT : r;
}

void ctl_reply_free(struct ctl_reply *rep)
{
	json_decref(rep->obj);
	free(rep->raw);
	rep->obj = NULL;
	rep->raw = NULL;
}

void ctl_print_raw(const struct ctl_reply *rep)
{
	fputs(rep->raw, stdout);
	fputc('\n', stdout);
}

/* connect(2) to a unix socket path of any length: sun_path holds 107 bytes,
 * and LOCAL_STORE may live deeper than that, so a long path is reached
 * through /proc/self/fd/<dirfd>/<name>. */
static int connect_path(int fd, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	const char *slash;
	char *dir;
	int dfd, r = 0;

	if (strlen(path) < sizeof(sa.sun_path)) {
		memcpy(sa.sun_path, path, strlen(path) + 1);
		return connect(fd, (struct sockaddr *)&sa, sizeof(sa)) ? -errno : 0;
	}
	slash = strrchr(path, '/');
	if (!slash)
		return -ENAMETOOLONG;
	dir = strndup(path, (size_t)(slash - path) + (slash == path));
	if (!dir)
		return -ENOMEM;
	dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	free(dir);
	if (dfd < 0)
		return -errno;
	if ((size_t)snprintf(sa.sun_path, sizeof(sa.sun_path), "/proc/self/fd/%d/%s",
			     dfd, slash + 1) >= sizeof(sa.sun_path))
		r = -ENAMETOOLONG;
	else if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
		r = -errno;
	close(dfd);
	return r;
}

static int send_all(int fd, const char *buf, size_t len, int64_t deadline)
{
	while (len) {
		/* MSG_NOSIGNAL: a daemon that went away is an error to report,
		 * not a reason to die of SIGPIPE. */
		ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		int r;

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				return -errno;
			r = wait_ready(fd, POLLOUT, deadline);
			if (r)
				return r;
			continue;
		}
		buf += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Read up to the first newline, by @deadline, into a NUL-terminated
 * malloc'd string.  EOF first: -ECONNRESET with nothing read, -EPROTO in
 * the middle of a line. */
static int recv_line(int fd, char **out, int64_t deadline)
{
	size_t len = 0, cap = 4096;
	int whole = 0;
	char *buf = malloc(cap);

	if (!buf)
		return -ENOMEM;
	for (;;) {
		char *nl;
		ssize_t n;

		if (cap - len < 2) {
			char *nb;

			if (cap >= CTL_REPLY_MAX + 2) {
				free(buf);
				return -EMSGSIZE;
			}
			cap = cap * 2 > CTL_REPLY_MAX + 2 ? CTL_REPLY_MAX + 2 : cap * 2;
			nb = realloc(buf, cap);
			if (!nb) {
				free(buf);
				return -ENOMEM;
			}
			buf = nb;
		}
		n = wait_ready(fd, POLLIN, deadline);
		if (n < 0) {
			free(buf);
			return (int)n;
		}
		n = read(fd, buf + len, cap - len - 1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			free(buf);
			return -errno;
		}
		if (n == 0)
			break;
		nl = memchr(buf + len, '\n', (size_t)n);
		len += (size_t)n;
		if (nl) {
			len = (size_t)(nl - buf);
			whole = 1;
			break;
		}
	}
	if (len > CTL_REPLY_MAX) {
		free(buf);
		return -EMSGSIZE;
	}
	/* EOF with no newline: nothing said, or a reply cut off (a daemon
	 * that died while it wrote) */
	if (!whole) {
		free(buf);
		return len ? -EPROTO : -ECONNRESET;
	}
	buf[len] = '\0';
	*out = buf;
	return 0;
}

int ctl_exchange(struct ctl_conn *c, const char *sock, const json_t *req, struct ctl_reply *rep)
{
	char *line = json_dumps(req, JSON_COMPACT);
	int64_t deadline = c->timeout_s ? mono_ms() + (int64_t)c->timeout_s * 1000 : -1;
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	size_t len;
	int fd, r;

	rep->obj = NULL;
	rep->raw = NULL;
	if (!line)
		return -ENOMEM;
	len = strlen(line);
	if (len + 1 > CTL_REQUEST_MAX) {
		free(line);
		return -E2BIG;
	}
	line[len] = '\n'; /* json_dumps left room: it was the NUL */
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		free(line);
		return -errno;
	}
	r = connect_by(fd, sock, deadline);
	/* the daemon's pid, to say what state it is in if it does not answer */
	c->peer_pid = !r && !getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) ? cred.pid : 0;
	if (!r)
		r = send_all(fd, line, len + 1, deadline);
	free(line);
	/* A daemon at its connection caps answers at once, unread, and
	 * closes: our send may then fail, its refusal (EAGAIN: ask again) is
	 * still there to read. */
	if (!r || r == -EPIPE || r == -ECONNRESET) {
		int rr = recv_line(fd, &rep->raw, deadline);

		r = !r || !rr ? rr : r;
	}
	close(fd);
	if (r)
		return r;
	rep->obj = json_loads(rep->raw, JSON_REJECT_DUPLICATES, NULL);
	if (!json_is_object(rep->obj) || !json_is_boolean(json_object_get(rep->obj, "ok"))) {
		ctl_reply_free(rep);
		return -EBADMSG;
	}
	return 0;
}

/* The number for an errno name such as "EPERM"; the daemon sends names
 * because numbers differ between architectures. */
static int errno_from_name(const char *name)
{
	int e;

	for (e = 1; e < 4096; e++) {
		const char *n = strerrorname_np(e);

		if (n && !strcmp(n, name))
			return e;
	}
	return EREMOTEIO;
}

int ctl_call(struct ctl_conn *c, const char *sock, const char *cmd, const json_t *req,
	     bool json_out, struct ctl_reply *rep)
{
	return ctl_call_ex(c, sock, cmd, req, json_out, "", rep);
}

int ctl_call_ex(struct ctl_conn *c, const char *sock, const char *cmd, const json_t *req,
		bool json_out, const char *err_prefix, struct ctl_reply *rep)
{
	return ctl_report(c, sock, cmd, json_out, err_prefix, ctl_exchange(c, sock, req, rep),
			  rep);
}

int ctl_report(struct ctl_conn *c, const char *sock, const char *cmd, bool json_out,
	       const char *err_prefix, int r, struct ctl_reply *rep)
{
	const char *err, *ename;
	char text[FMT_TEXT];

	if (r || !json_is_true(json_object_get(rep->obj, "ok")))
		fputs(err_prefix, stderr);

	switch (r) {
	case 0:
		break;
	case -ETIMEDOUT: {
		char what[PATH_MAX + 32];

		snprintf(what, sizeof(what), "the wfs daemon at %s", sock);
		report_timeout(c, cmd, what, daemon_pid(c, sock));
		return r;
	}
	case -E2BIG:
		fprintf(stderr, "wfsctl: %s: the request is over the daemon's %u KiB "
			"limit; name a directory instead of its files\n",
			cmd, CTL_REQUEST_MAX >> 10);
		return r;
	case -EMSGSIZE:
		fprintf(stderr, "wfsctl: %s: the reply from %s is over %u MiB, more than "
			"wfsctl reads: a request naming that many blobs (the daemon may have "
			"acted on it all the same; name fewer at a time), or not a wfs daemon\n",
			cmd, sock, CTL_REPLY_MAX >> 20);
		return r;
	case -EBADMSG:
		fprintf(stderr, "wfsctl: %s: the reply from %s is not a wfs reply "
			"(a JSON object with \"ok\")\n", cmd, sock);
		return r;
	case -ECONNRESET:
	case -EPIPE:
		fprintf(stderr, "wfsctl: %s: the wfs daemon at %s closed the "
			"connection without replying\n", cmd, sock);
		return r;
	case -EPROTO:
		fprintf(stderr, "wfsctl: %s: the wfs daemon at %s closed the connection in "
			"the middle of its reply (has it stopped?)\n", cmd, sock);
		return r;
	default: {
		/* connect() says ECONNREFUSED for a directory or a file too:
		 * --socket LOCAL_STORE is an easy slip */
		const char *hint = "";
		struct statvfs vfs;
		struct stat st;
		char dir[PATH_MAX];

		snprintf(dir, sizeof(dir), "%s", sock);
		/* a daemon whose LOCAL_STORE is read-only serves its copies
		 * but could make no socket there (README): none, or one a
		 * daemon before it left */
		if ((r == -ENOENT || (r == -ECONNREFUSED && stat(sock, &st) == 0 &&
				      S_ISSOCK(st.st_mode))) &&
		    statvfs(dirname(dir), &vfs) == 0 && (vfs.f_flag & ST_RDONLY))
			hint = " (its directory is on a read-only filesystem: no daemon runs "
			       "there, or one whose LOCAL_STORE is read-only, which has no "
			       "control socket)";
		else if (r == -ECONNREFUSED && stat(sock, &st) == 0)
			hint = S_ISDIR(st.st_mode) ? " (a directory: the socket is "
						     "LOCAL_STORE/wfs.sock)" :
			       !S_ISSOCK(st.st_mode) ? " (not a socket: the socket is "
						       "LOCAL_STORE/wfs.sock)" :
			       " (no daemon listens on it: has wfs stopped?)";
		fprintf(stderr, "wfsctl: cannot reach the wfs daemon at %s: %s%s\n",
			sock, strerror(-r), hint);
		return r;
	}
	}
	if (json_is_true(json_object_get(rep->obj, "ok")))
		return 0;
	err = json_string_value(json_object_get(rep->obj, "error"));
	ename = json_string_value(json_object_get(rep->obj, "errno"));
	if (json_out)
		ctl_print_raw(rep);
	if (!err || !*err)
		err = "the daemon refused the request";
	/* it often names a NAS path, which may hold control characters */
	err = fmt_text(err, text, sizeof(text));
	/* the daemon may name the op itself: "promote: only root ..." */
	if (!strncmp(err, cmd, strlen(cmd)) && err[strlen(cmd)] == ':')
		fprintf(stderr, "wfsctl: %s", err);
	else
		fprintf(stderr, "wfsctl: %s: %s", cmd, err);
	if (ename && *ename)
		fprintf(stderr, " [%s]", ename);
	fputc('\n', stderr);
	/* No hint of our own for EPERM: the daemon's refusal names who may
	 * ask, and an EPERM of the NAS's is about a file, not about us. */
	r = ename && *ename ? errno_from_name(ename) : EREMOTEIO;
	ctl_reply_free(rep);
	return -r;
}
