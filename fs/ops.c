/* ops.c - the FUSE low-level operations: a read-only view of the NAS hub.
 *
 * Lookup classifies a name with ns_classify() and hands the kernel a node;
 * reads are sent straight from the backing file descriptor (spliced where
 * libfuse can), and the NAS pages are dropped behind us so the page cache
 * holds the file once (in the FUSE inode), not twice.
 */
#include "wfs.h"
#include "path.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <time.h>
#include <syslog.h>
#include <unistd.h>

#define XATTR_STATE "user.wfs.state"
#define XATTR_ID "user.wfs.id"
#define XATTR_SOCKET "user.wfs.socket" /* on the root: how wfsctl finds us */

static struct wfs *W(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static struct node *N(struct wfs *w, fuse_ino_t ino)
{
	return ino == FUSE_ROOT_ID ? w->nodes.root : (struct node *)(uintptr_t)ino;
}

static fuse_ino_t ino_of(struct wfs *w, struct node *n)
{
	return n == w->nodes.root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)n;
}

/* The node's path, copied under the table lock (a lookup may replace it). */
static void node_rel(struct wfs *w, struct node *n, char *buf, size_t sz)
{
	pthread_mutex_lock(&w->nodes.lock);
	snprintf(buf, sz, "%s", n->rel ? n->rel : "");
	pthread_mutex_unlock(&w->nodes.lock);
}

static void init(void *data, struct fuse_conn_info *conn)
{
	struct wfs *w = data;

	/* Send file data from the backing fd without copying it through us. */
	if (conn->capable & FUSE_CAP_SPLICE_WRITE)
		conn->want |= FUSE_CAP_SPLICE_WRITE;
	if (conn->capable & FUSE_CAP_SPLICE_MOVE)
		conn->want |= FUSE_CAP_SPLICE_MOVE;
	/* Let the kernel keep several large reads in flight. */
	conn->max_background = 64;
	conn->congestion_threshold = 48;
	conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
	wfs_log(w, LOG_INFO, "mounted %s on %s (max_write %u, readahead %u)", w->opt.nas,
		w->opt.mnt, conn->max_write, conn->max_readahead);
}

/* A content-addressed blob never changes, so the kernel may cache it long;
 * everything else (refs, snapshot listings) must follow the NAS closely. */
static double timeout_for(struct wfs *w, struct node *n, int attr)
{
	if (n->kind == NS_FILE && hub_id_kind(n->blob_id) != HUB_ID_NONE)
		return w->opt.blob_timeout;
	return attr ? w->opt.attr_timeout : w->opt.entry_timeout;
}

static void fill_entry(struct wfs *w, struct node *n, struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->ino = ino_of(w, n);
	e->generation = 1;
	node_attr(&w->nodes, n, &e->attr);
	e->attr_timeout = timeout_for(w, n, 1);
	e->entry_timeout = timeout_for(w, n, 0);
}

/* Classify parent/name and take a lookup reference. */
static int do_lookup(struct wfs *w, struct node *parent, const char *name,
		     struct fuse_entry_param *e)
{
	char prel[PATH_MAX], rel[PATH_MAX];
	struct ns_entry *ent;
	struct node *n;
	int r;

