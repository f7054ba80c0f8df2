/* collect.c - the blobs under a mount-relative path; see collect.h. */
#include "collect.h"
#include "path.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>


static int set_add(struct blob_set *set, struct blob *b, const char *glob, const char *name)
{
	if (set->n == set->cap) {
		size_t cap = set->cap ? set->cap * 2 : 64;
		struct blob **v = realloc(set->v, cap * sizeof(*v));
		const char **g;
		char **nm;

		if (!v)
			return -ENOMEM;
		set->v = v;
		g = realloc(set->glob, cap * sizeof(*g));
		if (!g)
			return -ENOMEM;
		set->glob = g;
		nm = realloc(set->name, cap * sizeof(*nm));
		if (!nm)
			return -ENOMEM;
		set->name = nm;
		set->cap = cap;
	}
	set->v[set->n] = b;
	set->glob[set->n] = glob;
	set->name[set->n] = glob ? strdup(name) : NULL;
	set->n++;
	return 0;
}

int blob_set_add(struct blob_set *set, struct blob *b)
{
	return set_add(set, b, NULL, NULL);
}

struct order {
	struct blob *b;
	const char *glob;
	char *name;
};

static int order_cmp(const void *a, const void *b)
{
	const struct order *x = a, *y = b;

	if (x->b != y->b)
		return x->b < y->b ? -1 : 1;
	/* an excluded name first, so that it is the one kept */
	return (y->glob != NULL) - (x->glob != NULL);
}

void blob_set_unique(struct blob_set *set)
{
	struct order *o;
	size_t w = 0;

	if (set->n < 2)
		return;
	o = malloc(set->n * sizeof(*o));
	if (!o)
		return; /* duplicates are harmless, only slower */
	for (size_t i = 0; i < set->n; i++)
		o[i] = (struct order){ set->v[i], set->glob[i], set->name[i] };
	qsort(o, set->n, sizeof(*o), order_cmp);
	for (size_t i = 0; i < set->n; i++) {
		if (w && set->v[w - 1] == o[i].b) {
			free(o[i].name);
			continue;
		}
		set->v[w] = o[i].b;
		set->glob[w] = o[i].glob;
		set->name[w] = o[i].name;
		w++;
	}
	set->n = w;
	free(o);
}

int blob_set_has(const struct blob_set *set, const struct blob *b)
{
	size_t lo = 0, hi = set->n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (set->v[mid] == b)
			return 1;
		if ((const void *)set->v[mid] < (const void *)b)
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}

void blob_set_clear(struct blob_set *set)
{
	for (size_t i = 0; i < set->n; i++)
		free(set->name[i]);
	set->n = 0;
}

void blob_set_free(struct blob_set *set)
{
	blob_set_clear(set);
	free(set->v);
	free(set->glob);
	free(set->name);
	memset(set, 0, sizeof(*set));
}

struct file_walk {
	int (*fn)(void *arg, const char *rel, const struct ns_entry *e);
	void *arg;
};

static int file_only(void *arg, const char *rel, const struct ns_entry *e)
{
	struct file_walk *fw = arg;

	if (e->kind == NS_FILE ||
	    (e->kind == NS_LINK && e->link_state == NS_LINK_RESOLVED && e->backing[0]))
		return fw->fn(fw->arg, rel, e);
	return 0;
}

int collect_walk(const struct hub_roots *roots, const char *rel,
		 int (*fn)(void *arg, const char *rel, const struct ns_entry *e), void *arg)
{
	struct file_walk fw = { fn, arg };

	return ns_walk(roots, rel, NS_WALK_WEIGHTS, file_only, &fw);
}

struct collecting {
	struct store *s;
	const struct policy_opts *pol;
	struct blob_set *set;
};

static int collect_one(void *arg, const char *rel, const struct ns_entry *e)
{
	struct collecting *c = arg;
	struct stat st;
	struct blob *b;

	if (stat(e->backing, &st) < 0 || !S_ISREG(st.st_mode))
		return 0;
	b = store_blob(c->s, e->backing, &st, e->blob_id);
	if (!b)
		return -ENOMEM;
	return set_add(c->set, b, policy_excluded(c->pol, rel), rel);
}

int collect(const struct hub_roots *roots, struct store *s, const struct policy_opts *pol,
	    const char *rel, struct blob_set *set)
{
	struct collecting c = { s, pol, set };

	if (!hub_holds_weights(rel))
		return -EMEDIUMTYPE;
	return collect_walk(roots, rel, collect_one, &c);
}

/* ---- read-only: collect_peek ---- */

static int nas_add(struct nas_set *set, const char *key, const char *id, uint64_t size,
		   const char *glob, const char *name)
{
	struct nas_file *f;

	if (set->n == set->cap) {
		size_t cap = set->cap ? set->cap * 2 : 64;
		struct nas_file *v = realloc(set->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		set->v = v;
		set->cap = cap;
	}
	f = &set->v[set->n];
	*f = (struct nas_file){ .key = strdup(key), .id = strdup(id), .size = size,
				.glob = glob, .name = glob ? strdup(name) : NULL };
	if (!f->key || !f->id || (glob && !f->name)) {
		free(f->key);
		free(f->id);
		free(f->name);
		return -ENOMEM;
	}
	set->n++;
	return 0;
}

static void nas_file_free(struct nas_file *f)
{
	free(f->key);
	free(f->id);
	free(f->name);
}

static int nas_cmp(const void *a, const void *b)
{
	const struct nas_file *x = a, *y = b;
	int r = strcmp(x->key, y->key);

	/* an excluded name first, so that it is the one kept */
	return r ? r : (y->glob != NULL) - (x->glob != NULL);
}

void nas_set_unique(struct nas_set *set)
{
	size_t w = 0;

	if (set->n < 2)
		return;
	qsort(set->v, set->n, sizeof(*set->v), nas_cmp);
	for (size_t i = 0; i < set->n; i++) {
		if (w && !strcmp(set->v[w - 1].key, set->v[i].key)) {
			nas_file_free(&set->v[i]);
			continue;
		}
		set->v[w++] = set->v[i];
	}
	set->n = w;
}

void nas_set_clear(struct nas_set *set)
{
	for (size_t i = 0; i < set->n; i++)
		nas_file_free(&set->v[i]);
	set->n = 0;
}

void nas_set_free(struct nas_set *set)
{
	nas_set_clear(set);
	free(set->v);
	memset(set, 0, sizeof(*set));
}

struct peeking {
	struct store *s;
	const struct policy_opts *pol;
	struct blob_set *known;
	struct nas_set *unknown;
};

static int peek_one(void *arg, const char *rel, const struct ns_entry *e)
{
	struct peeking *p = arg;
	const char *glob = policy_excluded(p->pol, rel);
	struct stat st;
	struct blob *b;

	if (stat(e->backing, &st) < 0 || !S_ISREG(st.st_mode))
		return 0;
	/* store_find, never store_blob: a walk by any local user must not
	 * grow the table (nor, through it, the index on disk). */
	b = store_find(p->s, e->backing);
	if (b)
		return set_add(p->known, b, glob, rel);
	return nas_add(p->unknown, e->backing, e->blob_id, (uint64_t)st.st_size, glob, rel);
}

int collect_peek(const struct hub_roots *roots, struct store *s, const struct policy_opts *pol,
		 const char *rel, struct blob_set *known, struct nas_set *unknown)
{
	struct peeking p = { s, pol, known, unknown };

	if (!hub_holds_weights(rel))
		return -EMEDIUMTYPE;
	return collect_walk(roots, rel, peek_one, &p);
}
