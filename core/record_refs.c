/* record_refs.c - which revision a ref of the record shows while the NAS
 * is down.
 *
 * An engine offline (HF_HUB_OFFLINE=1) reads refs/<ref>, then opens
 * snapshots/<rev>/<path>: it needs a revision whose every file is local.
 * The record is rebuilt whenever a local copy lands, so while a ref pin
 * (or anyone) promotes the revision a ref moved to on the NAS, each
 * build reads the ref's new bytes -- and an outage in that window made
 * the mount show the new revision, its missing files EIO, while the one
 * the ref named before was still all local.  So a build keeps showing a
 * ref at the revision the record showed it at, as long as that one is
 * wholly local and the one the NAS names is not (files an exclusion glob
 * keeps on the NAS aside, as for a ref pin); the NAS's bytes go with
 * it (nas_data: status, the log).  While the NAS answers the record is
 * not read: the NAS's ref is what the mount shows.  Nothing is made up:
 * the bytes and attributes held are those of a build that read them from
 * the NAS.
 */
#include "record_int.h"
#include "path.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The length of "<repo>/snapshots/<rev>" at the start of @rel when
 * something lies under it, else 0. */
static size_t rev_len(const char *rel)
{
	const char *s = strchr(rel, '/'), *end;

	if (!s || s == rel || strncmp(s, "/snapshots/", 11) != 0)
		return 0;
	end = strchr(s + 11, '/');
	return end && end != s + 11 && end[1] ? (size_t)(end - rel) : 0;
}

static int revs_has(const struct revs *l, const char *dir, size_t len)
{
	for (size_t i = 0; i < l->n; i++)
		if (strlen(l->v[i]) == len && !strncmp(l->v[i], dir, len))
			return 1;
	return 0;
}

int revs_note(struct revs *l, const char *rel, const struct policy_opts *pol)
{
	size_t len = rev_len(rel);

	if (!len || revs_has(l, rel, len) || policy_excluded(pol, rel))
		return 0;
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 8;
		char **v = realloc(l->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		l->v = v;
		l->cap = cap;
	}
	if (!(l->v[l->n] = strndup(rel, len)))
		return -ENOMEM;
	l->n++;
	return 0;
}

void revs_free(struct revs *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
	*l = (struct revs){ 0 };
}

/* The revision a refs file's bytes name, as refs_read (pins.c) takes it:
 * up to the first blank, one plain name.  0, or -EINVAL. */
static int rev_of(const char *data, size_t len, char *out, size_t sz)
{
	size_t n = 0;

	while (n < len && data[n] && !strchr(" \t\r\n", data[n]))
		n++;
	if (!n || n >= sz || n > NAME_MAX || memchr(data, '/', n))
		return -EINVAL;
	memcpy(out, data, n);
	out[n] = '\0';
	return strcmp(out, ".") && strcmp(out, "..") ? 0 : -EINVAL;
}

/* Is "<repo of @ref_path>/snapshots/@rev" kept, with every file under it
 * wholly local? */
static int whole(const struct htab *h, const struct revs *partial, const char *ref_path,
		 const char *rev)
{
	char dir[PATH_MAX];
	struct rnode *d;
	int n = snprintf(dir, sizeof(dir), "%.*s/snapshots/%s", (int)strcspn(ref_path, "/"),
			 ref_path, rev);

	if (n < 0 || (size_t)n >= sizeof(dir))
		return 0;
	d = rnode_find(h, dir);
	return d && d->kind == NS_DIR && d->keep && !revs_has(partial, dir, (size_t)n);
}

/* @n (a kept refs file naming @now, not wholly local): held back at the
 * current table's node of its path when that names a revision that is.
 * 1 held (a line to @note), 0 not, or -ENOMEM. */
static int hold(struct record *r, const struct htab *h, struct revs *partial, struct rnode *n,
		const char *now, int (*note)(void *, const char *), void *arg)
{
	struct record_entry *old = malloc(sizeof(*old));
	char *data = NULL, was[NAME_MAX + 1], line[PATH_MAX + 3 * NAME_MAX + 200];
	int e;

	if (!old)
		return -ENOMEM;
	e = record_lookup_data(r, n->path, old, &data);
	if (e == -ENOENT || (!e && (old->e.kind != NS_FILE || !data ||
				     rev_of(data, old->data_len, was, sizeof(was)) < 0 ||
				     !strcmp(was, now) || !whole(h, partial, n->path, was))))
		e = 1; /* nothing to hold it at */
	if (e) {
		free(old);
		free(data);
		return e < 0 ? e : 0;
	}
	free(n->nas_data);
	n->nas_data = n->data;
	n->nas_data_len = n->data_len;
	n->data = data;
	n->data_len = old->data_len;
	n->st = old->e.st;
	free(old);
	snprintf(line, sizeof(line), "record: %s names %s, not all local yet: while the NAS is "
		 "down the mount shows it at %s (all local); the NAS's once it answers",
		 n->path, now, was);
	return note(arg, line) < 0 ? -ENOMEM : 1;
}

int record_hold_refs(struct record *r, const struct htab *h, const struct rnodes *all,
		     struct revs *partial, const struct policy_opts *pol,
		     int (*note)(void *arg, const char *line), void *arg)
{
	char now[NAME_MAX + 1];
	int e = 0;

	/* What the walk kept but cannot serve whole: a file with only some
	 * ranges local, a link that leads to one or was not kept. */
	for (size_t i = 0; !e && i < all->n; i++) {
		const struct rnode *n = all->v[i];

		if (n->kind != NS_DIR && !(n->keep && n->full))
			e = revs_note(partial, n->path, pol);
	}
	for (size_t i = 0; !e && i < all->n; i++) {
		struct rnode *n = all->v[i];

		if (n->kind != NS_FILE || !n->keep || !n->has_data || !record_is_ref(n->path) ||
		    rev_of(n->data, n->data_len, now, sizeof(now)) < 0 ||
		    whole(h, partial, n->path, now))
			continue;
		e = hold(r, h, partial, n, now, note, arg);
		e = e < 0 ? e : 0;
	}
	return e;
}

int record_held_refs(struct record *r, struct record_held **out, size_t *count)
{
	struct record_held *v = NULL;
	size_t n = 0, cap = 0;
	int e = 0;

	*out = NULL;
	*count = 0;
	pthread_mutex_lock(&r->lock);
	for (size_t i = 0; r->table && !e && i < r->table->n; i++) {
		const struct rnode *x = r->table->v[i];
		struct record_held *h;

		if (!x->nas_data || !x->has_data)
			continue;
		if (n == cap) {
			size_t c = cap ? 2 * cap : 4;
			struct record_held *nv = realloc(v, c * sizeof(*nv));

			if (!nv) {
				e = -ENOMEM;
				break;
			}
			v = nv;
			cap = c;
		}
		h = &v[n];
		if (rev_of(x->data, x->data_len, h->shows, sizeof(h->shows)) < 0 ||
		    rev_of(x->nas_data, x->nas_data_len, h->nas, sizeof(h->nas)) < 0)
			continue; /* a file loaded from record.json that is no ref of ours */
		snprintf(h->path, sizeof(h->path), "%s", x->path);
		n++;
	}
	pthread_mutex_unlock(&r->lock);
	if (e) {
		free(v);
		return e;
	}
	*out = v;
	*count = n;
	return 0;
}