	if (parent->kind != NS_DIR)
		return -ENOTDIR;
	if (strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
		return -ENOENT;
	node_rel(w, parent, prel, sizeof(prel));
	r = path_join(prel, name, rel, sizeof(rel));
	if (r < 0)
		return r;
	ent = malloc(sizeof(*ent));
	if (!ent)
		return -ENOMEM;
	r = ns_classify(&w->roots, rel, ent);
	if (r == 0 && ent->kind == NS_LINK && ent->link_state != NS_LINK_RESOLVED)
		wfs_log(w, LOG_DEBUG, "link %s shown as is: %s", rel,
			ns_link_state_name(ent->link_state));
	if (r == 0) {
		n = node_get(&w->nodes, rel, ent);
		if (!n)
			r = -errno;
		else
			fill_entry(w, n, e);
	}
	if (r == 0 && ent->kind == NS_FILE) {
		/* A blob per NAS file; a changed source is noticed here too. */
		struct blob *b = store_blob(&w->store, ent->backing, &ent->st, ent->blob_id);

		if (b) {
			__atomic_store_n(&b->fs_ino, e->ino, __ATOMIC_RELAXED);
			__atomic_store_n(&n->blob, b, __ATOMIC_RELEASE);
		}
	}
	free(ent);
	return r;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct wfs *w = W(req);
	struct fuse_entry_param e;
	int r = do_lookup(w, N(w, parent), name, &e);

	if (r == -ENOENT) {
		/* A negative entry, cached briefly: new revisions on the NAS
		 * must show up within negative_timeout. */
		memset(&e, 0, sizeof(e));
		e.entry_timeout = w->opt.negative_timeout;
		fuse_reply_entry(req, &e);
		return;
	}
	if (r < 0)
		fuse_reply_err(req, -r);
	else
		fuse_reply_entry(req, &e);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	struct wfs *w = W(req);

	node_forget(&w->nodes, N(w, ino), nlookup);
	fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *f)
{
	struct wfs *w = W(req);

	for (size_t i = 0; i < count; i++)
		node_forget(&w->nodes, N(w, f[i].ino), f[i].nlookup);
	fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct wfs *w = W(req);
	struct node *n = N(w, ino);
	struct stat st;
	char path[PATH_MAX];
	(void)fi;

	/* Refresh from the NAS: a file's size or mtime may change there. */
	if (n->kind != NS_LINK) {
		pthread_mutex_lock(&w->nodes.lock);
		if (n->kind == NS_FILE)
			snprintf(path, sizeof(path), "%s", n->backing);
		else
			path_join(w->roots.path[0], n->rel, path, sizeof(path));
		pthread_mutex_unlock(&w->nodes.lock);
		if (stat(path, &st) == 0) {
			pthread_mutex_lock(&w->nodes.lock);
			if (st.st_size != n->st.st_size ||
			    st.st_mtim.tv_sec != n->st.st_mtim.tv_sec ||
			    st.st_mtim.tv_nsec != n->st.st_mtim.tv_nsec)
				n->cache_ok = 0;
			st.st_ino = n->serial;
			st.st_mode &= ~(mode_t)0222;
			n->st = st;
			pthread_mutex_unlock(&w->nodes.lock);
			/* New NAS attributes make the blob re-check its source. */
			if (n->kind == NS_FILE && n->blob)
				store_blob(&w->store, path, &st, NULL);
		}
	}
	node_attr(&w->nodes, n, &st);
	fuse_reply_attr(req, &st, timeout_for(w, n, 1));
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct wfs *w = W(req);
	struct node *n = N(w, ino);
	char buf[PATH_MAX];

	if (n->kind != NS_LINK) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	pthread_mutex_lock(&w->nodes.lock);
	snprintf(buf, sizeof(buf), "%s", n->target);
	pthread_mutex_unlock(&w->nodes.lock);
	fuse_reply_readlink(req, buf);
}

/* ---- files ---- */

/* An open file.  It reads from whichever side its blob is on at the time
 * of each read: opened from the NAS, it moves to the local copy as soon as
 * the copy is verified, and back if the copy is demoted.  Both descriptors
 * stay open until release, so a read in flight never loses its fd. */
struct wfs_fh {
	pthread_mutex_t lock;
	struct blob *blob;
	char *nas_path;
	int nas_fd, nas_direct;
	int local_fd, local_direct;
	int local_failed;
};

/* Open a resolved NAS path without following any link a racing change on
 * the NAS could have put in it. */
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

/* Open @path with O_DIRECT where its filesystem allows it. */
static int open_direct(const char *path, int *direct)
{
	int fd = open_backing(path, O_DIRECT);

	*direct = 1;
	if (fd == -EINVAL) { /* tmpfs and friends: buffered, pages dropped */
		*direct = 0;
		fd = open_backing(path, 0);
	}
	return fd;
}

static int fh_nas_fd(struct wfs *w, struct wfs_fh *fh, int *direct)
{
	int fd;

	pthread_mutex_lock(&fh->lock);
	if (fh->nas_fd < 0) {
		fd = open_direct(fh->nas_path, &fh->nas_direct);
		if (fd < 0)
			wfs_log(w, LOG_WARNING, "open %s: %s", fh->nas_path, strerror(-fd));
		else
			fh->nas_fd = fd;
	}
	fd = fh->nas_fd;
	*direct = fh->nas_direct;
	pthread_mutex_unlock(&fh->lock);
	return fd;
}

static int fh_local_fd(struct wfs *w, struct wfs_fh *fh, int *direct)
{
	char path[PATH_MAX + 64];
	int fd;

	pthread_mutex_lock(&fh->lock);
	if (fh->local_fd < 0 && !fh->local_failed) {
		pthread_mutex_lock(&w->store.lock);
		store_local_path(&w->store, fh->blob, path, sizeof(path));
		pthread_mutex_unlock(&w->store.lock);
		fd = open_direct(path, &fh->local_direct);
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

static void fh_free(struct wfs_fh *fh)
{
	if (fh->nas_fd >= 0)
		close(fh->nas_fd);
	if (fh->local_fd >= 0)
		close(fh->local_fd);
	pthread_mutex_destroy(&fh->lock);
	free(fh->nas_path);
	free(fh);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
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
		node_rel(w, n, path, sizeof(path));
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
	fh->blob = __atomic_load_n(&n->blob, __ATOMIC_ACQUIRE);
	pthread_mutex_lock(&w->nodes.lock);
	fh->nas_path = strdup(n->backing);
	pthread_mutex_unlock(&w->nodes.lock);
	if (!fh->nas_path) {
		fh_free(fh);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (fh->blob) {
		fh->blob->opens++;
		fh->blob->last_used = (int64_t)time(NULL);
		/* First local read since start-up: is the source still the same? */
		local = store_check_source(&w->store, fh->blob) && fh_local_fd(w, fh, &direct) >= 0;
	}
	/* The NAS side is opened even for a local blob: it proves the name still
	 * resolves, gives the attributes, and is the fallback. */
	fd = fh_nas_fd(w, fh, &direct);
	if (fd < 0) {
		fuse_reply_err(req, -fd == ELOOP ? EIO : -fd);
		fh_free(fh);
		return;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		wfs_log(w, LOG_WARNING, "open %s: not a regular file any more", fh->nas_path);
		fuse_reply_err(req, EIO);
		fh_free(fh);
		return;
	}
	(void)local;
	/* The content under a name is immutable, so the kernel may keep its
	 * pages across opens -- unless the NAS shows a new size or mtime. */
	pthread_mutex_lock(&w->nodes.lock);
	if (st.st_size == n->st.st_size && st.st_mtim.tv_sec == n->st.st_mtim.tv_sec &&
	    st.st_mtim.tv_nsec == n->st.st_mtim.tv_nsec && n->cache_ok)
		fi->keep_cache = 1;
	n->cache_ok = 1;
	n->st.st_size = st.st_size;
	n->st.st_mtim = st.st_mtim;
	pthread_mutex_unlock(&w->nodes.lock);
	fi->fh = (uint64_t)(uintptr_t)fh;
	fi->noflush = 1;
	if (fuse_reply_open(req, fi) == -ENOENT)
		fh_free(fh); /* the opener was interrupted */
}

/* Reads of NAS files use O_DIRECT where the filesystem allows it: the bytes
 * land only in the FUSE inode's page cache, never in the NAS file's too, and
 * an NFS client's stale cache is not consulted.  Aligned requests (all of
 * the kernel's page-cache reads) are spliced from the descriptor; others
 * are read into an aligned bounce buffer. */
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

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
	struct wfs_fh *fh = (struct wfs_fh *)(uintptr_t)fi->fh;
	struct wfs *w = W(req);
	struct blob *b = fh->blob;
	int fd = -1, direct = 0;
	(void)ino;

	if (b && __atomic_load_n(&b->state, __ATOMIC_ACQUIRE) == BLOB_LOCAL) {
		fd = fh_local_fd(w, fh, &direct);
		if (fd >= 0)
			b->local_bytes += size;
	}
	if (fd < 0) {
		fd = fh_nas_fd(w, fh, &direct);
		if (fd < 0) {
			fuse_reply_err(req, EIO);
			return;
		}
		if (b)
			b->nas_bytes += size;
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

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct wfs_fh *fh = (struct wfs_fh *)(uintptr_t)fi->fh;
	(void)ino;

	fh_free(fh);
	fuse_reply_err(req, 0);
}

/* ---- directories ---- */

struct dir_entry {
	char *name;
	ino_t nas_ino;
	unsigned char nas_type;
};

struct dir_handle {
	struct dir_entry *ents;
	size_t n;
	char rel[PATH_MAX];
};

static void dir_free(struct dir_handle *d)
{
	for (size_t i = 0; i < d->n; i++)
		free(d->ents[i].name);
	free(d->ents);
	free(d);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct wfs *w = W(req);
	struct node *n = N(w, ino);
	struct dir_handle *d;
	char path[PATH_MAX];
	struct dirent *de;
	size_t cap = 0;
	DIR *dp;
	int fd;

	if (n->kind != NS_DIR) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	node_rel(w, n, d->rel, sizeof(d->rel));
	path_join(w->roots.path[0], d->rel, path, sizeof(path));
	fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	dp = fd < 0 ? NULL : fdopendir(fd);
	if (!dp) {
		int err = errno;

		if (fd >= 0)
			close(fd);
		wfs_log(w, LOG_WARNING, "opendir %s: %s", path, strerror(err));
		free(d);
		fuse_reply_err(req, err);
		return;
	}
	/* Take the whole listing now, so offsets stay stable for this handle. */
	while ((de = readdir(dp))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (d->n == cap) {
			struct dir_entry *ne;

			cap = cap ? cap * 2 : 64;
			ne = realloc(d->ents, cap * sizeof(*ne));
			if (!ne)
				break;
			d->ents = ne;
		}
		d->ents[d->n].name = strdup(de->d_name);
		if (!d->ents[d->n].name)
			break;
		d->ents[d->n].nas_type = de->d_type;
		d->ents[d->n].nas_ino = de->d_ino ? de->d_ino : 1;
		d->n++;
	}
	closedir(dp);
	fi->fh = (uint64_t)(uintptr_t)d;
	/* The kernel may keep the listing; it drops it when the directory's
	 * mtime changes, which it sees within attr_timeout. */
	fi->cache_readdir = 1;
	fi->keep_cache = 1;
	if (fuse_reply_open(req, fi) == -ENOENT)
		dir_free(d);
}

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi, int plus)
{
	struct wfs *w = W(req);
	struct dir_handle *d = (struct dir_handle *)(uintptr_t)fi->fh;
	struct node *dn = N(w, ino);
	char *buf = calloc(1, size), rel[PATH_MAX];
	struct ns_entry *ent = malloc(sizeof(*ent));
	size_t used = 0;

	if (!buf || !ent) {
		free(buf);
		free(ent);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	/* Offsets: 1 is ".", 2 is "..", 2 + i + 1 is entry i. */
	for (off_t i = off; i < (off_t)d->n + 2; i++) {
		struct fuse_entry_param e;
		struct stat st = {0};
		const char *name;
		struct node *n = NULL;
		size_t sz;

		memset(&e, 0, sizeof(e));
		if (i < 2) {
			name = i == 0 ? "." : "..";
			st.st_mode = S_IFDIR;
			st.st_ino = i == 0 ? dn->serial : 1; /* ".." is not ours to know */
			e.attr = st;
		} else {
			const struct dir_entry *de = &d->ents[i - 2];

			name = de->name;
			/* glibc hides entries whose d_ino is 0. */
			st.st_ino = de->nas_ino;
			if (path_join(d->rel, name, rel, sizeof(rel)) < 0)
				continue;
			if (!plus && (de->nas_type == DT_DIR || de->nas_type == DT_REG)) {
				st.st_mode = DTTOIF(de->nas_type);
			} else if (plus) {
				if (do_lookup(w, dn, name, &e) < 0)
					continue; /* hidden or vanished */
				n = N(w, e.ino);
				st = e.attr;
			} else {
				if (ns_classify(&w->roots, rel, ent) < 0)
					continue;
				st.st_mode = ent->st.st_mode & S_IFMT;
				st.st_ino = ent->st.st_ino;
			}
		}
		if (plus)
			sz = fuse_add_direntry_plus(req, buf + used, size - used, name, &e, i + 1);
		else
			sz = fuse_add_direntry(req, buf + used, size - used, name, &st, i + 1);
		if (sz > size - used) {
			if (n)
				node_forget(&w->nodes, n, 1); /* not sent: undo the lookup */
			break;
		}
		used += sz;
	}
	wfs_log(w, LOG_DEBUG, "readdir%s %s off %lld size %zu: %zu bytes", plus ? "plus" : "",
		d->rel, (long long)off, size, used);
	fuse_reply_buf(req, buf, used);
	free(buf);
	free(ent);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, 0);
}

static void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			   struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, 1);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	dir_free((struct dir_handle *)(uintptr_t)fi->fh);
	fuse_reply_err(req, 0);
}

/* ---- extended attributes: where a file is served from ---- */

static int xattr_value(struct wfs *w, struct node *n, const char *name, char *buf, size_t sz)
{
	struct blob *b = __atomic_load_n(&n->blob, __ATOMIC_ACQUIRE);

	if (n == w->nodes.root && !strcmp(name, XATTR_SOCKET))
		return snprintf(buf, sz, "%s", w->ctl.sock_path);
	if (n->kind != NS_FILE)
		return -ENODATA;
	if (!strcmp(name, XATTR_STATE))
		return snprintf(buf, sz, "%s",
				blob_state_name(b ? __atomic_load_n(&b->state, __ATOMIC_ACQUIRE)
						  : BLOB_NAS));
	if (!strcmp(name, XATTR_ID) && n->blob_id[0])
		return snprintf(buf, sz, "%s", n->blob_id);
	return -ENODATA;
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	struct wfs *w = W(req);
	char val[PATH_MAX];
	int len = xattr_value(w, N(w, ino), name, val, sizeof(val));

	if (len < 0)
		fuse_reply_err(req, -len);
	else if (size == 0)
		fuse_reply_xattr(req, (size_t)len);
	else if ((size_t)len > size)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, val, (size_t)len);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct wfs *w = W(req);
	struct node *n = N(w, ino);
	char list[64];
	size_t len = 0;

