/* nas.c - the NAS calls of FUSE requests, with deadlines; see nas.h. */
#include "nas.h"
#include "clock.h"
#include "nasopen.h"
#include "path.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

/* Each call's arguments and results live in one heap block: the gate owns
 * it if the call passes its deadline (and frees it with the release). */

struct classify_job {
	const struct hub_roots *roots; /* the daemon's: lives as long as it */
	struct ns_entry out;
	char rel[PATH_MAX];
};

static int classify_fn(void *arg)
{
	struct classify_job *j = arg;

	return ns_classify_beneath(j->roots, j->rel, &j->out);
}

struct gone_job {
	char root[PATH_MAX];
};

static int gone_fn(void *arg)
{
	struct gone_job *j = arg;
	int r = nas_root_gone(j->root);

	return r == 1 ? -ENOMEDIUM : r;
}

/* The NAS says a name of the local record is not there, or a repo while
 * the record holds some (so NAS_HUB is not empty): deleted, or the NAS
 * not mounted (an empty mount point seen in its place: every name is "not
 * there")?  -ENOMEDIUM for the second (the gate marks the NAS down, and
 * the record answers), else @r.  (A repo the record does not hold got
 * ENOENT, cached by the kernel, until the prober saw the NAS gone.) */
static int gone_or(struct wfs *w, const char *rel, int r)
{
	struct record_entry *re;
	struct gone_job *j;
	int has;

	if ((r != -ENOENT && r != -ENOTDIR) || !(re = malloc(sizeof(*re))))
		return r;
	has = record_lookup(&w->record, rel, re) == 0 ||
	      (!strchr(rel, '/') && record_has_any(&w->record));
	free(re);
	if (!has || !(j = malloc(sizeof(*j))))
		return r;
	snprintf(j->root, sizeof(j->root), "%s", w->roots.path[0]);
	switch (nas_call(&w->gate, gone_fn, j, free)) {
	case -ETIMEDOUT:
		return -ETIMEDOUT; /* j is the gate's; the NAS is down */
	case -ENOMEDIUM:
		r = -ENOMEDIUM;
		break;
	}
	free(j);
	return r;
}

struct root_gone_job {
	char root[PATH_MAX];
	int gone; /* out: nas_root_gone's answer */
};

/* Returns 0 whatever it finds: a further root empty is no NAS failure the
 * gate should count (its prober looks only at NAS_HUB, which answers). */
static int root_gone_fn(void *arg)
{
	struct root_gone_job *j = arg;

	j->gone = nas_root_gone(j->root);
	return 0;
}

int nas_dangling_or(struct wfs *w, const char *rel, const struct ns_entry *ent)
{
	struct record_entry *re;
	struct root_gone_job *j = NULL;
	const char *rest;
	int i = -1, r;

	if (ent->kind != NS_LINK || ent->link_state != NS_LINK_DANGLING ||
	    !(re = malloc(sizeof(*re))))
		return 0;
	if (record_lookup_file(&w->record, rel, re) == 0 && re->e.backing[0] == '/')
		i = hub_root_of(&w->roots, re->e.backing, &rest);
	if (i > 0 && (j = malloc(sizeof(*j))))
		snprintf(j->root, sizeof(j->root), "%s", w->roots.path[i]);
	free(re);
	if (!j)
		return 0;
	j->gone = 0;
	r = nas_call(&w->gate, root_gone_fn, j, free);
	if (r == -ETIMEDOUT)
		return 0; /* j is the gate's; shown as the NAS shows it */
	r = r == 0 && j->gone == 1 ? -ENOLINK : 0;
	if (r)
		wfs_log(w, LOG_DEBUG, "link %s dangles, %s: the local record answers", rel,
			nas_err_why(r));
	free(j);
	return r;
}

int nas_classify(struct wfs *w, const char *rel, struct ns_entry *out)
{
	struct classify_job *j = malloc(sizeof(*j));
	int r;

	if (!j)
		return -ENOMEM;
	j->roots = &w->roots;
	snprintf(j->rel, sizeof(j->rel), "%s", rel);
	r = nas_call(&w->gate, classify_fn, j, free);
	if (r == -ETIMEDOUT)
		return r; /* j is the gate's */
	if (r == 0)
		*out = j->out;
	free(j);
	return gone_or(w, rel, r);
}

struct batch_job {
	const struct hub_roots *roots;
	_Atomic uint64_t progress; /* names classified: nas_call_progress */
	size_t n;
	char **names;
	struct ns_dir dir;
	struct ns_entry e; /* the one being classified */
	struct ns_batch out;
};

static void batch_release(void *arg)
{
	struct batch_job *j = arg;

	for (size_t i = 0; i < j->n; i++)
		free(j->names[i]);
	free(j->names);
	ns_batch_free(&j->out);
	free(j);
}

