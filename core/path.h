/* path.h - lexical path helpers and hub naming rules.
 *
 * Everything here is pure string work: nothing touches the filesystem, so the
 * namespace rules can be unit-tested without a NAS.  Functions that fail
 * return -errno (-ENAMETOOLONG when the result does not fit).
 */
#ifndef WFS_PATH_H
#define WFS_PATH_H

#include <stddef.h>
#include <stdint.h>

/* Collapse "//", "." and ".." in @in.  An absolute path stays absolute ("/.."
 * is "/").  A relative path that climbs above its start returns -EXDEV: for
 * us that always means "escapes the root".  "" and "." normalise to "". */
int path_normalize(const char *in, char *out, size_t outsz);

/* The offset in @p of its first ".." component that follows a name (a
 * component other than "." and ".."), or -1.  A link text's ".." after a
 * name cannot be taken off as text: the name may be a link, and ".." is
 * then its target's parent ("sub/../x" with sub -> elsewhere). */
long path_dotdot_after_name(const char *p);

/* If @p is @root or lies below it, return the remainder ("" or "a/b"), else
 * NULL.  Both must be normalised; @root must not end in '/' (unless "/"). */
const char *path_under(const char *root, const char *p);

/* The relative link text that, placed in directory @from_dir, reaches @to.
 * Both are normalised paths relative to the same root ("" is the root). */
int path_relative(const char *from_dir, const char *to, char *out, size_t outsz);

/* Directory part of a normalised relative path ("a/b" -> "a", "a" -> ""). */
void path_dirname(const char *p, char *out, size_t outsz);

/* A hash of a path (or any key string) for the daemon's hash tables. */
uint64_t path_hash(const char *s);

/* Join two path pieces with one '/', either may be "". */
int path_join(const char *a, const char *b, char *out, size_t outsz);

enum hub_id_kind {
	HUB_ID_NONE = 0,
	HUB_ID_SHA256 = 1, /* 64 lower-case hex: SHA-256 of the content (LFS) */
	HUB_ID_SHA1 = 2,   /* 40 lower-case hex: git blob SHA-1 */
};

/* Is @name a content address, and of which kind. */
enum hub_id_kind hub_id_kind(const char *name);

/* For a hub-relative path "<repo>/snapshots/<rev>/<path...>" store the
 * repo's blob directory ("<repo>/blobs") in @out and return 1; return 0 for
 * any other path. */
int hub_snapshot_blob_dir(const char *rel, char *out, size_t outsz);

/* Is @rel a file name inside a snapshot ("<repo>/snapshots/<rev>/<path>")? */
int hub_is_snapshot_name(const char *rel);

/* For "<repo>/blobs/<name>" return a pointer to <name>, else NULL. */
const char *hub_repo_blob_name(const char *rel);

/* Is @name (@len bytes; need not be NUL-terminated there) a repo folder's
 * name: "models--", "datasets--" or "spaces--" followed by more
 * (HUB-LAYOUT.md), at most NAME_MAX bytes?  The one rule for what a repo
 * is: where weights may be (hub_holds_weights), which repos status lists,
 * which the local record hashes and which the start-up scan walks. */
int hub_is_repo_folder(const char *name, size_t len);

/* The length of @rel's first component when it names a repo folder, else 0. */
size_t hub_repo_len(const char *rel);

/* Can @rel (mount-relative, normalised; "" is the root) be or hold weight
 * data: the root, a repo folder ("<type>s--<org>--<name>"), or anything
 * under a repo's blobs/ or snapshots/.  Everything else -- refs (they move
 * in place), .no_exist markers, trees/ file lists, .locks and top-level
 * files -- is never copied and always read from the NAS. */
int hub_holds_weights(const char *rel);

#endif
