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
		free(k->v[i].key);
	k->n = 0;
}

int status_keys_add(struct keys *k, const char *key, uint64_t size)
{
	if (k->n == k->cap) {
		size_t cap = k->cap ? k->cap * 2 : 64;
		struct status_key *v = realloc(k->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		k->v = v;
		k->cap = cap;
	}
	if (!(k->v[k->n].key = strdup(key)))
		return -ENOMEM;
	k->v[k->n++].size = size;
	return 0;
}

void status_keys_free(struct keys *k)
{
	status_keys_clear(k);
	free(k->v);
}

struct record_entry *status_view_entry(struct view *v)
{
	if (v->others)
		return NULL; /* (no look in the record for another user) */
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

/* One recorded name: a file's key to @v->keys, a directory's children to
 * the work list @todo (which owns the strings). */
static int record_visit(struct view *v, const char *rel, struct keys *todo)
{
	char **names = NULL;
	size_t n = 0;
	int r = 0;

	if (record_lookup(v->c->record, rel, v->e) < 0)
		return 0;
	if (v->e->e.kind != NS_DIR) {
		/* a file, or a link the record resolves to one (only to files:
		 * a walk never follows a link) */
		if (record_lookup_file(v->c->record, rel, v->e) < 0)
			return 0;
		return status_keys_add(&v->keys, v->e->e.backing, (uint64_t)v->e->e.st.st_size);
	}
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

/* Every file under @rel the record holds, into @v->keys. */
static int record_files(struct view *v, const char *rel)
{
	struct keys todo = {0};
	int r;

	if (!status_view_entry(v))
		return v->c->record ? -ENOMEM : 0;
	r = status_keys_add(&todo, rel, 0);
	while (!r && todo.n) {
		char *at = todo.v[--todo.n].key;

		r = record_visit(v, at, &todo);
		free(at);
	}
	status_keys_free(&todo);
	return r;
}

void status_known_under(struct view *v, const char *rel, struct tally *t)
{
	char root[PATH_MAX * 2];
	struct under u = { root, &v->keys, 0 };

	status_keys_clear(&v->keys);
	if (v->others)
		return; /* the NAS went down in its walk: nothing more for it */
	if (path_join(v->c->roots->path[0], rel, root, sizeof(root)) == 0)
		store_each(v->c->store, key_under, &u);
	/* an error leaves what was found before it: status is a best effort */
	if (u.err || record_files(v, rel) < 0)
		return;
	if (v->keys.n > 1) /* qsort wants a base even for none */
		qsort(v->keys.v, v->keys.n, sizeof(*v->keys.v), status_cmp_key);
	for (size_t i = 0; i < v->keys.n; i++) {
		struct blob *b;

		if (i && !strcmp(v->keys.v[i].key, v->keys.v[i - 1].key))
			continue;
		if ((b = store_find(v->c->store, v->keys.v[i].key))) {
			if (blob_set_add(&v->set, b) < 0)
				return;
			continue;
		}
		t->files++;
		t->bytes += (json_int_t)v->keys.v[i].size;
		t->per_state[BLOB_NAS]++;
	}
}
