/* dir.c - directory listings, taken whole once a handle is first read, so
 * offsets are stable for that handle.
 *
 * Not at opendir: the kernel keeps a directory's listing (cache_readdir)
 * and then reads it from its cache with no READDIR at all, so a listing
 * taken at every opendir would be NAS work thrown away -- the whole cost
 * of a warm tree walk. */
#include "wfs.h"
#include "ops.h"
#include "path.h"
#include "nas.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>
#include <dirent.h>

/* The entries of a READDIRPLUS reply, classified in one NAS call rather
 * than one each: those from @first that fit @size (a direntplus is a
 * fuse_entry_out and a fuse_dirent header, 152 bytes, and the name, to 8).
 * Entries found hidden leave room unused; the rest are looked up one by
 * one. */
struct plus_batch {
	size_t first, n;
	struct ns_batch b;
};

struct dir_handle {
	char rel[PATH_MAX];  /* IMMUTABLE after opendir */
	int cached;          /* IMMUTABLE after opendir: the kernel was told it
			      * may keep the listing */
	/* LOCK lock: the kernel sends one READDIR of a handle at a time, but
	 * on any worker thread (an order a race detector cannot see). */
	pthread_mutex_t lock;
	int listed;
	struct dir_entry *ents;
	size_t n;
	int from_record;     /* the NAS could not answer: the local record's names */
	/* LOCK lock: the batch the next READDIRPLUS will ask for, classified
	 * by the worker that sent this one while the kernel builds the
	 * dentries of its reply and the reader stats them; ahead_busy while
	 * that worker is at it (outside the lock), ahead_cond when it is
	 * done. */
	struct plus_batch ahead;
	int ahead_busy;
	pthread_cond_t ahead_cond;
};

static void plus_batch_free(struct plus_batch *b)
{
	ns_batch_free(&b->b);
	memset(b, 0, sizeof(*b));
}

static void dir_free(struct dir_handle *d)
{
	dir_entries_free(d->ents, d->n);
	plus_batch_free(&d->ahead);
	pthread_cond_destroy(&d->ahead_cond);
	pthread_mutex_destroy(&d->lock);
	free(d);
}

/* The NAS cannot answer: a directory of a local revision lists what the
 * record holds; any other gets EIO. */
static int list_from_record(struct wfs *w, struct dir_handle *d)
{
	char **names = NULL, rel[PATH_MAX];
	size_t n = 0;
	int r = record_list(&w->record, d->rel, &names, &n);

	if (r < 0)
		return r == -ENOENT ? -EIO : r;
	nas_gate_count_record(&w->gate);
	d->ents = calloc(n ? n : 1, sizeof(*d->ents));
	for (size_t i = 0; i < n; i++) {
		struct record_entry *re = d->ents ? malloc(sizeof(*re)) : NULL;

		if (re && path_join(d->rel, names[i], rel, sizeof(rel)) == 0 &&
		    record_lookup(&w->record, rel, re) == 0) {
			d->ents[d->n].name = names[i];
			d->ents[d->n].nas_ino = re->e.st.st_ino ? re->e.st.st_ino : 1;
			d->ents[d->n].type = re->e.st.st_mode & S_IFMT;
			d->n++;
			names[i] = NULL;
		}
		free(re);
		free(names[i]);
	}
	free(names);
	d->from_record = 1;
	return d->ents ? 0 : -ENOMEM;
}

/* Take @d's whole listing (under d->lock, or before the handle is
 * shared), from the NAS or, when it cannot answer, the record. */
static int dir_list(struct wfs *w, struct dir_handle *d)
{
	char path[PATH_MAX];
	int r;

	if (d->listed)
		return 0;
	path_join(w->roots.path[0], d->rel, path, sizeof(path));
	r = nas_list(w, path, &d->ents, &d->n);
	if (NAS_CANNOT_ANSWER(r))
		r = list_from_record(w, d);
	if (r < 0) {
		wfs_log(w, LOG_WARNING, "listing %s: %s", path, strerror(-r));
		return r;
	}
	d->listed = 1;
	return 0;
}

void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct wfs *w = W(req);
	struct node *n = N(w, ino);
	struct dir_handle *d;
	int r;

	if (n->kind != NS_DIR) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	pthread_mutex_init(&d->lock, NULL);
	pthread_cond_init(&d->ahead_cond, NULL);
	node_path(n, d->rel, sizeof(d->rel));
	/* While the NAS is down the listing is the record's, now, and never
	 * kept by the kernel; a handle opened while it is up lists at its
	 * first READDIR. */
	if (!nas_gate_up(&w->gate) && (r = dir_list(w, d)) < 0) {
		dir_free(d);
		fuse_reply_err(req, -r);
		return;
	}
	d->cached = !d->from_record;
	fi->fh = (uint64_t)(uintptr_t)d;
	/* The kernel may keep the listing; it drops it when the directory's
	 * mtime changes, which it sees within attr_timeout, or when an open
	 * does not ask it to keep it: once the record's names may be there. */
	fi->cache_readdir = d->cached;
	fi->keep_cache = d->cached && !__atomic_exchange_n(&n->record_listed, 0, __ATOMIC_ACQ_REL);
	if (fuse_reply_open(req, fi) == -ENOENT)
		dir_free(d);
}

#define DIRENTPLUS_LEN(namelen) (((size_t)152 + (namelen) + 7) & ~(size_t)7)

static void batch_classify(struct wfs *w, const struct dir_handle *d, size_t first, size_t size,
			   struct plus_batch *b)
{
	const char **rels;
	size_t n = 0, room = size;
	char rel[PATH_MAX];

