/* file.c - open and release: which sides a file has, and whether the
 * kernel reads one of them itself (passthrough).  The daemon's reads are
 * read.c's.
 */
#include "wfs.h"
#include "clock.h"
#include "ops.h"
#include "path.h"
#include "nas.h"
#include "fh.h"
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

	if (fd < 0 && OPENAT2_REFUSED(errno))
		fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | flags);
	return fd < 0 ? -errno : fd;
}

/* Open a local copy with O_DIRECT where its filesystem allows it. */
int open_local_direct(const char *path, int *direct)
{
	int fd = open_backing(path, O_DIRECT);

	*direct = 1;
	if (fd == -EINVAL) { /* tmpfs and friends: buffered, pages dropped */
		*direct = 0;
		fd = open_backing(path, 0);
	}
	return fd;
}

/* Is @st (the NAS file opened after the open) the file the open showed?
 * If not, said, and the store told (its copy's source changed). */
static int same_file_shown(struct wfs *w, struct wfs_fh *fh, const struct stat *st)
{
	const struct stat *was = &fh->shown;

	if (st->st_size == was->st_size && same_ts(&st->st_mtim, &was->st_mtim))
		return 1;
	wfs_log(w, LOG_WARNING, "read %s: the NAS file is not the one this open was shown "
		"(size %lld, mtime %lld; shown %lld, %lld): EIO until it is opened again",
		fh->nas_path, (long long)st->st_size, (long long)st->st_mtim.tv_sec,
		(long long)was->st_size, (long long)was->st_mtim.tv_sec);
	if (fh->blob)
		store_source_attrs(&w->store, fh->blob, st);
	return 0;
}

int fh_nas_fd(struct wfs *w, struct wfs_fh *fh, int *direct)
{
	struct stat st;
	int fd, fresh_direct = 0;

	pthread_mutex_lock(&fh->lock);
	fd = fh->shown_not ? -ESTALE : fh->nas_fd;
	*direct = fh->nas_direct;
	pthread_mutex_unlock(&fh->lock);
	if (fd >= 0 || fd == -ESTALE)
		return fd;
	/* Opened while the NAS was down (for a local copy since demoted, or
	 * ranges that do not cover this read): opened now, without @lock --
	 * a read of the open's local ranges takes it, and never waits on the
	 * NAS (partread.h).  The caller gets the open's -errno. */
	fd = nas_open_file(w, fh->nas_path, &fresh_direct, &st);
	if (fd >= 0 && !S_ISREG(st.st_mode)) {
		nas_close_later(&w->closer, fd);
		fd = -EIO;
	}
	if (fd >= 0 && fh->shown_set && !same_file_shown(w, fh, &st)) {
		nas_close_later(&w->closer, fd);
		pthread_mutex_lock(&fh->lock);
		fh->shown_not = 1;
		pthread_mutex_unlock(&fh->lock);
		return -ESTALE;
	}
	if (fd < 0) {
		if (!NAS_CANNOT_ANSWER(fd))
			wfs_log(w, LOG_WARNING, "open %s: %s", fh->nas_path, nas_err_why(fd));
		return fd;
	}
	pthread_mutex_lock(&fh->lock);
	if (fh->nas_fd < 0) {
		fh->nas_fd = fd;
		fh->nas_st = st;
		fh->nas_direct = fresh_direct;
	} else {
		/* another read opened it meanwhile: that one serves */
		nas_close_later(&w->closer, fd);
		fd = fh->nas_fd;
	}
	*direct = fh->nas_direct;
	pthread_mutex_unlock(&fh->lock);
	return fd;
}

/* A free place in @old (FH_OLD_FDS of them), or -1. */
int old_fd_slot(const int *old)
{
	for (int i = 0; i < FH_OLD_FDS; i++)
		if (old[i] < 0)
			return i;
	return -1;
}

static void close_old_fds(const int *old, struct nas_closer *nas)
{
	for (int i = 0; i < FH_OLD_FDS; i++)
		if (old[i] >= 0 && nas)
			nas_close_later(nas, old[i]);
		else if (old[i] >= 0)
			close(old[i]);
}

/* An open that failed for want of a resource the process will have again
 * (descriptors, memory), not because of the file. */
