/* fh.h - an open file of the mount, as file.c (open, release) makes it
 * and read.c (the daemon's reads) reads from it. */
#ifndef WFS_FS_FH_H
#define WFS_FS_FH_H

#include "wfs.h"

#include <sys/stat.h>

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
	 * store.h), or -1; @local_failed: it could not be opened;
	 * @local_short: its last open failed for want of descriptors or
	 * memory (said in the log once, tried again at each read).  Copies of
	 * earlier generations stay open until release in @local_old, as a
	 * read in flight may use them. */
	int local_fd, local_direct;
	unsigned local_gen;
	int local_failed, local_short;
	int local_old[FH_OLD_FDS];
	/* FH: the partial copy (partread.h), of generation @part_gen; those
	 * of earlier generations stay open until release, as a read in
	 * flight may use them */
	int part_fd, part_direct;
	unsigned part_gen;
	int part_old[FH_OLD_FDS];
	char *mem;                  /* OPEN: a refs file, marker or file list opened
				     * while the NAS was down: its bytes, from the
				     * local record */
	size_t mem_len;             /* OPEN */
	unsigned bytes_gen; /* OPEN: the blob's bytes_gen (store.h) once the open's
			     * sides were checked: a backing it registers holds
			     * those bytes */
	/* OPEN: the size and mtime the open was answered with, when the NAS
	 * could not be asked (@shown_set): a NAS file opened later for it
	 * must be that file (fh_nas_fd), or its bytes would mix with the
	 * ones read before */
	struct stat shown;
	int shown_set;
	int shown_not; /* FH: the NAS file was found another: said once */
	int backing_id; /* OPEN: > 0: the kernel reads the local copy itself */
	int backing_nas; /* OPEN: ... or the NAS file (nas_passthrough) */
	int pt_nas_fd;  /* OPEN: the NAS file passed through, for its cache
			 * figures at release (-1 if none) */
	int counted;    /* TABLE: counted in the node's open tallies */
	int noted;      /* OPEN: store_note_open() was called: store_note_close() is due */
	struct wfs_fh *open_prev, *open_next; /* TABLE: on w->open_fhs until freed */
};

/* Free the opens the kernel never released: a stop with files open (a
 * SIGTERM, an unmount the kernel made lazy) sends no RELEASE.  Once no
 * request can come (the session's workers and rings ended): their memory
 * only, their descriptors left to the process's exit (a NAS thread may
 * still be in a read of one, past its deadline). */
void fh_free_left(struct wfs *w);

/* Open a local copy with O_DIRECT where its filesystem allows it
 * (*@direct says): the descriptor, or -errno. */
int open_local_direct(const char *path, int *direct);
/* The open's NAS descriptor, opened now if it could not be at open:
 * the descriptor (the open's: not to be closed), or -errno. */
int fh_nas_fd(struct wfs *w, struct wfs_fh *fh, int *direct);
/* A free place in @old (FH_OLD_FDS of them), or -1. */
int old_fd_slot(const int *old);
/* The blob's verified local copy, opened once per copy generation (*@gen):
 * the descriptor (the open's), or -errno. */
int fh_local_fd(struct wfs *w, struct wfs_fh *fh, int *direct, unsigned *gen);

#endif
