/* file.c - open, read, release: where a file's bytes come from.
 *
 * A file is read from its blob's verified local copy when there is one and
 * from the NAS otherwise, deciding at every read, so an open file moves to
 * the copy the moment it is verified.
 */
#include "wfs.h"
#include "ops.h"
#include "path.h"
#include "nas.h"
#include "partread.h"

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


/* Descriptors of an open's earlier local copies or partial files, kept
 * until its release: a read in flight may still use one. */
#define FH_OLD_FDS 4

/* An open file.  It reads from whichever side its blob is on at the time
 * of each read: opened from the NAS, it moves to the local copy as soon as
 * the copy is verified, and back if the copy is demoted.  Its descriptors
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
	/* FH: what @nas_fd is; descriptors of it whose mount died (kept) */
	struct stat nas_st;
	int nas_old[FH_OLD_FDS];
	/* FH: the local copy of generation @local_gen (the blob's copy_gen,
	 * store.h), or -1; @local_failed: it could not be opened.  Copies of
	 * earlier generations stay open until release in @local_old, as a
	 * read in flight may use them. */
	int local_fd, local_direct;
	unsigned local_gen;
	int local_failed;
	int local_old[FH_OLD_FDS];
	/* FH: the partial copy (partread.h), of generation @part_gen; those
	 * of earlier generations stay open until release, as a read in
	 * flight may use them */
	int part_fd, part_direct;
	unsigned part_gen;
	int part_old[FH_OLD_FDS];
	char *mem;                  /* OPEN: a refs file opened while the NAS was down:
				     * its bytes, from the local record */
	size_t mem_len;             /* OPEN */
	unsigned bytes_gen; /* OPEN: the blob's bytes_gen (store.h) once the open's
			     * sides were checked: a backing it registers holds
			     * those bytes */
	int backing_id; /* OPEN: > 0: the kernel reads the local copy itself */
	int backing_nas; /* OPEN: ... or the NAS file (nas_passthrough) */
	int pt_nas_fd;  /* OPEN: the NAS file passed through, for its cache
			 * figures at release (-1 if none) */
	uint64_t pt_cached; /* OPEN: bytes of it in the page cache at open */
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

/* Open a local copy with O_DIRECT where its filesystem allows it. */
static int open_local_direct(const char *path, int *direct)
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
	fd = fh->nas_fd;
	if (fd < 0) { /* the caller gets the open's -errno */
		struct stat st;

		/* (opened while the NAS was down, for a local copy since demoted) */
		fd = nas_open_file(w, fh->nas_path, &fh->nas_direct, &st);
		if (fd >= 0 && !S_ISREG(st.st_mode)) {
			close(fd);
			fd = -EIO;
		}
		if (fd < 0 && !NAS_CANNOT_ANSWER(fd))
			wfs_log(w, LOG_WARNING, "open %s: %s", fh->nas_path, strerror(-fd));
		else if (fd >= 0) {
			fh->nas_fd = fd;
			fh->nas_st = st;
		}
	}
	*direct = fh->nas_direct;
	pthread_mutex_unlock(&fh->lock);
	return fd;
}

/* A free place in @old (FH_OLD_FDS of them), or -1. */
static int old_fd_slot(const int *old)
{
	for (int i = 0; i < FH_OLD_FDS; i++)
		if (old[i] < 0)
			return i;
	return -1;
}

static void close_old_fds(const int *old)
{
	for (int i = 0; i < FH_OLD_FDS; i++)
		if (old[i] >= 0)
			close(old[i]);
}

/* The blob's local copy verified now, opened once per copy: one demoted or
 * evicted and copied again is another file (under the same name if its
 * content hash is the same), opened afresh, the descriptor of the copy
 * before set aside.  *@gen: the copy's generation (for
 * store_local_read_error).  -errno: the NAS serves this read. */
