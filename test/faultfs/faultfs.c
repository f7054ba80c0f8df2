/* faultfs.c - a read-only FUSE view of a directory whose faults a test
 * turns on and off: a stand-in NAS for the wfs integration tests.
 *
 *   faultfs [-f] [-d] --ctl SOCKET SRC MNT
 *
 * MNT shows SRC read-only with SRC's inode numbers (wfs keys files by the
 * NAS (dev, ino)), modes, sizes and times.  Nothing is cached by the
 * kernel (entry/attr timeouts 0, every open direct_io), so every system
 * call a client makes reaches us and sees the fault in force.  The faults,
 * set over the unix socket SOCKET (one command a line, one reply a line),
 * are those of a real NAS: a frozen server (hang), a gone one (fail
 * ENOTCONN), bad sectors (eio ranges), a slow one (latency); a kill -9 of
 * this process leaves the mount answering ENOTCONN, as a dead one does.
 * The commands are listed in usage() below.
 */
#define FUSE_USE_VERSION 312

#include <fuse_lowlevel.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define NODE_BUCKETS 4096
#define MAX_EIO 64

static void usage(FILE *f)
{
	fprintf(f,
"usage: faultfs [-f] [-d] --ctl SOCKET SRC MNT\n"
"Mount SRC read-only at MNT, with faults set over the unix socket SOCKET.\n"
"  -f  stay in the foreground (else detach once the mount is up)\n"
"  -d  FUSE debug output (implies -f)\n"
"Commands (one a line; each reply is one line, `ok` or `error REASON`):\n"
"  ok                 normal operation; hung calls go on normally\n"
"  hang               every call blocks until `ok` or `fail` (a frozen NAS)\n"
"  fail ERRNAME|N     every call fails with that errno (hung ones too)\n"
"  eio REL OFF LEN    reads of SRC/REL overlapping [OFF, OFF+LEN) fail with EIO\n"
"  clear              drop every eio range\n"
"  latency MS         every call waits MS milliseconds first (0: off)\n"
"  state              one JSON line: mode, errno, hung, calls, reads, read_bytes,\n"
"                     latency_ms, eio_ranges\n");
}

/* ---- nodes: one per source inode the kernel knows, keyed by (dev, ino) */

struct node {
	struct node *next;   /* LOCK nodes.lock: hash chain */
	dev_t dev;           /* immutable */
	ino_t ino;           /* immutable */
	int fd;              /* immutable: O_PATH on the source inode */
	uint64_t nlookup;    /* LOCK nodes.lock */
};

static struct {
	pthread_mutex_t lock;
	struct node *bucket[NODE_BUCKETS];
	struct node root;    /* FUSE_ROOT_ID: SRC, never forgotten */
} nodes = { .lock = PTHREAD_MUTEX_INITIALIZER };

static struct node *N(fuse_ino_t ino)
{
	return ino == FUSE_ROOT_ID ? &nodes.root : (struct node *)(uintptr_t)ino;
}

static size_t bucket_of(dev_t dev, ino_t ino)
{
	return (size_t)((ino * 0x9E3779B97F4A7C15ull) ^ dev) % NODE_BUCKETS;
}

/* The node of (st->st_dev, st->st_ino), one more lookup on it; takes @fd
 * (closes it when the node existed already).  NULL: no memory. */
static struct node *node_get(const struct stat *st, int fd)
{
	size_t b = bucket_of(st->st_dev, st->st_ino);
	struct node *n;

	if (st->st_dev == nodes.root.dev && st->st_ino == nodes.root.ino) {
		close(fd);
		return &nodes.root;
	}
	pthread_mutex_lock(&nodes.lock);
	for (n = nodes.bucket[b]; n; n = n->next)
		if (n->dev == st->st_dev && n->ino == st->st_ino)
			break;
	if (n) {
		close(fd);
	} else if ((n = calloc(1, sizeof(*n)))) {
		n->dev = st->st_dev;
		n->ino = st->st_ino;
		n->fd = fd;
		n->next = nodes.bucket[b];
		nodes.bucket[b] = n;
	}
	if (n)
		n->nlookup++;
	pthread_mutex_unlock(&nodes.lock);
	if (!n)
		close(fd);
	return n;
}

