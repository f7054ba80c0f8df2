/* collect.c - the blobs under a mount-relative path; see collect.h. */
#include "collect.h"
#include "path.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_DEPTH 64

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

struct walk {
	const struct hub_roots *roots;
	int (*fn)(void *arg, const char *rel, const struct ns_entry *e);
	void *arg;
	struct ns_entry e; /* one per walk: only used between readdir calls */
};

static int walk(struct walk *wk, const char *rel, int depth)
{
	char backing[PATH_MAX];
	DIR *d;
	struct dirent *de;
	int r = ns_classify(wk->roots, rel, &wk->e);

	if (r < 0)
		return r;
	if (wk->e.kind == NS_FILE ||
	    (wk->e.kind == NS_LINK && wk->e.link_state == NS_LINK_RESOLVED && wk->e.backing[0]))
		return wk->fn(wk->arg, rel, &wk->e);
	if (wk->e.kind != NS_DIR || depth >= MAX_DEPTH)
		return 0;
	snprintf(backing, sizeof(backing), "%s", wk->e.backing);
	d = opendir(backing);
	if (!d)
		return -errno;
	while ((de = readdir(d)) && r == 0) {
		char child[PATH_MAX];

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (path_join(rel, de->d_name, child, sizeof(child)) < 0 || !hub_holds_weights(child))
			continue;
		r = walk(wk, child, depth + 1);
		if (r == -ENOENT)
			r = 0; /* vanished or hidden */
	}
	closedir(d);
	return r;
}

int collect_walk(const struct hub_roots *roots, const char *rel,
		 int (*fn)(void *arg, const char *rel, const struct ns_entry *e), void *arg)
{
	struct walk *wk = malloc(sizeof(*wk));
	int r;

	if (!wk)
		return -ENOMEM;
	wk->roots = roots;
	wk->fn = fn;
	wk->arg = arg;
	/* A path from a client or from a ref file must not reach through a
	 * link the namespace would not follow. */
	r = hub_check_parents(roots, rel);
	if (r == 0)
		r = walk(wk, rel, 0);
	free(wk);
	return r > 0 ? 0 : r;
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
