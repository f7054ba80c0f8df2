/* faultfs.h - what the FUSE side of faultfs (faultfs.c) and its control
 * socket (control.c) and its writable mode (rw.c) share: the faults in
 * force, their counters, the nodes. */
#ifndef FAULTFS_H
#define FAULTFS_H

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif

#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#define MAX_EIO 64

enum mode { MODE_OK, MODE_HANG, MODE_FAIL };

/* Reads of [off, off+len) of the source file (dev, ino) fail with EIO; or,
 * a cut, the next read that starts before off and reaches past it returns
 * only the bytes before off (a short read inside the file), once. */
struct eio_range {
	dev_t dev;
	ino_t ino;
	uint64_t off, len;
	int cut;
};

struct faults {
	pthread_mutex_t lock;
	pthread_cond_t cond;     /* mode, faildir or latency changed, an interrupt */
	enum mode mode;          /* LOCK (all below too) */
	int err;                 /* errno of MODE_FAIL */
	unsigned latency_ms;
	int notype;              /* listings give no entry types (DT_UNKNOWN) */
	int closes;              /* FLUSH (a file's close) is a call: hung, failed */
	unsigned hung;           /* calls waiting in MODE_HANG now */
	unsigned hung_reads;     /* of them, READs */
	uint64_t calls, reads, read_bytes, writes, write_bytes;
	unsigned n_eio;
	struct eio_range eio[MAX_EIO];
	/* `faildir`: lookups in, and listings of, the source directory
	 * (dev, ino) fail with faildir_err (0: none), or block while it is
	 * FAILDIR_HANG (one directory of the NAS frozen, the rest answering) */
	dev_t faildir_dev;
	ino_t faildir_ino;
	int faildir_err;
};

#define FAILDIR_HANG (-1)

extern struct faults g;   /* faultfs.c */
extern int rw;            /* faultfs.c: --rw (existing regular files writable) */

/* faultfs.c: 0, or the -errno the call must fail with (it waits first, as
 * the faults in force say).  @is_read: a READ, counted in hung_reads while
 * it hangs (a test can tell a copy's read blocked from any other call). */
int gate(fuse_req_t req, int is_read);

/* faultfs.c: 0, or the -errno of `faildir` for a lookup in, or a listing
 * of, the directory @ino (after blocking, for `faildir REL hang`). */
int dir_fault(fuse_req_t req, fuse_ino_t ino);

/* ranges.c, on the source file (@dev, @ino), under g.lock each: */
/* Does a read of [@off, @off + @size) overlap an eio range?  (Counts the
 * read.) */
int eio_hit(dev_t dev, ino_t ino, uint64_t off, uint64_t size);
/* @len bytes at @off were written: the eio ranges they cover go, those
 * they overlap shrink to the bytes not written (a disk remaps a sector
 * written; reads of it succeed again). */
void eio_written(dev_t dev, ino_t ino, uint64_t off, uint64_t len);
/* @size, or less when a cut lies inside [@off, @off + @size): the cut is
 * then used up (the read after it, from anywhere, is whole). */
size_t cut_size(dev_t dev, ino_t ino, uint64_t off, size_t size);

/* faultfs.c: the source file (its st_dev, st_ino) of @ino. */
void node_id(fuse_ino_t ino, dev_t *dev, ino_t *sino);

/* Fail the request with the gate's errno, if any, and return. */
#define GATE(req) GATE_CALL(req, 0)
#define GATE_CALL(req, is_read)                    \
	do {                                       \
		int gr_ = gate(req, is_read);      \
		if (gr_ < 0) {                     \
			fuse_reply_err(req, -gr_); \
			return;                    \
		}                                  \
	} while (0)

/* faultfs.c: the O_PATH descriptor of @ino's source; its attributes
 * (links not followed), 0 or -errno; a descriptor of it open with @flags
 * (an access mode, O_TRUNC), or -errno. */
int node_fd(fuse_ino_t ino);
int stat_fd(int fd, struct stat *st);
int node_reopen(fuse_ino_t ino, int flags);

/* rw.c: the operations --rw adds to @ops. */
void rw_ops(struct fuse_lowlevel_ops *ops);

/* control.c: bind the control socket at @path (absolute; a socket left
 * there by a killed faultfs is replaced).  0 or -errno. */
int ctl_open(const char *path);
/* Serve it on a thread of its own, never blocked by hung calls; @src_fd is
 * SRC, where `eio REL ...` looks REL up.  0 or an errno. */
int ctl_start(int src_fd);
/* Stop serving (joins the thread if started), close and unlink @path. */
void ctl_close(const char *path);

#endif
