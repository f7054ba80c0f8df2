/* node.c - the inode table; see node.h. */
#include "node.h"
#include "clock.h"
#include "path.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t mix(uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	return h;
}

static uint64_t file_hash(uint64_t dev, uint64_t ino)
{
	return mix(dev * 0x9e3779b97f4a7c15ULL ^ ino);
}

uint64_t node_shown_ino(const struct node_table *t, const struct stat *st)
{
	if ((uint64_t)st->st_dev == t->dev)
		return (uint64_t)st->st_ino;
	return file_hash((uint64_t)st->st_dev, (uint64_t)st->st_ino);
}

static uint64_t name_hash(const struct node *parent, int kind, const char *name)
{
	return mix((uint64_t)(uintptr_t)parent ^ path_hash(name) ^ (uint64_t)kind);
}

int node_path(const struct node *n, char *buf, size_t sz)
{
	size_t len = 0, at;
	const struct node *p;

	for (p = n; p->parent; p = p->parent)
		len += strlen(p->name) + (p != n);
	if (len + 1 > sz) {
		if (sz)
			buf[0] = '\0';
		return -ENAMETOOLONG;
	}
	at = len;
	buf[at] = '\0';
	for (p = n; p->parent; p = p->parent) {
		size_t l = strlen(p->name);

		if (p != n)
			buf[--at] = '/';
		at -= l;
		memcpy(buf + at, p->name, l);
	}
	return 0;
}

/* NAS_HUB/<path>: where a file's NAS path usually is. */
static int natural_backing(const struct node_table *t, const struct node *n, char *buf, size_t sz)
{
	char rel[PATH_MAX];
	int r = node_path(n, rel, sizeof(rel));

	return r < 0 ? r : path_join(t->nas, rel, buf, sz);
}

void node_backing(struct node_table *t, const struct node *n, char *buf, size_t sz)
{
	pthread_mutex_lock(&t->lock);
	if (n->aux)
		snprintf(buf, sz, "%s", n->aux);
	else if (natural_backing(t, n, buf, sz) < 0 && sz)
		buf[0] = '\0';
	pthread_mutex_unlock(&t->lock);
}

void node_target(struct node_table *t, const struct node *n, char *buf, size_t sz)
{
	pthread_mutex_lock(&t->lock);
	snprintf(buf, sz, "%s", n->aux ? n->aux : "");
	pthread_mutex_unlock(&t->lock);
}

static void put_stat(struct node_stat *s, const struct stat *st)
{
	s->size = (uint64_t)st->st_size;
	s->blocks = (uint64_t)st->st_blocks;
	s->atime = st->st_atim.tv_sec;
	s->atime_ns = (uint32_t)st->st_atim.tv_nsec;
	s->mtime = st->st_mtim.tv_sec;
	s->mtime_ns = (uint32_t)st->st_mtim.tv_nsec;
	s->ctime = st->st_ctim.tv_sec;
	s->ctime_ns = (uint32_t)st->st_ctim.tv_nsec;
	s->mode = st->st_mode & ~(mode_t)0222; /* read-only, whatever the NAS says */
	s->nlink = (uint32_t)st->st_nlink;
	s->uid = st->st_uid;
	s->gid = st->st_gid;
	s->blksize = (uint32_t)st->st_blksize; /* an I/O size hint readers use */
}

static void attr_locked(const struct node *n, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = n->serial;
	st->st_mode = n->st.mode;
	st->st_nlink = n->st.nlink;
	st->st_uid = n->st.uid;
	st->st_gid = n->st.gid;
	st->st_size = (off_t)n->st.size;
	st->st_blocks = (blkcnt_t)n->st.blocks;
	st->st_blksize = (blksize_t)n->st.blksize;
	st->st_atim.tv_sec = n->st.atime;
	st->st_atim.tv_nsec = n->st.atime_ns;
	st->st_mtim.tv_sec = n->st.mtime;
	st->st_mtim.tv_nsec = n->st.mtime_ns;
	st->st_ctim.tv_sec = n->st.ctime;
	st->st_ctim.tv_nsec = n->st.ctime_ns;
}

/* CLOCK_MONOTONIC in NODE_TICKS_PER_S ticks, mod 2^32 (it wraps after 2.1
 * years: an age is right below that, and one that is not passes for
 * fresh once at most, for at most its timeout) */
static uint32_t now_ticks(void)
{
	return (uint32_t)((uint64_t)mono_ns() / (1000000000u / NODE_TICKS_PER_S));
}

int node_attr_fresh(struct node_table *t, struct node *n, double ttl, struct stat *st,
		    double *left)
{
	double age;

	pthread_mutex_lock(&t->lock);
	/* (+2: both times were cut to a tick, so the age may be one more; and
	 * attributes from a batch classified ahead (fs/dir.c) were read up to
	 * a tick before st_read) */
	age = (double)(uint32_t)(now_ticks() - n->st_read + 2) / NODE_TICKS_PER_S;
	if (age < ttl)
		attr_locked(n, st); /* the attributes of that age, in the same hold */
	pthread_mutex_unlock(&t->lock);
	if (age >= ttl)
		return -ESTALE;
	*left = ttl - age;
	return 0;
}