static int open_error_passes(int err)
{
	return err == -EMFILE || err == -ENFILE || err == -ENOMEM || err == -EINTR ||
	       err == -EAGAIN;
}

/* The blob's local copy verified now, opened once per copy: one demoted or
 * evicted and copied again is another file (under the same name if its
 * content hash is the same), opened afresh, the descriptor of the copy
 * before set aside.  *@gen: the copy's generation (for
 * store_local_read_error).  -errno: the NAS serves this read. */
int fh_local_fd(struct wfs *w, struct wfs_fh *fh, int *direct, unsigned *gen)
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
		if ((fd = open_local_direct(path, &fh->local_direct)) >= 0 &&
		    store_copy_opened(&w->store, fh->blob, now, fd) < 0) {
			close(fd); /* changed since it was verified: demoted, the NAS serves */
			fh->local_failed = 1;
		} else if (fd >= 0) {
			fh->local_fd = fd;
			fh->local_short = 0;
		} else if (open_error_passes(fd)) {
			/* Out of descriptors or memory for now: this read goes to
			 * the NAS, the next one tries the copy again.  Latched, the
			 * open would read the NAS until the copy changed, and fail
			 * with it while the NAS is down.  Said once a shortage. */
			if (!fh->local_short)
				wfs_log(w, LOG_WARNING, "open local copy %s of %s: %s; this read "
					"goes to the NAS, the next tries the copy again", path,
					fh->nas_path, strerror(-fd));
			fh->local_short = 1;
		} else {
			/* until the next copy (this one evicted under the open, say) */
			fh->local_failed = 1;
			wfs_log(w, LOG_WARNING, "open local copy %s of %s: %s; reading the NAS",
				path, fh->nas_path, strerror(-fd));
			/* A copy of this generation gone (removed by hand, a tmp
			 * cleaner) or unreadable serves no open: demoted as one that
			 * fails a read, not left LOCAL with every open going to the
			 * NAS.  (Evicted or copied again meanwhile: @now says so.) */
			if (fd == -ENOENT || fd == -ENOTDIR || fd == -EIO || fd == -ELOOP)
				store_local_read_error(&w->store, fh->blob, now, fd);
		}
	}
	fd = fh->local_failed ? -EIO : fh->local_fd >= 0 ? fh->local_fd : -ENOENT;
	*direct = fh->local_direct;
	*gen = fh->local_gen;
	pthread_mutex_unlock(&fh->lock);
	return fd;
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

/* A NAS file registered as a backing (nas_passthrough): the daemon keeps
 * its descriptor @fd of it until the backing @id is closed, and then the
 * closer closes it.  The kernel's reference alone was the last one: the
 * BACKING_CLOSE that dropped it ran the file's release on the worker that
 * made the ioctl, as it returned (NFSv4: a CLOSE to the server; a hung NAS
 * held the worker).  Table lock held.  0, or -ENOMEM: @fd is the caller's
 * to close. */
static int pt_nas_keep_locked(struct wfs *w, int id, int fd)
{
	if (w->pt_nas_n == w->pt_nas_cap) {
		size_t cap = w->pt_nas_cap ? 2 * w->pt_nas_cap : 16;
		struct pt_nas_fd *a = realloc(w->pt_nas_fds, cap * sizeof(*a));

		if (!a)
			return -ENOMEM;
		w->pt_nas_fds = a;
		w->pt_nas_cap = cap;
	}
	/* (cachestat reads the page cache only: no NAS call under the lock) */
	w->pt_nas_fds[w->pt_nas_n++] = (struct pt_nas_fd){ id, fd, cached_bytes(fd) };
	return 0;
}

/* The NAS file kept for backing @id, or NULL.  Table lock held. */
static struct pt_nas_fd *pt_nas_find_locked(struct wfs *w, int id)
{
	for (size_t i = 0; i < w->pt_nas_n; i++)
		if (w->pt_nas_fds[i].id == id)
			return &w->pt_nas_fds[i];
	return NULL;
}

/* An open joins backing @id: pages of its NAS file dropped since the last
 * count (the kernel reclaims them any time) are brought in again by this
 * open's reads, and count from here.  Table lock held. */