static int fh_local_fd(struct wfs *w, struct wfs_fh *fh, int *direct, unsigned *gen)
{
	char path[PATH_MAX + 64] = "";
	/* Before the path is taken: a copy that changes after is seen as
	 * changed at the next read, never the reverse. */
	unsigned now = blob_copy_gen(fh->blob);
	int fd, slot = -1;

	pthread_mutex_lock(&fh->lock);
	if (fh->local_gen != now) {
		/* The copy it opened (or could not open) stopped serving since. */
		if (fh->local_fd >= 0)
			slot = old_fd_slot(fh->local_old);
		fh->local_failed = 0;
		if (slot >= 0) {
			fh->local_old[slot] = fh->local_fd;
			fh->local_fd = -1;
		} else if (fh->local_fd >= 0) {
			fh->local_failed = 1; /* copies came and went: this open reads the NAS */
			wfs_log(w, LOG_WARNING, "open local copy of %s: this open still holds %d "
				"copies since demoted or evicted; reading the NAS", fh->nas_path,
				FH_OLD_FDS + 1);
		}
		fh->local_gen = now;
	}
	/* (the store's -ENOENT: not LOCAL now, a read that raced a demotion:
	 * no copy failed) */
	if (!fh->local_failed && fh->local_fd < 0 &&
	    store_local_path(&w->store, fh->blob, path, sizeof(path)) == 0) {
		if ((fd = open_local_direct(path, &fh->local_direct)) >= 0) {
			fh->local_fd = fd;
		} else {
			/* until the next copy (this one evicted under the open, say) */
			fh->local_failed = 1;
			wfs_log(w, LOG_WARNING, "open local copy %s of %s: %s; reading the NAS",
				path, fh->nas_path, strerror(-fd));
		}
	}
	fd = fh->local_failed ? -EIO : fh->local_fd >= 0 ? fh->local_fd : -ENOENT;
	*direct = fh->local_direct;
	*gen = fh->local_gen;
	pthread_mutex_unlock(&fh->lock);
	return fd;
}

/* Choose how this open is served.  The kernel wants every open of an inode
 * at one time alike, so: an inode already open daemon-served stays so (it
 * reads the local copy through us) until its last open closes; otherwise a
 * local blob goes passthrough, sharing one backing id between opens, and so
 * does a NAS file when @nas_fd (buffered, opened by the caller: no NAS call
 * under the table lock) is given (-o nas_passthrough).  An inode passed
 * through to its NAS file stays so until its last open closes, even once
 * its blob is local.  The table lock also guards w->pt_warned and
 * w->pt_opens_total.  Returns 0, or -ESTALE: the inode's passthrough opens
 * read a backing since found not to hold the blob's bytes (a copy demoted,
 * a NAS file replaced).  Joining them would serve those bytes to this
 * open too, and the kernel takes no other kind of open of an inode with
 * passthrough opens (a FOPEN_DIRECT_IO one gets EIO), so this inode
 * serves no new open until they close.  An ESTALE open makes the kernel's
 * open(2) look the path up again (LOOKUP_REVAL), and the lookup gives a
 * new node (node_get): a new inode, served from the NAS. */
