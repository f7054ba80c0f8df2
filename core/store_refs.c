/* store_refs.c - ref pins: the revision a ref of a repo names is kept local
 * and pinned, and follows the ref when it moves on the NAS (read by the
 * policy thread every ref_poll seconds).  See store.h.
 */
#include "store.h"
#include "store_int.h"
#include "collect.h"
#include "path.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#define RETRY_FAILED_S 60 /* failed copies of a revision being moved to: retried this often */

/* Read <repo>/refs/<ref> on the NAS: a revision name.  Returns -errno. */
int refs_read(const struct hub_roots *roots, const char *repo, const char *ref, char *out,
	      size_t sz)
{
	char rel[PATH_MAX], path[PATH_MAX], buf[NAME_MAX + 2];
	struct stat st;
	ssize_t n;
	int fd, r;

	if (snprintf(rel, sizeof(rel), "%s/refs/%s", repo, ref) >= (int)sizeof(rel) ||
	    path_join(roots->path[0], rel, path, sizeof(path)) < 0)
		return -ENAMETOOLONG;
	r = hub_check_parents(roots, rel);
	if (r < 0)
		return r;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return -EINVAL; /* a ref is a small regular file; nothing else is read */
	}
	n = read(fd, buf, sizeof(buf) - 1);
	r = n < 0 ? -errno : 0;
	close(fd);
	if (r < 0)
		return r;
	buf[n] = '\0';
	buf[strcspn(buf, " \t\r\n")] = '\0';
	if (!*buf || strchr(buf, '/') || !strcmp(buf, ".") || !strcmp(buf, ".."))
		return -EINVAL;
	snprintf(out, sz, "%s", buf);
	return 0;
}

static struct store_ref *ref_find_locked(struct store *s, const char *repo, const char *ref)
{
	for (size_t i = 0; i < s->nrefs; i++)
		if (!strcmp(s->refs[i].repo, repo) && !strcmp(s->refs[i].ref, ref))
			return &s->refs[i];
	return NULL;
}

