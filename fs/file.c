/* file.c - open, read, release: where a file's bytes come from.
 *
 * A file is read from its blob's verified local copy when there is one and
 * from the NAS otherwise, deciding at every read, so an open file moves to
 * the copy the moment it is verified.
 */
#include "wfs.h"
#include "ops.h"
#include "path.h"
#include "nasopen.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <time.h>


/* An open file.  It reads from whichever side its blob is on at the time
 * of each read: opened from the NAS, it moves to the local copy as soon as
 * the copy is verified, and back if the copy is demoted.  Both descriptors
 * stay open until release, so a read in flight never loses its fd.
 * Who may touch a field (one rule each):
 *   OPEN   set by op_open before the open is answered, read-only after
 *          (the kernel sends every READ and the RELEASE after that reply);
 *   FH     under @lock;
 *   TABLE  under w->nodes.lock (with the node's open tallies). */
struct wfs_fh {
	pthread_mutex_t lock;
	struct blob *blob;          /* OPEN */
	struct node *node;          /* OPEN */
	char *nas_path;             /* OPEN */
	int nas_fd, nas_direct;     /* FH */
	int local_fd, local_direct; /* FH */
	int local_failed;           /* FH */
	int backing_id; /* OPEN: > 0: the kernel reads the local copy itself */
	int counted;    /* TABLE: counted in the node's open tallies */
	int noted;      /* OPEN: store_note_open() was called: store_note_close() is due */
};

int fh_backing_id(uint64_t fh)
{
	return ((struct wfs_fh *)(uintptr_t)fh)->backing_id;
}

/* Open a local copy (NAS paths go through nas_open) without following any
 * link. */
static int open_backing(const char *path, int flags)
{
	struct open_how how = {
		.flags = (uint64_t)(O_RDONLY | O_CLOEXEC | O_NOCTTY | flags),
		.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	int fd = (int)syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof(how));

	if (fd < 0 && errno == ENOSYS)
		fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | flags);
	return fd < 0 ? -errno : fd;
}

/* Open @path with O_DIRECT where its filesystem allows it: a NAS path
 * (@roots given) with nas_open -- no link in any component, never beneath
 * its root, no FIFO opened -- a local copy with open_backing. */
static int open_direct(const struct hub_roots *roots, const char *path, int *direct)
{
	int fd = roots ? nas_open(roots, path, O_DIRECT) : open_backing(path, O_DIRECT);

	*direct = 1;
	if (fd == -EINVAL) { /* tmpfs and friends: buffered, pages dropped */
		*direct = 0;
		fd = roots ? nas_open(roots, path, 0) : open_backing(path, 0);
	}
	return fd;
}

static int fh_nas_fd(struct wfs *w, struct wfs_fh *fh, int *direct)
{
	int fd;

	pthread_mutex_lock(&fh->lock);
	fd = fh->nas_fd;
	if (fd < 0) { /* the caller gets the open's -errno */
		fd = open_direct(&w->roots, fh->nas_path, &fh->nas_direct);
		if (fd < 0)
			wfs_log(w, LOG_WARNING, "open %s: %s", fh->nas_path, strerror(-fd));
		else
			fh->nas_fd = fd;
	}
	*direct = fh->nas_direct;
	pthread_mutex_unlock(&fh->lock);
	return fd;
}

static int fh_local_fd(struct wfs *w, struct wfs_fh *fh, int *direct)
{
	char path[PATH_MAX + 64] = "";
	int fd;

	pthread_mutex_lock(&fh->lock);
	if (fh->local_fd < 0 && !fh->local_failed) {
		fd = store_local_path(&w->store, fh->blob, path, sizeof(path));
		if (fd == 0)
			fd = open_direct(NULL, path, &fh->local_direct);
		if (fd < 0) {
			fh->local_failed = 1;
			wfs_log(w, LOG_WARNING, "open local copy %s of %s: %s; reading the NAS",
				path, fh->nas_path, strerror(-fd));
		} else {
			fh->local_fd = fd;
		}
	}
	fd = fh->local_fd;
	*direct = fh->local_direct;
	pthread_mutex_unlock(&fh->lock);
	return fd;
}

/* Choose how this open is served.  The kernel wants every open of an inode
 * at one time alike, so: an inode already open daemon-served stays so (it
 * reads the local copy through us) until its last open closes; otherwise a
 * local blob goes passthrough, sharing one backing id between opens.
 * The table lock also guards w->pt_warned and w->pt_opens_total. */