static int batch_fn(void *arg)
{
	struct batch_job *j = arg;
	int r = ns_dir_open(&j->dir, j->roots, j->dir.rel);
	/* A directory that cannot be opened: gone (each name then is), or a
	 * link now (the listing is out of date) */
	int dir_err = ns_dir_stale(r);

	if (nas_gate_unavailable(r)) {
		ns_dir_close(&j->dir);
		return r;
	}
	for (size_t i = 0; i < j->n; i++) {
		r = j->dir.fd >= 0 ? ns_classify_in(&j->dir, j->names[i], &j->e) : dir_err;
		if (nas_gate_unavailable(r))
			break; /* the rest would fail alike */
		if (ns_batch_add(&j->out, r, &j->e) < 0) {
			r = -ENOMEM;
			break;
		}
		atomic_fetch_add_explicit(&j->progress, 1, memory_order_relaxed);
		r = 0;
	}
	ns_dir_close(&j->dir);
	return r;
}

int nas_classify_batch(struct wfs *w, const char *dir_rel, const char *const *names, size_t n,
		       struct ns_batch *out)
{
	struct batch_job *j = calloc(1, sizeof(*j));
	int r = -ENOMEM;

	if (!j)
		return r;
	j->roots = &w->roots;
	if (strlen(dir_rel) >= sizeof(j->dir.rel)) {
		r = -ENAMETOOLONG;
		goto out;
	}
	strcpy(j->dir.rel, dir_rel);
	j->names = calloc(n ? n : 1, sizeof(*j->names));
	if (!j->names)
		goto out;
	for (; j->n < n; j->n++)
		if (!(j->names[j->n] = strdup(names[j->n])))
			goto out;
	r = nas_call_progress(&w->gate, batch_fn, j, batch_release, &j->progress);
	if (r == -ETIMEDOUT)
		return r;
	if (r == 0) {
		*out = j->out;
		memset(&j->out, 0, sizeof(j->out));
	}
out:
	batch_release(j);
	return r;
}

struct stat_job {
	const struct hub_roots *roots; /* the daemon's: lives as long as it */
	struct stat st;
	struct statvfs sv;
	char path[PATH_MAX];
};

/* An lstat that follows no link in any component: the directory opened as
 * nas_open() opens it (a root itself: canonical), the name looked at in it.
 * The daemon runs as root: a link swapped in on the NAS since the lookup,
 * for the name or a directory above it, must not show its target's
 * attributes (a file other users could not even see). */
