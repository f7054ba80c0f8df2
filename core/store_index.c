/* store_index.c - what the store keeps on disk, and the checks that it
 * still holds: the index (loaded at start-up, written after every change),
 * tmp/ emptied, leftovers removed, each copy's source re-checked (at
 * start-up, before a first local read, on wfsctl verify).  See store.h and
 * index.h.
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
	char local[PATH_MAX + 64];
	struct stat lst, nst;
	struct blob *b;
	int local_ok;

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
	store_local_path(s, b, local, sizeof(local));
	/* The quick check: both sides still have the recorded size.  The
	 * source's sampled hash is compared before the first local read. */
	local_ok = strlen(r->xxh) == 32 && stat(local, &lst) == 0 && S_ISREG(lst.st_mode) &&
		   (uint64_t)lst.st_size == r->size;
	if (local_ok && stat(r->key, &nst) == 0 && (uint64_t)nst.st_size == r->size) {
		b->state = BLOB_LOCAL;
	} else {
		store_log(s, LOG_NOTICE, "start-up: dropped local copy of %s (%s)", r->key,
			  local_ok ? "source changed size or vanished" :
			  "local copy missing or wrong size");
		b->xxh[0] = '\0';
	}
	return 0;
}

static int load_ref(void *arg, const struct index_ref *r)
{
	struct store_ref ref = { 0 };

	snprintf(ref.repo, sizeof(ref.repo), "%s", r->repo);
	snprintf(ref.ref, sizeof(ref.ref), "%s", r->ref);
	snprintf(ref.commit, sizeof(ref.commit), "%s", r->commit);
	snprintf(ref.pending, sizeof(ref.pending), "%s", r->pending);
	return auto_ref_add_locked(arg, &ref);
}

/* Local files no index entry names are leftovers: remove them. */
static void drop_orphans(struct store *s)
{
	DIR *top = opendir(s->data_dir);
	struct dirent *de;

	if (!top)
		return;
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
			int used = 0;

			if (fe->d_name[0] == '.')
				continue;
			for (size_t i = 0; i < s->nbuckets && !used; i++)
				for (struct blob *b = s->buckets[i]; b && !used; b = b->hnext)
					used = b->state == BLOB_LOCAL && !strcmp(b->xxh, fe->d_name);
			if (!used && unlinkat(dirfd(d), fe->d_name, 0) == 0)
				store_log(s, LOG_NOTICE, "start-up: removed unreferenced copy %s/%s",
					  sub, fe->d_name);
		}
		closedir(d);
	}
	closedir(top);
}

int index_load(struct store *s)
{
	struct index_cb cb = { .arg = s, .blob = load_rec, .ref = load_ref };
	int r;

	pthread_mutex_lock(&s->lock);
	r = index_read(s->index_path, &cb);
	if (r == -EINVAL)
		store_log(s, LOG_ERR, "index %s unreadable: starting empty", s->index_path);
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
	struct store_ref *rcopy;
	struct rec_strings *str;
	size_t n = 0, cap, nrefs;
	int r;

	pthread_mutex_lock(&s->index_lock);
	pthread_mutex_lock(&s->lock);
	cap = s->count ? s->count : 1;
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
	for (size_t i = 0; i < s->nbuckets; i++)
		for (struct blob *b = s->buckets[i]; b; b = b->hnext) {
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
				.last_used = b->last_used, .use_ns = b->use_ns, .pinned = b->pinned,
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
	pthread_mutex_unlock(&s->index_lock);
	for (size_t i = 0; i < n; i++)
		free(str[i].key);
	free(str);
	free(recs);
	free(refs);
	free(rcopy);
	if (r < 0)
		store_log(s, LOG_ERR, "cannot write index %s: %s", s->index_path, strerror(-r));
	return r;
}

/* ---- the sources ---- */

static int sample_source(const char *key, uint64_t size, char out[33])
{
	int fd = open(key, O_RDONLY | O_CLOEXEC | O_NOFOLLOW), r;

	if (fd < 0)
		return -errno;
	r = source_sample(fd, size, out);
	close(fd);
	return r;
}

int store_check_source(struct store *s, struct blob *b)
{
	char sample[33], key[PATH_MAX];
	uint64_t size;
	int r;

	pthread_mutex_lock(&s->lock);
	if (b->state != BLOB_LOCAL || b->checked) {
		r = b->state == BLOB_LOCAL;
		pthread_mutex_unlock(&s->lock);
		return r;
	}
	snprintf(key, sizeof(key), "%s", b->key);
	size = b->size;
	pthread_mutex_unlock(&s->lock);

	r = sample_source(key, size, sample);
	pthread_mutex_lock(&s->lock);
	if (b->state == BLOB_LOCAL) {
		if (r < 0) {
			char why[128];

			snprintf(why, sizeof(why), "source unreadable: %s", strerror(-r));
			store_demote_locked(s, b, why, 1);
		} else if (strcmp(sample, b->sample)) {
			store_demote_locked(s, b, "source changed (sampled hash differs)", 1);
		} else {
			b->checked = 1;
		}
	}
	r = b->state == BLOB_LOCAL;
	pthread_mutex_unlock(&s->lock);
	if (!r)
		store_write_index(s);
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
		store_log(s, LOG_NOTICE, "start-up: discarded %d unverified copies in %s", n,
			  s->tmp_dir);
}

/* Re-check every local copy's source once after start-up, in the
 * background; an open of an unchecked blob checks it first anyway. */
void *store_recheck_sweep(void *arg)
{
	struct store *s = arg;

	for (;;) {
		struct blob *todo = NULL;

		pthread_mutex_lock(&s->lock);
		for (size_t i = 0; i < s->nbuckets && !todo && !s->stop; i++)
			for (struct blob *b = s->buckets[i]; b && !todo; b = b->hnext)
				if (b->state == BLOB_LOCAL && !b->checked)
					todo = b;
		pthread_mutex_unlock(&s->lock);
		if (!todo)
			return NULL;
		store_check_source(s, todo);
	}
}

int store_verify(struct store *s, struct blob *b, int full, char *reason, size_t rsz)
{
	char key[PATH_MAX], local[PATH_MAX + 64], xxh[33], want[33];
	int r, demoted = 0;

	pthread_mutex_lock(&s->lock);
	if (b->state != BLOB_LOCAL) {
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	b->checked = 0;
	snprintf(key, sizeof(key), "%s", b->key);
	snprintf(want, sizeof(want), "%s", b->xxh);
	store_local_path(s, b, local, sizeof(local));
	pthread_mutex_unlock(&s->lock);

	if (!store_check_source(s, b)) {
		pthread_mutex_lock(&s->lock);
		snprintf(reason, rsz, "%s", b->reason);
		pthread_mutex_unlock(&s->lock);
		return 1;
	}
	if (!full)
		return 0;
	r = fetch_hash_file(local, xxh, NULL);
	pthread_mutex_lock(&s->lock);
	if (b->state == BLOB_LOCAL && (r < 0 || strcmp(xxh, want))) {
		if (r < 0)
			snprintf(reason, rsz, "local copy unreadable: %s", strerror(-r));
		else
			snprintf(reason, rsz, "local copy corrupt: xxh128 %s, expected %s", xxh, want);
		store_demote_locked(s, b, reason, 1);
		demoted = 1;
	}
	pthread_mutex_unlock(&s->lock);
	if (demoted)
		store_write_index(s);
	return demoted;
}