static void node_forget(fuse_ino_t ino, uint64_t count)
{
	struct node *n = N(ino), **p;

	if (n == &nodes.root)
		return;
	pthread_mutex_lock(&nodes.lock);
	n->nlookup -= count < n->nlookup ? count : n->nlookup;
	if (n->nlookup == 0) {
		for (p = &nodes.bucket[bucket_of(n->dev, n->ino)]; *p != n; p = &(*p)->next)
			;
		*p = n->next;
		close(n->fd);
		free(n);
	}
	pthread_mutex_unlock(&nodes.lock);
}

/* ---- the fault gate: every call passes it first */

enum mode { MODE_OK, MODE_HANG, MODE_FAIL };

struct eio_range {
	dev_t dev;
	ino_t ino;
	uint64_t off, len;
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;     /* mode changed, an interrupt, a tick */
	enum mode mode;          /* LOCK (all below too) */
	int err;                 /* errno of MODE_FAIL */
	unsigned latency_ms;
	unsigned hung;           /* calls waiting in MODE_HANG now */
	uint64_t calls, reads, read_bytes;
	unsigned n_eio;
	struct eio_range eio[MAX_EIO];
} g = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static struct fuse_session *se; /* set before any thread starts */

/* libfuse calls this with the request's own lock held and none of ours;
 * the waiter checks fuse_req_interrupted() under g.lock, so broadcasting
 * under g.lock loses no wake-up. */
static void on_interrupt(fuse_req_t req, void *data)
{
	(void)req;
	(void)data;
	pthread_mutex_lock(&g.lock);
	pthread_cond_broadcast(&g.cond);
	pthread_mutex_unlock(&g.lock);
}

/* 0, or the -errno the call must fail with.  A hung call also ends when
 * the kernel interrupts it (its caller got a signal: EINTR, so a killed
 * client can exit) or the session ends (libfuse joins its workers at
 * unmount: a worker hung forever would keep the process alive). */
static int gate(fuse_req_t req)
{
	unsigned lat;
	int r = 0;

	/* Before g.lock: registering may call on_interrupt at once. */
	fuse_req_interrupt_func(req, on_interrupt, NULL);
	pthread_mutex_lock(&g.lock);
	g.calls++;
	lat = g.latency_ms;
	pthread_mutex_unlock(&g.lock);
	if (lat) {
		struct timespec ts = { lat / 1000, (long)(lat % 1000) * 1000000L };

		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
	}
	pthread_mutex_lock(&g.lock);
	if (g.mode == MODE_HANG) {
		g.hung++;
		while (g.mode == MODE_HANG && !fuse_req_interrupted(req) &&
		       !fuse_session_exited(se)) {
			struct timespec ts;

			/* Session end is not signalled to us: look every 100 ms. */
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 100000000L;
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&g.cond, &g.lock, &ts);
		}
		g.hung--;
		if (g.mode == MODE_HANG)
			r = fuse_req_interrupted(req) ? -EINTR : -ENOTCONN;
	}
	if (g.mode == MODE_FAIL)
		r = -g.err;
	pthread_mutex_unlock(&g.lock);
	return r;
}

/* Does a read of [off, off+size) of (dev, ino) overlap an eio range? */
static int eio_hit(const struct node *n, uint64_t off, uint64_t size)
{
	int hit = 0;

	pthread_mutex_lock(&g.lock);
	g.reads++;
	for (unsigned i = 0; i < g.n_eio && !hit; i++) {
		const struct eio_range *e = &g.eio[i];

		hit = e->dev == n->dev && e->ino == n->ino && off < e->off + e->len &&
		      e->off < off + size;
	}
	pthread_mutex_unlock(&g.lock);
	return hit;
}

/* ---- FUSE operations (no kernel caching: every timeout is 0) */

#define GATE(req)                                  \
	do {                                       \
		int gr_ = gate(req);               \
		if (gr_ < 0) {                     \
			fuse_reply_err(req, -gr_); \
			return;                    \
		}                                  \
	} while (0)