static void choose_mode(struct wfs *w, struct node *n, struct wfs_fh *fh, int local)
{
	char path[PATH_MAX + 64];
	int id = 0, fd, refused_now = 0;

	pthread_mutex_lock(&w->nodes.lock);
	if (n->pt_opens > 0) {
		id = n->backing_id; /* join the opens already passed through */
	} else if (local && n->daemon_opens == 0 && passthrough_usable(&w->pt)) {
		/* Buffered: the kernel serves reads from this file's page cache,
		 * the only copy of the bytes. */
		fd = store_local_path(&w->store, fh->blob, path, sizeof(path));
		if (fd == 0)
			fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		if (fd >= 0) {
			id = passthrough_open_backing(&w->pt, fd);
			close(fd); /* the kernel holds its own reference */
			if (id < 0) {
				refused_now = !w->pt_warned;
				w->pt_warned = 1;
				wfs_log(w, refused_now ? LOG_WARNING : LOG_DEBUG,
					"passthrough refused for %s (%s): reads are daemon-served",
					path, strerror(-id));
				id = 0;
			}
			n->backing_id = id;
		}
	}
	if (id > 0) {
		n->pt_opens++;
		fh->backing_id = id;
		w->pt_opens_total++;
		store_count_passthrough_open(&w->store);
	} else {
		n->daemon_opens++;
	}
	fh->counted = 1;
	pthread_mutex_unlock(&w->nodes.lock);
}

/* The open is over (released, or its reply never reached the opener). */
static void fh_uncount(struct wfs *w, struct wfs_fh *fh)
{
	struct node *n = fh->node;
	int close_id = 0;

	pthread_mutex_lock(&w->nodes.lock);
	if (!fh->counted) {
		pthread_mutex_unlock(&w->nodes.lock);
		return;
	}
	fh->counted = 0;
	if (fh->backing_id) {
		if (--n->pt_opens == 0) {
			close_id = n->backing_id;
			n->backing_id = 0;
		}
	} else {
		n->daemon_opens--;
	}
	pthread_mutex_unlock(&w->nodes.lock);
	/* Only now: the kernel has released every open that used it. */
	if (close_id > 0)
		passthrough_close_backing(&w->pt, close_id);
}

static void fh_free(struct wfs *w, struct wfs_fh *fh)
{
	struct blob *noted = fh->noted ? fh->blob : NULL;
	int nas_fd, local_fd;

	pthread_mutex_lock(&fh->lock);
	nas_fd = fh->nas_fd;
	local_fd = fh->local_fd;
	pthread_mutex_unlock(&fh->lock);
	if (nas_fd >= 0)
		close(nas_fd);
	if (local_fd >= 0)
		close(local_fd);
	pthread_mutex_destroy(&fh->lock);
	free(fh->nas_path);
	free(fh);
	/* After our descriptors are closed: the space of a copy evicted while
	 * open comes back now. */
	if (noted)
		store_note_close(&w->store, noted);
}