static int stat_fn(void *arg)
{
	struct stat_job *j = arg;
	const char *rest, *name = strrchr(j->path, '/');
	char dir[PATH_MAX];
	int root, fd, r;

	root = hub_root_of(j->roots, j->path, &rest) >= 0 && !*rest;
	if (!root && (!name || !name[1]))
		return -EINVAL;
	if (!root)
		path_dirname(j->path, dir, sizeof(dir));
	fd = nas_open(j->roots, root ? j->path : dir, O_DIRECTORY);
	if (fd < 0)
		return fd;
	r = fstatat(fd, root ? "" : name + 1, &j->st,
		    root ? AT_EMPTY_PATH : AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
	close(fd);
	return r;
}

static int statvfs_fn(void *arg)
{
	struct stat_job *j = arg;

	return statvfs(j->path, &j->sv) < 0 ? -errno : 0;
}

static int run_stat(struct wfs *w, int (*fn)(void *), const char *path, struct stat *st,
		    struct statvfs *sv)
{
	struct stat_job *j = malloc(sizeof(*j));
	int r;

	if (!j)
		return -ENOMEM;
	j->roots = &w->roots;
	snprintf(j->path, sizeof(j->path), "%s", path);
	r = nas_call(&w->gate, fn, j, free);
	if (r == -ETIMEDOUT)
		return r;
	if (r == 0 && st)
		*st = j->st;
	if (r == 0 && sv)
		*sv = j->sv;
	free(j);
	return r;
}

int nas_stat(struct wfs *w, const char *path, struct stat *st)
{
	return run_stat(w, stat_fn, path, st, NULL);
}

int nas_statvfs(struct wfs *w, struct statvfs *sv)
{
	return run_stat(w, statvfs_fn, w->roots.path[0], NULL, sv);
}

void dir_entries_free(struct dir_entry *ents, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(ents[i].name);
	free(ents);
}

struct list_job {
	const struct hub_roots *roots;
	_Atomic uint64_t progress; /* entries read: nas_call_progress */
	struct dir_entry *ents;
	size_t n;
	char path[PATH_MAX];
};

static void list_release(void *arg)
{
	struct list_job *j = arg;

	dir_entries_free(j->ents, j->n);
	free(j);
}

static int add_entry(struct list_job *j, size_t *cap, const struct dirent *de)
{
	if (j->n == *cap) {
		size_t nc = *cap ? *cap * 2 : 64;
		struct dir_entry *ne = realloc(j->ents, nc * sizeof(*ne));

		if (!ne)
			return -ENOMEM;
		j->ents = ne;
		*cap = nc;
	}
	j->ents[j->n].name = strdup(de->d_name);
	if (!j->ents[j->n].name)
		return -ENOMEM;
	j->ents[j->n].type = de->d_type == DT_UNKNOWN ? 0 : DTTOIF(de->d_type);
	/* glibc hides entries whose d_ino is 0 */
	j->ents[j->n].nas_ino = de->d_ino ? de->d_ino : 1;
	j->n++;
	return 0;
}

static int list_fn(void *arg)
{
	struct list_job *j = arg;
	struct dirent *de;
	size_t cap = 0;
	int r = 0;
	DIR *dp;

	/* no link followed in any component (a parent swapped for a link) */
	dp = nas_opendir(j->roots, j->path);
	if (!dp) /* ENOMEDIUM: the NAS not mounted, as open_fn says */
		return nas_missing_or_gone(j->roots->path[0], 1, -errno);
	errno = 0;
	while (r == 0 && (de = readdir(dp))) {
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			r = add_entry(j, &cap, de);
		atomic_fetch_add_explicit(&j->progress, 1, memory_order_relaxed);
		errno = 0;
	}
	if (r == 0 && errno)
		r = -errno; /* a listing cut short is no listing */
	closedir(dp);
	return r;
}

int nas_list(struct wfs *w, const char *path, struct dir_entry **ents, size_t *n)
{
	struct list_job *j = calloc(1, sizeof(*j));
	int r;

	if (!j)
		return -ENOMEM;
	j->roots = &w->roots;
	snprintf(j->path, sizeof(j->path), "%s", path);
	r = nas_call_progress(&w->gate, list_fn, j, list_release, &j->progress);
	if (r == -ETIMEDOUT)
		return r;
	/* NAS_HUB listed empty while the record shows revisions of it: its
	 * mount point with no NAS on it (nasgate.h) */
	if (r == 0 && !j->n && !strcmp(path, w->roots.path[0]) && record_has_any(&w->record)) {
		nas_gate_note(&w->gate, -ENOMEDIUM);
		r = -ENOMEDIUM;
	}
	if (r == 0) {
		*ents = j->ents;
		*n = j->n;
		j->ents = NULL;
		j->n = 0;
	}
	list_release(j);
	return r;
}

struct open_job {
	const struct hub_roots *roots;
	int fd, direct, buffered;
	struct stat st;
	char path[PATH_MAX];
};

static void open_release(void *arg)
{
	struct open_job *j = arg;

	if (j->fd >= 0)
		close(j->fd);
	free(j);
}

static int open_fn(void *arg)
{
	struct open_job *j = arg;

	j->direct = !j->buffered;
	j->fd = nas_open(j->roots, j->path, j->direct ? O_DIRECT : 0);
	if (j->fd == -EINVAL && j->direct) { /* tmpfs and friends: buffered, pages dropped */
		j->direct = 0;
		j->fd = nas_open(j->roots, j->path, 0);
	}
	/* A file the kernel holds gone along with everything in its root: the
	 * NAS not mounted (rare enough, a file gone at its open, to look);
	 * -ENOLINK for a further root, whose files the record answers for. */
	if (j->fd < 0) {
		const char *rest;
		int i = hub_root_of(j->roots, j->path, &rest);

		i = i < 0 ? 0 : i;
		return nas_missing_or_gone(j->roots->path[i], i == 0, j->fd);
	}
	if (fstat(j->fd, &j->st) < 0)
		return -errno;
	return 0;
}

static int open_file(struct wfs *w, const char *path, int buffered, int *direct, struct stat *st)
{
	struct open_job *j = malloc(sizeof(*j));
	int r;

	if (!j)
		return -ENOMEM;
	j->roots = &w->roots;
	j->fd = -1;
	j->buffered = buffered;
	snprintf(j->path, sizeof(j->path), "%s", path);
	r = nas_call(&w->gate, open_fn, j, open_release);
	if (r == -ETIMEDOUT)
		return r;
	if (r == 0) {
		r = j->fd;
		*direct = j->direct;
		*st = j->st;
		j->fd = -1;
	} else if (j->fd >= 0) {
		/* opened, then its fstat failed: the last close of a NAS file
		 * is a call to the NAS, never made on a FUSE worker */
		nas_close_later(&w->closer, j->fd);
		j->fd = -1;
	}
	open_release(j);
	return r;
}

int nas_open_file(struct wfs *w, const char *path, int *direct, struct stat *st)
{
	return open_file(w, path, 0, direct, st);
}

int nas_open_buffered(struct wfs *w, const char *path, struct stat *st)
{
	int direct;

	return open_file(w, path, 1, &direct, st);
}

int nas_reopen_same(struct wfs *w, const char *path, const struct stat *was, int *direct)
{
	struct stat st;
	int fd = nas_open_file(w, path, direct, &st);

	if (fd >= 0 && (st.st_ino != was->st_ino || st.st_size != was->st_size ||
			!same_ts(&st.st_mtim, &was->st_mtim) ||
			!same_ts(&st.st_ctim, &was->st_ctim))) {
		nas_close_later(&w->closer, fd);
		return -ESTALE;
	}
	return fd;
}

struct read_job {
	int fd, drop;
	size_t len;
	off_t off;
	ssize_t got;
	void *buf;
	_Atomic uint64_t *made; /* counted when the NAS thread makes the read */
};

static void read_release(void *arg)
{
	struct read_job *j = arg;

	free(j->buf);
	free(j);
}

static int read_fn(void *arg)
{
	struct read_job *j = arg;

	atomic_fetch_add(j->made, 1);
	j->got = pread(j->fd, j->buf, j->len, j->off);
	if (j->got < 0)
		return -errno;
	if (j->drop) /* the bytes live on in the FUSE inode's page cache */
		posix_fadvise(j->fd, j->off, (off_t)j->len, POSIX_FADV_DONTNEED);
	return 0;
}

/* The read is made on this thread's own io_uring and waited for there with
 * the deadline -- a ring thread's (-o fuse_uring: uring.h), or a FUSE
 * worker's (core/ringread.h) -- under the gate's rules (refused while the
 * NAS is down, a late read marks it down), without the hand-off to a NAS
 * thread and back that cost a 4 KiB read about as much as the read.
 * -ENOTSUP: this thread has no ring; the caller hands the read off. */
static ssize_t ring_pread(struct wfs *w, int fd, size_t len, off_t off, int drop, void **buf)
{
	ssize_t got;
	int ring = uring_here(), r;

	if (!ring && (r = ringread_ready(&w->ringread)) <= 0)
		return r < 0 ? r : -ENOTSUP;
	if ((r = nas_gate_admit(&w->gate)) < 0)
		return r;
	atomic_fetch_add(&w->store.nas_reads_ring, 1);
	if (ring)
		got = uring_pread(fd, len, off, w->gate.timeout_ms, buf);
	else
		got = ringread_pread(&w->ringread, fd, len, off, w->gate.timeout_ms, buf);
	nas_gate_done(&w->gate, got < 0 ? (int)got : 0);
	if (got >= 0 && drop) /* the bytes live on in the FUSE inode's page cache */
		posix_fadvise(fd, off, (off_t)len, POSIX_FADV_DONTNEED);
	return got;
}

ssize_t nas_pread(struct wfs *w, int fd, size_t len, off_t off, int drop, void **buf)
{
	struct read_job *j;
	ssize_t got;
	int r;

	if ((uring_here() || w->opt.nas_read_ring) &&
	    (got = ring_pread(w, fd, len, off, drop, buf)) != -ENOTSUP)
		return got;
	if (!(j = malloc(sizeof(*j))))
		return -ENOMEM;
	*j = (struct read_job){ .fd = fd, .drop = drop, .len = len, .off = off,
				.made = &w->store.nas_reads_handed };
	if (posix_memalign(&j->buf, 4096, len ? len : 4096)) {
		free(j);
		return -ENOMEM;
	}
	/* @fd may be of a NAS mount since gone: its "unreachable" is not the
	 * NAS's (the caller opens the path again: nas_reopen_same) */
	r = nas_call_on_fd(&w->gate, read_fn, j, read_release);
	if (r == -ETIMEDOUT)
		return r;
	if (r < 0) {
		read_release(j);
		return r;
	}
	got = j->got;
	*buf = j->buf;
	free(j);
	return got;
}

int record_data_for(struct wfs *w, const char *rel, struct record_entry *out, char **data)
{
	int r = record_lookup_data(&w->record, rel, out, data);

	if (r == -ENOENT)
		return -EIO;
	if (r == 0)
		nas_gate_count_record(&w->gate);
	return r;
}

int record_entry_for(struct wfs *w, const char *rel, struct record_entry *out)
{
	if (record_lookup(&w->record, rel, out) < 0)
		return -EIO;
	nas_gate_count_record(&w->gate);
	return 0;
}