static void pt_nas_rebase_locked(struct wfs *w, int id)
{
	struct pt_nas_fd *k = pt_nas_find_locked(w, id);
	uint64_t now = k ? cached_bytes(k->fd) : 0;

	if (k && now < k->counted)
		k->counted = now;
}

/* The bytes the NAS file of backing @id has in the page cache now past
 * what was counted (then counted): what the kernel's reads brought in,
 * once for the file however many opens share it -- an open made after its
 * promotion that joined it included, which has no NAS descriptor of its
 * own (the one kept with the backing is asked).  Table lock held. */
static uint64_t pt_nas_read_locked(struct wfs *w, int id)
{
	struct pt_nas_fd *k = pt_nas_find_locked(w, id);
	uint64_t now = k ? cached_bytes(k->fd) : 0, add = 0;

	if (k && now > k->counted) {
		add = now - k->counted;
		k->counted = now;
	}
	return add;
}

/* The descriptor kept for backing @id (-1: none).  Table lock held. */
static int pt_nas_take_locked(struct wfs *w, int id)
{
	struct pt_nas_fd *k = pt_nas_find_locked(w, id);
	int fd = k ? k->fd : -1;

	if (k)
		*k = w->pt_nas_fds[--w->pt_nas_n];
	return fd;
}

/* The kernel refused @path (a local copy if @local, else a NAS file) as a
 * backing, with @err.  For good, not this once: the whole route (EPERM, no
 * passthrough), or every file of that filesystem (ELOOP: stacked too deep,
 * overlayfs; the kernel takes backings of stack depth 0 under our
 * max_stack_depth of 1, so that the mount may itself be stacked on) -- each
 * open asked again, and the route was reported on. */
static void pt_refused_locked(struct wfs *w, int local, int err, const char *path, int first)
{
	int deep = err == -ELOOP;

	if (deep && local)
		w->pt_deep_local = 1;
	else if (deep)
		w->pt_deep_nas = 1;
	if (!passthrough_usable(&w->pt) || (deep && local))
		store_note_route(&w->store, STORE_ROUTE_PASSTHROUGH, STORE_ROUTE_REFUSED, err);
	wfs_log(w, first || deep ? LOG_WARNING : LOG_DEBUG,
		"passthrough refused for %s (%s): reads are daemon-served%s", path, strerror(-err),
		!deep ? "" : local ? "; LOCAL_STORE is on a stacked filesystem (overlayfs?): no "
				     "local copy is passed through, put it on a plain one" :
				     "; NAS_HUB is on a stacked filesystem: no NAS file is passed "
				     "through (-o nas_passthrough)");
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
		if (fh->backing_nas)
			pt_nas_rebase_locked(w, id);
	} else if ((local || nas_fd >= 0) && n->daemon_opens == 0 && passthrough_usable(&w->pt) &&
		   !(local ? w->pt_deep_local : w->pt_deep_nas)) {
		/* Buffered: the kernel serves reads from this file's page cache,
		 * the only copy of the bytes. */
		if (local) {
			unsigned gen = blob_copy_gen(fh->blob);

			fd = store_local_path(&w->store, fh->blob, path, sizeof(path));
			if (fd == 0)
				fd = open_backing(path, 0);
			/* changed since it was verified: demoted, daemon-served
			 * (from the NAS) */
			if (fd >= 0 && store_copy_opened(&w->store, fh->blob, gen, fd) < 0) {
				close(fd);
				fd = -1;
			}
		} else {
			snprintf(path, sizeof(path), "%s", fh->nas_path);
			fd = dup(nas_fd);
		}
		/* (a NAS descriptor's close is a NAS call -- a FUSE client's
		 * FLUSH may hang -- and the table's lock is held: the closer's) */
		if (fd >= 0 && blob_bytes_gen(fh->blob) != fh->bytes_gen) {
			/* its bytes changed while this open was made: daemon-served */
			if (local)
				close(fd);
			else
				nas_close_later(&w->closer, fd);
			fd = -1;
		}
		if (fd >= 0) {
			id = passthrough_open_backing(&w->pt, fd);
			/* the kernel holds its own reference; a NAS file's
			 * last one is ours (pt_nas_keep_locked) */
			if (local)
				close(fd);
			else if (id <= 0 || pt_nas_keep_locked(w, id, fd) < 0)
				nas_close_later(&w->closer, fd);
			if (id < 0) {
				refused_now = !w->pt_warned;
				w->pt_warned = 1;
				pt_refused_locked(w, local, id, path, refused_now);
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
	int close_id = 0, close_fd = -1;

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
			if (n->backing_nas)
				close_fd = pt_nas_take_locked(w, close_id);
		}
	} else {
		n->daemon_opens--;
	}
	pthread_mutex_unlock(&w->nodes.lock);
	/* Only now: the kernel has released every open that used it. */
	if (close_id > 0)
		passthrough_close_backing(&w->pt, close_id);
	if (close_fd >= 0)
		nas_close_later(&w->closer, close_fd);
}

