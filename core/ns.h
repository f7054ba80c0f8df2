/* ns.h - what the mount shows for a path of the NAS hub.
 *
 * The rules of DESIGN.md "The namespace", in one function: given a
 * hub-relative path, classify it as a directory, a regular file (with the
 * physical NAS file that holds its bytes) or a symlink (with the text to
 * show).  Knows nothing of FUSE.
 */
#ifndef WFS_NS_H
#define WFS_NS_H

#include "resolve.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <sys/stat.h>

enum ns_kind { NS_DIR = 1, NS_FILE, NS_LINK };

/* Why a link is shown verbatim instead of being resolved. */
enum ns_link_state {
	NS_LINK_RESOLVED = 0, /* rewritten to a relative link inside the mount */
	NS_LINK_DANGLING,
	NS_LINK_LOOP,
	NS_LINK_ESCAPE,
	NS_LINK_FOREIGN, /* into an extra root: to a directory, or (backing set)
			  * to a file past one not every class may search
			  * (hub_res.closed): shown as on the NAS, absolute */
};

struct ns_entry {
	enum ns_kind kind;
	enum ns_link_state link_state;
	struct stat st;             /* attributes to present (no write bits) */
	char backing[PATH_MAX];     /* FILE: physical path of the bytes; DIR: NAS path */
	char target[PATH_MAX];      /* LINK: the readlink text */
	char blob_id[NAME_MAX + 1]; /* the repo blob this entry is, or links to; else "" */
	/* A FILE, or a LINK that resolves to one: the backing file's own
	 * attributes as the classification read them (a walk's consumer
	 * needs no second stat of @backing); 0 when not read (ns_batch_get) */
	int has_backing_st;
	struct stat backing_st;
};

/* Classify @rel ("" is the root).  Returns 0, -ENOENT for names that do not
 * exist or that the mount hides (fifos, sockets, devices), or -errno. */
int ns_classify(const struct hub_roots *roots, const char *rel, struct ns_entry *out);

/* ns_classify() of @rel (physical: no ".", ".." or link in it) in the
 * directory above it as it is now, opened with no link followed
 * (ns_dir_open): ns_classify() takes the directories above @rel to be the
 * directories they were when @rel was found, and a directory the NAS has
 * since swapped for a link would be followed out of NAS_HUB by its lstat.
 * A parent that is a link now, or no longer a directory, answers -ESTALE
 * (the caller's path is out of date); else what ns_classify() answers. */
int ns_classify_beneath(const struct hub_roots *roots, const char *rel, struct ns_entry *out);

/* ns_dir_open()'s error @r for a directory the caller found before: one
 * that is a link now, or no longer a directory, is -ESTALE (its names are
 * never looked up through it); any other as it is. */
static inline int ns_dir_stale(int r)
{
	return r == -ELOOP || r == -ENOTDIR ? -ESTALE : r;
}

const char *ns_link_state_name(enum ns_link_state s);

/* The entries of one directory classified one after another (a READDIRPLUS
 * batch), each exactly as ns_classify() would, but by descriptor: the
 * directory is opened once (nas_open: no link in any component), each name
 * looked at with fstatat/readlinkat in it, and a snapshot link of the shape
 * huggingface_hub writes ("../../blobs/<id>", a regular file there) resolved
 * in its repo's blobs/, opened once too.  Any other link takes
 * ns_classify()'s walk. */
struct ns_dir {
	const struct hub_roots *roots;
	int fd;                    /* the directory */
	int blobs_fd, blobs_tried; /* its repo's blobs/, opened at the first such link */
	char rel[PATH_MAX];        /* the directory, relative to root 0 */
	char blobs_rel[PATH_MAX];
};

/* Open the directory @rel ("" the root; may be d->rel).  Returns 0 or
 * nas_open()'s -errno; ns_dir_close() in both cases. */
int ns_dir_open(struct ns_dir *d, const struct hub_roots *roots, const char *rel);
void ns_dir_close(struct ns_dir *d);
/* Classify the entry @name (one component) of @d: what ns_classify() of
 * "<rel>/<name>" returns. */
int ns_classify_in(struct ns_dir *d, const char *name, struct ns_entry *out);

/* Classified entries kept compactly, for a READDIRPLUS reply's worth of
 * them: as ns_entry each would take 8.5 KiB (two PATH_MAX buffers), 1.3 MiB
 * for a 32 KiB reply, and every thread's malloc arena would keep such
 * blocks after a tree walk.  Here an entry is its attributes and its
 * strings, packed. */
struct ns_batch_item;
struct ns_batch {
	size_t n, cap;
	struct ns_batch_item *items;
	char *strs;            /* each entry's backing, target and blob_id, '\0'-ended */
	size_t len, strs_cap;
};

/* Append @res (0 or ns_classify's -errno) and, when it is 0, @e.  Returns
 * 0 or -ENOMEM (the batch is unchanged then). */
int ns_batch_add(struct ns_batch *b, int res, const struct ns_entry *e);
/* Entry @i (< b->n): returns its res; when that is 0, @out holds the entry. */
int ns_batch_get(const struct ns_batch *b, size_t i, struct ns_entry *out);
/* Free what the batch holds and empty it (a zeroed batch is empty). */
void ns_batch_free(struct ns_batch *b);

/* The one tree walker: call @fn for @rel and every entry under it, parents
 * before children, with the entry's classification (@fn must copy what it
 * keeps).  Directories are listed physically on the NAS and walked by
 * readdir, never through a link, at most NS_WALK_DEPTH deep.  With
 * NS_WALK_WEIGHTS, names that cannot hold weight data (hub_holds_weights)
 * are skipped.  @fn returns 0 to go on, < 0 to stop with that error, > 0 to
 * stop with 0.  A path from a client must not reach through a link the
 * namespace would not follow: @rel's parents are checked first.  Returns 0
 * or -errno (-ENOENT: @rel does not exist or is hidden).
 *
 * An entry below @rel that cannot be classified or listed is skipped and
 * the walk goes on (it vanished, is hidden, or is not ours to read).  With
 * NS_WALK_STRICT only such errors are skipped (ENOENT, EACCES, EPERM,
 * ELOOP, ENAMETOOLONG); any other -- a NAS failing mid-walk: ENOTCONN,
 * EIO, ... -- stops the walk with it, for a caller that must not take a
 * listing with holes for the whole tree (the store's record).  A readdir
 * that fails part way stops the walk in every mode. */
#define NS_WALK_WEIGHTS 1
#define NS_WALK_STRICT 2
#define NS_WALK_DEPTH 64
int ns_walk(const struct hub_roots *roots, const char *rel, int flags,
	    int (*fn)(void *arg, const char *rel, const struct ns_entry *e), void *arg);

#endif
