/* collect.h - the blobs under a mount-relative path.
 *
 * A repo, a revision, a directory or a file of the mount stands for every
 * blob it is or contains: files, snapshot links resolved to their blobs,
 * everything under a directory.  wfsctl's commands (through the control
 * server) and the store's own policy thread (hot shards, ref pins) both
 * work on such sets.  Paths are walked physically on the NAS: directories
 * found by readdir, never through a link.
 */
#ifndef WFS_COLLECT_H
#define WFS_COLLECT_H

#include "ns.h"
#include "policy.h"
#include "resolve.h"
#include "store.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct blob_set {
	struct blob **v;
	const char **glob; /* per blob: the exclusion glob one of its names matched, or NULL */
	char **name;       /* per blob: that name (malloc'ed), or NULL */
	size_t n, cap;
};

/* Call @fn for each file under @rel (or @rel itself): regular files and
 * links resolved to files, with the mount-relative name and the
 * classification.  Directory walks leave out what is not weight data
 * (see hub_holds_weights); links to directories are not followed.
 * @strict: an entry the NAS fails to answer for (EIO, ENOTCONN, ...)
 * stops the walk with that error (NS_WALK_STRICT), for callers that act
 * on the set (copy, evict, pin, exclude); else it is skipped (status, a
 * best effort).  @fn returns 0 to go on, < 0 to stop with that error,
 * > 0 to stop with 0.  Returns 0 or -errno (-ENOENT: @rel does not exist
 * or is hidden). */
int collect_walk(const struct hub_roots *roots, const char *rel, int strict,
		 int (*fn)(void *arg, const char *rel, const struct ns_entry *e), void *arg);

/* Add every blob under @rel to @set (blobs created in the store as
 * needed), noting for each whether a name it was found by matches an
 * exclusion glob of @pol (may be NULL) -- for a blob found by its
 * "<repo>/blobs/<id>" name, any of its snapshot names (a walk of the
 * repo's snapshots: collect_snapshot_names).  -EMEDIUMTYPE: @rel is not
 * weight data (a ref, a marker, a client's file): it is always read from
 * the NAS; -ENOENT: @rel is not there (whatever its name says). */
int collect(const struct hub_roots *roots, struct store *s, const struct policy_opts *pol,
	    const char *rel, struct blob_set *set);

/* Every snapshot name of @repo's files, by the NAS file it resolves to:
 * @map (a JSON object) gets, for each NAS key, an array of the
 * mount-relative names (strings of bytes: NAS names need not be UTF-8, so
 * the map is not for serialising).  One walk of "<repo>/snapshots", at
 * most @max names: a repo with more is -E2BIG (an exclusion glob may speak
 * of a name past them).  Returns the number of names, or -errno (none: 0). */
#define COLLECT_NAMES_MAX 200000
int collect_snapshot_names(const struct hub_roots *roots, const char *repo, json_t *map,
			   size_t max);

/* A file under a path that the store has no blob for (collect_peek): what
 * a read-only request reports of it, from the NAS.  Until a request that
 * may change state (or an open) creates its blob, it is simply on the NAS. */
struct nas_file {
	char *key;         /* physical NAS path: the key its blob would get */
	char *id;          /* the repo's name for it ("" if none) */
	uint64_t size;     /* as the NAS shows it */
	const char *glob;  /* as in blob_set */
	char *name;        /* as in blob_set: malloc'ed, only with @glob */
};

struct nas_set {
	struct nas_file *v;
	size_t n, cap;
};

/* collect() for requests that must not change the store, status and dry
 * runs (open to every local user): nothing is created.  Files the store
 * knows (store_find) go to @known as collect() would add them, the others
 * to @unknown.  A file may show up in both only if something else creates
 * its blob meanwhile.  Returns as collect(). */
int collect_peek(const struct hub_roots *roots, struct store *s, const struct policy_opts *pol,
		 const char *rel, struct blob_set *known, struct nas_set *unknown);

/* collect_peek's step for one file a walk found (collect_walk's @fn gets
 * @rel and @e): its blob to @known if the store knows it, else the file to
 * @unknown, each with the exclusion glob of @pol (may be NULL) @rel
 * matches.  For a caller that sorts what one walk finds into several sets (status:
 * a repo and each of its revisions); the blob-name exclusions collect_peek
 * adds for a walk of "<repo>/blobs" are not looked at.  0 or -ENOMEM. */
int collect_peek_file(struct store *s, const struct policy_opts *pol, const char *rel,
		      const struct ns_entry *e, struct blob_set *known, struct nas_set *unknown);

/* Sort by key and drop duplicates, keeping an exclusion any name matched. */
void nas_set_unique(struct nas_set *set);
void nas_set_clear(struct nas_set *set); /* empty, keep the memory */
void nas_set_free(struct nas_set *set);

/* Sort by blob and drop duplicates (two names of one NAS file are one
 * blob), keeping an exclusion any of its names matched. */
void blob_set_unique(struct blob_set *set);
int blob_set_add(struct blob_set *set, struct blob *b);
void blob_set_clear(struct blob_set *set); /* empty, keep the memory */
void blob_set_free(struct blob_set *set);
int blob_set_has(const struct blob_set *set, const struct blob *b); /* after _unique */

#endif