static int choose_mode(struct wfs *w, struct node *n, struct wfs_fh *fh, int local, int nas_fd)
{
	char path[PATH_MAX + 64];
	int id = 0, fd = -1, refused_now = 0;

	pthread_mutex_lock(&w->nodes.lock);
	if (node_backing_stale_locked(n)) {
		pthread_mutex_unlock(&w->nodes.lock);
		return -ESTALE;
	}
	if (n->pt_opens > 0) {
		id = n->backing_id; /* join the opens already passed through */
		fh->backing_nas = n->backing_nas;
	} else if ((local || nas_fd >= 0) && n->daemon_opens == 0 && passthrough_usable(&w->pt)) {
		/* Buffered: the kernel serves reads from this file's page cache,
		 * the only copy of the bytes. */
		if (local) {
			fd = store_local_path(&w->store, fh->blob, path, sizeof(path));
			if (fd == 0)
				fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		} else {
			snprintf(path, sizeof(path), "%s", fh->nas_path);
			fd = dup(nas_fd);
		}
		if (fd >= 0 && blob_bytes_gen(fh->blob) != fh->bytes_gen) {
			close(fd); /* its bytes changed while this open was made: daemon-served */
			fd = -1;
		}
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
			n->backing_gen = fh->bytes_gen;
			n->backing_nas = (uint8_t)(fh->backing_nas = id > 0 && !local);
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
	return 0;
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
	close_old_fds(fh->local_old);
	if (fh->part_fd >= 0)
		close(fh->part_fd);
	close_old_fds(fh->part_old);
	close_old_fds(fh->nas_old);
	if (fh->pt_nas_fd >= 0)
		close(fh->pt_nas_fd);
	pthread_mutex_destroy(&fh->lock);
	free(fh->nas_path);
	free(fh->mem);
	free(fh);
	/* After our descriptors are closed: the space of a copy evicted while
	 * open comes back now. */
	if (noted)
		store_note_close(&w->store, noted);
}

/* cachestat(2) (Linux 6.5; not in Debian 12's headers): the page-cache
 * pages of a file.  What a passthrough reader read never reaches us, so
 * what it brought into the NAS file's cache stands for its NAS bytes (for
 * hotness and the figures).  0 when the kernel cannot say. */
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif
struct cachestat_range_abi { uint64_t off, len; };
struct cachestat_abi { uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted; };

static uint64_t cached_bytes(int fd)
{
	struct cachestat_range_abi range = { 0, 0 }; /* the whole file */
	struct cachestat_abi cs;

	if (fd < 0 || syscall(__NR_cachestat, fd, &range, &cs, 0) < 0)
		return 0;
	return cs.nr_cache * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* The NAS cannot answer the open: a local copy serves alone (its NAS side
 * is opened later if it is demoted meanwhile), a refs file of a local
 * revision from the record's bytes; anything else gets EIO.  Returns 1
 * when the open goes on locally, 0 with @fh->mem set, or -errno. */
static int open_without_nas(struct wfs *w, struct wfs_fh *fh, struct stat *st)
{
	struct record_entry *re;
	char rel[PATH_MAX];
	int direct, r = -EIO;
	unsigned gen;

	if (fh->blob && blob_state(fh->blob) == BLOB_LOCAL && fh_local_fd(w, fh, &direct, &gen) >= 0) {
		node_attr(&w->nodes, fh->node, st);
		nas_gate_count_record(&w->gate);
		return 1;
	}
	/* local ranges serve; the rest of the file gets EIO until the NAS is back */
	if (fh->blob && atomic_load(&fh->blob->part_bytes)) {
		node_attr(&w->nodes, fh->node, st);
		nas_gate_count_record(&w->gate);
		return 2;
	}
	re = malloc(sizeof(*re));
	if (!re)
		return -ENOMEM;
	if (node_path(fh->node, rel, sizeof(rel)) == 0 && record_entry_for(w, rel, re) == 0 &&
	    re->has_data) {
		fh->mem = malloc(re->data_len ? re->data_len : 1);
		if (fh->mem) {
			memcpy(fh->mem, re->data, re->data_len);
			fh->mem_len = re->data_len;
			*st = re->e.st;
			r = 0;
		} else {
			r = -ENOMEM;
		}
	}
	free(re);
	return r;
}

/* Open the NAS side: 0 with @st, or -errno for the reader. */
static int open_nas_side(struct wfs *w, struct wfs_fh *fh, struct stat *st)
{
	int fd;

	/* Known down: a local copy need not wait for the gate to say so. */
	if (fh->blob && (blob_state(fh->blob) == BLOB_LOCAL || atomic_load(&fh->blob->part_bytes)) &&
	    !nas_gate_up(&w->gate))
		return -EHOSTDOWN;
	fd = nas_open_file(w, fh->nas_path, &fh->nas_direct, st);
	if (fd < 0 && !NAS_CANNOT_ANSWER(fd))
		wfs_log(w, LOG_WARNING, "open %s: %s", fh->nas_path, strerror(-fd));
	if (fd < 0)
		return fd;
	fh->nas_fd = fd; /* not shared yet: no lock needed */
	fh->nas_st = *st;
	if (!S_ISREG(st->st_mode)) {
		wfs_log(w, LOG_WARNING, "open %s: not a regular file any more", fh->nas_path);
		return -EIO;
	}
	return 0;
}

/* A handle for an open of @n, nothing opened yet. */
static struct wfs_fh *fh_new(struct wfs *w, struct node *n)
{
	struct wfs_fh *fh = calloc(1, sizeof(*fh));
	char path[PATH_MAX];

	if (!fh)
		return NULL;
	pthread_mutex_init(&fh->lock, NULL);
	fh->nas_fd = fh->local_fd = fh->pt_nas_fd = fh->part_fd = -1;
	for (int i = 0; i < FH_OLD_FDS; i++)
		fh->part_old[i] = fh->local_old[i] = fh->nas_old[i] = -1;
	fh->node = n;
	fh->blob = node_blob(w, n);
	node_backing(&w->nodes, n, path, sizeof(path));
	fh->nas_path = strdup(path);
	if (!fh->nas_path) {
		fh_free(w, fh);
		return NULL;
	}
	return fh;
}

/* -o nas_passthrough: the NAS file opened buffered for the kernel to read
 * (@st: the NAS side's attributes).  Blobs only: their bytes never change,
 * so the NAS client's page cache can be trusted with them (refs are read
 * O_DIRECT, afresh). */
static void open_nas_passthrough(struct wfs *w, struct wfs_fh *fh, const struct stat *st)
{
	struct stat bst;

	if (!fh->blob || fh->mem || atomic_load(&fh->blob->part_bytes))
		return;
	fh->pt_nas_fd = nas_open_buffered(w, fh->nas_path, &bst);
	if (fh->pt_nas_fd >= 0 && (bst.st_ino != st->st_ino || bst.st_dev != st->st_dev)) {
		close(fh->pt_nas_fd); /* replaced between the two opens */
		fh->pt_nas_fd = -1;
	}
}

/* The content under a blob's name is immutable, so the kernel may keep its
 * pages across opens -- unless the NAS shows a new size or mtime (@st, when
 * @from_nas).  Refs and other small files are rewritten in place, maybe
 * within one timestamp tick: always read afresh. */
static void set_keep_cache(struct wfs *w, struct node *n, const struct wfs_fh *fh,
			   int from_nas, const struct stat *st, struct fuse_file_info *fi)
{
	pthread_mutex_lock(&w->nodes.lock);
	if (from_nas) {
		if (!node_set_stat_locked(n, st) && n->cache_ok && fh->blob)
			fi->keep_cache = 1;
		n->cache_ok = 1;
	} else if (n->cache_ok && fh->blob) {
		fi->keep_cache = 1; /* nothing new is known: what the kernel has stands */
	}
	pthread_mutex_unlock(&w->nodes.lock);
}

void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct wfs *w = W(req);
	struct node *n = N(w, ino);
	char path[PATH_MAX];
	struct wfs_fh *fh;
	struct stat st;
	int r, direct, local = 0, from_nas = 1;
	unsigned gen;

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
	fh = fh_new(w, n);
	if (!fh) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	/* The NAS side is opened even for a local blob: it proves the name still
	 * resolves, gives the attributes, and is the fallback. */
	r = open_nas_side(w, fh, &st);
	if (NAS_CANNOT_ANSWER(r)) {
		from_nas = 0;
		r = open_without_nas(w, fh, &st);
		local = r == 1;
		r = r == 2 ? 0 : r;
	}
	if (r < 0) {
		/* a link, FIFO or other file swapped in since the lookup: the
		 * reader gets EIO, as for any NAS file that cannot be read */
		fuse_reply_err(req, r == -ELOOP || r == -ENXIO || r == -ESTALE || r == -EISDIR ||
				    r == -EXDEV || r == -EINVAL ? EIO : -r);
		fh_free(w, fh);
		return;
	}
	if (fh->blob) {
		node_path(n, path, sizeof(path));
		store_note_open(&w->store, fh->blob, path);
		fh->noted = 1;
		/* Attributes the kernel has not asked about yet count too: a
		 * source that changed is checked before its copy serves. */
		if (from_nas)
			store_source_attrs(&w->store, fh->blob, &st);
		if (!local)
			local = store_check_source(&w->store, fh->blob) &&
				fh_local_fd(w, fh, &direct, &gen) >= 0;
		/* After the checks (a demotion they made counts) and before the
		 * files a backing is made of are opened. */
		fh->bytes_gen = blob_bytes_gen(fh->blob);
	}
	if (w->opt.nas_passthrough && from_nas && !local)
		open_nas_passthrough(w, fh, &st);
	r = choose_mode(w, n, fh, local && !fh->mem, fh->pt_nas_fd);
	if (r < 0) {
		node_path(n, path, sizeof(path));
		wfs_log(w, LOG_WARNING, "open of %s refused (%s): earlier opens of it, still open, are "
			"read by the kernel from a copy since demoted or a NAS file since replaced; "
			"the name is looked up again to a new inode", path, strerror(-r));
		fuse_reply_err(req, -r);
		fh_free(w, fh);
		return;
	}
	if (fh->backing_nas)
		fh->pt_cached = cached_bytes(fh->pt_nas_fd);
	set_keep_cache(w, n, fh, from_nas, &st, fi);
	fi->fh = (uint64_t)(uintptr_t)fh;
	fi->noflush = 1;
	if (fuse_reply_open(req, fi) == -ENOENT) {
		fh_uncount(w, fh); /* the opener was interrupted */
		fh_free(w, fh);
	}
}

/* Reads use O_DIRECT where the filesystem allows it: the bytes land only in
 * the FUSE inode's page cache, never in the NAS file's (or the copy's) too,
 * and an NFS client's stale cache is not consulted.  Every read goes
 * through an aligned buffer of ours (partread.h: span_local, span_nas; a
 * 1 MiB reply does not fit libfuse's pipe, so it would not be spliced
 * anyway): a NAS read through the gate, so it has a deadline; a local read
 * here, so its error is seen (a local copy that returns EIO is demoted, and
 * the read retried on the NAS). */

/* The bytes of @buf (@n of them) from @skip on, at most @size. */
static void reply_slice(fuse_req_t req, const char *buf, ssize_t n, off_t skip, size_t size)
{
	size_t avail;

	if (n <= skip) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	avail = (size_t)(n - skip);
	fuse_reply_buf(req, buf + skip, avail < size ? avail : size);
}

/* A read of the local copy of a file of @file_size bytes: 0 once
 * answered, or -errno (not answered).  A copy shorter than its file is a
 * bad copy (-EIO): a short reply would tell the kernel the file ends there. */
static int read_local(fuse_req_t req, int fd, size_t size, off_t off, int drop,
		      uint64_t file_size)
{
	uint64_t left = (uint64_t)off < file_size ? file_size - (uint64_t)off : 0;
	size_t need = left < size ? (size_t)left : size, skip;
	char *buf;
	ssize_t n = span_local(fd, (uint64_t)off, size, drop, &buf, &skip);

	if (n < 0)
		return (int)n;
	if ((size_t)n < need) {
		free(buf);
		return -EIO;
	}
	fuse_reply_buf(req, buf + skip, (size_t)n);
	free(buf);
	return 0;
}

/* The NAS descriptor @dead failed as one of a mount since gone does (a
 * NAS client restarted): the path opened afresh serves the open, if it is
 * still the same file.  That open says whether the NAS is down. */
static int fh_nas_reopen(struct wfs *w, struct wfs_fh *fh, int dead, int *direct)
{
	int fd, slot;

	pthread_mutex_lock(&fh->lock);
	fd = fh->nas_fd; /* != @dead: another read opened it again already */
	if (fd == dead) {
		slot = old_fd_slot(fh->nas_old);
		fd = slot < 0 ? -EMFILE : nas_reopen_same(w, fh->nas_path, &fh->nas_st, direct);
		if (fd >= 0) {
			fh->nas_old[slot] = dead;
			fh->nas_fd = fd;
			fh->nas_direct = *direct;
		}
		if (slot < 0)
			wfs_log(w, LOG_WARNING, "read %s: the NAS descriptor of this open died %d "
				"times; the file must be opened again", fh->nas_path, FH_OLD_FDS + 1);
		else if (!NAS_CANNOT_ANSWER(fd))
			wfs_log(w, fd >= 0 ? LOG_NOTICE : LOG_WARNING, "read %s: its NAS descriptor "
				"died; opened again: %s", fh->nas_path, fd >= 0 ? "the same file"
				: fd == -ESTALE ? "another file now" : strerror(-fd));
	}
	*direct = fh->nas_direct;
	pthread_mutex_unlock(&fh->lock);
	return fd;
}

static void read_nas(fuse_req_t req, struct wfs *w, struct wfs_fh *fh, size_t size, off_t off)
{
	char *buf;
	size_t skip;
	int direct;
	ssize_t n;
	int fd = fh_nas_fd(w, fh, &direct);

	if (fd < 0) {
		fuse_reply_err(req, EIO);
		return;
	}
	n = span_nas(w, fd, (uint64_t)off, size, !direct, &buf, &skip);
	if (nas_fd_died(n) && (fd = fh_nas_reopen(w, fh, fd, &direct)) >= 0)
		n = span_nas(w, fd, (uint64_t)off, size, !direct, &buf, &skip);
	if (n < 0) {
		fuse_reply_err(req, NAS_CANNOT_ANSWER(n) ? EIO : (int)-n);
		return;
	}
	fuse_reply_buf(req, buf + skip, (size_t)n);
	free(buf);
}

/* The partial copy of generation @gen, opened once per generation (an
 * older one stays open: a read in flight may use it).  -ESTALE when the
 * copy has moved on since the read was planned. */
static int fh_part_fd(struct wfs *w, struct wfs_fh *fh, unsigned gen, int *direct)
{
	char path[PATH_MAX + 64];
	unsigned now;
	int fd, slot = -1;

	pthread_mutex_lock(&fh->lock);
	if (fh->part_fd >= 0 && fh->part_gen == gen) {
		fd = fh->part_fd;
		*direct = fh->part_direct;
		pthread_mutex_unlock(&fh->lock);
		return fd;
	}
	if (fh->part_fd >= 0)
		slot = old_fd_slot(fh->part_old);
	fd = store_part_path(&w->store, fh->blob, path, sizeof(path), &now);
	if (fd == 0 && now != gen)
		fd = -ESTALE;
	if (fd == 0 && fh->part_fd >= 0 && slot < 0)
		fd = -EMFILE; /* generations come and go: the NAS serves this open */
	if (fd == 0)
		fd = open_local_direct(path, direct);
	/* Still generation @gen now: the file opened is the one the plan was
	 * made on (ranges dropped between the two looks would have moved it
	 * on, and a new partial file may sit under the same name). */
	if (fd >= 0 && (store_part_path(&w->store, fh->blob, path, sizeof(path), &now) < 0 ||
			now != gen)) {
		close(fd);
		fd = -ESTALE;
	}
	if (fd >= 0) {
		if (slot >= 0)
			fh->part_old[slot] = fh->part_fd;
		fh->part_fd = fd;
		fh->part_gen = gen;
		fh->part_direct = *direct;
	}
	pthread_mutex_unlock(&fh->lock);
	return fd;
}

#define PART_SEGS 64 /* local parts planned at a time, on the stack */

/* Bytes [@off, @off + @len) of a file with local ranges into @out, @segs
 * (@n, of generation @gen) its first plan.  A full plan may stop short of
 * the read's end: the rest is planned again from its last part's end, so
 * every local byte is read locally however many ranges the read spans
 * (the NAS, down, would fail them).  Adds the local bytes to *@local.
 * Returns part_read's 0 or -errno, or 1: the copy moved on meanwhile. */
static int read_planned(struct wfs *w, struct wfs_fh *fh, struct part_src *src,
			struct brange *segs, size_t n, unsigned gen, char *out, uint64_t off,
			size_t len, uint64_t *local)
{
	uint64_t pos = off, end = off + len;
	int r, nas_asked = 0;

	for (;;) {
		uint64_t stop = n < PART_SEGS ? end : segs[n - 1].off + segs[n - 1].len, here = 0;
		unsigned now = gen;

		for (size_t i = 0; i < n; i++)
			here += segs[i].len;
		/* a piece all inside local ranges never asks the NAS for anything */
		if (here < stop - pos && !nas_asked) {
			src->nas_fd = fh_nas_fd(w, fh, &src->nas_direct);
			nas_asked = 1;
		}
		r = part_read(w, src, segs, n, out + (pos - off), pos, (size_t)(stop - pos));
		if (nas_fd_died(r) &&
		    (src->nas_fd = fh_nas_reopen(w, fh, src->nas_fd, &src->nas_direct)) >= 0)
			r = part_read(w, src, segs, n, out + (pos - off), pos, (size_t)(stop - pos));
		*local += here;
		if (r || stop == end)
			return r;
		pos = stop;
		n = store_part_plan(&w->store, fh->blob, pos, end - pos, segs, PART_SEGS, &now);
		if (n && now != gen)
			return 1;
	}
}

/* A read of a file with local ranges: 0 once answered, 1 when the NAS is
 * to serve it all. */
static int read_partial(fuse_req_t req, struct wfs *w, struct wfs_fh *fh, size_t size, off_t off)
{
	struct brange segs[PART_SEGS];
	struct part_src src = { .nas_fd = -1 };
	uint64_t fsize = atomic_load(&fh->blob->size), local = 0;
	unsigned gen = 0;
	size_t n, len;
	char *out;
	int r = 0;

	if ((uint64_t)off >= fsize)
		return 1;
	len = (uint64_t)off + size > fsize ? (size_t)(fsize - (uint64_t)off) : size;
	n = store_part_plan(&w->store, fh->blob, (uint64_t)off, len, segs, PART_SEGS, &gen);
	if (!n || (src.local_fd = fh_part_fd(w, fh, gen, &src.local_direct)) < 0)
		return 1;
	/* all inside one range (a rank reading its own part): read as a local
	 * copy is, straight into the reply's buffer.  Counted before: once
	 * read_local has replied, the file may be released (fh freed) by
	 * another thread. */
	if (n == 1 && segs[0].len == len) {
		struct blob *b = fh->blob;

		store_part_note_read(&w->store, b, len);
		r = read_local(req, src.local_fd, len, off, !src.local_direct, fsize);
		if (r == -EIO)
			store_part_read_error(&w->store, b); /* no reply sent */
		return r == 0 ? 0 : 1;
	}
	out = malloc(len ? len : 1);
	if (!out) {
		fuse_reply_err(req, ENOMEM);
		return 0;
	}
	r = read_planned(w, fh, &src, segs, n, gen, out, (uint64_t)off, len, &local);
	if (r == -EUCLEAN || r == 1) {
		free(out);
		if (r == -EUCLEAN)
			store_part_read_error(&w->store, fh->blob);
		return 1;
	}
	if (r == 0) {
		store_part_note_read(&w->store, fh->blob, local);
		store_note_read(&w->store, fh->blob, len - local, 0);
		fuse_reply_buf(req, out, len);
	} else {
		fuse_reply_err(req, NAS_CANNOT_ANSWER(r) ? EIO : -r);
	}
	free(out);
	return 0;
}

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct wfs_fh *fh = (struct wfs_fh *)(uintptr_t)fi->fh;
	struct wfs *w = W(req);
	struct blob *b = fh->blob;
	int fd = -1, direct = 0, r;
	unsigned gen;

	__atomic_add_fetch(&N(w, ino)->daemon_reads, 1, __ATOMIC_RELAXED);
	if (fh->mem) {
		/* From a copy: once the reply is written the file may be
		 * released (and fh->mem freed) while writev still returns. */
		char copy[RECORD_MAX_DATA];

		memcpy(copy, fh->mem, fh->mem_len);
		reply_slice(req, copy, (ssize_t)fh->mem_len, off, size);
		return;
	}
	/* Nothing of fh may be touched after the reply: the file can be
	 * released as soon as the kernel has the bytes. */
	if (b && blob_state(b) == BLOB_LOCAL && (fd = fh_local_fd(w, fh, &direct, &gen)) >= 0) {
		store_note_read(&w->store, b, size, 1);
		r = read_local(req, fd, size, off, !direct, atomic_load(&b->size));
		if (r == 0)
			return;
		/* A media error: the copy cannot be trusted any more (the store
		 * demotes it and logs why).  Anything else (ENOMEM): this read
		 * only goes to the NAS. */
		if (r == -EIO)
			store_local_read_error(&w->store, b, gen, r);
	}
	if (b && atomic_load(&b->part_bytes) && read_partial(req, w, fh, size, off) == 0)
		return;
	if (b)
		store_note_read(&w->store, b, size, 0);
	read_nas(req, w, fh, size, off);
}

void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct wfs_fh *fh = (struct wfs_fh *)(uintptr_t)fi->fh;
	(void)ino;

	if (fh->backing_nas && fh->blob) {
		uint64_t now = cached_bytes(fh->pt_nas_fd);

		if (now > fh->pt_cached)
			store_note_read(&W(req)->store, fh->blob, now - fh->pt_cached, 0);
	}
	fh_uncount(W(req), fh);
	fh_free(W(req), fh);
	fuse_reply_err(req, 0);
}