int auto_ref_add_locked(struct store *s, const struct store_ref *r)
{
	struct store_ref *v;

	if (ref_find_locked(s, r->repo, r->ref))
		return 0;
	v = realloc(s->refs, (s->nrefs + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	s->refs = v;
	s->refs[s->nrefs++] = *r;
	return 0;
}

struct store_ref *store_refs(struct store *s, size_t *n)
{
	struct store_ref *v;

	pthread_mutex_lock(&s->lock);
	*n = s->nrefs;
	v = malloc((s->nrefs ? s->nrefs : 1) * sizeof(*v));
	if (v && s->nrefs)
		memcpy(v, s->refs, s->nrefs * sizeof(*v));
	if (!v)
		*n = 0;
	pthread_mutex_unlock(&s->lock);
	return v;
}

void store_refs_poke(struct store *s)
{
	pthread_mutex_lock(&s->lock);
	s->refs_poked = 1;
	pthread_cond_broadcast(&s->auto_cond);
	pthread_mutex_unlock(&s->lock);
}

static int revision_set(struct store *s, const char *repo, const char *rev, struct blob_set *set)
{
	char rel[PATH_MAX];
	int r;

	if (!*rev)
		return 0;
	if (snprintf(rel, sizeof(rel), "%s/snapshots/%s", repo, rev) >= (int)sizeof(rel))
		return -ENAMETOOLONG;
	r = collect(s->opt.roots, s, s->opt.policy, rel, set);
	blob_set_unique(set);
	return r;
}

/* What the ref pins other than (@repo, @ref) keep pinned. */
static void kept_by_others(struct store *s, const char *repo, const char *ref,
			   struct blob_set *keep)
{
	size_t n;
	struct store_ref *v = store_refs(s, &n);

	for (size_t i = 0; v && i < n; i++) {
		if (!strcmp(v[i].repo, repo) && !strcmp(v[i].ref, ref))
			continue;
		revision_set(s, v[i].repo, v[i].commit, keep);
		revision_set(s, v[i].repo, v[i].pending, keep);
	}
	blob_set_unique(keep);
	free(v);
}

/* Pin and queue (explicitly) every blob of @set but the excluded ones;
 * returns how many are not local yet, with the first reason in @why. */
static size_t pin_set(struct store *s, const struct blob_set *set, int retry_failed, char *why,
		      size_t wsz)
{
	size_t missing = 0;

	for (size_t i = 0; i < set->n; i++) {
		struct blob *b = set->v[i];
		enum blob_state st;

		if (set->glob[i])
			continue;
		pthread_mutex_lock(&s->lock);
		b->pinned = 1;
		st = b->state;
		if (st != BLOB_LOCAL) {
			missing++;
			if (!*why && b->reason[0])
				snprintf(why, wsz, "%s: %s", b->id[0] ? b->id : b->key, b->reason);
		}
		pthread_mutex_unlock(&s->lock);
		if (st == BLOB_NAS || (st == BLOB_FAILED && retry_failed))
			store_promote(s, b, 0, 1);
	}
	return missing;
}

static size_t unpin_unless_kept(struct store *s, const struct blob_set *set,
				const struct blob_set *keep)
{
	size_t n = 0;

	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < set->n; i++)
		if (set->v[i]->pinned && !blob_set_has(keep, set->v[i])) {
			set->v[i]->pinned = 0;
			n++;
		}
	pthread_mutex_unlock(&s->lock);
	return n;
}

static int valid_name(const char *repo, const char *ref)
{
	char norm[PATH_MAX];

	return *repo && !strchr(repo, '/') && strcmp(repo, ".") && strcmp(repo, "..") && *ref &&
	       ref[0] != '/' && path_normalize(ref, norm, sizeof(norm)) == 0 &&
	       !strcmp(norm, ref) && strlen(repo) <= NAME_MAX && strlen(ref) <= NAME_MAX;
}

static int snapshot_exists(const struct hub_roots *roots, const char *repo, const char *rev)
{
	char rel[PATH_MAX];
	struct ns_entry *e = malloc(sizeof(*e));
	int ok;

	snprintf(rel, sizeof(rel), "%s/snapshots/%s", repo, rev);
	ok = e && hub_check_parents(roots, rel) == 0 && ns_classify(roots, rel, e) == 0 &&
	     e->kind == NS_DIR;
	free(e);
	return ok;
}

int store_ref_pin(struct store *s, const char *repo, const char *ref, char *commit, size_t csz)
{
	struct blob_set set = { 0 };
	struct store_ref *r, add = { 0 };
	char c[NAME_MAX + 1], why[512] = "";
	int err;

	if (!s->opt.roots)
		return -ENOTSUP;
	if (!valid_name(repo, ref))
		return -EINVAL;
	err = refs_read(s->opt.roots, repo, ref, c, sizeof(c));
	if (err < 0)
		return err;
	if (!snapshot_exists(s->opt.roots, repo, c))
		return -ENOENT;
	pthread_mutex_lock(&s->lock);
	r = ref_find_locked(s, repo, ref);
	if (r) {
		snprintf(r->pending, sizeof(r->pending), "%s", strcmp(r->commit, c) ? c : "");
	} else {
		snprintf(add.repo, sizeof(add.repo), "%s", repo);
		snprintf(add.ref, sizeof(add.ref), "%s", ref);
		snprintf(add.pending, sizeof(add.pending), "%s", c);
		err = auto_ref_add_locked(s, &add);
	}
	pthread_mutex_unlock(&s->lock);
	if (err < 0)
		return err;
	err = revision_set(s, repo, c, &set);
	if (err >= 0) {
		pin_set(s, &set, 1, why, sizeof(why));
		err = (int)set.n;
	}
	blob_set_free(&set);
	store_write_index(s);
	store_refs_poke(s);
	store_log(s, LOG_NOTICE, "ref pin %s refs/%s: revision %s", repo, ref, c);
	snprintf(commit, csz, "%s", c);
	return err;
}

int store_ref_unpin(struct store *s, const char *repo, const char *ref)
{
	struct blob_set keep = { 0 }, set = { 0 };
	struct store_ref gone;
	struct store_ref *r;
	size_t n = 0;

	pthread_mutex_lock(&s->lock);
	r = ref_find_locked(s, repo, ref);
	if (r) {
		gone = *r;
		memmove(r, r + 1, (size_t)(s->refs + s->nrefs - (r + 1)) * sizeof(*r));
		s->nrefs--;
	}
	pthread_mutex_unlock(&s->lock);
	if (!r)
		return -ENOENT;
	kept_by_others(s, repo, ref, &keep);
	revision_set(s, repo, gone.commit, &set);
	revision_set(s, repo, gone.pending, &set);
	blob_set_unique(&set);
	n = unpin_unless_kept(s, &set, &keep);
	blob_set_free(&set);
	blob_set_free(&keep);
	store_write_index(s);
	store_log(s, LOG_NOTICE, "ref pin %s refs/%s dropped: %zu blobs unpinned", repo, ref, n);
	return (int)n;
}

/* The pending revision of @r: pin and queue it; once all of it is local it
 * becomes the kept one, and the old one's blobs (unless another ref pin or
 * the new revision has them) are unpinned.  Returns 1 when @r changed. */
static int settle(struct store *s, struct store_ref *r)
{
	struct blob_set set = { 0 }, keep = { 0 }, old = { 0 };
	time_t now = time(NULL);
	int retry = now >= r->retry_at;
	char why[512] = "";
	size_t missing, n = 0;

	if (!r->pending[0])
		return 0;
	if (retry)
		r->retry_at = now + RETRY_FAILED_S;
	if (revision_set(s, r->repo, r->pending, &set) < 0) {
		snprintf(r->reason, sizeof(r->reason), "cannot list %s/snapshots/%s", r->repo,
			 r->pending);
		blob_set_free(&set);
		return 0;
	}
	missing = pin_set(s, &set, retry, why, sizeof(why));
	if (missing) {
		snprintf(r->reason, sizeof(r->reason), "moving to %s: %zu of %zu blobs not local "
			 "yet%s%s", r->pending, missing, set.n, *why ? "; " : "", why);
		blob_set_free(&set);
		return 0;
	}
	if (r->commit[0] && strcmp(r->commit, r->pending)) {
		kept_by_others(s, r->repo, r->ref, &keep);
		for (size_t i = 0; i < set.n; i++)
			if (!set.glob[i] && blob_set_add(&keep, set.v[i]) < 0)
				break;
		blob_set_unique(&keep);
		revision_set(s, r->repo, r->commit, &old);
		n = unpin_unless_kept(s, &old, &keep);
	}
	store_log(s, LOG_NOTICE, "ref pin %s refs/%s: revision %s is local (%zu blobs)%s%s%s",
		  r->repo, r->ref, r->pending, set.n, n ? "; unpinned what only " : "",
		  n ? r->commit : "", n ? " had" : "");
	snprintf(r->commit, sizeof(r->commit), "%s", r->pending);
	r->pending[0] = '\0';
	r->reason[0] = '\0';
	r->retry_at = 0;
	blob_set_free(&keep);
	blob_set_free(&old);
	blob_set_free(&set);
	return 1;
}

/* The ref moved on while @r->pending was still being copied: that revision
 * is not wanted any more; unpin what neither the kept revision, the new one
 * nor another ref pin has. */
static void drop_pending(struct store *s, struct store_ref *r, const char *next)
{
	struct blob_set keep = { 0 }, gone = { 0 };

	kept_by_others(s, r->repo, r->ref, &keep);
	revision_set(s, r->repo, r->commit, &keep);
	revision_set(s, r->repo, next, &keep);
	blob_set_unique(&keep);
	revision_set(s, r->repo, r->pending, &gone);
	unpin_unless_kept(s, &gone, &keep);
	blob_set_free(&keep);
	blob_set_free(&gone);
}

/* One ref pin: follow the ref, promote the revision it moved to, and once
 * that is all local, let the old one go.  Returns 1 when the pin changed. */
static int follow_ref(struct store *s, struct store_ref *r)
{
	char cur[NAME_MAX + 1];
	int err, changed;

	/* First what is under way: a revision local by now is the kept one
	 * before the ref is looked at again. */
	changed = settle(s, r);
	err = refs_read(s->opt.roots, r->repo, r->ref, cur, sizeof(cur));
	if (err < 0) {
		snprintf(r->reason, sizeof(r->reason), "cannot read %s/refs/%s: %s", r->repo, r->ref,
			 strerror(-err));
		return changed;
	}
	if (!strcmp(cur, r->commit) || !strcmp(cur, r->pending))
		return changed;
	if (!snapshot_exists(s->opt.roots, r->repo, cur)) {
		snprintf(r->reason, sizeof(r->reason), "refs/%s names %s, which has no snapshot yet",
			 r->ref, cur);
		return changed;
	}
	store_log(s, LOG_NOTICE, "ref %s refs/%s moved from %s to %s: promoting it", r->repo,
		  r->ref, r->commit[0] ? r->commit : "(none)", cur);
	if (r->pending[0])
		drop_pending(s, r, cur);
	snprintf(r->pending, sizeof(r->pending), "%s", cur);
	r->retry_at = 0;
	settle(s, r);
	return 1;
}

void refs_poll(struct store *s)
{
	size_t n;
	struct store_ref *v = store_refs(s, &n);
	int changed = 0;

	for (size_t i = 0; v && i < n; i++) {
		int c = follow_ref(s, &v[i]);
		struct store_ref *r;

		pthread_mutex_lock(&s->lock);
		r = ref_find_locked(s, v[i].repo, v[i].ref);
		if (r) { /* still pinned: keep what we learnt */
			*r = v[i];
			changed |= c;
		}
		pthread_mutex_unlock(&s->lock);
	}
	free(v);
	if (changed)
		store_write_index(s);
}