	if (n == w->nodes.root) {
		memcpy(list, XATTR_SOCKET, sizeof(XATTR_SOCKET));
		len = sizeof(XATTR_SOCKET);
	} else if (n->kind == NS_FILE) {
		memcpy(list, XATTR_STATE, sizeof(XATTR_STATE));
		len = sizeof(XATTR_STATE);
		if (n->blob_id[0]) {
			memcpy(list + len, XATTR_ID, sizeof(XATTR_ID));
			len += sizeof(XATTR_ID);
		}
	}
	if (size == 0)
		fuse_reply_xattr(req, len);
	else if (len > size)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, list, len);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct wfs *w = W(req);
	struct statvfs sv;
	(void)ino;

	if (statvfs(w->roots.path[0], &sv) < 0)
		fuse_reply_err(req, errno);
	else
		fuse_reply_statfs(req, &sv);
}

/* ---- everything that would write: EROFS, logged ---- */

static void refuse(fuse_req_t req, fuse_ino_t parent, const char *name, const char *what)
{
	struct wfs *w = W(req);
	char rel[PATH_MAX], full[PATH_MAX];

	node_rel(w, N(w, parent), rel, sizeof(rel));
	if (name)
		path_join(rel, name, full, sizeof(full));
	else
		snprintf(full, sizeof(full), "%s", rel);
	wfs_log(w, LOG_NOTICE, "refused %s of %s: read-only filesystem", what,
		*full ? full : "/");
	fuse_reply_err(req, EROFS);
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *a, int to_set,
		       struct fuse_file_info *fi)
{
	(void)a; (void)to_set; (void)fi;
	refuse(req, ino, NULL, "setattr");
}

