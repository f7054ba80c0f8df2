/* read.c - the daemon's reads: where a file's bytes come from.
 *
 * A file is read from its blob's verified local copy when there is one and
 * from the NAS otherwise, deciding at every read, so an open file moves to
 * the copy the moment it is verified.  (Reads the kernel makes itself,
 * through passthrough, never come here: file.c.)
 */
#include "fh.h"
#include "clock.h"
#include "nas.h"
#include "ops.h"
#include "partread.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

/* Reads use O_DIRECT where the filesystem allows it: the bytes land only in
 * the FUSE inode's page cache, never in the NAS file's (or the copy's) too,
 * and an NFS client's stale cache is not consulted.  Every read goes
 * through an aligned buffer of ours (partread.h: span_local, span_nas; a
 * 1 MiB reply does not fit libfuse's pipe, so it would not be spliced
 * anyway): a NAS read through the gate, so it has a deadline; a local read
 * here, so its error is seen (a local copy that returns EIO is demoted, and
 * the read retried on the NAS). */

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
 * still the same file.  That open says whether the NAS is down.  It is
 * made without the open's lock, as fh_nas_fd's is: a read of the open's
 * local ranges takes it, and never waits on the NAS (partread.h). */
static int fh_nas_reopen(struct wfs *w, struct wfs_fh *fh, int dead, int *direct)
{
	struct stat was;
	int fd, slot, fresh_direct = 0;

	pthread_mutex_lock(&fh->lock);
	fd = fh->nas_fd; /* != @dead: another read opened it again already */
	slot = old_fd_slot(fh->nas_old);
	was = fh->nas_st;
	*direct = fh->nas_direct;
	pthread_mutex_unlock(&fh->lock);
	if (fd != dead)
		return fd;
	if (slot < 0) {
		wfs_log(w, LOG_WARNING, "read %s: the NAS descriptor of this open died %d times; "
			"the file must be opened again", fh->nas_path, FH_OLD_FDS + 1);
		return -EMFILE;
	}
	fd = nas_reopen_same(w, fh->nas_path, &was, &fresh_direct);
	if (!NAS_CANNOT_ANSWER(fd))
		wfs_log(w, fd >= 0 ? LOG_NOTICE : LOG_WARNING, "read %s: its NAS descriptor died; "
			"opened again: %s", fh->nas_path, fd >= 0 ? "the same file" :
			fd == -ESTALE ? "another file now" : strerror(-fd));
	if (fd < 0)
		return fd;
	pthread_mutex_lock(&fh->lock);
	slot = old_fd_slot(fh->nas_old);
	if (fh->nas_fd == dead && slot >= 0) {
		fh->nas_old[slot] = dead;
		fh->nas_fd = fd;
		fh->nas_direct = fresh_direct;
	} else {
		/* another read opened it again meanwhile: that one serves */
		nas_close_later(&w->closer, fd);
		fd = fh->nas_fd == dead ? -EMFILE : fh->nas_fd;
	}
	*direct = fh->nas_direct;
	pthread_mutex_unlock(&fh->lock);
	return fd;
}

/* How many bytes a read of @size at @off gets of a file of @len bytes. */
static size_t mem_slice(size_t len, size_t size, off_t off)
{
	size_t n = off >= 0 && (uint64_t)off < len ? len - (size_t)off : 0;

	return n < size ? n : size;
}

/* A file held in memory (fh->mem: bytes from the record, up to a file
 * list's 1 MiB), from a copy of the slice asked: once the reply is written
 * the file may be released (and fh->mem freed) while writev still
 * returns. */
static void reply_mem(fuse_req_t req, const char *mem, size_t len, size_t size, off_t off)
{
	size_t n = mem_slice(len, size, off);
	char *copy;

	if (!n) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	if (!(copy = malloc(n))) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	memcpy(copy, mem + off, n);
	fuse_reply_buf(req, copy, n);
	free(copy);
}

/* The NAS stopped answering after this refs file, marker or file list was
 * opened from it (an open just before an outage, or between two of a
 * flapping NAS's looks): local revisions never wait on the NAS, so the read
 * is answered from the record's bytes -- only when they are the version
 * opened (the same size and mtime), never a mix of two.  0 when answered. */
