/* record_table.c - the record's table: every recorded name by path
 * (htab.h), each directory with its children's names sorted, so a lookup
 * is one hash probe and a listing linear in the children; and the calls
 * that read it (record.h).  A published table is never changed: a build
 * makes a whole new one and record.c swaps it in under record.lock, which
 * the readers here hold only to copy out.
 */
#include "record_int.h"
#include "path.h"
#include "resolve.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void record_log(struct record *r, int prio, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	if (!r->log)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	r->log(r->log_arg, prio, msg);
}

/* ---- the table ---- */

void rnode_free(struct rnode *n)
{
	if (!n)
		return;
	free(n->path);
	free(n->backing);
	free(n->target);
	free(n->blob_id);
	free(n->data);
	free(n->nas_data);
	free(n->kids);
	free(n);
}

int rnodes_push(struct rnodes *l, struct rnode *n)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		struct rnode **v = realloc(l->v, cap * sizeof(*v));

		if (!v) {
			rnode_free(n);
			return -ENOMEM;
		}
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = n;
	return 0;
}

void rnodes_free(struct rnodes *l)
{
	for (size_t i = 0; i < l->n; i++)
		rnode_free(l->v[i]);
	free(l->v);
	*l = (struct rnodes){ 0 };
}

struct rnode *rnode_find(const struct htab *h, const char *path)
{
	uint64_t hash = path_hash(path);

	for (struct hlink *l = htab_chain(h, hash); l; l = l->next) {
		struct rnode *n = htab_entry(l, struct rnode, hl);

		if (l->hash == hash && !strcmp(n->path, path))
			return n;
	}
	return NULL;
}

struct rnode *record_table_find(const struct record_table *t, const char *path)
{
	return t ? rnode_find(&t->h, path) : NULL;
}

void record_table_free(struct record_table *t)
{
	if (!t)
		return;
	for (size_t i = 0; i < t->n; i++)
		rnode_free(t->v[i]);
	free(t->v);
	htab_free(&t->h);
	free(t);
}

static int by_path(const void *a, const void *b)
{
	return strcmp((*(struct rnode *const *)a)->path, (*(struct rnode *const *)b)->path);
}

