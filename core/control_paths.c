/* control_paths.c - the PATHs of a request: checked and normalised, and,
 * when one names no blob, the reply that says why (not weight data, a link
 * the walks do not follow).  See control_int.h. */
#include "control_int.h"
#include "collect.h"
#include "reply.h"
#include "ns.h"
#include "path.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* "LINK/": @norm (normalised, its "/" gone) as the directory a link to one
 * inside NAS_HUB leads to, as the kernel follows it.  wfsctl --socket with
 * no mount in sight sends a PATH as given; through a mount, realpath has
 * done this.  Anything else is left as it is (and answered as such). */
static void follow_dir_link(struct control *c, char *norm, size_t sz)
{
	struct ns_entry *e = malloc(sizeof(*e));
	char dir[PATH_MAX], joined[PATH_MAX * 2], to[PATH_MAX];

	if (e && ns_classify(c->roots, norm, e) == 0 && e->kind == NS_LINK &&
	    e->link_state == NS_LINK_RESOLVED && !e->backing[0]) {
		path_dirname(norm, dir, sizeof(dir));
		snprintf(joined, sizeof(joined), "%s%s%s", dir, *dir ? "/" : "", e->target);
		if (path_normalize(joined, to, sizeof(to)) == 0)
			snprintf(norm, sz, "%s", to);
	}
	free(e);
}

/* One PATH of a request, normalised into @out (a string added), or the
 * reply that refuses it: a name that leaves the mount ("..", "/") would
 * let any user who may ask a dry run learn what is outside NAS_HUB. */
static json_t *req_path_add(struct control *c, json_t *p, json_t *out)
{
	char norm[PATH_MAX];
	const char *rel = json_string_value(p);
	size_t len = rel ? strlen(rel) : 0;

	if (!rel || rel[0] == '/' || path_normalize(rel, norm, sizeof(norm)) < 0)
		return reply_error(EINVAL, "%s: not a path inside the mount %s",
				   rel ? rel : "(not a string)", c->mount);
	if (len && rel[len - 1] == '/' && *norm)
		follow_dir_link(c, norm, sizeof(norm));
	/* _nocheck: a NAS name need not be UTF-8 (req_hex_names) */
	if (json_array_append_new(out, json_stringn_nocheck(norm, strlen(norm))))
		return reply_error(ENOMEM, "out of memory");
	return NULL;
}

struct named { const char *rel; size_t at; };

static int by_name(const void *a, const void *b)
{
	const struct named *x = a, *y = b;
	int d = strcmp(x->rel, y->rel);

	return d ? d : (x->at > y->at) - (x->at < y->at);
}

/* @paths with each name kept once, at its first place, or NULL (no
 * memory).  A dry run is open to every local user: 16,000 copies of ""
 * in one 64 KiB request walked the whole hub 16,000 times and held every
 * result until the end (the daemon grew by GiBs on a large hub).  Distinct
 * names reach a file at most once per directory above it. */
static json_t *unique_paths(json_t *paths)
{
	size_t n = json_array_size(paths), i;
	struct named *v = malloc((n ? n : 1) * sizeof(*v));
	char *again = calloc(n ? n : 1, 1);
	json_t *out = json_array();

	for (i = 0; v && again && i < n; i++)
		v[i] = (struct named){ json_string_value(json_array_get(paths, i)), i };
	if (v && again)
		qsort(v, n, sizeof(*v), by_name);
	for (i = 1; v && again && i < n; i++)
		again[v[i].at] = !strcmp(v[i].rel, v[i - 1].rel);
	for (i = 0; out && v && again && i < n; i++)
		if (!again[i] && json_array_append(out, json_array_get(paths, i)) < 0)
			break;
	if (!v || !again || i < n) {
		json_decref(out);
		out = NULL;
	}
	free(v);
	free(again);
	return out;
}