void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct wfs *w = W(req);
	struct node *n = N(w, ino);
	char path[PATH_MAX];
	struct wfs_fh *fh;
	struct stat st;
	int fd, direct, local = 0;

	if (n->kind != NS_FILE) {
		fuse_reply_err(req, n->kind == NS_DIR ? EISDIR : ELOOP);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
		node_path(n, path, sizeof(path));
		wfs_log(w, LOG_NOTICE, "refused write open of %s: read-only filesystem", path);
		fuse_reply_err(req, EROFS);
		return;
	}
	fh = calloc(1, sizeof(*fh));
	if (!fh) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	pthread_mutex_init(&fh->lock, NULL);
	fh->nas_fd = fh->local_fd = -1;
	fh->node = n;
	fh->blob = node_blob(w, n);
	node_backing(&w->nodes, n, path, sizeof(path));
	fh->nas_path = strdup(path);
	if (!fh->nas_path) {
		fh_free(w, fh);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	/* The NAS side is opened even for a local blob: it proves the name still
	 * resolves, gives the attributes, and is the fallback. */
	fd = fh_nas_fd(w, fh, &direct);
	if (fd < 0) {
		/* a link, FIFO or other file swapped in since the lookup: the
		 * reader gets EIO, as for any NAS file that cannot be read */
		fuse_reply_err(req, fd == -ELOOP || fd == -ENXIO || fd == -ESTALE ||
				    fd == -EISDIR || fd == -EXDEV || fd == -EINVAL ? EIO : -fd);
		fh_free(w, fh);
		return;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		wfs_log(w, LOG_WARNING, "open %s: not a regular file any more", fh->nas_path);
		fuse_reply_err(req, EIO);
		fh_free(w, fh);
		return;
	}
	if (fh->blob) {
		node_path(n, path, sizeof(path));
		store_note_open(&w->store, fh->blob, path);
		fh->noted = 1;
		/* Attributes the kernel has not asked about yet count too: a
		 * source that changed is checked before its copy serves. */
		store_source_attrs(&w->store, fh->blob, &st);
		local = store_check_source(&w->store, fh->blob) && fh_local_fd(w, fh, &direct) >= 0;
	}
	choose_mode(w, n, fh, local);
	/* The content under a blob's name is immutable, so the kernel may keep
	 * its pages across opens -- unless the NAS shows a new size or mtime.
	 * Refs and other small files are rewritten in place, maybe within one
	 * timestamp tick: always read afresh. */
	pthread_mutex_lock(&w->nodes.lock);
	if (!node_set_stat_locked(n, &st) && n->cache_ok && fh->blob)
		fi->keep_cache = 1;
	n->cache_ok = 1;
	pthread_mutex_unlock(&w->nodes.lock);
	fi->fh = (uint64_t)(uintptr_t)fh;
	fi->noflush = 1;
	if (fuse_reply_open(req, fi) == -ENOENT) {
		fh_uncount(w, fh); /* the opener was interrupted */
		fh_free(w, fh);
	}
}

/* Reads of NAS files use O_DIRECT where the filesystem allows it: the bytes
 * land only in the FUSE inode's page cache, never in the NAS file's too, and
 * an NFS client's stale cache is not consulted.  Aligned requests (all of
 * the kernel's page-cache reads) are handed to libfuse as the descriptor,
 * which splices them when the reply fits its pipe and otherwise reads them
 * into a buffer of its own; others are read into an aligned bounce buffer. */
#define DIO_ALIGN 4096

static void read_bounce(fuse_req_t req, int fd, size_t size, off_t off, int drop)
{
	off_t aoff = off & ~(off_t)(DIO_ALIGN - 1);
	size_t alen = (size_t)(off - aoff) + size;
	ssize_t n;
	void *buf;

	alen = (alen + DIO_ALIGN - 1) & ~(size_t)(DIO_ALIGN - 1);
	if (posix_memalign(&buf, DIO_ALIGN, alen)) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	n = pread(fd, buf, alen, aoff);
	if (drop) /* the bytes live on in the FUSE inode's page cache */
		posix_fadvise(fd, aoff, (off_t)alen, POSIX_FADV_DONTNEED);
	if (n < 0) {
		fuse_reply_err(req, errno);
	} else if (n <= off - aoff) {
		fuse_reply_buf(req, NULL, 0);
	} else {
		size_t avail = (size_t)(n - (off - aoff));

		fuse_reply_buf(req, (char *)buf + (off - aoff), avail < size ? avail : size);
	}
	free(buf);
}

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
	struct wfs_fh *fh = (struct wfs_fh *)(uintptr_t)fi->fh;
	struct wfs *w = W(req);
	struct blob *b = fh->blob;
	int fd = -1, direct = 0;

	__atomic_add_fetch(&N(w, ino)->daemon_reads, 1, __ATOMIC_RELAXED);
	if (b && blob_state(b) == BLOB_LOCAL) {
		fd = fh_local_fd(w, fh, &direct);
		if (fd >= 0)
			store_note_read(&w->store, b, size, 1);
	}
	if (fd < 0) {
		fd = fh_nas_fd(w, fh, &direct);
		if (fd < 0) {
			fuse_reply_err(req, EIO);
			return;
		}
		if (b)
			store_note_read(&w->store, b, size, 0);
	}
	/* Nothing of fh may be touched after the reply: the file can be
	 * released as soon as the kernel has the bytes. */
	if (!direct || ((off | (off_t)size) & (DIO_ALIGN - 1))) {
		read_bounce(req, fd, size, off, !direct);
		return;
	}
	buf.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	buf.buf[0].fd = fd;
	buf.buf[0].pos = off;
	fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
}

void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct wfs_fh *fh = (struct wfs_fh *)(uintptr_t)fi->fh;
	(void)ino;

	fh_uncount(W(req), fh);
	fh_free(W(req), fh);
	fuse_reply_err(req, 0);
}

