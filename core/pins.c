/* pins.c - ref pins: the revision a ref of a repo names is kept local and
 * pinned, and follows the ref when it moves on the NAS.  See pins.h (the
 * locking rule: every operation whole under op_lock).
 */
#include "pins.h"
#include "collect.h"
#include "nasgate.h"
#include "nasopen.h"
#include "path.h"
#include "reply.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

/* Read <repo>/refs/<ref> on the NAS: a revision name.  Returns -errno. */
int refs_read(const struct hub_roots *roots, const char *repo, const char *ref, char *out,
	      size_t sz)
{
	char rel[PATH_MAX], path[PATH_MAX], buf[NAME_MAX + 2], esc[4 * sizeof(buf)];
	ssize_t n;
	int fd, r;

	if (snprintf(rel, sizeof(rel), "%s/refs/%s", repo, ref) >= (int)sizeof(rel) ||
	    path_join(roots->path[0], rel, path, sizeof(path)) < 0)
		return -ENAMETOOLONG;
	r = hub_check_parents(roots, rel);
	if (r < 0)
		return r;
	/* no link in any component (one swapped in since the check above
	 * included), and a FIFO is never opened (nasopen.h) */
	fd = nas_open(roots, path, 0);
	if (fd == -EISDIR || fd == -ENXIO)
		return -EINVAL; /* a ref is a small regular file; nothing else is read */
	if (fd < 0)
		return fd;
	n = read(fd, buf, sizeof(buf) - 1);
	r = n < 0 ? -errno : 0;
	close(fd);
	if (r < 0)
		return r;
	buf[n] = '\0';
	buf[strcspn(buf, " \t\r\n")] = '\0';
	/* a revision names a snapshot directory: one plain name, and text
	 * (it goes into the index and replies as it is) */
	if (!*buf || strchr(buf, '/') || !strcmp(buf, ".") || !strcmp(buf, "..") ||
	    reply_escape(buf, esc, sizeof(esc), 1))
		return -EINVAL;
	snprintf(out, sz, "%s", buf);
	return 0;
}

/* refs_read on a NAS thread, with the deadline: the poll reads each
 * pinned ref every ref_poll seconds, so a NAS that hangs is all but sure
 * to catch it -- and a poll stuck in it held the automatic-promotion
 * thread, and the daemon's exit, until the NAS let go.  Heap memory with
 * copies of what it reads: one past its deadline ends on its thread. */
struct ref_job {
	const struct hub_roots *roots; /* the daemon's: lives as long as it */
	char repo[NAME_MAX + 1], ref[NAME_MAX + 1], out[NAME_MAX + 1];
};

static int ref_job_run(void *arg)
{
	struct ref_job *j = arg;

	return refs_read(j->roots, j->repo, j->ref, j->out, sizeof(j->out));
}

static int refs_read_gated(struct pins *p, const char *repo, const char *ref, char *out,
			   size_t sz)
{
	struct ref_job *j = calloc(1, sizeof(*j));
	int r;

	if (!j)
		return -ENOMEM;
	j->roots = p->roots;
	snprintf(j->repo, sizeof(j->repo), "%s", repo);
	snprintf(j->ref, sizeof(j->ref), "%s", ref);
	r = nas_call(p->store->opt.gate, ref_job_run, j, free);
	if (r == -ETIMEDOUT)
		return r; /* the gate's now (and the NAS down) */
	if (r == 0)
		snprintf(out, sz, "%s", j->out);
	free(j);
	return r;
}

static struct pin *find_locked(struct pins *p, const char *repo, const char *ref)
{
	for (size_t i = 0; i < p->n; i++)
		if (!strcmp(p->v[i].repo, repo) && !strcmp(p->v[i].ref, ref))
			return &p->v[i];
	return NULL;
}

struct pin *pins_list(struct pins *p, size_t *n)
{
	struct pin *v;

	pthread_mutex_lock(&p->lock);
	*n = p->n;
	v = malloc((p->n ? p->n : 1) * sizeof(*v));
	if (v && p->n)
		memcpy(v, p->v, p->n * sizeof(*v));
	if (!v)
		*n = 0;
	pthread_mutex_unlock(&p->lock);
	return v;
}

