/* node.h - the daemon's inode table.
 *
 * A node is what the kernel holds a FUSE node id for.  Files are keyed by
 * the NAS file they resolve to (device and inode), so two names that reach
 * the same NAS file are one node (one blob, one st_ino); directories and
 * links are keyed by their parent node and name.  Node ids are the node's
 * address, as in passthrough_ll.
 *
 * Memory is what limits a large hub (the kernel may hold a node for every
 * entry), so a node keeps its name, not its path: the path is rebuilt from
 * the parent chain (a node holds a reference on its parent), the NAS path
 * of a file only when it differs from NAS_HUB/<path>, and its attributes
 * without the fields a stat of ours never shows.
 */
#ifndef WFS_NODE_H
#define WFS_NODE_H

#include "htab.h"
#include "ns.h"
#include "store.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>

/* The attributes shown for a node, from the NAS's stat. */
struct node_stat {
	uint64_t size, blocks;
	int64_t atime, mtime, ctime;
	uint32_t atime_ns, mtime_ns, ctime_ns;
	uint32_t mode, nlink, uid, gid, blksize;
};

/* Who may touch a field (one rule each):
 *   IMMUTABLE  set before the node is in the table, never changed;
 *   TABLE      read and written under node_table.lock only;
 *   ATOMIC     goes from 0 to its one value (never back) by release
 *              stores, read with acquire loads; no lock (two racing
 *              setters store the same value);
 *   COUNTER    relaxed atomic adds and loads: it orders nothing. */
struct node {
	struct hlink hl;      /* TABLE: in the table (core/htab.h) */
	struct node *parent;  /* IMMUTABLE: referenced; NULL for the root */
	uint64_t nlookup;     /* TABLE: the kernel's lookups */
	union {
		uint32_t children;    /* TABLE: DIR: nodes whose parent this is */
		uint32_t backing_gen; /* TABLE: FILE: its blob's bytes_gen (store.h) when
				       * backing_id was registered */
	};
	uint8_t kind;         /* IMMUTABLE: enum ns_kind */
	uint8_t weights;      /* ATOMIC: FILE: reached by a name that may be copied
			       * (hub_holds_weights), under any of its names */
	uint8_t record_listed; /* ATOMIC: DIR: listed from the record once
				* (fs/dir.c): an overflowed invalidation queue
				* must not forget it (main.c) */
	/* TABLE, bit-fields of one byte (every writer holds the lock): */
	uint8_t cache_ok : 1;    /* FILE: size, mtime and ctime unchanged since the last open */
	uint8_t own_id : 1;      /* blob_id is malloc'ed, not inside name */
	uint8_t backing_nas : 1; /* the backing id is the NAS file's (nas_passthrough) */
	uint64_t dev;         /* IMMUTABLE: FILE: the key object's device */
	uint64_t serial;      /* TABLE: st_ino shown: the NAS inode of the key object,
			       * so readdir's d_ino and stat agree (a directory's
			       * changes when the NAS replaces it) */
	char *aux;            /* TABLE: FILE: NAS path when not NAS_HUB/<path>;
			       * LINK: link text */
	const char *blob_id;  /* ATOMIC: FILE: the repo's name for it, or NULL */
	struct blob *blob;    /* ATOMIC: FILE: the blob (never freed while mounted) */
	/* TABLE: open tallies: the kernel wants all opens of an inode alike,
	 * passthrough with one backing id or daemon-served. */
	int pt_opens, daemon_opens, backing_id;
	uint32_t st_read;     /* TABLE: when st was read (NODE_TICKS_PER_S ticks) */
	uint64_t daemon_reads; /* COUNTER: READ requests we served */
	struct node_stat st;  /* TABLE: last attributes presented */
	char name[];          /* IMMUTABLE: its name in the parent (FILE: the first seen) */
};
/* With the table lock held: does @n have passthrough opens whose backing
 * may no longer hold its blob's bytes (a copy demoted, a NAS file replaced
 * since it was registered)?  No open may join them, and the kernel takes
 * no other kind of open of an inode with passthrough opens: such a node
 * serves no new open (fs/file.c) and takes no new lookup (node_get). */
