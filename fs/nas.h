/* nas.h - the NAS calls of FUSE requests, each run through the gate
 * (core/nasgate.h) so a request waits at most nas_timeout, and the answers
 * the local record gives when the NAS cannot.
 *
 * Every function here returns what the NAS said (0, or -errno such as
 * -ENOENT), or NAS_CANNOT_ANSWER(r) is true: the NAS is down or the call
 * passed its deadline.  Only then may the caller answer from the record:
 * while the NAS answers, it is the truth.
 *
 * A call that passes its deadline keeps running on its NAS thread with a
 * copy of its arguments and its own buffers; its result is dropped.  A
 * read's descriptor may meanwhile be closed (and its number reused) by a
 * release: the late read then reads another file into a buffer nobody
 * looks at -- read-only, harmless.
 */
#ifndef WFS_FS_NAS_H
#define WFS_FS_NAS_H

#include "wfs.h"

#include <errno.h>
#include <sys/statvfs.h>

#define NAS_CANNOT_ANSWER(r) nas_cannot_answer(r)

/* One name of a NAS directory listing. */
struct dir_entry {
	char *name;
	ino_t nas_ino;
	mode_t type;   /* S_IFMT bits, 0 when the NAS did not say */
};

int nas_classify(struct wfs *w, const char *rel, struct ns_entry *out);
/* Classify @n names of the directory @dir_rel in one NAS call (a
 * READDIRPLUS batch; ns_classify_in): 0 with @out holding each name's
 * result (ns_batch_get), or the call's error (the NAS could not answer,
 * ENOMEM). */
int nas_classify_batch(struct wfs *w, const char *dir_rel, const char *const *names, size_t n,
		       struct ns_batch *out);
/* A link the NAS shows dangling (@ent, classified at @rel) where the local
 * record has a file -- or a link to one -- whose source lies in a further
 * root (-o root=DIR) that is empty or missing (its filesystem not mounted,
 * the mount point seen instead): -ENOLINK, and the record answers for it,
 * as for a NAS that is down, so the local copy keeps serving.  Else 0 (the
 * link is shown as the NAS shows it).  A NAS call when it looks. */
int nas_dangling_or(struct wfs *w, const char *rel, const struct ns_entry *ent);
/* lstat the physical NAS path @path following no link in any component
 * (nasopen.h): a link at @path gives its own attributes, one above it
 * -ELOOP (or -ENOTDIR). */
int nas_stat(struct wfs *w, const char *path, struct stat *st);
int nas_statvfs(struct wfs *w, struct statvfs *sv);
/* The directory @path's entries but "." and "..": *@ents malloc'ed. */
int nas_list(struct wfs *w, const char *path, struct dir_entry **ents, size_t *n);
void dir_entries_free(struct dir_entry *ents, size_t n);
/* Open the NAS file @path for reading (nasopen.h's rules), with O_DIRECT
 * where its filesystem allows it (*@direct says), and fstat it.  Returns
 * the descriptor. */
int nas_open_file(struct wfs *w, const char *path, int *direct, struct stat *st);
/* The same without O_DIRECT: a backing file for the kernel's passthrough,
 * read through the NAS file's page cache. */
int nas_open_buffered(struct wfs *w, const char *path, struct stat *st);
/* Did a read on a descriptor fail as one of a NAS mount since gone does
 * (an error meaning unreachable, or ESTALE; not the gate's deadline or
 * refusal: the NAS is down then)?  The caller may open it again. */
static inline int nas_fd_died(ssize_t r)
{
	return r == -ESTALE || (nas_gate_unavailable((int)r) && r != -ETIMEDOUT && r != -EHOSTDOWN);
}

/* Open @path again for a reader whose descriptor of it died with its
 * mount (a NAS client restarted): the descriptor, or -ESTALE when the file
 * there now is not the one @was describes (inode, size, mtime, ctime), so
 * an open never mixes the bytes of two files. */
int nas_reopen_same(struct wfs *w, const char *path, const struct stat *was, int *direct);
/* pread @len bytes at @off (both multiples of 4096 when @direct) into a
 * buffer of the call's: on success *@buf (free() it) holds the bytes read
 * (the return value, maybe short).  An error meaning unreachable does not
 * mark the NAS down by itself (nas_call_on_fd): @fd may be of a mount
 * since gone. */
ssize_t nas_pread(struct wfs *w, int fd, size_t len, off_t off, int drop, void **buf);

/* From the record: the entry for @rel (0 or -EIO: the NAS is needed and
 * cannot answer), counted as answered from the record. */
int record_entry_for(struct wfs *w, const char *rel, struct record_entry *out);
/* The same, with the bytes it keeps (a refs file, marker or file list) in
 * a malloc'ed *@data (NULL: none kept).  0, -EIO, or -ENOMEM. */
int record_data_for(struct wfs *w, const char *rel, struct record_entry *out, char **data);

#endif