void pins_poke(struct pins *p)
{
	atomic_store(&p->poked, 1);
	store_wake_hot(p->store);
}

int pins_take_poke(struct pins *p)
{
	return atomic_exchange(&p->poked, 0);
}

/* Hand the store the pins to persist with its index, and write it
 * (op_lock held).  0, or -errno: not saved (logged; the store's writes go
 * on trying as anything else changes). */
static int persist(struct pins *p)
{
	struct store_ref_rec *v = calloc(p->n ? p->n : 1, sizeof(*v));
	int err;

	if (!v) {
		store_log_msg(p->store, LOG_ERR, "ref pins: out of memory: not persisted");
		return -ENOMEM;
	}
	pthread_mutex_lock(&p->lock);
	for (size_t i = 0; i < p->n; i++) {
		memcpy(v[i].repo, p->v[i].repo, sizeof(v[i].repo));
		memcpy(v[i].ref, p->v[i].ref, sizeof(v[i].ref));
		memcpy(v[i].commit, p->v[i].commit, sizeof(v[i].commit));
		memcpy(v[i].pending, p->v[i].pending, sizeof(v[i].pending));
	}
	pthread_mutex_unlock(&p->lock);
	err = store_set_refs(p->store, v, p->n);
	free(v);
	return err < 0 ? err : store_sync(p->store);
}

/* Replace the pin (@r's repo, ref) by @r, or add it (op_lock held). */
static int put(struct pins *p, const struct pin *r)
{
	struct pin *old, *v;
	int err = 0;

	pthread_mutex_lock(&p->lock);
	old = find_locked(p, r->repo, r->ref);
	if (old) {
		*old = *r;
	} else if ((v = realloc(p->v, (p->n + 1) * sizeof(*v)))) {
		p->v = v;
		p->v[p->n++] = *r;
	} else {
		err = -ENOMEM;
	}
	pthread_mutex_unlock(&p->lock);
	return err;
}

/* A copy of the pin (@repo, @ref); 0, or -ENOENT (op_lock held). */
static int get(struct pins *p, const char *repo, const char *ref, struct pin *out)
{
	struct pin *r;

	pthread_mutex_lock(&p->lock);
	r = find_locked(p, repo, ref);
	if (r)
		*out = *r;
	pthread_mutex_unlock(&p->lock);
	return r ? 0 : -ENOENT;
}

static int revision_set(struct pins *p, const char *repo, const char *rev, struct blob_set *set)
{
	char rel[PATH_MAX];
	int r;

	if (!*rev)
		return 0;
	if (snprintf(rel, sizeof(rel), "%s/snapshots/%s", repo, rev) >= (int)sizeof(rel))
		return -ENAMETOOLONG;
	r = collect(p->roots, p->store, p->policy, rel, set);
	blob_set_unique(set);
	/* (an empty NAS_HUB -- the NAS not mounted -- is no deletion) */
	if (r == -ENOENT && (r = nas_missing_or_gone(p->roots->path[0], 1, r)) == -ENOENT)
		return 1;
	return r;
}

struct ref_keys {
	char **v;
	size_t n, cap;
	int err;
};

static void note_ref_pinned(void *arg, const struct blob_info *b)
{
	struct ref_keys *k = arg;
	char **v;

	if (k->err || !(b->pin_why & PIN_REF))
		return;
	if (k->n == k->cap) {
		k->cap = k->cap ? 2 * k->cap : 16;
		if (!(v = realloc(k->v, k->cap * sizeof(*v)))) {
			k->err = -ENOMEM;
			return;
		}
		k->v = v;
	}
	if (!(k->v[k->n] = strdup(b->key)))
		k->err = -ENOMEM;
	else
		k->n++;
}

/* Every blob a ref pin holds (PIN_REF) into @set.  What a revision gone
 * from the NAS held cannot be listed any more: when one is let go, each of
 * them is a candidate, and what the revisions still there keep decides
 * (without this, its blobs stayed pinned for good, and the pin could never
 * move on or be dropped).  0 or -ENOMEM. */
