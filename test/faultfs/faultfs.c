/* faultfs.c - a FUSE view of a directory whose faults a test turns on and
 * off: a stand-in NAS (read-only) or disk (--rw) for the wfs integration
 * tests.
 *
 *   faultfs [-f] [-d] [--rw] --ctl SOCKET SRC MNT
 *
 * MNT shows SRC with SRC's inode numbers (wfs keys files by the NAS (dev,
 * ino)), modes, sizes and times.  Nothing is cached by the kernel
 * (entry/attr timeouts 0, every open direct_io), so every system call a
 * client makes reaches us and sees the fault in force.  The faults, set
 * over the unix socket SOCKET (one command a line, one reply a line;
 * control.c), are those of a real NAS or disk: a frozen server (hang), a
 * gone one (fail ENOTCONN), bad sectors (eio ranges), a slow one
 * (latency); a kill -9 of this process leaves the mount answering
 * ENOTCONN, as a dead one does.
 *
 * Read-only by default (the mount is `ro`).  With --rw the files that
 * exist in SRC can be opened for writing, written, truncated, fallocated
 * and synced -- enough for a disk image attached to a loop device, whose
 * bad sectors are then `eio` ranges of the image -- but nothing is
 * created, removed, renamed or re-moded: those fail with EROFS.
 * The commands are listed in usage() below.
 */
#define FUSE_USE_VERSION 312

#include "faultfs.h"

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
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define NODE_BUCKETS 4096

static void usage(FILE *f)
{
	fprintf(f,
"usage: faultfs [-f] [-d] [--rw] --ctl SOCKET SRC MNT\n"
"Mount SRC at MNT, with faults set over the unix socket SOCKET.\n"
"  -f    stay in the foreground (else detach once the mount is up)\n"
"  -d    FUSE debug output (implies -f)\n"
"  --rw  the regular files of SRC may be written, truncated, fallocated and\n"
"        synced (a disk image for a loop device); nothing is created, removed,\n"
"        renamed or changed otherwise (EROFS).  Without it the mount is read-only\n"
"Commands (one a line; each reply is one line, `ok` or `error REASON`):\n"
"  ok                 normal operation; hung calls go on normally\n"
"  hang               every call blocks until `ok` or `fail` (a frozen NAS)\n"
"  fail ERRNAME|N     every call fails with that errno (hung ones too)\n"
"  eio REL OFF LEN    reads of SRC/REL overlapping [OFF, OFF+LEN) fail with EIO\n"
"                     (--rw: writes there succeed, and the bytes written read\n"
"                     again, as a disk remaps a sector written; the rest of\n"
"                     the range still fails)\n"
"  cut REL OFF        the next read of SRC/REL from before OFF to past it returns\n"
"                     only the bytes before OFF, once: short inside the file (an\n"
"                     NFS read whose later RPC failed, a client that splits reads)\n"
"  faildir REL ERR    lookups in the directory SRC/REL, and listings of it\n"
"                     (those open already too), fail with ERR (a name or\n"
"                     number), or with ERR `hang` block until `clear`; other\n"
"                     calls work\n"
"  clear              drop every eio range, cut and the faildir\n"
"  latency MS         every call waits MS milliseconds first (0: off); calls\n"
"                     waiting now follow the new MS from their arrival, so a\n"
"                     lower one releases them\n"
"  notype 1|0         listings give no entry types (DT_UNKNOWN, as NFS\n"
"                     without READDIRPLUS does), or give them again\n"
"  closes 1|0         a file's close (FLUSH) is a call like any other, hung\n"
"                     by `hang` (as NFSv4's CLOSE waits for the server), or\n"
"                     answered at once again (the default)\n"
"  state              one JSON line: mode, errno, hung (of them hung_reads),\n"
"                     calls, reads, read_bytes, writes, write_bytes, latency_ms,\n"
"                     eio_ranges (cuts included; a write may split or drop\n"
"                     one), faildir, rw\n");
}

int rw; /* --rw; set before any thread starts */

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

struct faults g = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

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

/* Session end is not signalled to us: a waiter looks every TICK_NS. */
#define TICK_NS 100000000L

/* g.lock held: wait on g.cond (a change, an interrupt) for at most @ns
 * nanoseconds (< 1 s). */
static void cond_wait_ns(long ns)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts); /* g.cond's clock */
	ts.tv_nsec += ns;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_cond_timedwait(&g.cond, &g.lock, &ts);
}

/* g.lock held: wait while @still(@arg) holds.  A hung call also ends when
 * the kernel interrupts it (its caller got a signal: EINTR, so a killed
 * client can exit) or the session ends (libfuse joins its workers at
 * unmount: a worker hung forever would keep the process alive).  0, or
 * -EINTR / -ENOTCONN if it ended so. */