/* @fh off w->open_fhs, and its memory freed (its descriptors are the
 * caller's to close, or not). */
static void fh_forget(struct wfs *w, struct wfs_fh *fh)
{
	pthread_mutex_lock(&w->nodes.lock);
	if (fh->open_prev)
		fh->open_prev->open_next = fh->open_next;
	else if (w->open_fhs == fh)
		w->open_fhs = fh->open_next;
	if (fh->open_next)
		fh->open_next->open_prev = fh->open_prev;
	pthread_mutex_unlock(&w->nodes.lock);
	pthread_mutex_destroy(&fh->lock);
	free(fh->nas_path);
	free(fh->mem);
	free(fh);
}

static void fh_free(struct wfs *w, struct wfs_fh *fh)
{
	struct blob *noted = fh->noted ? fh->blob : NULL;
	int nas_fd, local_fd;

	pthread_mutex_lock(&fh->lock);
	nas_fd = fh->nas_fd;
	local_fd = fh->local_fd;
	pthread_mutex_unlock(&fh->lock);
	/* NAS files: their last close asks the NAS (nasclose.h) */
	nas_close_later(&w->closer, nas_fd);
	if (local_fd >= 0)
		close(local_fd);
	close_old_fds(fh->local_old, NULL);
	if (fh->part_fd >= 0)
		close(fh->part_fd);
	close_old_fds(fh->part_old, NULL);
	close_old_fds(fh->nas_old, &w->closer);
	nas_close_later(&w->closer, fh->pt_nas_fd);
	fh_forget(w, fh);
	/* After our descriptors are closed: the space of a copy evicted while
	 * open comes back now. */
	if (noted)
		store_note_close(&w->store, noted);
}

/* The open counted on its blob (once): from then on an eviction of its
 * copy keeps the copy's room held until the release. */
static void note_open(struct wfs *w, struct wfs_fh *fh)
{
	char path[PATH_MAX];

	if (!fh->blob || fh->noted)
		return;
	node_path(fh->node, path, sizeof(path));
	store_note_open(&w->store, fh->blob, path);
	fh->noted = 1;
}

/* The NAS cannot answer the open: a local copy serves alone (its NAS side
 * is opened later if it is demoted meanwhile), a refs file, marker or
 * file list of a local revision from the record's bytes; anything else
 * gets EIO.  Returns 1
 * when the open goes on locally, 0 with @fh->mem set, or -errno. */