static int read_from_record(fuse_req_t req, struct wfs *w, struct wfs_fh *fh, size_t size,
			    off_t off)
{
	struct record_entry *re = fh->blob ? NULL : malloc(sizeof(*re));
	char rel[PATH_MAX], *mem = NULL;
	int r = -EIO;

	if (re && node_path(fh->node, rel, sizeof(rel)) == 0 &&
	    record_data_for(w, rel, re, &mem) == 0 && mem &&
	    re->data_len == (size_t)fh->nas_st.st_size &&
	    same_ts(&re->e.st.st_mtim, &fh->nas_st.st_mtim)) {
		size_t n = mem_slice(re->data_len, size, off);

		/* @mem is this call's own: replied from, not copied */
		fuse_reply_buf(req, n ? mem + off : NULL, n);
		r = 0;
	}
	free(mem);
	free(re);
	return r;
}

/* A NAS read (@n bytes from @off, at *@buf + *@skip) that came back short
 * inside the file as opened (@end): the rest up to @size or @end is read
 * on (span_nas_into); its error fails the read, and a read of no bytes
 * means the file does end there now (shrunk on the NAS since the open).
 * Returns the bytes now in *@buf (from *@skip 0), or -errno with *@buf
 * freed. */
static ssize_t nas_rest(struct wfs *w, int fd, int direct, char **buf, size_t *skip, ssize_t n,
			size_t size, off_t off, uint64_t end)
{
	size_t want = end - (uint64_t)off < size ? (size_t)(end - (uint64_t)off) : size;
	char *all = malloc(size);
	ssize_t m;

	if (all)
		memcpy(all, *buf + *skip, (size_t)n);
	free(*buf);
	*buf = all;
	*skip = 0;
	if (!all)
		return -ENOMEM;
	m = span_nas_into(w, fd, (uint64_t)off + (uint64_t)n, want - (size_t)n, !direct,
			  all + n);
	if (m < 0) {
		free(all);
		return m;
	}
	return n + m;
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
	if (n >= 0 && (size_t)n < size && (uint64_t)off + (uint64_t)n < (uint64_t)fh->nas_st.st_size)
		n = nas_rest(w, fd, direct, &buf, &skip, n, size, off,
			     (uint64_t)fh->nas_st.st_size);
	if (n < 0 && NAS_CANNOT_ANSWER(n) && read_from_record(req, w, fh, size, off) == 0)
		return;
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
	if (fd == 0) {
		fd = open_local_direct(path, direct);
		/* the file of this generation gone (removed by hand, a tmp
		 * cleaner) or unreadable: its ranges serve nothing any more */
		if (fd == -ENOENT || fd == -ENOTDIR || fd == -EIO || fd == -ELOOP)
			store_part_open_error(&w->store, fh->blob, gen, fd);
	}
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

/* What a read of @size at @off gets of a file of @fsize: counted as
 * served (the kernel asks for whole pages past the end of a small file). */
static size_t read_len(size_t size, off_t off, uint64_t fsize)
{
	if ((uint64_t)off >= fsize)
		return 0;
	return (uint64_t)off + size > fsize ? (size_t)(fsize - (uint64_t)off) : size;
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

	if (!(len = read_len(size, off, fsize)))
		return 1;
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
		reply_mem(req, fh->mem, fh->mem_len, size, off);
		return;
	}
	/* Nothing of fh may be touched after the reply: the file can be
	 * released as soon as the kernel has the bytes. */
	if (b && blob_state(b) == BLOB_LOCAL && (fd = fh_local_fd(w, fh, &direct, &gen)) >= 0) {
		uint64_t fsize = atomic_load(&b->size);

		store_note_read(&w->store, b, read_len(size, off, fsize), 1);
		r = read_local(req, fd, size, off, !direct, fsize);
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
		store_note_read(&w->store, b, read_len(size, off, atomic_load(&b->size)), 0);
	read_nas(req, w, fh, size, off);
}
