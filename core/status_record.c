/* status_record.c - the figures of a part of the tree while the NAS is
 * down (status_int.h): the files the local record holds under it, each
 * link of the record resolved as the record keeps it, and the blobs the
 * store knows there.  Reads only memory: the record and the store.
 */
#include "status_int.h"
#include "path.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void status_keys_clear(struct keys *k)
{
	for (size_t i = 0; i < k->n; i++)
		free(k->v[i]);
	k->n = 0;
}

int status_keys_add(struct keys *k, const char *key, uint64_t size)
{
	if (k->n == k->cap) {
		size_t cap = k->cap ? k->cap * 2 : 64;
		char **v = realloc(k->v, cap * sizeof(*v));
		uint64_t *sz = v ? realloc(k->size, cap * sizeof(*sz)) : NULL;

		if (v)
			k->v = v;
		if (!sz)
			return -ENOMEM;
		k->size = sz;
		k->cap = cap;
	}
	if (!(k->v[k->n] = strdup(key)))
		return -ENOMEM;
	k->size[k->n++] = size;
	return 0;
}

void status_keys_free(struct keys *k)
{
	status_keys_clear(k);
	free(k->v);
	free(k->size);
}

struct record_entry *status_view_entry(struct view *v)
{
	if (v->c->record && !v->e)
		v->e = malloc(sizeof(*v->e));
	return v->e;
}

struct under {
	const char *root;   /* NAS path of the part asked for */
	struct keys *keys;
	int err;
};

static void key_under(void *arg, const struct blob_info *b)
{
	struct under *u = arg;

	if (!u->err && path_under(u->root, b->key))
		u->err = status_keys_add(u->keys, b->key, b->size);
}

/* The file a resolved link of the record leads to, as recorded: 1 and its
 * key in @out, else 0.  Links are resolved lexically, as the record keeps
 * them (record.h), and only to files: a walk never follows a link. */
static int record_link_file(struct view *v, const char *rel, const char *target,
			    char *key, size_t keysz, uint64_t *size)
{
	char dir[PATH_MAX], joined[PATH_MAX * 2], norm[PATH_MAX];

	path_dirname(rel, dir, sizeof(dir));
	if (path_join(dir, target, joined, sizeof(joined)) < 0 ||
	    path_normalize(joined, norm, sizeof(norm)) < 0 ||
	    record_lookup(v->c->record, norm, v->e) < 0 || v->e->e.kind != NS_FILE)
		return 0;
	snprintf(key, keysz, "%s", v->e->e.backing);
	*size = (uint64_t)v->e->e.st.st_size;
	return 1;
}

/* One recorded name: a file's key to @v->keys, a directory's children to
 * the work list @todo (which owns the strings). */
static int record_visit(struct view *v, const char *rel, struct keys *todo)
{
	char key[PATH_MAX], **names = NULL;
	uint64_t size = 0;
	size_t n = 0;
	int r = 0;

	if (record_lookup(v->c->record, rel, v->e) < 0)
		return 0;
	switch (v->e->e.kind) {
	case NS_FILE:
		return status_keys_add(&v->keys, v->e->e.backing, (uint64_t)v->e->e.st.st_size);
	case NS_LINK:
		if (v->e->e.link_state == NS_LINK_RESOLVED &&
		    record_link_file(v, rel, v->e->e.target, key, sizeof(key), &size))
			return status_keys_add(&v->keys, key, size);
		return 0;
	case NS_DIR:
		if (record_list(v->c->record, rel, &names, &n) < 0)
			return 0;
		for (size_t i = 0; i < n; i++) {
			char child[PATH_MAX * 2];

			/* as collect_walk: what is not weight data is not counted */
			if (!r && path_join(rel, names[i], child, sizeof(child)) == 0 &&
			    hub_holds_weights(child))
				r = status_keys_add(todo, child, 0);
			free(names[i]);
		}
		free(names);
		return r;
	}
	return 0;
}

/* Every file under @rel the record holds, into @v->keys. */
static int record_files(struct view *v, const char *rel)
{
	struct keys todo = {0};
	int r;

	if (!status_view_entry(v))
		return v->c->record ? -ENOMEM : 0;
	r = status_keys_add(&todo, rel, 0);
	while (!r && todo.n) {
		char *at = todo.v[--todo.n];

		r = record_visit(v, at, &todo);
		free(at);
	}
	status_keys_free(&todo);
	return r;
}

struct key_size {
	char *key;
	uint64_t size;
};

static int cmp_key_size(const void *a, const void *b)
{
	return strcmp(((const struct key_size *)a)->key, ((const struct key_size *)b)->key);
}

/* Sort @k by key, each size staying with its key (sorted apart, a file
 * the store does not know was counted with another's size). */
static int sort_keys(struct keys *k)
{
	struct key_size *p;

	if (k->n < 2)
		return 0;
	if (!(p = malloc(k->n * sizeof(*p))))
		return -ENOMEM;
	for (size_t i = 0; i < k->n; i++)
		p[i] = (struct key_size){ k->v[i], k->size[i] };
	qsort(p, k->n, sizeof(*p), cmp_key_size);
	for (size_t i = 0; i < k->n; i++) {
		k->v[i] = p[i].key;
		k->size[i] = p[i].size;
	}
	free(p);
	return 0;
}

void status_known_under(struct view *v, const char *rel, struct tally *t)
{
	char root[PATH_MAX * 2];
	struct under u = { root, &v->keys, 0 };

	status_keys_clear(&v->keys);
	if (path_join(v->c->roots->path[0], rel, root, sizeof(root)) == 0)
		store_each(v->c->store, key_under, &u);
	/* an error leaves what was found before it: status is a best effort */
	if (u.err || record_files(v, rel) < 0 || sort_keys(&v->keys) < 0)
		return;
	for (size_t i = 0; i < v->keys.n; i++) {
		struct blob *b;

		if (i && !strcmp(v->keys.v[i], v->keys.v[i - 1]))
			continue;
		if ((b = store_find(v->c->store, v->keys.v[i]))) {
			if (blob_set_add(&v->set, b) < 0)
				return;
			continue;
		}
		t->files++;
		t->bytes += (json_int_t)v->keys.size[i];
		t->per_state[BLOB_NAS]++;
	}
}