static void op_mknod(fuse_req_t req, fuse_ino_t p, const char *name, mode_t m, dev_t d)
{
	(void)m; (void)d;
	refuse(req, p, name, "mknod");
}

static void op_mkdir(fuse_req_t req, fuse_ino_t p, const char *name, mode_t m)
{
	(void)m;
	refuse(req, p, name, "mkdir");
}

static void op_unlink(fuse_req_t req, fuse_ino_t p, const char *name)
{
	refuse(req, p, name, "unlink");
}

static void op_rmdir(fuse_req_t req, fuse_ino_t p, const char *name)
{
	refuse(req, p, name, "rmdir");
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t p, const char *name)
{
	(void)link;
	refuse(req, p, name, "symlink");
}

static void op_rename(fuse_req_t req, fuse_ino_t p, const char *name, fuse_ino_t np,
		      const char *nn, unsigned int flags)
{
	(void)np; (void)nn; (void)flags;
	refuse(req, p, name, "rename");
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t np, const char *nn)
{
	(void)ino;
	refuse(req, np, nn, "link");
}

static void op_create(fuse_req_t req, fuse_ino_t p, const char *name, mode_t m,
		      struct fuse_file_info *fi)
{
	(void)m; (void)fi;
	refuse(req, p, name, "create");
}

