/* record_int.h - what record.c (the table, the build, the thread) and
 * record_table.c (the table and its readers) and record_file.c
 * (record.json) share; not for other modules.
 */
#ifndef WFS_RECORD_INT_H
#define WFS_RECORD_INT_H

#include "htab.h"
#include "record.h"

#include <stdint.h>

/* One recorded name.  A node belongs to one table (or one build) and is
 * never changed once the table is published: readers copy under
 * record.lock, a rebuild makes new nodes. */
struct rnode {
	struct hlink hl;             /* in the table, by path_hash(path) */
	char *path;                  /* relative, normalised; "" is the root */
	const char *name;            /* the last component of @path */
	enum ns_kind kind;
	enum ns_link_state link_state;
	struct stat st;
	char *backing, *target, *blob_id; /* NULL: none */
	char *data;                  /* a refs file's, marker's or file list's bytes (@has_data) */
	size_t data_len;
	int has_data;
	/* A refs file held back (record_refs.c): @data names the revision the
	 * record shows while the NAS is down, these bytes the one the NAS
	 * named, not all local; NULL: not held. */
	char *nas_data;
	size_t nas_data_len;
	int keep;                    /* the build: kept (record.h says what is) */
	int full;                    /* the build: a FILE wholly local (no mere ranges), or a
				      * kept LINK leading to one or to a kept directory */
	const char **kids;           /* DIR: the children's names (their @name), sorted */
	size_t nkids, kcap;
};

struct record_table {
	struct htab h;
	struct rnode **v;            /* every node, sorted by path (parents first) */
	size_t n;
	uint64_t files;              /* FILE nodes */
};

/* A growing list of nodes. */
struct rnodes {
	struct rnode **v;
	size_t n, cap;
};

void record_log(struct record *r, int prio, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The most bytes of the file @path the record keeps: RECORD_MAX_TREE for a
 * revision's file list "<repo>/trees/<rev>.json", RECORD_MAX_DATA for any
 * other (record.c). */
size_t record_data_max(const char *path);

void rnode_free(struct rnode *n);
/* Append @n (on failure @n is freed): 0 or -ENOMEM. */
int rnodes_push(struct rnodes *l, struct rnode *n);
/* Free every node of @l and the list. */
void rnodes_free(struct rnodes *l);
/* The node of @path in @h (a table's or a build's), or NULL. */
struct rnode *rnode_find(const struct htab *h, const char *path);
/* A table of the nodes of @l (taken: @l is emptied, every node is in the
 * table or freed).  Nodes are sorted by path; a second node of the same
 * path, or one whose parent is not a recorded directory (the root must be a
 * directory), is dropped and counted in *@dropped.  NULL: -ENOMEM. */
struct record_table *record_table_make(struct rnodes *l, size_t *dropped);
void record_table_free(struct record_table *t);
struct rnode *record_table_find(const struct record_table *t, const char *path);
/* A link is kept when its text, read from its directory, names a kept
 * file (itself or through further links), or (@dirs) a kept directory of
 * the link's own revision
 * (packs-latest -> packs): what a reader's resolution reaches without the
 * NAS, never leaving the revision.  Returns 1 when @dirs kept it.
 * (record.c, after the walks) */
int record_keep_link(const struct htab *h, struct rnode *n, int dirs);

/* ---- record_file.c ---- */

/* record.json's text for @t (version, nas, @built, entries), *@len its
 * length.  NULL: -ENOMEM. */
char *record_text(const struct record_table *t, const char *nas, int64_t built, size_t *len);
/* The same written to @path (durable.h: durable_replace's steps) as it is
 * made: 0, -EFBIG (over RECORD_MAX_BYTES: @path untouched), -errno. */
int record_write(const char *path, const struct record_table *t, const char *nas, int64_t built);
/* A hash of what record_text writes of @t and @nas but "built" and the
 * access times (reads move them; that alone is no reason to write): the
 * table loaded from a file and the build of the same content hash equal.
 * 0 or -ENOMEM. */
int record_sig(const struct record_table *t, const char *nas, uint64_t *sig);
/* Load r->path into *@t, @nas, *@built.  Missing: an empty table.  Damaged:
 * set aside (unless read-only), logged, empty.  A newer version: left,
 * r->newer set, empty.  Entries with bad fields are skipped (one line).
 * 0 or -ENOMEM. */
int record_load(struct record *r, struct record_table **t, char *nas, size_t nsz,
		int64_t *built);

/* ---- record_side.c ---- */

/* 1 if @rel is a file under a repo's refs/: "<repo>/refs/..." */
int record_is_ref(const char *rel);

/* record_bytes.c.  The bytes of a refs file, a marker or a file list, at
 * most @max (a reader resolves "main" through refs/main; offline loading
 * asks the others), with the attributes of the file they were read from (not the
 * walk's: a file rewritten in between would pair its old mtime with the
 * new bytes, and a reader that opened the old one would get them).  0
 * with them in @n, 1 when the file is not one to keep any more (gone,
 * swapped for a link or a directory, unreadable to us), 2 when it is over
 * @max (never served cut short), or -errno of the NAS (-EAGAIN: it was
 * being rewritten at each of three reads; the build is made again).  A
 * refs file found empty is read again too, and kept empty only if it is
 * so at each read. */
int record_read_bytes(const struct hub_roots *roots, struct rnode *n, size_t max);

/* The files of a repo that belong to one of its revisions without being
 * in its snapshot: a marker "<repo>/.no_exist/<rev>/<path>"
 * (huggingface_hub: <path> does not exist at <rev>) and the revision's file
 * list "<repo>/trees/<rev>.json". */
enum side { SIDE_NONE, SIDE_MARKER, SIDE_TREE };

/* Which of them @rel is, with its revision's directory
 * "<repo>/snapshots/<rev>" in @out. */
enum side record_side_of(const char *rel, char *out, size_t sz);

/* The most bytes a kept file of side @k keeps: the loader and the
 * builder both ask here, so the two never disagree. */
size_t record_side_max(enum side k);

/* ---- record_refs.c ---- */

/* The revisions a build found not wholly local: "<repo>/snapshots/<rev>". */
struct revs {
	char **v;
	size_t n, cap;
};

/* @rel, an entry of a build under "<repo>/snapshots/<rev>/", is not
 * wholly local: its revision is noted -- unless an exclusion glob of @pol
 * keeps @rel on the NAS (a ref pin settles without it too: pins.h).
 * 0 or -ENOMEM. */
int revs_note(struct revs *l, const char *rel, const struct policy_opts *pol);
void revs_free(struct revs *l);
/* After a build's keep decisions (@h, @all: its nodes by path, and all of
 * them; @partial: what revs_note was told): every kept refs file that
 * names a revision not wholly local, where the record's current table
 * shows that ref at a revision that is, is held back at the current
 * table's bytes and attributes (record.h).  @note gets a log line for each
 * (said once by the caller).  0 or -ENOMEM. */
int record_hold_refs(struct record *r, const struct htab *h, const struct rnodes *all,
		     struct revs *partial, const struct policy_opts *pol,
		     int (*note)(void *arg, const char *line), void *arg);

#endif
