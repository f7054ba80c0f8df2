/* node.h - the daemon's inode table.
 *
 * A node is what the kernel holds a FUSE node id for.  Files are keyed by
 * the NAS file they resolve to, so two names that reach the same NAS file
 * are one node (one blob, one st_ino); directories and links are keyed by
 * their path.  Node ids are the node's address, as in passthrough_ll.
 */
#ifndef WFS_NODE_H
#define WFS_NODE_H

#include "ns.h"
#include "store.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>

struct node {
	struct node *hnext;
	char *key;
	uint64_t nlookup;
	uint64_t serial;  /* st_ino shown: the NAS inode of the key object, so
			   * readdir's d_ino and stat agree */
	enum ns_kind kind;
	char *rel;        /* DIR/LINK: the path; FILE: the first name it was seen by */
	char *backing;    /* FILE: physical NAS path */
	char *target;     /* LINK: readlink text */
	char *blob_id;    /* FILE: the repo's name for it (set once), or NULL */
	struct stat st;   /* last attributes presented */
	int cache_ok;     /* FILE: size and mtime unchanged since the last open */
	struct blob *blob; /* FILE: the blob (never freed while mounted) */
	/* Open tallies (under the table lock): the kernel wants all opens of
	 * an inode alike, passthrough with one backing id or daemon-served. */
	int pt_opens, daemon_opens, backing_id;
	uint64_t daemon_reads; /* READ requests we served (atomic) */
};

struct node_table {
	pthread_mutex_t lock;
	struct node **buckets;
	size_t nbuckets, count;
	struct node *root;
};

int node_table_init(struct node_table *t, const struct ns_entry *root_entry);
void node_table_destroy(struct node_table *t);

/* Find or create the node for @rel classified as @e, take one lookup
 * reference, refresh its attributes.  Returns NULL with errno set. */
struct node *node_get(struct node_table *t, const char *rel, const struct ns_entry *e);

/* Drop @n lookups; frees the node at zero (never the root). */
void node_forget(struct node_table *t, struct node *n, uint64_t nlookup);

/* Copy a node's attributes under the table lock. */
void node_attr(struct node_table *t, struct node *n, struct stat *st);

#endif
