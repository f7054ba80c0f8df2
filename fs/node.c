/* node.c - the inode table; see node.h. */
#include "node.h"
#include "path.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int make_key(const char *rel, const struct ns_entry *e, char *buf, size_t sz)
{
	int n;

	if (e->kind == NS_FILE)
		n = snprintf(buf, sz, "f:%llx:%llx", (unsigned long long)e->st.st_dev,
			     (unsigned long long)e->st.st_ino);
	else
		n = snprintf(buf, sz, "%c:%s", e->kind == NS_DIR ? 'd' : 'l', rel);
	return n < 0 || (size_t)n >= sz ? -ENAMETOOLONG : 0;
}

static void node_free(struct node *n)
{
	free(n->key);
	free(n->rel);
	free(n->backing);
	free(n->target);
	free(n->blob_id);
	free(n);
}

static int grow(struct node_table *t)
{
	size_t nb = t->nbuckets * 2;
	struct node **b = calloc(nb, sizeof(*b));

	if (!b)
		return -ENOMEM;
	for (size_t i = 0; i < t->nbuckets; i++) {
		struct node *n = t->buckets[i], *next;

		for (; n; n = next) {
			size_t h = path_hash(n->key) & (nb - 1);

			next = n->hnext;
			n->hnext = b[h];
			b[h] = n;
		}
	}
	free(t->buckets);
	t->buckets = b;
	t->nbuckets = nb;
	return 0;
}

/* Refresh what may have changed on the NAS since the node was made. */
static int node_update(struct node *n, const char *rel, const struct ns_entry *e)
{
	n->kind = e->kind;
	if (e->kind == NS_FILE) {
		if (!n->backing || strcmp(n->backing, e->backing)) {
			char *b = strdup(e->backing);

			if (!b)
				return -ENOMEM;
			free(n->backing);
			n->backing = b;
		}
		/* Set once: read without the lock by xattr and timeout code. */
		if (!n->blob_id && e->blob_id[0]) {
			char *id = strdup(e->blob_id);

			__atomic_store_n(&n->blob_id, id, __ATOMIC_RELEASE);
		}
	} else {
		if (e->kind == NS_LINK && (!n->target || strcmp(n->target, e->target))) {
			char *tg = strdup(e->target);

			if (!tg)
				return -ENOMEM;
			free(n->target);
			n->target = tg;
		}
	}
	if (!n->rel) {
		n->rel = strdup(rel);
		if (!n->rel)
			return -ENOMEM;
	}
	if (n->st.st_size != e->st.st_size || n->st.st_mtim.tv_sec != e->st.st_mtim.tv_sec ||
	    n->st.st_mtim.tv_nsec != e->st.st_mtim.tv_nsec)
		n->cache_ok = 0;
	n->st = e->st;
	n->serial = e->st.st_ino;
	return 0;
}

int node_table_init(struct node_table *t, const struct ns_entry *root_entry)
{
	memset(t, 0, sizeof(*t));
	pthread_mutex_init(&t->lock, NULL);
	t->nbuckets = 1024;
	t->buckets = calloc(t->nbuckets, sizeof(*t->buckets));
	t->root = calloc(1, sizeof(*t->root));
	if (!t->buckets || !t->root)
		return -ENOMEM;
	t->root->nlookup = 1;
	t->root->key = strdup("root");
	if (!t->root->key)
		return -ENOMEM;
	return node_update(t->root, "", root_entry);
}

void node_table_destroy(struct node_table *t)
{
	for (size_t i = 0; t->buckets && i < t->nbuckets; i++) {
		struct node *n = t->buckets[i], *next;

		for (; n; n = next) {
			next = n->hnext;
			node_free(n);
		}
	}
	free(t->buckets);
	if (t->root)
		node_free(t->root);
	pthread_mutex_destroy(&t->lock);
}

struct node *node_get(struct node_table *t, const char *rel, const struct ns_entry *e)
{
	char key[PATH_MAX + 8];
	struct node *n;
	size_t h;
	int r;

	r = make_key(rel, e, key, sizeof(key));
	if (r < 0) {
		errno = -r;
		return NULL;
	}
	if (e->kind == NS_DIR && !*rel) {
		pthread_mutex_lock(&t->lock);
		t->root->nlookup++;
		node_update(t->root, rel, e);
		pthread_mutex_unlock(&t->lock);
		return t->root;
	}
	h = path_hash(key);
	pthread_mutex_lock(&t->lock);
	for (n = t->buckets[h & (t->nbuckets - 1)]; n; n = n->hnext)
		if (!strcmp(n->key, key))
			break;
	if (!n) {
		n = calloc(1, sizeof(*n));
		if (!n || !(n->key = strdup(key))) {
			free(n);
			pthread_mutex_unlock(&t->lock);
			errno = ENOMEM;
			return NULL;
		}
		if (t->count + 1 > t->nbuckets)
			grow(t);
		n->hnext = t->buckets[h & (t->nbuckets - 1)];
		t->buckets[h & (t->nbuckets - 1)] = n;
		t->count++;
	}
	r = node_update(n, rel, e);
	if (r == 0)
		n->nlookup++;
	pthread_mutex_unlock(&t->lock);
	if (r < 0) {
		errno = -r;
		return NULL;
	}
	return n;
}

void node_forget(struct node_table *t, struct node *n, uint64_t nlookup)
{
	struct node **pp;

	pthread_mutex_lock(&t->lock);
	n->nlookup = nlookup > n->nlookup ? 0 : n->nlookup - nlookup;
	if (n->nlookup || n == t->root) {
		pthread_mutex_unlock(&t->lock);
		return;
	}
	pp = &t->buckets[path_hash(n->key) & (t->nbuckets - 1)];
	for (; *pp; pp = &(*pp)->hnext) {
		if (*pp == n) {
			*pp = n->hnext;
			t->count--;
			break;
		}
	}
	pthread_mutex_unlock(&t->lock);
	node_free(n);
}

void node_attr(struct node_table *t, struct node *n, struct stat *st)
{
	pthread_mutex_lock(&t->lock);
	*st = n->st;
	pthread_mutex_unlock(&t->lock);
}
