/* store_verify.c - every check that lets a local copy serve, after the
 * copy itself.  Read with fetch.c, which makes the copy and proves it at
 * copy time (hashes as read, durable re-read from disk, content address):
 *
 *   copy time    fetch_copy_verify (fetch.c); its result is recorded here
 *                (verify_record_locked): the copy's XXH3-128 and the
 *                source's identity (size + sampled hash, hash.h)
 *   start-up     verify_loaded_locked: the copy and the source still have
 *                the recorded size, else the record is dropped
 *   first open   store_check_source: the source's sampled hash, once per
 *   and sweep    start-up (store_recheck_sweep checks them all in the
 *                background) and again whenever the NAS attributes change
 *   on request   store_verify: the same, and with @full the copy re-hashed
 *                (scrub); any mismatch demotes the copy, reads go to the NAS
 */
#include "store.h"
#include "store_int.h"
#include "hash.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

void verify_record_locked(struct blob *b, const struct fetch_result *res)
{
	snprintf(b->xxh, sizeof(b->xxh), "%s", res->xxh);
	snprintf(b->sample, sizeof(b->sample), "%s", res->sample);
	b->checked = 1; /* the sample was taken from the bytes just copied */
}

int verify_loaded_locked(struct store *s, struct blob *b)
{
	char local[PATH_MAX + 64];
	struct stat lst, nst;
	int local_ok;

	/* The quick check: both sides still have the recorded size.  The
	 * source's sampled hash is compared before the first local read. */
	local_ok = strlen(b->xxh) == 32 &&
		   store_local_path_locked(s, b, local, sizeof(local)) == 0 &&
		   stat(local, &lst) == 0 && S_ISREG(lst.st_mode) &&
		   (uint64_t)lst.st_size == b->size;
	if (local_ok && stat(b->key, &nst) == 0 && (uint64_t)nst.st_size == b->size)
		return 1;
	store_log_msg(s, LOG_NOTICE, "start-up: dropped local copy of %s (%s)", b->key,
		  local_ok ? "source changed size or vanished" : "local copy missing or wrong size");
	b->xxh[0] = '\0';
	return 0;
}

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
	return r;
}

/* Re-check every local copy's source once after start-up, in the
 * background; an open of an unchecked blob checks it first anyway. */
void *store_recheck_sweep(void *arg)
{
	struct store *s = arg;

	/* One pass over the table: a bucket at a time, resumed where it was
	 * (the table may grow meanwhile; blobs added later were checked when
	 * made LOCAL, or are checked on first open). */
	for (size_t i = 0;; i++) {
		struct blob *todo = NULL;

		pthread_mutex_lock(&s->lock);
		if (s->stop || i >= s->blobs.nb) {
			pthread_mutex_unlock(&s->lock);
			return NULL;
		}
		for (struct hlink *l = s->blobs.b[i]; l && !todo; l = l->next) {
			struct blob *b = htab_entry(l, struct blob, hl);

			if (b->state == BLOB_LOCAL && !b->checked)
				todo = b;
		}
		pthread_mutex_unlock(&s->lock);
		if (todo) {
			store_check_source(s, todo);
			i--; /* the same bucket again: it may hold more */
		}
	}
}

int store_verify(struct store *s, struct blob *b, int full, char *reason, size_t rsz)
{
	char local[PATH_MAX + 64], xxh[33], want[33];
	int r, demoted = 0;

	pthread_mutex_lock(&s->lock);
	if (b->state != BLOB_LOCAL) {
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	b->checked = 0;
	snprintf(want, sizeof(want), "%s", b->xxh);
	store_local_path_locked(s, b, local, sizeof(local));
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
	return demoted;
}