static int all_ref_pinned(struct pins *p, struct blob_set *set)
{
	struct ref_keys k = { 0 };
	struct blob *b;

	store_each(p->store, note_ref_pinned, &k);
	for (size_t i = 0; i < k.n; i++) {
		if (!k.err && (b = store_find(p->store, k.v[i])) && blob_set_add(set, b) < 0)
			k.err = -ENOMEM;
		free(k.v[i]);
	}
	free(k.v);
	blob_set_unique(set);
	return k.err;
}

/* What revision @rev of @repo keeps pinned into @keep: its blobs but the
 * excluded ones, which no ref pin pins (pin_set).  Counted as kept, a blob
 * one pin's revision excludes and another's pinned stayed pinned for good
 * once the other let it go.  As revision_set. */
static int revision_keeps(struct pins *p, const char *repo, const char *rev,
			  struct blob_set *keep)
{
	struct blob_set set = { 0 };
	int r = revision_set(p, repo, rev, &set);

	for (size_t i = 0; r >= 0 && i < set.n; i++)
		if (!set.glob[i] && blob_set_add(keep, set.v[i]) < 0)
			r = -ENOMEM;
	blob_set_free(&set);
	return r;
}

/* What the ref pins other than (@repo, @ref) keep pinned: 0, or the
 * -errno of a listing that failed -- @keep is then short of what they
 * keep, and nothing may be unpinned by it.  (A revision gone from the NAS
 * keeps nothing.) */
static int kept_by_others(struct pins *p, const char *repo, const char *ref,
			  struct blob_set *keep)
{
	size_t n;
	struct pin *v = pins_list(p, &n);
	int err = v || !n ? 0 : -ENOMEM;

	for (size_t i = 0; v && i < n && !err; i++) {
		if (!strcmp(v[i].repo, repo) && !strcmp(v[i].ref, ref))
			continue;
		err = revision_keeps(p, v[i].repo, v[i].commit, keep);
		if (err >= 0)
			err = revision_keeps(p, v[i].repo, v[i].pending, keep);
		err = err < 0 ? err : 0;
	}
	blob_set_unique(keep);
	free(v);
	return err;
}

/* When the pin (@repo, @ref) lets the revisions @revs go (@nrevs of
 * them): their blobs into @gone, what every other ref pin keeps into
 * @keep.  0, or the -errno of a listing that failed: nothing may be
 * unpinned then (a blob another pin keeps could be), and the caller
 * changes nothing, to try again at its next look. */
static int let_go(struct pins *p, const char *repo, const char *ref, const char *const *revs,
		  size_t nrevs, struct blob_set *gone, struct blob_set *keep)
{
	int err = kept_by_others(p, repo, ref, keep), deleted = 0;

	for (size_t i = 0; !err && i < nrevs; i++) {
		int e = revision_set(p, repo, revs[i], gone);

		if (e == 1 && revs[i][0]) {
			deleted = 1;
			store_log_msg(p->store, LOG_NOTICE, "ref pin %s refs/%s: revision %s is gone "
				      "from the NAS; what only it held is unpinned", repo, ref, revs[i]);
		}
		err = e < 0 ? e : 0;
	}
	if (!err && deleted)
		err = all_ref_pinned(p, gone);
	blob_set_unique(gone);
	return err;
}

/* Pin and queue (as a ref pin's: before automatic requests, retried by
 * the store with backoff after a failure) every blob of @set but the
 * excluded ones; @now: an operator asked (pins_pin): a blob in its backoff
 * is queued at once too.  Returns how many are not local yet, with the
 * first reason in @why. */
static size_t pin_set(struct pins *p, const struct blob_set *set, int now, char *why,
		      size_t wsz)
{
	size_t missing = 0;

	for (size_t i = 0; i < set->n; i++) {
		struct blob *b = set->v[i];
		struct blob_info info;

		if (set->glob[i])
			continue;
		store_pin_why(p->store, b, PIN_REF, 1);
		blob_info(p->store, b, &info);
		if (info.state != BLOB_LOCAL) {
			missing++;
			if (!*why && info.reason[0])
				snprintf(why, wsz, "%s: %s", info.id[0] ? info.id : info.key,
					 info.reason);
		}
		if (info.state == BLOB_NAS || info.state == BLOB_FAILED)
			store_request(p->store, b, STORE_BY_PIN, now);
	}
	return missing;
}