static int open_without_nas(struct wfs *w, struct wfs_fh *fh, struct stat *st)
{
	struct record_entry *re;
	char rel[PATH_MAX];
	int direct, r = -EIO;
	unsigned gen;

	if (fh->blob && blob_state(fh->blob) == BLOB_LOCAL) {
		/* counted before the copy's descriptor is taken, as when the
		 * NAS answers: evicted in between, its room would not be held */
		note_open(w, fh);
		if (fh_local_fd(w, fh, &direct, &gen) >= 0) {
			node_attr(&w->nodes, fh->node, st);
			nas_gate_count_record(&w->gate);
			return 1;
		}
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
	if (node_path(fh->node, rel, sizeof(rel)) == 0)
		r = record_data_for(w, rel, re, &fh->mem);
	if (r == 0 && fh->mem) {
		fh->mem_len = re->data_len;
		*st = re->e.st;
	} else if (r == 0) {
		r = -EIO; /* shown, its bytes not kept */
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
	/* (ENOLINK: said once per blob, by the store's source check) */
	if (fd < 0 && !NAS_CANNOT_ANSWER(fd) && fd != -ENOLINK)
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
	pthread_mutex_lock(&w->nodes.lock);
	fh->open_next = w->open_fhs;
	if (w->open_fhs)
		w->open_fhs->open_prev = fh;
	w->open_fhs = fh;
	pthread_mutex_unlock(&w->nodes.lock);
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
		nas_close_later(&w->closer, fh->pt_nas_fd); /* replaced between the two opens */
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

/* The errno for an open whose NAS side failed with @r.  The name itself
 * swapped on the NAS for a link or another type of file since the kernel
 * looked it up (a snapshot's real file replaced by the link huggingface_hub
 * writes): ESTALE, as getattr answers (ops.c), so that open(2) looks the
 * name up again and opens what it is now.  A link on the way to it (a
 * parent swapped), a FIFO or other file that cannot be read: EIO, never
 * followed. */
static int open_error(struct wfs *w, const char *path, int r)
{
	struct stat st;

	if ((r == -ELOOP || r == -ENXIO || r == -EISDIR) && nas_stat(w, path, &st) == 0 &&
	    !S_ISREG(st.st_mode)) {
		wfs_log(w, LOG_WARNING, "open %s: %s on the NAS now: stale", path,
			S_ISLNK(st.st_mode) ? "a link" : "another type of file");
		return ESTALE;
	}
	return r == -ELOOP || r == -ENXIO || r == -ESTALE || r == -EISDIR || r == -EXDEV ||
	       r == -EINVAL ? EIO : -r;
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
	if (r == 0 && node_open_replaced(&w->nodes, n, &st) < 0) {
		wfs_log(w, LOG_NOTICE, "open of %s refused (%s): replaced on the NAS since the "
			"name was looked up; it is looked up again to a new inode", fh->nas_path,
			strerror(ESTALE));
		fuse_reply_err(req, ESTALE); /* (not open_error's: a NAS's own ESTALE is EIO) */
		fh_free(w, fh);
		return;
	}
	/* (ENOLINK: its further root is not mounted, the rest of the NAS is) */
	if (NAS_CANNOT_ANSWER(r) || r == -ENOLINK) {
		from_nas = 0;
		r = open_without_nas(w, fh, &st);
		local = r == 1;
		/* a local copy or local ranges: what it showed binds a NAS file
		 * opened later for it */
		fh->shown_set = r == 1 || r == 2;
		fh->shown = st;
		r = r == 2 ? 0 : r;
	}
	if (r < 0) {
		fuse_reply_err(req, open_error(w, fh->nas_path, r));
		fh_free(w, fh);
		return;
	}
	if (fh->blob) {
		note_open(w, fh);
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
	set_keep_cache(w, n, fh, from_nas, &st, fi);
	fi->fh = (uint64_t)(uintptr_t)fh;
	fi->noflush = 1;
	if (fuse_reply_open(req, fi) == -ENOENT) {
		fh_uncount(w, fh); /* the opener was interrupted */
		fh_free(w, fh);
	}
}

void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct wfs_fh *fh = (struct wfs_fh *)(uintptr_t)fi->fh;
	(void)ino;

	if (fh->backing_nas && fh->blob) {
		uint64_t add;

		pthread_mutex_lock(&W(req)->nodes.lock);
		add = pt_nas_read_locked(W(req), fh->backing_id);
		pthread_mutex_unlock(&W(req)->nodes.lock);
		if (add)
			store_note_read(&W(req)->store, fh->blob, add, 0);
	}
	fh_uncount(W(req), fh);
	fh_free(W(req), fh);
	fuse_reply_err(req, 0);
}

void fh_free_left(struct wfs *w)
{
	struct wfs_fh *fh;
	size_t n = 0;

	for (;;) {
		pthread_mutex_lock(&w->nodes.lock);
		fh = w->open_fhs;
		pthread_mutex_unlock(&w->nodes.lock);
		if (!fh)
			break;
		/* Memory only: a NAS thread left in a read past its deadline
		 * may still read one of its descriptors, and one closed now
		 * could be reused under it; they close with the process (and
		 * the node's tallies and the store's held room go with it). */
		fh_forget(w, fh);
		n++;
	}
	if (n)
		wfs_log(w, LOG_DEBUG, "freed %zu open%s the kernel never released", n,
			n == 1 ? "" : "s");
}
