/* store_index.c - what the store keeps on disk: the index (index.c's
 * format) loaded at start-up -- each record checked by store_verify.c --
 * and written when dirty (store.h says when); tmp/ emptied and unreferenced
 * copies removed at start-up.  Linear in the number of blobs and files.
 */
#include "store.h"
#include "store_int.h"
#include "index.h"
#include "hash.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

static int load_rec(void *arg, const struct index_rec *r)
{
	struct store *s = arg;
	struct blob *b;

	if (store_find_locked(s, r->key))
		return 0; /* a damaged index naming a file twice: the first wins */
	b = store_insert_locked(s, r->key);
	if (!b)
		return -ENOMEM;
	snprintf(b->id, sizeof(b->id), "%s", r->id);
	b->size = r->size;
	b->nas_mtime = r->mtime;
	b->nas_ctime = r->ctime;
	b->pinned = r->pinned;
	b->last_used = r->last_used;
	b->use_ns = r->use_ns ? r->use_ns : (uint64_t)(r->last_used > 0 ? r->last_used : 0) *
		    1000000000u;
	if (!strcmp(r->state, "mismatch")) {
		b->state = BLOB_MISMATCH;
		snprintf(b->reason, sizeof(b->reason), "%s", r->reason);
		return 0;
	}
	if (strcmp(r->state, "local"))
		return 0;
	snprintf(b->xxh, sizeof(b->xxh), "%s", r->xxh);
	snprintf(b->sample, sizeof(b->sample), "%s", r->sample);
	if (verify_loaded_locked(s, b))
		b->state = BLOB_LOCAL;
	else
		s->index_dirty = 1; /* the record changed: write it at the next chance */
	return 0;
}