/* Has @st another ctime than the one @n last saw? */
static int ctime_differs(const struct node *n, const struct stat *st)
{
	return n->st.ctime != st->st_ctim.tv_sec || n->st.ctime_ns != (uint32_t)st->st_ctim.tv_nsec;
}

int node_set_stat_locked(struct node *n, const struct stat *st)
{
	/* (the ctime too: a file replaced in place keeping its mtime -- cp -p,
	 * a tool restoring times -- shows only that) */
	int changed = n->st.size != (uint64_t)st->st_size || n->st.mtime != st->st_mtim.tv_sec ||
		      n->st.mtime_ns != (uint32_t)st->st_mtim.tv_nsec || ctime_differs(n, st);

	if (changed)
		n->cache_ok = 0;
	put_stat(&n->st, st);
	n->st_read = now_ticks();
	return changed;
}

int node_open_replaced(struct node_table *t, const struct node *n, const struct stat *st)
{
	int other;

	pthread_mutex_lock(&t->lock);
	other = n->dev != (uint64_t)st->st_dev || n->serial != node_shown_ino(t, st);
	pthread_mutex_unlock(&t->lock);
	return other ? -ESTALE : 0;
}

uint64_t node_serial(struct node_table *t, const struct node *n)
{
	uint64_t serial;

	pthread_mutex_lock(&t->lock);
	serial = n->serial;
	pthread_mutex_unlock(&t->lock);
	return serial;
}

void node_attr(struct node_table *t, struct node *n, struct stat *st)
{
	pthread_mutex_lock(&t->lock);
	attr_locked(n, st);
	pthread_mutex_unlock(&t->lock);
}

static void node_free(struct node *n)
{
	free(n->aux);
	if (n->own_id)
		free((char *)n->blob_id);
	free(n);
}


/* Replace a malloc'ed string if it changed. */
static int set_aux(struct node *n, const char *s)
{
	char *c;

	if (!s) {
		free(n->aux);
		n->aux = NULL;
		return 0;
	}
	if (n->aux && !strcmp(n->aux, s))
		return 0;
	c = strdup(s);
	if (!c)
		return -ENOMEM;
	free(n->aux);
	n->aux = c;
	return 0;
}

/* Refresh what may have changed on the NAS since the node was made. */
static int node_update(struct node_table *t, struct node *n, const struct ns_entry *e)
{
	char natural[PATH_MAX];
	int r = 0;

	if (e->kind == NS_FILE) {
		if (natural_backing(t, n, natural, sizeof(natural)) == 0 &&
		    !strcmp(natural, e->backing))
			r = set_aux(n, NULL);
		else
			r = set_aux(n, e->backing);
		/* Set once (ATOMIC): read without the lock by xattr and
		 * timeout code.  A blob's name is usually the node's own. */
		if (r == 0 && !n->blob_id && e->blob_id[0]) {
			const char *id = n->name;

			if (strcmp(id, e->blob_id)) {
				id = strdup(e->blob_id);
				n->own_id = id != NULL;
			}
			__atomic_store_n(&n->blob_id, id, __ATOMIC_RELEASE);
		}
	} else {
		if (e->kind == NS_LINK)
			r = set_aux(n, e->target);
		n->serial = node_shown_ino(t, &e->st); /* files are keyed by theirs */
	}
	if (r < 0)
		return r;
	node_set_stat_locked(n, &e->st);
	return 0;
}

static struct node *node_new(const struct node_table *t, struct node *parent, const char *name,
			     const struct ns_entry *e)
{
	size_t len = strlen(name);
	struct node *n = calloc(1, sizeof(*n) + len + 1);

	if (!n)
		return NULL;
	memcpy(n->name, name, len + 1);
	n->kind = (uint8_t)e->kind;
	n->parent = parent;
	n->dev = e->kind == NS_FILE ? (uint64_t)e->st.st_dev : 0;
	n->serial = node_shown_ino(t, &e->st);
	parent->children++;
	return n;
}

int node_table_init(struct node_table *t, const char *nas, const struct ns_entry *root_entry)
{
	memset(t, 0, sizeof(*t));
	pthread_mutex_init(&t->lock, NULL);
	t->nas = nas;
	t->dev = (uint64_t)root_entry->st.st_dev;
	t->root = calloc(1, sizeof(*t->root) + 1);
	if (htab_init(&t->nodes, 1024) < 0 || !t->root)
		return -ENOMEM;
	t->root->nlookup = 1;
	t->root->kind = NS_DIR;
	t->root->serial = node_shown_ino(t, &root_entry->st);
	return node_update(t, t->root, root_entry);
}