/* The request's "paths" (or "path"; none: the mount root; one string is a
 * list of one), each checked and normalised, each name once: a new array
 * of strings, or NULL with *@err set. */
json_t *control_req_paths(struct control *c, json_t *req, json_t **err)
{
	json_t *paths = json_object_get(req, "paths"), *p, *out;
	json_t *one = json_object_get(req, "path");
	size_t i;

	*err = NULL;
	if (!paths && one)
		paths = one;
	if (!paths)
		return json_pack("[s]", "");
	if (!json_is_array(paths) && !json_is_string(paths)) {
		*err = reply_error(EINVAL, "\"paths\" must be a list of mount-relative paths");
		return NULL;
	}
	if (!(out = json_array())) {
		*err = reply_error(ENOMEM, "out of memory");
		return NULL;
	}
	if (json_is_string(paths))
		*err = req_path_add(c, paths, out);
	else
		json_array_foreach(paths, i, p)
			if ((*err = req_path_add(c, p, out)))
				break;
	if (*err) {
		json_decref(out);
		return NULL;
	}
	p = unique_paths(out);
	json_decref(out);
	if (!p)
		*err = reply_error(ENOMEM, "out of memory");
	return p;
}

json_t *control_collect_error(const char *rel, int r)
{
	if (r == -EMEDIUMTYPE)
		return reply_error(EINVAL, "%s: not weight data (refs, .no_exist, trees/ and files "
				   "outside a repo's blobs/ and snapshots/ change on the NAS or "
				   "belong to its clients): always read from the NAS, never copied",
				   rel);
	if (r == -E2BIG)
		return reply_error(E2BIG, "%s: its repo's snapshots hold more than %d names: "
				   "the exclusion globs, which speak of those names, cannot be "
				   "told for its blobs/; name a revision (snapshots/REV) instead",
				   rel, COLLECT_NAMES_MAX);
	return reply_error(-r, "%s: %s", *rel ? rel : "/", strerror(-r));
}

/* A link into another root shown as on the NAS (ns.h): to a directory
 * there, or (its backing set) to a file past a directory some class cannot
 * search. */
static json_t *foreign_link_error(const struct ns_entry *e, const char *rel,
				  const char *target)
{
	if (e->backing[0])
		return reply_error(EACCES, "%s: a link into another root (-> %s) past a directory "
				   "not every user may search, shown as on the NAS: not followed "
				   "for a request", rel, target);
	return reply_error(EISDIR, "%s: a link to a directory of another root (-> %s), "
			   "shown as on the NAS: not walked", rel, target);
}

json_t *control_link_error(struct control *c, const char *rel)
{
	struct ns_entry *e = malloc(sizeof(*e));
	json_t *err = NULL;

	if (!e)
		return reply_error(ENOMEM, "out of memory");
	if (ns_classify(c->roots, rel, e) < 0 || e->kind != NS_LINK)
		goto out;
	switch (e->link_state) {
	case NS_LINK_RESOLVED:
		if (e->backing[0])
			break; /* a link to a file: its blob was found */
		err = reply_error(EISDIR, "%s: a link to a directory (-> %s): links to "
				  "directories are not walked; name the directory (or end "
				  "the PATH with '/')", rel, e->target);
		break;
	case NS_LINK_FOREIGN:
		err = foreign_link_error(e, rel, e->target);
		break;
	case NS_LINK_DANGLING:
		err = reply_error(ENOENT, "%s: a dangling link (-> %s): nothing to act on",
				  rel, e->target);
		break;
	case NS_LINK_LOOP:
		err = reply_error(ELOOP, "%s: a link that loops (-> %s): never followed",
				  rel, e->target);
		break;
	case NS_LINK_ESCAPE:
		err = reply_error(EXDEV, "%s: a link leading outside NAS_HUB (-> %s): never "
				  "followed (wfs -o root=DIR serves what is under DIR)",
				  rel, e->target);
		break;
	}
out:
	free(e);
	return err;
}