/* Take the ref pins' reason off the blobs of @set that no ref pin keeps
 * (@keep): a blob pinned by hand too stays pinned.  Returns how many are
 * unpinned now (what "N blobs unpinned" tells the user). */
static size_t unpin_unless_kept(struct pins *p, const struct blob_set *set,
				const struct blob_set *keep)
{
	size_t n = 0;

	for (size_t i = 0; i < set->n; i++) {
		struct blob_info info;

		if (blob_set_has(keep, set->v[i]) ||
		    !store_pin_why(p->store, set->v[i], PIN_REF, 0))
			continue;
		blob_info(p->store, set->v[i], &info);
		n += !info.pinned;
	}
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

/* The ref moved on (or back) while @r->pending was still being copied:
 * that revision is not wanted any more; unpin what neither the kept
 * revision, the one the ref names now (@next) nor another ref pin has, and
 * forget it (pending and the reason it gave).  0, or -errno with nothing
 * changed but @r's reason (a listing failed: tried again later). */
static int drop_pending(struct pins *p, struct pin *r, const char *next)
{
	struct blob_set keep = { 0 }, gone = { 0 };
	const char *revs[] = { r->pending };
	size_t n = 0;
	int err = let_go(p, r->repo, r->ref, revs, 1, &gone, &keep);

	if (!err)
		err = revision_keeps(p, r->repo, r->commit, &keep);
	if (err >= 0)
		err = revision_keeps(p, r->repo, next, &keep);
	blob_set_unique(&keep);
	if (err >= 0)
		n = unpin_unless_kept(p, &gone, &keep);
	blob_set_free(&keep);
	blob_set_free(&gone);
	if (err < 0) {
		snprintf(r->reason, sizeof(r->reason), "the ref names %s: revision %s not let go "
			 "yet (a listing failed: %s)", next, r->pending, strerror(-err));
		return err;
	}
	store_log_msg(p->store, LOG_NOTICE, "ref pin %s refs/%s: revision %s dropped before it was "
		      "local (the ref names %s): %zu blobs unpinned", r->repo, r->ref, r->pending,
		      next, n);
	r->pending[0] = '\0';
	r->reason[0] = '\0';
	return 0;
}

/* op_lock for a client's request (pin, unpin --ref).  The operation it
 * waits behind may be stuck in a NAS listing that hangs (the poll's walk
 * of a revision has no deadline): it waits only while the gate says the
 * NAS is up, and once it says down the request is refused as one made
 * then would be, not held until the NAS answers again.  0 or -EHOSTDOWN. */
static int op_lock_request(struct pins *p)
{
	/* (tried every 2 ms: a timed lock waits on CLOCK_REALTIME, which may
	 * jump, and the sanitizers know no CLOCK_MONOTONIC one) */
	while (pthread_mutex_trylock(&p->op_lock) != 0) {
		if (!nas_gate_up(p->store->opt.gate))
			return -EHOSTDOWN;
		nanosleep(&(struct timespec){ 0, 2000000L }, NULL);
	}
	return 0;
}

int pins_pin(struct pins *p, const char *repo, const char *ref, char *commit, size_t csz)
{
	struct blob_set set = { 0 };
	struct pin r;
	char c[NAME_MAX + 1], why[512] = "";
	int err, e;

	if (!p->roots)
		return -ENOTSUP;
	if (!valid_name(repo, ref))
		return -EINVAL;
	if ((err = op_lock_request(p)) < 0)
		return err;
	err = refs_read_gated(p, repo, ref, c, sizeof(c));
	if (err == 0 && !snapshot_exists(p->roots, repo, c))
		err = -ENOENT;
	/* the revision's blobs before anything is saved: a pin that cannot
	 * be made (not a repo, the NAS not answering) is refused whole, not
	 * kept behind a failure */
	if (err == 0)
		err = revision_set(p, repo, c, &set);
	err = err == 1 ? -ENOENT : err; /* gone since it was seen */
	if (err < 0)
		goto out;
	if (get(p, repo, ref, &r) == 0) {
		const char *next = strcmp(r.commit, c) ? c : "";

		/* a revision the ref no longer names: dropped, as when the
		 * poll sees the ref move (follow_ref) */
		if (r.pending[0] && strcmp(r.pending, next) && (err = drop_pending(p, &r, c)) < 0)
			goto out;
		snprintf(r.pending, sizeof(r.pending), "%s", next);
	} else {
		memset(&r, 0, sizeof(r));
		snprintf(r.repo, sizeof(r.repo), "%s", repo);
		snprintf(r.ref, sizeof(r.ref), "%s", ref);
		snprintf(r.pending, sizeof(r.pending), "%s", c);
	}
	err = put(p, &r);
	if (err < 0)
		goto out;
	/* the pin saved before its blobs are pinned: a stop in between
	 * leaves a pin whose pending revision the next poll pins (settle),
	 * never blobs pinned by no pin (a copy worker may write the index
	 * between any two steps here) */
	e = persist(p);
	pin_set(p, &set, 1, why, sizeof(why));
	/* what was pinned: excluded blobs stay on the NAS, unpinned */
	for (size_t i = 0; i < set.n; i++)
		err += !set.glob[i];
	store_log_msg(p->store, LOG_NOTICE, "ref pin %s refs/%s: revision %s", repo, ref, c);
	snprintf(commit, csz, "%s", c);
	if (e == 0)
		e = store_sync(p->store);
	if (e < 0) {
		/* in place, not saved: a restart would forget it */
		store_log_msg(p->store, LOG_ERR, "ref pin %s refs/%s not saved: %s", repo, ref,
			      strerror(-e));
		err = e;
	}
out:
	blob_set_free(&set);
	pthread_mutex_unlock(&p->op_lock);
	if (err >= 0)
		pins_poke(p);
	return err;
}

int pins_unpin(struct pins *p, const char *repo, const char *ref)
{
	struct blob_set keep = { 0 }, set = { 0 };
	struct pin gone, *r;
	const char *revs[2];
	size_t n = 0;
	int err;

	if ((err = op_lock_request(p)) < 0)
		return err;
	err = get(p, repo, ref, &gone);
	revs[0] = gone.commit;
	revs[1] = gone.pending;
	/* its revisions listed before it is dropped: a pin dropped with
	 * blobs it could not name would leave them pinned for good */
	if (!err)
		err = let_go(p, repo, ref, revs, 2, &set, &keep);
	if (!err) {
		pthread_mutex_lock(&p->lock);
		r = find_locked(p, repo, ref);
		memmove(r, r + 1, (size_t)(p->v + p->n - (r + 1)) * sizeof(*r));
		p->n--;
		pthread_mutex_unlock(&p->lock);
		/* the pin's end saved before its blobs are unpinned: a stop
		 * in between leaves blobs pinned by no pin, which the first
		 * poll after the start unpins (unpin_orphans), never a pin
		 * whose revision is no longer pinned */
		err = persist(p);
		n = unpin_unless_kept(p, &set, &keep);
		if (err == 0)
			err = store_sync(p->store);
		if (err < 0)
			store_log_msg(p->store, LOG_ERR, "ref pin %s refs/%s dropped, not saved: "
				      "%s", repo, ref, strerror(-err));
	}
	blob_set_free(&set);
	blob_set_free(&keep);
	pthread_mutex_unlock(&p->op_lock);
	if (err < 0)
		return err;
	store_log_msg(p->store, LOG_NOTICE, "ref pin %s refs/%s dropped: %zu blobs unpinned", repo,
		      ref, n);
	return (int)n;
}

/* 1 when @repo's blobs/ on the NAS holds a download in progress
 * (HUB-LAYOUT.md: "<id>.incomplete" or "<id>.<8 hex>.incomplete", renamed
 * when done): a client writes refs/<name> before the files, so a snapshot
 * seen then may hold only the files done so far.  0 otherwise, and when
 * blobs/ cannot be listed (the revision's own listing speaks for it). */
static int downloads_in_progress(struct pins *p, const char *repo)
{
	static const char suffix[] = ".incomplete";
	char rel[PATH_MAX];
	struct ns_dir nd;
	struct dirent *de;
	DIR *d = NULL;
	int fd = -1, busy = 0;

	if (snprintf(rel, sizeof(rel), "%s/blobs", repo) >= (int)sizeof(rel))
		return 0;
	if (ns_dir_open(&nd, p->roots, rel) == 0 && (fd = dup(nd.fd)) >= 0 && !(d = fdopendir(fd)))
		close(fd);
	while (d && !busy && (de = readdir(d))) {
		size_t n = strlen(de->d_name);

		busy = n > sizeof(suffix) - 1 && !strcmp(de->d_name + n - (sizeof(suffix) - 1), suffix);
	}
	if (d)
		closedir(d);
	ns_dir_close(&nd);
	return busy;
}

/* The pending revision of @r: pin and queue it; once all of it is local it
 * becomes the kept one, and the old one's blobs (unless another ref pin or
 * the new revision has them) are unpinned.  Returns 1 when @r changed. */
static int settle(struct pins *p, struct pin *r)
{
	struct blob_set set = { 0 }, keep = { 0 }, old = { 0 };
	char why[512] = "";
	size_t missing, n = 0;

	if (!r->pending[0])
		return 0;
	/* (not there: a client writes the ref before the files) */
	if (revision_set(p, r->repo, r->pending, &set) != 0) {
		snprintf(r->reason, sizeof(r->reason), "cannot list %s/snapshots/%s", r->repo,
			 r->pending);
		blob_set_free(&set);
		return 0;
	}
	/* failed copies: the store retries them with backoff (store.h) */
	missing = pin_set(p, &set, 0, why, sizeof(why));
	if (missing) {
		snprintf(r->reason, sizeof(r->reason), "moving to %s: %zu of %zu blobs not local "
			 "yet%s%s", r->pending, missing, set.n, *why ? "; " : "", why);
		blob_set_free(&set);
		return 0;
	}
	/* all of it local, but maybe not all of it there yet: listed again at
	 * the next look, the files that came meanwhile pinned and copied */
	if (downloads_in_progress(p, r->repo)) {
		snprintf(r->reason, sizeof(r->reason), "moving to %s: its %zu blobs local; downloads "
			 "in progress on the NAS (%s/blobs/*.incomplete)", r->pending, set.n,
			 r->repo);
		blob_set_free(&set);
		return 0;
	}
	if (r->commit[0] && strcmp(r->commit, r->pending)) {
		const char *revs[] = { r->commit };
		int err = let_go(p, r->repo, r->ref, revs, 1, &old, &keep);

		for (size_t i = 0; !err && i < set.n; i++)
			if (!set.glob[i] && blob_set_add(&keep, set.v[i]) < 0)
				err = -ENOMEM;
		if (err) {
			snprintf(r->reason, sizeof(r->reason), "moving to %s: all local; %s not let "
				 "go yet (a listing failed: %s)", r->pending, r->commit,
				 strerror(-err));
			blob_set_free(&keep);
			blob_set_free(&old);
			blob_set_free(&set);
			return 0;
		}
		blob_set_unique(&keep);
		n = unpin_unless_kept(p, &old, &keep);
	}
	store_log_msg(p->store, LOG_NOTICE, "ref pin %s refs/%s: revision %s is local (%zu blobs)%s%s%s",
		  r->repo, r->ref, r->pending, set.n, n ? "; unpinned what only " : "",
		  n ? r->commit : "", n ? " had" : "");
	snprintf(r->commit, sizeof(r->commit), "%s", r->pending);
	r->pending[0] = '\0';
	r->reason[0] = '\0';
	blob_set_free(&keep);
	blob_set_free(&old);
	blob_set_free(&set);
	return 1;
}

/* One ref pin: follow the ref, promote the revision it moved to, and once
 * that is all local, let the old one go.  Returns 1 when the pin changed. */
static int follow_ref(struct pins *p, struct pin *r)
{
	char cur[NAME_MAX + 1];
	int err, changed;

	/* First what is under way: a revision local by now is the kept one
	 * before the ref is looked at again. */
	changed = settle(p, r);
	err = refs_read_gated(p, r->repo, r->ref, cur, sizeof(cur));
	if (err < 0) {
		snprintf(r->reason, sizeof(r->reason), "cannot read %s/refs/%s: %s", r->repo, r->ref,
			 strerror(-err));
		return changed;
	}
	/* Back to the kept revision before the pending one was local: that
	 * one is dropped, as when the ref moves on to a third. */
	if (!strcmp(cur, r->commit) && r->pending[0])
		return drop_pending(p, r, cur) == 0 ? 1 : changed;
	if (!strcmp(cur, r->commit) || !strcmp(cur, r->pending))
		return changed;
	if (!snapshot_exists(p->roots, r->repo, cur)) {
		snprintf(r->reason, sizeof(r->reason), "refs/%s names %s, which has no snapshot yet",
			 r->ref, cur);
		return changed;
	}
	store_log_msg(p->store, LOG_NOTICE, "ref %s refs/%s moved from %s to %s: promoting it", r->repo,
		  r->ref, r->commit[0] ? r->commit : "(none)", cur);
	if (r->pending[0] && drop_pending(p, r, cur) < 0)
		return changed;
	snprintf(r->pending, sizeof(r->pending), "%s", cur);
	settle(p, r);
	return 1;
}

/* Unpin the blobs a ref pin's reason holds that no ref pin keeps: what a
 * stop between an unpin --ref's saved end and the blobs it then unpins
 * leaves (pins_unpin), or a wfs that pinned blobs before it saved the pin
 * (older than this one).  Once, at the first poll whose listings of the
 * pinned revisions all succeed: kept blindly, they stayed pinned for good
 * (no pin would ever let them go, and evict --force keeps a ref pin's). */
static void unpin_orphans(struct pins *p)
{
	struct blob_set held = { 0 }, keep = { 0 };
	/* (no pin is named "": every pin's revisions are listed) */
	int err = all_ref_pinned(p, &held);
	size_t n = 0;

	if (!err && held.n)
		err = kept_by_others(p, "", "", &keep);
	if (!err) {
		n = unpin_unless_kept(p, &held, &keep);
		p->orphans_checked = 1;
	}
	if (n)
		store_log_msg(p->store, LOG_NOTICE, "ref pins: %zu blobs pinned by no ref pin "
			      "unpinned (left by a stop as a pin was dropped)", n);
	if (!err && held.n)
		store_sync(p->store);
	blob_set_free(&held);
	blob_set_free(&keep);
}

void pins_poll(struct pins *p)
{
	size_t n;
	struct pin *v;
	int changed = 0;

	pthread_mutex_lock(&p->op_lock);
	if (!p->orphans_checked)
		unpin_orphans(p);
	v = pins_list(p, &n);
	for (size_t i = 0; v && i < n; i++) {
		changed |= follow_ref(p, &v[i]);
		put(p, &v[i]); /* what we learnt; no one else changed it meanwhile */
	}
	free(v);
	if (changed)
		persist(p);
	pthread_mutex_unlock(&p->op_lock);
}

int pins_open(struct pins *p, struct store *s, const struct hub_roots *roots,
	      const struct policy_opts *policy)
{
	struct store_ref_rec *v;
	size_t n;

	memset(p, 0, sizeof(*p));
	pthread_mutex_init(&p->op_lock, NULL);
	pthread_mutex_init(&p->lock, NULL);
	p->store = s;
	p->roots = roots;
	p->policy = policy;
	v = store_get_refs(s, &n);
	if (!v)
		return -ENOMEM;
	p->v = calloc(n ? n : 1, sizeof(*p->v));
	if (!p->v) {
		free(v);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		memcpy(p->v[i].repo, v[i].repo, sizeof(v[i].repo));
		memcpy(p->v[i].ref, v[i].ref, sizeof(v[i].ref));
		memcpy(p->v[i].commit, v[i].commit, sizeof(v[i].commit));
		memcpy(p->v[i].pending, v[i].pending, sizeof(v[i].pending));
	}
	p->n = n;
	free(v);
	return 0;
}

void pins_close(struct pins *p)
{
	free(p->v);
	p->v = NULL;
	p->n = 0;
	pthread_mutex_destroy(&p->lock);
	pthread_mutex_destroy(&p->op_lock);
}