static int add_kid(struct rnode *dir, const char *name)
{
	if (dir->nkids == dir->kcap) {
		size_t cap = dir->kcap ? 2 * dir->kcap : 8;
		const char **v = realloc(dir->kids, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		dir->kids = v;
		dir->kcap = cap;
	}
	dir->kids[dir->nkids++] = name;
	return 0;
}

/* @n into @t if its parent is a recorded directory: 1 taken, 0 not, or
 * -ENOMEM.  Sorted by path, a parent comes before its children (a prefix
 * sorts first) and the children of one directory in name order. */
static int table_take(struct record_table *t, struct rnode *n)
{
	const char *slash = strrchr(n->path, '/');
	char parent[PATH_MAX];
	struct rnode *p = NULL;

	n->name = slash ? slash + 1 : n->path;
	if (n->path[0]) {
		path_dirname(n->path, parent, sizeof(parent));
		p = rnode_find(&t->h, parent);
		if (!p || p->kind != NS_DIR)
			return 0;
	} else if (n->kind != NS_DIR) {
		return 0;
	}
	if (rnode_find(&t->h, n->path))
		return 0;
	if (p && add_kid(p, n->name) < 0)
		return -ENOMEM;
	htab_add(&t->h, &n->hl, path_hash(n->path));
	t->v[t->n++] = n;
	t->files += n->kind == NS_FILE;
	return 1;
}

struct record_table *record_table_make(struct rnodes *l, size_t *dropped)
{
	struct record_table *t = calloc(1, sizeof(*t));
	int r = t ? 0 : -ENOMEM;

	*dropped = 0;
	if (t && (htab_init(&t->h, l->n ? l->n : 1) < 0 ||
		  !(t->v = malloc((l->n ? l->n : 1) * sizeof(*t->v)))))
		r = -ENOMEM;
	if (!r && l->n)
		qsort(l->v, l->n, sizeof(*l->v), by_path);
	for (size_t i = 0; i < l->n; i++) {
		r = r < 0 ? r : table_take(t, l->v[i]);
		if (r <= 0) {
			*dropped += r == 0;
			rnode_free(l->v[i]);
		}
	}
	free(l->v);
	*l = (struct rnodes){ 0 };
	if (r < 0) {
		record_table_free(t);
		return NULL;
	}
	return t;
}

/* ---- reading it ---- */

static void copy_out(const struct rnode *n, struct record_entry *out)
{
	memset(out, 0, sizeof(*out));
	out->e.kind = n->kind;
	out->e.link_state = n->link_state;
	out->e.st = n->st;
	snprintf(out->e.backing, sizeof(out->e.backing), "%s", n->backing ? n->backing : "");
	snprintf(out->e.target, sizeof(out->e.target), "%s", n->target ? n->target : "");
	snprintf(out->e.blob_id, sizeof(out->e.blob_id), "%s", n->blob_id ? n->blob_id : "");
	out->has_data = n->has_data;
	out->data_len = n->data_len;
}

int record_lookup(struct record *r, const char *rel, struct record_entry *out)
{
	struct rnode *n;

	pthread_mutex_lock(&r->lock);
	n = record_table_find(r->table, rel);
	if (n)
		copy_out(n, out);
	pthread_mutex_unlock(&r->lock);
	return n ? 0 : -ENOENT;
}

int record_lookup_file(struct record *r, const char *rel, struct record_entry *out)
{
	char dir[PATH_MAX], joined[PATH_MAX * 2], norm[PATH_MAX];

	if (record_lookup(r, rel, out) < 0)
		return -ENOENT;
	if (out->e.kind == NS_LINK && out->e.link_state == NS_LINK_RESOLVED) {
		path_dirname(rel, dir, sizeof(dir));
		if (path_join(dir, out->e.target, joined, sizeof(joined)) < 0 ||
		    path_normalize(joined, norm, sizeof(norm)) < 0 ||
		    record_lookup(r, norm, out) < 0)
			return -ENOENT;
	}
	return out->e.kind == NS_FILE ? 0 : -ENOENT;
}

int record_lookup_data(struct record *r, const char *rel, struct record_entry *out,
		       char **data)
{
	struct rnode *n;
	int e = 0;

	*data = NULL;
	pthread_mutex_lock(&r->lock);
	n = record_table_find(r->table, rel);
	if (!n)
		e = -ENOENT;
	else
		copy_out(n, out);
	/* Under the lock: the bytes of the node @out was copied from, not of
	 * a table swapped in since.  A leaf lock: malloc takes none of ours. */
	if (n && n->has_data) {
		*data = malloc(n->data_len ? n->data_len : 1);
		if (*data)
			memcpy(*data, n->data, n->data_len);
		else
			e = -ENOMEM;
	}
	pthread_mutex_unlock(&r->lock);
	return e;
}

int record_list(struct record *r, const char *rel, char ***names, size_t *count)
{
	struct rnode *n;
	char **v = NULL;
	size_t i = 0;
	int e = 0;

	*names = NULL;
	*count = 0;
	pthread_mutex_lock(&r->lock);
	n = record_table_find(r->table, rel);
	if (!n || n->kind != NS_DIR)
		e = -ENOENT;
	else if (!(v = calloc(n->nkids ? n->nkids : 1, sizeof(*v))))
		e = -ENOMEM;
	for (; !e && i < n->nkids; i++)
		if (!(v[i] = strdup(n->kids[i])))
			e = -ENOMEM;
	pthread_mutex_unlock(&r->lock);
	if (e) {
		for (size_t j = 0; v && j < i; j++)
			free(v[j]);
		free(v);
		return e;
	}
	*names = v;
	*count = i;
	return 0;
}

void record_nas(struct record *r, char *out, size_t sz)
{
	pthread_mutex_lock(&r->lock);
	snprintf(out, sz, "%s", r->nas);
	pthread_mutex_unlock(&r->lock);
}

int record_has_any(struct record *r)
{
	int any;

	pthread_mutex_lock(&r->lock);
	any = r->table && r->table->n > 0;
	pthread_mutex_unlock(&r->lock);
	return any;
}

/* Does @p lie in the revision directory "<repo>/snapshots/<rev>" that
 * holds the link @link (the directory itself included)? */
static int in_revision_of(const char *link, const char *p)
{
	const char *s = strchr(link, '/');
	size_t len;

	if (!s || s == link || strncmp(s, "/snapshots/", 11) != 0 || !(s = strchr(s + 11, '/')))
		return 0;
	len = (size_t)(s - link);
	return strncmp(link, p, len) == 0 && (p[len] == '\0' || p[len] == '/');
}

/* Links to directories a path passed through on its way (marked kept
 * once the link that needed them is). */
struct via_links {
	struct rnode *v[HUB_MAX_HOPS];
	int n;
};

/* The node of @norm (normalised, PATH_MAX; rewritten), a recorded link in
 * its way followed: a closed way's first hop may pass a link to a
 * directory (.dl -> .closed: ns.c present_closed), which the kernel follows
 * in the mount, and the record must too. */
static struct rnode *find_through(const struct htab *h, char *norm, struct via_links *via)
{
	char dir[PATH_MAX], joined[3 * PATH_MAX];
	struct rnode *f = rnode_find(h, norm), *l;

	while (!f && *norm && via->n < HUB_MAX_HOPS) {
		char *p = norm;

		for (l = NULL; !l && (p = strchr(p + 1, '/')); ) {
			*p = '\0';
			l = rnode_find(h, norm);
			*p = '/';
			if (!l)
				return NULL; /* a way the record does not hold */
			if (l->kind != NS_LINK)
				l = NULL;
		}
		if (!l || l->target[0] == '/')
			return NULL;
		path_dirname(l->path, dir, sizeof(dir));
		if (snprintf(joined, sizeof(joined), "%s%s%s%s", dir, *dir ? "/" : "", l->target, p) >=
		    (int)sizeof(joined) || path_normalize(joined, norm, PATH_MAX) < 0)
			return NULL;
		via->v[via->n++] = l;
		f = rnode_find(h, norm);
	}
	return f;
}

/* The node a relative link @n names, its path into @norm (PATH_MAX). */
static struct rnode *link_next(const struct htab *h, const struct rnode *n, char *norm,
			       struct via_links *via)
{
	char dir[PATH_MAX], joined[PATH_MAX];

	if (n->kind != NS_LINK || n->target[0] == '/')
		return NULL;
	path_dirname(n->path, dir, sizeof(dir));
	if (path_join(dir, n->target, joined, sizeof(joined)) < 0 ||
	    path_normalize(joined, norm, PATH_MAX) < 0)
		return NULL;
	return find_through(h, norm, via);
}

int record_keep_link(const struct htab *h, struct rnode *n, int dirs)
{
	char norm[PATH_MAX];
	struct via_links via = { .n = 0 };
	struct rnode *f;

	if (n->kind != NS_LINK || n->target[0] == '/' || (dirs && n->keep))
		return 0;
	f = link_next(h, n, norm, dirs ? &(struct via_links){ .n = HUB_MAX_HOPS } : &via);
	/* (a snapshot entry may name a repo blob shown as a link itself:
	 * ns.c present_closed) */
	for (int hops = 0; !dirs && f && f->kind == NS_LINK && hops < HUB_MAX_HOPS; hops++)
		f = link_next(h, f, norm, &via);
	if (!dirs) {
		/* (kept already: a link to a directory another link's way
		 * passed, below) */
		if (f && f->kind == NS_FILE && f->keep) {
			n->keep = 1;
			n->full = f->full;
		}
		for (int i = 0; n->keep && i < via.n; i++)
			via.v[i]->keep = via.v[i]->full = 1;
		return 0;
	}
	/* what the directory holds is judged entry by entry */
	n->keep = n->full = f && f->kind == NS_DIR && f->keep && in_revision_of(n->path, norm);
	return n->keep;
}