static int stat_fd(int fd, struct stat *st)
{
	return fstatat(fd, "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}

static void ff_init(void *data, struct fuse_conn_info *conn)
{
	(void)data;
	/* Cached pages would hide faults from readers. */
	conn->want &= ~(FUSE_CAP_WRITEBACK_CACHE | FUSE_CAP_AUTO_INVAL_DATA);
	conn->max_background = 64;
}

static void ff_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e = {0};
	struct node *n;
	int fd, r;

	GATE(req);
	fd = openat(N(parent)->fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	if ((r = stat_fd(fd, &e.attr)) < 0) {
		close(fd);
		fuse_reply_err(req, -r);
		return;
	}
	if (!(n = node_get(&e.attr, fd))) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	e.ino = n == &nodes.root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)n;
	if (fuse_reply_entry(req, &e) != 0 && n != &nodes.root)
		node_forget(e.ino, 1); /* the kernel never saw it */
}

static void ff_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	node_forget(ino, nlookup);
	fuse_reply_none(req);
}

static void ff_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stat st;
	int r;

	(void)fi;
	GATE(req);
	if ((r = stat_fd(N(ino)->fd, &st)) < 0)
		fuse_reply_err(req, -r);
	else
		fuse_reply_attr(req, &st, 0);
}

static void ff_readlink(fuse_req_t req, fuse_ino_t ino)
{
	char buf[PATH_MAX + 1];
	ssize_t n;

	GATE(req);
	n = readlinkat(N(ino)->fd, "", buf, sizeof(buf));
	if (n < 0 || n > PATH_MAX) {
		fuse_reply_err(req, n < 0 ? errno : ENAMETOOLONG);
		return;
	}
	buf[n] = '\0';
	fuse_reply_readlink(req, buf);
}

struct dirh {
	DIR *dp;
	off_t off;           /* where dp is */
	struct dirent *ent;  /* read from dp but not yet sent (did not fit) */
};

static void ff_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct dirh *d;
	int fd;

	GATE(req);
	if (!(d = calloc(1, sizeof(*d)))) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	fd = openat(N(ino)->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || !(d->dp = fdopendir(fd))) {
		int e = errno;

		if (fd >= 0)
			close(fd);
		free(d);
		fuse_reply_err(req, e);
		return;
	}
	fi->fh = (uintptr_t)d;
	if (fuse_reply_open(req, fi) != 0) {
		closedir(d->dp);
		free(d);
	}
}

/* The kernel serialises READDIR on one open directory. */
static void ff_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	struct dirh *d = (struct dirh *)(uintptr_t)fi->fh;
	size_t used = 0;
	char *buf;

	(void)ino;
	GATE(req);
	if (!(buf = malloc(size))) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (off != d->off) {
		seekdir(d->dp, off);
		d->off = off;
		d->ent = NULL;
	}
	for (;;) {
		struct stat st = {0};
		size_t sz;

		if (!d->ent) {
			errno = 0;
			if (!(d->ent = readdir(d->dp))) {
				if (errno && used == 0) {
					int e = errno;

					free(buf);
					fuse_reply_err(req, e);
					return;
				}
				break;
			}
		}
		st.st_ino = d->ent->d_ino; /* the source's d_ino, as the brief says */
		st.st_mode = (mode_t)d->ent->d_type << 12;
		sz = fuse_add_direntry(req, buf + used, size - used, d->ent->d_name, &st,
				       d->ent->d_off);
		if (sz > size - used)
			break;
		used += sz;
		d->off = d->ent->d_off;
		d->ent = NULL;
	}
	fuse_reply_buf(req, buf, used);
	free(buf);
}

static void ff_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct dirh *d = (struct dirh *)(uintptr_t)fi->fh;

	(void)ino;
	closedir(d->dp);
	free(d);
	fuse_reply_err(req, 0);
}

static void ff_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	char path[64];
	int fd;

	GATE(req);
	if ((fi->flags & O_ACCMODE) != O_RDONLY || fi->flags & O_TRUNC) {
		fuse_reply_err(req, EROFS);
		return;
	}
	/* Never O_DIRECT on the source (its alignment rules are not the
	 * caller's: the caller's O_DIRECT is honoured by direct_io below). */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", N(ino)->fd);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	fi->fh = (uint64_t)fd;
	fi->direct_io = 1;  /* every read reaches us: no page cache */
	fi->keep_cache = 0;
	if (fuse_reply_open(req, fi) != 0)
		close(fd);
}