static int hang_while(fuse_req_t req, int (*still)(const void *arg), const void *arg)
{
	int r = 0;

	g.hung++;
	while (still(arg) && !fuse_req_interrupted(req) && !fuse_session_exited(se))
		cond_wait_ns(TICK_NS);
	g.hung--;
	if (still(arg))
		r = fuse_req_interrupted(req) ? -EINTR : -ENOTCONN;
	return r;
}

static int mode_hang(const void *arg)
{
	(void)arg;
	return g.mode == MODE_HANG;
}

/* Nanoseconds from @t0 (CLOCK_MONOTONIC) until @ms milliseconds after it;
 * 0 once they have passed. */
static int64_t ns_left(const struct timespec *t0, unsigned ms)
{
	struct timespec now;
	int64_t left;

	clock_gettime(CLOCK_MONOTONIC, &now);
	left = (int64_t)ms * 1000000 - ((int64_t)(now.tv_sec - t0->tv_sec) * 1000000000 +
					(now.tv_nsec - t0->tv_nsec));
	return left > 0 ? left : 0;
}

/* g.lock held: wait out `latency` for a call that arrived at @t0.  The
 * setting is read again at each wake-up (`latency` broadcasts g.cond): a
 * test that lowers it, or turns it off, releases the calls waiting now --
 * each waits what the setting says, counted from its arrival.  Like a hang,
 * the wait ends too when the call is interrupted (a killed client exits)
 * or the session ends (libfuse joins its workers).  0, -EINTR, -ENOTCONN. */
static int latency_wait(fuse_req_t req, const struct timespec *t0)
{
	int64_t left;

	while ((left = ns_left(t0, g.latency_ms)) > 0) {
		if (fuse_req_interrupted(req))
			return -EINTR;
		if (fuse_session_exited(se))
			return -ENOTCONN;
		cond_wait_ns(left < TICK_NS ? (long)left : TICK_NS);
	}
	return 0;
}

/* 0, or the -errno the call must fail with. */
int gate(fuse_req_t req, int is_read)
{
	struct timespec t0;
	int r;

	clock_gettime(CLOCK_MONOTONIC, &t0); /* immune to clock changes */
	/* Before g.lock: registering may call on_interrupt at once. */
	fuse_req_interrupt_func(req, on_interrupt, NULL);
	pthread_mutex_lock(&g.lock);
	g.calls++;
	r = latency_wait(req, &t0);
	if (r == 0 && g.mode == MODE_HANG) {
		g.hung_reads += is_read != 0;
		r = hang_while(req, mode_hang, NULL);
		g.hung_reads -= is_read != 0;
	}
	if (r == 0 && g.mode == MODE_FAIL)
		r = -g.err;
	pthread_mutex_unlock(&g.lock);
	return r;
}

/* g.lock held: is `faildir` set on @n's directory? */
static int dir_faulted(const void *arg)
{
	const struct node *n = arg;

	return g.faildir_err && n->dev == g.faildir_dev && n->ino == g.faildir_ino;
}

/* g.lock held: is @n's directory frozen by `faildir REL hang`? */
static int dir_hung(const void *arg)
{
	return dir_faulted(arg) && g.faildir_err == FAILDIR_HANG;
}

int dir_fault(fuse_req_t req, fuse_ino_t ino)
{
	const struct node *n = N(ino);
	int r = 0;

	pthread_mutex_lock(&g.lock);
	if (dir_hung(n))
		r = hang_while(req, dir_hung, n);
	/* (a hang released by `clear`, or turned into an errno by `faildir`) */
	if (r == 0 && dir_faulted(n))
		r = -g.faildir_err;
	pthread_mutex_unlock(&g.lock);
	return r;
}

/* ---- FUSE operations (no kernel caching: every timeout is 0) */

int node_fd(fuse_ino_t ino)
{
	return N(ino)->fd;
}

void node_id(fuse_ino_t ino, dev_t *dev, ino_t *sino)
{
	*dev = N(ino)->dev;
	*sino = N(ino)->ino;
}