static inline int node_backing_stale_locked(const struct node *n)
{
	struct blob *b = __atomic_load_n(&n->blob, __ATOMIC_ACQUIRE);

	return n->kind == NS_FILE && n->pt_opens > 0 && b && n->backing_gen != blob_bytes_gen(b);
}

/* The clock of st_read: node_attr_fresh() allows two ticks of slack (the
 * rounding, and a batch classified ahead; fs/dir.c). */
#define NODE_TICKS_PER_S 64u

/* A node is the daemon's memory per entry the kernel holds (a tree walk of
 * 200k entries makes 200k): at 176 bytes, one with a 64-character blob name
 * takes a 256-byte malloc chunk, not 272. */
_Static_assert(sizeof(void *) != 8 || sizeof(struct node) == 176, "struct node grew");

struct node_table {
	pthread_mutex_t lock;
	struct htab nodes;    /* TABLE: every node but the root */
	struct node *root;    /* IMMUTABLE after node_table_init */
	const char *nas;      /* IMMUTABLE: NAS_HUB: file paths are stored relative to it */
	uint64_t dev;         /* IMMUTABLE: NAS_HUB's st_dev (node_shown_ino) */
	/* SET-UP (may be NULL): kept equal to the nodes' count, for the
	 * metrics (a reference the kernel never returns shows there) */
	_Atomic uint64_t *count;
};

int node_table_init(struct node_table *t, const char *nas, const struct ns_entry *root_entry);
void node_table_destroy(struct node_table *t);

/* Find or create the node for @name in @parent, classified as @e, take one
 * lookup reference, refresh its attributes.  @weights: this name may be
 * copied (hub_holds_weights).  Returns NULL with errno set. */
struct node *node_get(struct node_table *t, struct node *parent, const char *name,
		      const struct ns_entry *e, int weights);

/* Drop @n lookups; frees the node (and parents left unused) at zero. */
void node_forget(struct node_table *t, struct node *n, uint64_t nlookup);

/* The node's mount-relative path ("" for the root); -ENAMETOOLONG. */
int node_path(const struct node *n, char *buf, size_t sz);

/* FILE: the NAS path it reads (under the table lock). */
void node_backing(struct node_table *t, const struct node *n, char *buf, size_t sz);

/* LINK: the link text shown (under the table lock). */
void node_target(struct node_table *t, const struct node *n, char *buf, size_t sz);

/* The st_ino shown for a NAS object of attributes @st: its own inode
 * number on NAS_HUB's filesystem; on another (a root= directory, a mount
 * below NAS_HUB) one mixed with its device, since the mount shows one
 * st_dev for all and two files must not share an st_ino. */
uint64_t node_shown_ino(const struct node_table *t, const struct stat *st);

/* An open of FILE @n found @st (the NAS file it opened) another file than
 * the one @n was made for: the name was replaced on the NAS (renamed
 * over) since the kernel looked it up.  -ESTALE then: the kernel looks the
 * name up again, to a new node and inode for the new file.  Served on @n,
 * it would share @n's page cache with opens of the old file (held ones,
 * or one racing it past this check: old bytes, or a mix), and every later
 * open of @n would differ again, its cache dropped each time.  Else 0. */
int node_open_replaced(struct node_table *t, const struct node *n, const struct stat *st);

/* The st_ino shown for @n (under the table lock). */
uint64_t node_serial(struct node_table *t, const struct node *n);

/* Copy a node's attributes under the table lock. */
void node_attr(struct node_table *t, struct node *n, struct stat *st);

/* The attributes of @n if they were read (from the NAS, or from the record
 * while it could not answer) less than @ttl seconds ago, with the rest of
 * @ttl in *@left; else -ESTALE. */
int node_attr_fresh(struct node_table *t, struct node *n, double ttl, struct stat *st,
		    double *left);
/* With the table lock held: record @st as presented (read now); returns 1
 * if size or mtime differ from what was (and clears cache_ok then). */
int node_set_stat_locked(struct node *n, const struct stat *st);

#endif