static void ff_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	char *buf;
	ssize_t n;

	GATE(req);
	if (eio_hit(N(ino), (uint64_t)off, size)) {
		fuse_reply_err(req, EIO);
		return;
	}
	if (!(buf = malloc(size ? size : 1))) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	n = pread((int)fi->fh, buf, size, off);
	if (n < 0) {
		fuse_reply_err(req, errno);
	} else {
		pthread_mutex_lock(&g.lock);
		g.read_bytes += (uint64_t)n;
		pthread_mutex_unlock(&g.lock);
		fuse_reply_buf(req, buf, (size_t)n);
	}
	free(buf);
}

static void ff_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	close((int)fi->fh);
	fuse_reply_err(req, 0);
}

static void ff_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs sv;

	(void)ino;
	GATE(req);
	if (fstatvfs(nodes.root.fd, &sv) < 0)
		fuse_reply_err(req, errno);
	else
		fuse_reply_statfs(req, &sv);
}

static void ff_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	(void)ino;
	(void)name;
	(void)size;
	GATE(req);
	fuse_reply_err(req, ENODATA);
}

static void ff_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	(void)ino;
	GATE(req);
	if (size == 0)
		fuse_reply_xattr(req, 0);
	else
		fuse_reply_buf(req, NULL, 0);
}

/* Writes need no operations: the mount is `ro`, the kernel answers EROFS. */
static const struct fuse_lowlevel_ops ops = {
	.init = ff_init,
	.lookup = ff_lookup,
	.forget = ff_forget, /* libfuse splits BATCH_FORGET into these */
	.getattr = ff_getattr,
	.readlink = ff_readlink,
	.opendir = ff_opendir,
	.readdir = ff_readdir,
	.releasedir = ff_releasedir,
	.open = ff_open,
	.read = ff_read,
	.release = ff_release,
	.statfs = ff_statfs,
	.getxattr = ff_getxattr,
	.listxattr = ff_listxattr,
};

/* ---- the control socket: its own thread, never blocked by hung calls */