static void op_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv, off_t off,
			 struct fuse_file_info *fi)
{
	(void)bufv; (void)off; (void)fi;
	refuse(req, ino, NULL, "write");
}

static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
			size_t size, int flags)
{
	(void)name; (void)value; (void)size; (void)flags;
	refuse(req, ino, NULL, "setxattr");
}

static void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	(void)name;
	refuse(req, ino, NULL, "removexattr");
}

static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
			 struct fuse_file_info *fi)
{
	(void)mode; (void)off; (void)len; (void)fi;
	refuse(req, ino, NULL, "fallocate");
}

const struct fuse_lowlevel_ops wfs_ops = {
	.init = init,
	.lookup = op_lookup,
	.forget = op_forget,
	.forget_multi = op_forget_multi,
	.getattr = op_getattr,
	.readlink = op_readlink,
	.open = op_open,
	.read = op_read,
	.release = op_release,
	.opendir = op_opendir,
	.readdir = op_readdir,
	.readdirplus = op_readdirplus,
	.releasedir = op_releasedir,
	.getxattr = op_getxattr,
	.listxattr = op_listxattr,
	.statfs = op_statfs,
	.setattr = op_setattr,
	.mknod = op_mknod,
	.mkdir = op_mkdir,
	.unlink = op_unlink,
	.rmdir = op_rmdir,
	.symlink = op_symlink,
	.rename = op_rename,
	.link = op_link,
	.create = op_create,
	.write_buf = op_write_buf,
	.setxattr = op_setxattr,
	.removexattr = op_removexattr,
	.fallocate = op_fallocate,
};