int stat_fd(int fd, struct stat *st)
{
	return fstatat(fd, "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}

/* A descriptor of @ino's source file open with @flags (an access mode,
 * O_TRUNC), or -errno.  Never O_DIRECT on the source (its alignment rules
 * are not the caller's: the caller's O_DIRECT is honoured by direct_io). */
int node_reopen(fuse_ino_t ino, int flags)
{
	char path[64];
	int fd;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", N(ino)->fd);
	fd = open(path, flags | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
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
	if ((r = dir_fault(req, parent)) < 0) {
		fuse_reply_err(req, -r);
		return;
	}
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
	if ((fd = dir_fault(req, ino)) < 0) {
		fuse_reply_err(req, -fd);
		return;
	}
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

/* The kernel serialises READDIR on one open directory.  `faildir` holds
 * here too, not only at opendir: a listing open when it is set fails (or
 * blocks) from its next batch, as a NAS's directory gone bad mid-listing. */
static void ff_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	struct dirh *d = (struct dirh *)(uintptr_t)fi->fh;
	size_t used = 0;
	char *buf;
	int r;

	GATE(req);
	if ((r = dir_fault(req, ino)) < 0) {
		fuse_reply_err(req, -r);
		return;
	}
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
		pthread_mutex_lock(&g.lock);
		st.st_mode = g.notype ? 0 : (mode_t)d->ent->d_type << 12;
		pthread_mutex_unlock(&g.lock);
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
	int flags = O_RDONLY, fd;
	struct stat st;

	GATE(req);
	if ((fi->flags & O_ACCMODE) != O_RDONLY || fi->flags & O_TRUNC) {
		/* --rw: a regular file only (what a loop device needs) */
		if (!rw || stat_fd(N(ino)->fd, &st) < 0 || !S_ISREG(st.st_mode)) {
			fuse_reply_err(req, EROFS);
			return;
		}
		flags = (fi->flags & O_ACCMODE) | (fi->flags & O_TRUNC);
	}
	if ((fd = node_reopen(ino, flags)) < 0) {
		fuse_reply_err(req, -fd);
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

	GATE_CALL(req, 1);
	if (eio_hit(N(ino)->dev, N(ino)->ino, (uint64_t)off, size)) {
		fuse_reply_err(req, EIO);
		return;
	}
	size = cut_size(N(ino)->dev, N(ino)->ino, (uint64_t)off, size);
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

/* Answered always (an ENOSYS would stop the kernel sending it for good);
 * a call that may hang only under `closes 1`. */
static void ff_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	int closes;

	(void)ino;
	(void)fi;
	pthread_mutex_lock(&g.lock);
	closes = g.closes;
	pthread_mutex_unlock(&g.lock);
	if (closes)
		GATE(req);
	fuse_reply_err(req, 0);
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

/* Read-only, writes need no operations: the mount is `ro`, the kernel
 * answers EROFS.  --rw adds its own (rw_ops, rw.c). */
static struct fuse_lowlevel_ops ops = {
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
	.flush = ff_flush,
	.release = ff_release,
	.statfs = ff_statfs,
	.getxattr = ff_getxattr,
	.listxattr = ff_listxattr,
};

int main(int argc, char **argv)
{
	const char *ctl = NULL, *src = NULL, *argv_mnt = NULL, *mnt;
	char ctl_abs[PATH_MAX], mnt_abs[PATH_MAX], opts[128];
	int foreground = 0, debug = 0, ret = 1, src_fd, r;
	struct fuse_loop_config *cfg;
	struct stat root_st;
	struct rlimit rl;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(argv[i], "-f")) {
			foreground = 1;
		} else if (!strcmp(argv[i], "-d")) {
			debug = foreground = 1;
		} else if (!strcmp(argv[i], "--rw")) {
			rw = 1;
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

	/* `ro`: the kernel refuses every write with EROFS (--rw: our own
	 * operations refuse what it may not do); allow_other: wfs runs as
	 * root, but tests also read the NAS as nobody. */
	snprintf(opts, sizeof(opts), "fsname=faultfs,subtype=faultfs%s,default_permissions%s",
		 rw ? "" : ",ro", geteuid() == 0 ? ",allow_other" : "");
	if (rw)
		rw_ops(&ops);
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
	if ((r = ctl_open(ctl)) < 0) {
		fprintf(stderr, "faultfs: --ctl %s: %s\n", ctl, strerror(-r));
		goto out_signals;
	}
	if (fuse_session_mount(se, mnt) != 0) {
		fprintf(stderr, "faultfs: cannot mount %s\n", mnt);
		goto out_ctl;
	}
	if (fuse_daemonize(foreground) != 0)
		goto out_unmount;
	/* Threads only now: fuse_daemonize() forks. */
	if ((r = ctl_start(src_fd)) != 0) {
		fprintf(stderr, "faultfs: control thread: %s\n", strerror(r));
		goto out_unmount;
	}

	cfg = fuse_loop_cfg_create();
	/* Hung calls each hold a worker: leave room for many (and for the
	 * INTERRUPTs that end them). */
	fuse_loop_cfg_set_max_threads(cfg, 256);
	ret = fuse_session_loop_mt(se, cfg) ? 1 : 0;
	fuse_loop_cfg_destroy(cfg);

out_unmount:
	fuse_session_unmount(se);
out_ctl:
	ctl_close(ctl);
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