static int src_fd = -1;
static int ctl_fd = -1;

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
					    "eio" };
	static const int nargs[] = { 0, 0, 0, 0, 1, 1, 3 };
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
	} else if (!strcmp(cmd, "eio")) {
		if (parse_u64(a2, &v1) || parse_u64(a3, &v2) || v2 == 0) {
			snprintf(out, sz, "error usage: eio REL OFF LEN (LEN > 0)");
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
			g.eio[g.n_eio++] = (struct eio_range){ st.st_dev, st.st_ino, v1, v2 };
		else
			snprintf(out, sz, "error at most %d eio ranges", MAX_EIO);
		pthread_mutex_unlock(&g.lock);
	} else if (!strcmp(cmd, "clear")) {
		pthread_mutex_lock(&g.lock);
		g.n_eio = 0;
		pthread_mutex_unlock(&g.lock);
	} else if (!strcmp(cmd, "latency")) {
		if (parse_u64(a1, &v1) || v1 > 600000) {
			snprintf(out, sz, "error latency needs milliseconds (0-600000)");
			return;
		}
		pthread_mutex_lock(&g.lock);
		g.latency_ms = (unsigned)v1;
		pthread_mutex_unlock(&g.lock);
	} else if (!strcmp(cmd, "state")) {
		static const char *const names[] = { "ok", "hang", "fail" };

		pthread_mutex_lock(&g.lock);
		snprintf(out, sz, "{\"mode\": \"%s\", \"errno\": %d, \"hung\": %u, "
			 "\"calls\": %" PRIu64 ", \"reads\": %" PRIu64 ", \"read_bytes\": %" PRIu64
			 ", \"latency_ms\": %u, \"eio_ranges\": %u}", names[g.mode], g.err, g.hung,
			 g.calls, g.reads, g.read_bytes, g.latency_ms, g.n_eio);
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

static int ctl_bind(const char *path)
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
	return fd;
}

int main(int argc, char **argv)
{
	const char *ctl = NULL, *src = NULL, *argv_mnt = NULL, *mnt;
	char ctl_abs[PATH_MAX], mnt_abs[PATH_MAX], opts[128];
	int foreground = 0, debug = 0, ret = 1, r;
	struct fuse_loop_config *cfg;
	struct stat root_st;
	struct rlimit rl;
	pthread_t ctl_tid;
	int ctl_started = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(argv[i], "-f")) {
			foreground = 1;
		} else if (!strcmp(argv[i], "-d")) {
			debug = foreground = 1;
		} else if (!strcmp(argv[i], "--ctl") && i + 1 < argc) {
			ctl = argv[++i];
		} else if (argv[i][0] == '-' || (src && argv_mnt)) {
			usage(stderr);
			return 2;
		} else if (!src) {
			src = argv[i];
		} else {
			argv_mnt = argv[i];
		}
	}
	if (!ctl || !src || !argv_mnt) {
		usage(stderr);
		return 2;
	}
	/* The daemon leaves its working directory: make the socket path
	 * absolute (it is unlinked at exit). */
	if (ctl[0] != '/') {
		char cwd[PATH_MAX];

		if (!getcwd(cwd, sizeof(cwd)) ||
		    snprintf(ctl_abs, sizeof(ctl_abs), "%s/%s", cwd, ctl) >= (int)sizeof(ctl_abs)) {
			fprintf(stderr, "faultfs: --ctl %s: path too long\n", ctl);
			return 1;
		}
		ctl = ctl_abs;
	}
	/* libfuse unmounts by this path, after it may have left the cwd. */
	if (!realpath(argv_mnt, mnt_abs)) {
		fprintf(stderr, "faultfs: MNT %s: %s\n", argv_mnt, strerror(errno));
		return 1;
	}
	mnt = mnt_abs;
	/* One O_PATH descriptor per inode the kernel holds. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	src_fd = open(src, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (src_fd < 0) {
		fprintf(stderr, "faultfs: SRC %s: %s\n", src, strerror(errno));
		return 1;
	}
	if (fstat(src_fd, &root_st) < 0) {
		fprintf(stderr, "faultfs: SRC %s: %s\n", src, strerror(errno));
		goto out_src;
	}
	nodes.root = (struct node){ .dev = root_st.st_dev, .ino = root_st.st_ino, .fd = src_fd };

	/* `ro`: the kernel refuses every write with EROFS; allow_other: wfs
	 * runs as root, but tests also read the NAS as nobody. */
	snprintf(opts, sizeof(opts), "fsname=faultfs,subtype=faultfs,ro,default_permissions%s",
		 geteuid() == 0 ? ",allow_other" : "");
	{
		char *fargv[] = { argv[0], "-o", opts, debug ? "-d" : NULL, NULL };
		struct fuse_args args = FUSE_ARGS_INIT(debug ? 4 : 3, fargv);

		se = fuse_session_new(&args, &ops, sizeof(ops), NULL);
	}
	if (!se)
		goto out_src;
	if (fuse_set_signal_handlers(se) != 0)
		goto out_session;
	/* Bound before the mount: a caller that sees the mount can talk. */
	if ((ctl_fd = ctl_bind(ctl)) < 0) {
		fprintf(stderr, "faultfs: --ctl %s: %s\n", ctl, strerror(-ctl_fd));
		goto out_signals;
	}
	if (fuse_session_mount(se, mnt) != 0) {
		fprintf(stderr, "faultfs: cannot mount %s\n", mnt);
		goto out_ctl;
	}
	if (fuse_daemonize(foreground) != 0)
		goto out_unmount;
	/* Threads only now: fuse_daemonize() forks. */
	if ((r = pthread_create(&ctl_tid, NULL, ctl_thread, NULL)) != 0) {
		fprintf(stderr, "faultfs: control thread: %s\n", strerror(r));
		goto out_unmount;
	}
	ctl_started = 1;

	cfg = fuse_loop_cfg_create();
	/* Hung calls each hold a worker: leave room for many (and for the
	 * INTERRUPTs that end them). */
	fuse_loop_cfg_set_max_threads(cfg, 256);
	ret = fuse_session_loop_mt(se, cfg) ? 1 : 0;
	fuse_loop_cfg_destroy(cfg);

out_unmount:
	fuse_session_unmount(se);
out_ctl:
	shutdown(ctl_fd, SHUT_RDWR); /* wakes accept() */
	if (ctl_started)
		pthread_join(ctl_tid, NULL);
	close(ctl_fd);
	unlink(ctl);
out_signals:
	fuse_remove_signal_handlers(se);
out_session:
	fuse_session_destroy(se);
out_src:
	for (size_t b = 0; b < NODE_BUCKETS; b++)
		while (nodes.bucket[b]) {
			struct node *n = nodes.bucket[b];

			nodes.bucket[b] = n->next;
			close(n->fd);
			free(n);
		}
	close(src_fd);
	return ret;
}