	memset(b, 0, sizeof(*b));
	b->first = first;
	while (first + n < d->n && DIRENTPLUS_LEN(strlen(d->ents[first + n].name)) <= room)
		room -= DIRENTPLUS_LEN(strlen(d->ents[first + n++].name));
	if (n < 2 || !(rels = calloc(n, sizeof(*rels))))
		return; /* one by one */
	for (size_t k = 0; k < n; k++)
		if (path_join(d->rel, d->ents[first + k].name, rel, sizeof(rel)) < 0 ||
		    !(rels[k] = strdup(rel)))
			goto out;
	if (nas_classify_batch(w, rels, n, &b->b) == 0)
		b->n = n;
out:
	for (size_t k = 0; k < n; k++)
		free((char *)rels[k]);
	free(rels);
}

/* (a worker that just replied to a READDIRPLUS of @d; d->ahead_busy keeps
 * the handle from being released meanwhile) */
static void classify_ahead(struct wfs *w, struct dir_handle *d, size_t first, size_t size)
{
	struct plus_batch b;

	batch_classify(w, d, first, size, &b);
	pthread_mutex_lock(&d->lock);
	d->ahead = b;
	d->ahead_busy = 0;
	pthread_cond_broadcast(&d->ahead_cond);
	pthread_mutex_unlock(&d->lock);
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
	uint64_t dot_ino = node_serial(&w->nodes, dn);
	struct plus_batch batch = { 0 };
	int r = buf && ent ? 0 : -ENOMEM, uncache, ahead;
	off_t i;

	pthread_mutex_lock(&d->lock);
	while (d->ahead_busy)
		pthread_cond_wait(&d->ahead_cond, &d->lock);
	if (!r)
		r = dir_list(w, d);
	if (r < 0) {
		pthread_mutex_unlock(&d->lock);
		free(buf);
		free(ent);
		fuse_reply_err(req, -r);
		return;
	}
	if (plus && !d->from_record) {
		size_t first = off > 2 ? (size_t)off - 2 : 0;

		if (d->ahead.n && d->ahead.first == first) {
			batch = d->ahead;
			memset(&d->ahead, 0, sizeof(d->ahead));
		} else {
			plus_batch_free(&d->ahead);
			batch_classify(w, d, first, size, &batch);
		}
	}
	/* Offsets: 1 is ".", 2 is "..", 2 + i + 1 is entry i. */
	for (i = off; i < (off_t)d->n + 2; i++) {
		struct fuse_entry_param e;
		struct stat st = {0};
		const char *name;
		struct node *n = NULL;
		size_t sz;

		memset(&e, 0, sizeof(e));
		if (i < 2) {
			name = i == 0 ? "." : "..";
			st.st_mode = S_IFDIR;
			st.st_ino = i == 0 ? dot_ino : 1; /* ".." is not ours to know */
			e.attr = st;
		} else {
			const struct dir_entry *de = &d->ents[i - 2];

			name = de->name;
			/* glibc hides entries whose d_ino is 0. */
			st.st_ino = de->nas_ino;
			if (path_join(d->rel, name, rel, sizeof(rel)) < 0)
				continue;
			if (!plus && (S_ISDIR(de->type) || S_ISREG(de->type) || d->from_record)) {
				st.st_mode = de->type;
			} else if (plus) {
				size_t k = (size_t)i - 2 - batch.first;
				int r;

				if (k < batch.n) {
					r = ns_batch_get(&batch.b, k, ent);
					r = lookup_classified(w, dn, name, rel, r, ent, &e);
				} else
					r = do_lookup(w, dn, name, &e);

				if (r < 0)
					continue; /* hidden or vanished */
				n = N(w, e.ino);
				st = e.attr;
			} else {
				if (nas_classify(w, rel, ent) < 0)
					continue; /* hidden, vanished, or the NAS is down */
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
	wfs_log(w, LOG_DEBUG, "readdir%s %s off %lld size %zu: %zu bytes%s", plus ? "plus" : "",
		d->rel, (long long)off, size, used, d->from_record ? " (record)" : "");
	/* The NAS went down between opendir and now: the kernel, told it may
	 * keep this listing, must not keep the record's once the NAS is back.
	 * The directory's next open drops it (op_opendir); so does the
	 * invalidation queued here, should no open come. */
	uncache = d->from_record && d->cached;
	if (uncache)
		__atomic_store_n(&dn->record_listed, 1, __ATOMIC_RELEASE);
	/* Entry i - 2 is the first the next request asks for.  Classified
	 * once this reply is sent, a tree walk's NAS work and the kernel's
	 * (dentries, inodes, the reader's stats) run side by side, on two
	 * cores, instead of in turn. */
	ahead = plus && !d->from_record && used && i >= 2 && (size_t)i - 2 < d->n;
	d->ahead_busy = ahead;
	pthread_mutex_unlock(&d->lock);
	fuse_reply_buf(req, buf, used);
	if (uncache)
		inval_push(&w->inval, ino);
	free(buf);
	free(ent);
	plus_batch_free(&batch);
	if (ahead)
		classify_ahead(w, d, (size_t)i - 2, size);
}

void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, 0);
}

void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			   struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, 1);
}

void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct dir_handle *d = (struct dir_handle *)(uintptr_t)fi->fh;

	(void)ino;
	pthread_mutex_lock(&d->lock);
	while (d->ahead_busy)
		pthread_cond_wait(&d->ahead_cond, &d->lock);
	pthread_mutex_unlock(&d->lock);
	dir_free(d);
	fuse_reply_err(req, 0);
}