void node_table_destroy(struct node_table *t)
{
	for (size_t i = 0; i < t->nodes.nb; i++) {
		struct hlink *l = t->nodes.b[i], *next;

		for (; l; l = next) {
			next = l->next;
			node_free(htab_entry(l, struct node, hl));
		}
	}
	htab_free(&t->nodes);
	if (t->root)
		node_free(t->root);
	pthread_mutex_destroy(&t->lock);
}

/* A file node met under a repo blob name other than the one it was made
 * for: the NAS renamed the file, keeping its inode (a client's download
 * ends so: blobs/<id>.incomplete becomes blobs/<id>).  Its blob id and
 * blob are the old name's, and the new name's content address would go
 * unchecked; so the name gets a node of its own.  A name with no blob id,
 * a hub-level store's, shares the repo blob's node -- when it is the file
 * last seen (its ctime): else it is a file the NAS made since with the
 * inode number of the deleted blob (ext4 and XFS reuse them) while the
 * kernel still holds the blob's node, and it took the blob's id, blob and
 * long cache times with it.  So too a node with a blob but no id (a
 * snapshot's plain file, opened): a file made since on its inode number
 * took its blob, and was served from the NAS, its own copy unused, for as
 * long as the kernel kept the node. */
static int renamed_blob_locked(const struct node *n, const struct ns_entry *e)
{
	const char *id = __atomic_load_n(&n->blob_id, __ATOMIC_ACQUIRE);
	int changed = ctime_differs(n, &e->st);

	if (!id)
		return __atomic_load_n(&n->blob, __ATOMIC_ACQUIRE) && changed;
	if (e->blob_id[0])
		return strcmp(id, e->blob_id) != 0;
	return changed;
}

static int node_matches(const struct node_table *t, const struct node *n,
			const struct node *parent, const char *name, const struct ns_entry *e)
{
	if (n->kind != e->kind)
		return 0;
	/* A file node whose backing went stale is passed over: the name gets
	 * a new node, a new inode in the kernel, which new opens can use (the
	 * kernel's open(2) of a path looks it up again after an ESTALE). */
	if (e->kind == NS_FILE)
		return n->dev == (uint64_t)e->st.st_dev && n->serial == node_shown_ino(t, &e->st) &&
		       !node_backing_stale_locked(n) && !renamed_blob_locked(n, e);
	return n->parent == parent && !strcmp(n->name, name);
}

struct node *node_get(struct node_table *t, struct node *parent, const char *name,
		      const struct ns_entry *e, int weights)
{
	struct node *n;
	uint64_t h;
	int r, made = 0;

	h = e->kind == NS_FILE ? file_hash((uint64_t)e->st.st_dev, e->st.st_ino)
			       : name_hash(parent, e->kind, name);
	pthread_mutex_lock(&t->lock);
	n = NULL;
	for (struct hlink *l = htab_chain(&t->nodes, h); l && !n; l = l->next)
		if (l->hash == h && node_matches(t, htab_entry(l, struct node, hl), parent, name, e))
			n = htab_entry(l, struct node, hl);
	if (!n) {
		n = node_new(t, parent, name, e);
		if (!n) {
			pthread_mutex_unlock(&t->lock);
			errno = ENOMEM;
			return NULL;
		}
		made = 1;
	}
	r = node_update(t, n, e);
	if (r == 0) {
		n->nlookup++;
		if (weights)
			__atomic_store_n(&n->weights, 1, __ATOMIC_RELEASE);
		if (made)
			htab_add(&t->nodes, &n->hl, h);
		if (made && t->count)
			atomic_store(t->count, t->nodes.count);
	} else if (made) {
		parent->children--;
	}
	pthread_mutex_unlock(&t->lock);
	if (r < 0) {
		if (made)
			node_free(n);
		errno = -r;
		return NULL;
	}
	return n;
}

void node_forget(struct node_table *t, struct node *n, uint64_t nlookup)
{
	struct node *dead = NULL;

	pthread_mutex_lock(&t->lock);
	n->nlookup = nlookup > n->nlookup ? 0 : n->nlookup - nlookup;
	/* Free @n and every parent it leaves with neither lookups nor children. */
	while (n && n != t->root && n->nlookup == 0 && (n->kind != NS_DIR || n->children == 0)) {
		struct node *parent = n->parent;

		htab_del(&t->nodes, &n->hl);
		parent->children--;
		n->hl.next = dead ? &dead->hl : NULL; /* unlinked: the link chains the dead */
		dead = n;
		n = parent;
	}
	if (dead && t->count)
		atomic_store(t->count, t->nodes.count);
	pthread_mutex_unlock(&t->lock);
	while (dead) {
		struct node *next = dead->hl.next ? htab_entry(dead->hl.next, struct node, hl)
						  : NULL;

		node_free(dead);
		dead = next;
	}
}
