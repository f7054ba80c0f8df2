/* partread.h - a read of a file with local ranges (core/store_part.c):
 * the bytes inside verified ranges from the partial copy, the rest from
 * the NAS, assembled into one reply -- also when the read straddles a
 * range's edge, so a reader (and mmap, whose page faults are READs like
 * any other) never sees where the edge is.
 *
 * The kernel cannot pass such a file through (passthrough needs one whole
 * backing file), so these reads are always the daemon's.  The NAS parts
 * go through the gate (nas.h: a deadline; EIO when the NAS cannot answer),
 * the local parts never wait on it.
 */
#ifndef WFS_FS_PARTREAD_H
#define WFS_FS_PARTREAD_H

#include "wfs.h"

#include <sys/types.h>

/* The sides of one read: descriptors the caller owns (and keeps open for
 * the call); @nas_fd < 0 when the NAS side could not be opened (a read
 * that needs it gets EIO). */
struct part_src {
	int local_fd, local_direct;
	int nas_fd, nas_direct;
};

/* Every daemon-served read (file.c's too) goes through these: the block-
 * aligned span around [@off, @off + @len) read into an aligned buffer of
 * its own (O_DIRECT needs one), from the local file @fd or, through the
 * gate, from the NAS file @fd.  Each returns how many bytes from @off on
 * it holds (at most @len; fewer at the end of the file), at *@buf (free it)
 * + *@skip, or -errno (the NAS's as nas_pread gives it).  @drop: drop the
 * pages read (a buffered descriptor: the FUSE inode's cache is the one
 * copy). */
ssize_t span_local(int fd, uint64_t off, size_t len, int drop, char **buf, size_t *skip);
ssize_t span_nas(struct wfs *w, int fd, uint64_t off, size_t len, int drop, char **buf,
		 size_t *skip);
/* Bytes [@off, @off + @len) of the NAS file @fd into @dst, read on where a
 * read comes back short inside the file (an NFS read of several RPCs whose
 * later one failed, a NAS client that splits reads: replied short, the
 * kernel would take it for the file's end).  Returns the bytes got, fewer
 * than @len only where a read got none (the file ends there), or -errno
 * of the read that failed. */
ssize_t span_nas_into(struct wfs *w, int fd, uint64_t off, size_t len, int drop, char *dst);

/* Fill @out with bytes [@off, @off + @len) of the file (@len already cut
 * at its end): the parts @segs (sorted, inside the read: store_part_plan)
 * from @src->local_fd, the others from the NAS.  Returns 0, or -errno:
 * -EIO for a local read error is returned as -EUCLEAN (the partial copy
 * is bad: the caller drops it and reads the NAS), a NAS error as such. */
int part_read(struct wfs *w, const struct part_src *src, const struct brange *segs,
	      size_t nseg, char *out, uint64_t off, size_t len);

#endif