static int load_ref(void *arg, const struct index_ref *r)
{
	struct store *s = arg;
	struct store_ref_rec *v = realloc(s->refs, (s->nrefs + 1) * sizeof(*v));

	if (!v)
		return -ENOMEM;
	s->refs = v;
	v += s->nrefs++;
	memset(v, 0, sizeof(*v));
	snprintf(v->repo, sizeof(v->repo), "%s", r->repo);
	snprintf(v->ref, sizeof(v->ref), "%s", r->ref);
	snprintf(v->commit, sizeof(v->commit), "%s", r->commit);
	snprintf(v->pending, sizeof(v->pending), "%s", r->pending);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Local files no LOCAL blob names are leftovers: remove them.  The names
 * in use are sorted once, each file looked up by bisection: O((blobs +
 * files) log blobs), not one table scan per file. */
static void drop_orphans(struct store *s)
{
	const char **used = malloc((s->blobs.count ? s->blobs.count : 1) * sizeof(*used));
	DIR *top = opendir(s->data_dir);
	struct dirent *de;
	size_t n = 0;

	if (!used || !top) {
		free(used);
		if (top)
			closedir(top);
		return; /* nothing removed: leftovers only cost space */
	}
	STORE_EACH(s, b)
		if (b->state == BLOB_LOCAL)
			used[n++] = b->xxh;
	qsort(used, n, sizeof(*used), cmp_str);
	while ((de = readdir(top))) {
		char sub[PATH_MAX + 300];
		struct dirent *fe;
		DIR *d;

		if (de->d_name[0] == '.')
			continue;
		snprintf(sub, sizeof(sub), "%s/%s", s->data_dir, de->d_name);
		d = opendir(sub);
		if (!d)
			continue;
		while ((fe = readdir(d))) {
			const char *name = fe->d_name;

			if (name[0] == '.' || bsearch(&name, used, n, sizeof(*used), cmp_str))
				continue;
			if (unlinkat(dirfd(d), name, 0) == 0)
				store_log_msg(s, LOG_NOTICE, "start-up: removed unreferenced copy %s/%s",
					  sub, name);
		}
		closedir(d);
	}
	closedir(top);
	free(used);
}

int index_load(struct store *s)
{
	struct index_cb cb = { .arg = s, .blob = load_rec, .ref = load_ref };
	int r;

	pthread_mutex_lock(&s->lock);
	r = index_read(s->index_path, &cb);
	if (r == -EINVAL)
		store_log_msg(s, LOG_ERR, "index %s unreadable: starting empty", s->index_path);
	drop_orphans(s);
	pthread_mutex_unlock(&s->lock);
	return r == -EINVAL ? 0 : r;
}

struct rec_strings {
	char *key;
	char id[NAME_MAX + 1], xxh[33], sample[33], reason[256];
};

int store_write_index(struct store *s)
{
	struct index_rec *recs;
	struct index_ref *refs;
	struct store_ref_rec *rcopy;
	struct rec_strings *str;
	size_t n = 0, cap, nrefs;
	int r;

	pthread_mutex_lock(&s->index_lock);
	pthread_mutex_lock(&s->lock);
	/* What changes from here on is in the next write. */
	s->index_dirty = 0;
	s->copies_unrecorded = 0;
	cap = s->blobs.count ? s->blobs.count : 1;
	nrefs = s->nrefs;
	recs = calloc(cap, sizeof(*recs));
	str = calloc(cap, sizeof(*str));
	refs = calloc(nrefs ? nrefs : 1, sizeof(*refs));
	rcopy = calloc(nrefs ? nrefs : 1, sizeof(*rcopy));
	if (!recs || !str || !refs || !rcopy) {
		free(recs);
		free(str);
		free(refs);
		free(rcopy);
		pthread_mutex_unlock(&s->lock);
		pthread_mutex_unlock(&s->index_lock);
		return -ENOMEM;
	}
	STORE_EACH(s, b) {
		const char *state = b->state == BLOB_LOCAL ? "local" :
				    b->state == BLOB_MISMATCH ? "mismatch" : "nas";

		if (!strcmp(state, "nas") && !b->pinned)
			continue;
		/* Copies: the fields change under other threads once we
		 * let go of the lock. */
		str[n].key = strdup(b->key);
		snprintf(str[n].id, sizeof(str[n].id), "%s", b->id);
		memcpy(str[n].xxh, b->xxh, sizeof(str[n].xxh));
		memcpy(str[n].sample, b->sample, sizeof(str[n].sample));
		snprintf(str[n].reason, sizeof(str[n].reason), "%s", b->reason);
		if (!str[n].key)
			continue;
		recs[n] = (struct index_rec){
			.key = str[n].key, .id = str[n].id, .state = state,
			.xxh = str[n].xxh, .sample = str[n].sample, .reason = str[n].reason,
			.size = b->size, .mtime = b->nas_mtime, .ctime = b->nas_ctime,
			.last_used = b->last_used, .pinned = b->pinned,
			.use_ns = atomic_load_explicit(&b->use_ns, memory_order_relaxed),
		};
		n++;
	}
	if (nrefs)
		memcpy(rcopy, s->refs, nrefs * sizeof(*rcopy));
	pthread_mutex_unlock(&s->lock);
	for (size_t i = 0; i < nrefs; i++)
		refs[i] = (struct index_ref){ rcopy[i].repo, rcopy[i].ref, rcopy[i].commit,
					      rcopy[i].pending };
	r = index_write(s->index_path, recs, n, refs, nrefs);
	s->index_writes++;
	pthread_mutex_unlock(&s->index_lock);
	for (size_t i = 0; i < n; i++)
		free(str[i].key);
	free(str);
	free(recs);
	free(refs);
	free(rcopy);
	if (r < 0)
		store_log_msg(s, LOG_ERR, "cannot write index %s: %s", s->index_path, strerror(-r));
	return r;
}

void store_empty_tmp(struct store *s)
{
	DIR *d = opendir(s->tmp_dir);
	struct dirent *de;
	int n = 0;

	if (!d)
		return;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		if (unlinkat(dirfd(d), de->d_name, 0) == 0)
			n++;
	}
	closedir(d);
	if (n)
		store_log_msg(s, LOG_NOTICE, "start-up: discarded %d unverified copies in %s", n,
			  s->tmp_dir);
}

