/* control.c - the control server; see control.h. */
#include "control.h"
#include "doctor.h"
#include "metrics.h"
#include "collect.h"
#include "ns.h"
#include "pins.h"
#include "path.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* ---- replies ---- */

static json_t *error_reply(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static json_t *error_reply(int err, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return json_pack("{s:b, s:s, s:s}", "ok", 0, "error", msg, "errno",
			 strerrorname_np(err) ? strerrorname_np(err) : "EIO");
}

static json_t *blob_json(struct control *c, struct blob *b)
{
	struct blob_info in;

	blob_info(c->store, b, &in);
	return json_pack("{s:s, s:s, s:s, s:I, s:I, s:b, s:s}", "key", in.key, "id", in.id,
			 "state", blob_state_name(in.state), "size", (json_int_t)in.size,
			 "bytes_done", (json_int_t)in.bytes_done, "pinned", in.pinned,
			 "reason", in.reason);
}

static const struct policy_opts *pol_of(struct control *c)
{
	return c->store->opt.policy;
}

/* The request's "paths" (or "path"; none: the mount root), validated and
 * normalised: a new array of strings, or NULL with *@err set. */
static json_t *req_paths(struct control *c, json_t *req, json_t **err)
{
	json_t *paths = json_object_get(req, "paths"), *p, *out;
	json_t *one = json_object_get(req, "path");
	size_t i;

	if (!paths && one)
		paths = one;
	if (!paths)
		return json_pack("[s]", "");
	if (json_is_string(paths))
		return json_pack("[O]", paths);
	if (!json_is_array(paths)) {
		*err = error_reply(EINVAL, "\"paths\" must be a list of mount-relative paths");
		return NULL;
	}
	out = json_array();
	json_array_foreach(paths, i, p) {
		char norm[PATH_MAX];
		const char *rel = json_string_value(p);

		if (!rel || rel[0] == '/' || path_normalize(rel, norm, sizeof(norm)) < 0) {
			*err = error_reply(EINVAL, "%s: not a path inside the mount %s",
					   rel ? rel : "(not a string)", c->mount);
			json_decref(out);
			return NULL;
		}
		json_array_append_new(out, json_string(norm));
	}
	return out;
}

static json_t *collect_error(const char *rel, int r)
{
	if (r == -EMEDIUMTYPE)
		return error_reply(EINVAL, "%s: not weight data (refs, .no_exist, trees/ and files "
				   "outside a repo's blobs/ and snapshots/ change on the NAS or "
				   "belong to its clients): always read from the NAS, never copied",
				   rel);
	return error_reply(-r, "%s: %s", *rel ? rel : "/", strerror(-r));
}

/* Collect the blobs of every path of the request into @set. */
static json_t *gather(struct control *c, json_t *req, struct blob_set *set)
{
	json_t *err = NULL, *paths = req_paths(c, req, &err), *p;
	size_t i;

	if (!paths)
		return err;
	json_array_foreach(paths, i, p) {
		int r = collect(c->roots, c->store, pol_of(c), json_string_value(p), set);

		if (r < 0) {
			err = collect_error(json_string_value(p), r);
			break;
		}
	}
	json_decref(paths);
	blob_set_unique(set);
	return err;
}

static json_t *excluded_json(const struct blob_set *set, size_t i)
{
	return json_pack("{s:s, s:s, s:s?, s:s, s:I}", "key", set->v[i]->key, "id", set->v[i]->id,
			 "path", set->name[i], "glob", set->glob[i], "size",
			 (json_int_t)set->v[i]->size);
}

/* Promote every blob under the paths.  An excluded name keeps its blob on
 * the NAS unless "force": a path that is all excluded is refused (named in
 * "refused"), excluded blobs inside a larger path are skipped (listed in
 * "excluded"). */
static json_t *op_promote(struct control *c, json_t *req)
{
	struct blob_set set = {0}, one = {0};
	int pin = json_is_true(json_object_get(req, "pin"));
	int dry = json_is_true(json_object_get(req, "dry_run"));
	int force = json_is_true(json_object_get(req, "force"));
	json_t *err = NULL, *paths = req_paths(c, req, &err), *p, *list, *excl, *refused;
	uint64_t need = 0, evictable = 0, room;
	size_t i;

	if (!paths)
		return err;
	refused = json_array();
	json_array_foreach(paths, i, p) {
		const char *rel = json_string_value(p);
		size_t nex = 0;
		int r;

		blob_set_clear(&one);
		r = collect(c->roots, c->store, pol_of(c), rel, &one);
		if (r < 0) {
			err = collect_error(rel, r);
			goto out;
		}
		for (size_t k = 0; k < one.n; k++) {
			nex += one.glob[k] != NULL;
			if (blob_set_add(&set, one.v[k]) < 0) {
				err = error_reply(ENOMEM, "out of memory");
				goto out;
			}
			/* keep the exclusion with the blob */
			set.glob[set.n - 1] = one.glob[k];
			set.name[set.n - 1] = one.name[k];
			one.name[k] = NULL;
		}
		if (!force && one.n && nex == one.n)
			json_array_append_new(refused, json_pack("{s:s, s:s, s:s?}", "path", rel,
				"glob", one.glob[0], "name", set.name[set.n - one.n]));
	}
	blob_set_unique(&set);
	list = json_array();
	excl = json_array();
	for (i = 0; i < set.n; i++) {
		struct blob_info snap;
		int skip = set.glob[i] && !force;

		blob_info(c->store, set.v[i], &snap);
		if (skip) {
			json_array_append_new(excl, excluded_json(&set, i));
			continue;
		}
		if (snap.state != BLOB_LOCAL && snap.state != BLOB_MISMATCH)
			need += snap.size;
		if (!dry && snap.state != BLOB_MISMATCH)
			store_promote(c->store, set.v[i], pin, 1);
		json_array_append_new(list, blob_json(c, set.v[i]));
	}
	room = store_room(c->store, &evictable);
	err = json_pack("{s:b, s:o, s:I, s:I, s:I, s:b, s:o, s:O}", "ok", 1, "blobs", list,
			"bytes_to_copy", (json_int_t)need, "space_available", (json_int_t)room,
			"evictable_bytes", (json_int_t)evictable, "dry_run", dry, "excluded", excl,
			"refused", refused);
out:
	json_decref(refused);
	json_decref(paths);
	blob_set_free(&one);
	blob_set_free(&set);
	return err;
}

static json_t *op_progress(struct control *c, json_t *req)
{
	json_t *keys = json_object_get(req, "keys"), *k, *list = json_array();
	size_t i;

	if (!json_is_array(keys)) {
		json_decref(list);
		return error_reply(EINVAL, "\"keys\" must be a list");
	}
	json_array_foreach(keys, i, k) {
		const char *key = json_string_value(k);
		struct blob *b = key ? store_find(c->store, key) : NULL;

		if (b)
			json_array_append_new(list, blob_json(c, b));
		else
			json_array_append_new(list, json_pack("{s:s, s:s, s:s}", "key",
				key ? key : "", "state", "unknown", "reason", "no such blob"));
	}
	return json_pack("{s:b, s:o}", "ok", 1, "blobs", list);
}

static json_t *op_each(struct control *c, json_t *req, const char *op)
{
	struct blob_set set = {0};
	int force = json_is_true(json_object_get(req, "force"));
	int full = json_is_true(json_object_get(req, "full"));
	json_t *err = gather(c, req, &set), *skipped = json_array(), *demoted = json_array();
	json_int_t count = 0;

	if (err)
		goto out;
	for (size_t i = 0; i < set.n; i++) {
		struct blob *b = set.v[i];
		struct blob_info in;
		char reason[512];

		blob_info(c->store, b, &in);
		if (!strcmp(op, "evict")) {
			int r = store_evict(c->store, b, force);

			if (r == -EBUSY)
				json_array_append_new(skipped, json_pack("{s:s, s:s, s:s}", "key", in.key,
					"id", in.id, "reason", "pinned (evict --force to drop it)"));
			else if (r > 0)
				count++;
		} else if (!strcmp(op, "pin") || !strcmp(op, "unpin")) {
			store_pin(c->store, b, !strcmp(op, "pin"));
			count++;
		} else {
			if (in.state != BLOB_LOCAL)
				continue;
			count++;
			if (store_verify(c->store, b, full, reason, sizeof(reason)) > 0)
				json_array_append_new(demoted, json_pack("{s:s, s:s, s:s}", "key",
					in.key, "id", in.id, "reason", reason));
		}
	}
	if (!strcmp(op, "evict"))
		err = json_pack("{s:b, s:I, s:O}", "ok", 1, "evicted", count, "skipped", skipped);
	else if (!strcmp(op, "verify"))
		err = json_pack("{s:b, s:I, s:O}", "ok", 1, "checked", count, "demoted", demoted);
	else
		err = json_pack("{s:b, s:I}", "ok", 1, "count", count);
out:
	json_decref(skipped);
	json_decref(demoted);
	blob_set_free(&set);
	return err;
}

/* pin/unpin --ref: {"op":"pin","ref":"main","paths":["<repo>"]} */
static json_t *op_ref(struct control *c, json_t *req, int pin)
{
	const char *ref = json_string_value(json_object_get(req, "ref"));
	json_t *err = NULL, *paths = req_paths(c, req, &err), *rep;
	char repo[PATH_MAX], commit[NAME_MAX + 1] = "";
	const char *rel;
	int r;

	if (!paths)
		return err;
	rel = json_array_size(paths) == 1 ? json_string_value(json_array_get(paths, 0)) : NULL;
	if (!ref || !*ref || !rel || !*rel) {
		json_decref(paths);
		return error_reply(EINVAL, "%s --ref needs a ref name and one repo", pin ? "pin" :
				   "unpin");
	}
	snprintf(repo, sizeof(repo), "%.*s", (int)strcspn(rel, "/"), rel);
	json_decref(paths);
	if (!c->pins)
		return error_reply(ENOTSUP, "ref pins are not available on this mount");
	r = pin ? pins_pin(c->pins, repo, ref, commit, sizeof(commit))
		: pins_unpin(c->pins, repo, ref);
	if (r == -ENOENT && pin)
		return error_reply(ENOENT, "%s: no refs/%s, or no snapshot of the revision it names",
				   repo, ref);
	if (r == -ENOENT)
		return error_reply(ENOENT, "%s: refs/%s is not pinned", repo, ref);
	if (r < 0)
		return error_reply(-r, "%s: refs/%s: %s", repo, ref, strerror(-r));
	rep = json_pack("{s:b, s:s, s:s, s:I}", "ok", 1, "repo", repo, "ref", ref, "count",
			(json_int_t)r);
	if (pin)
		json_object_set_new(rep, "commit", json_string(commit));
	return rep;
}

/* ---- status ---- */

struct tally {
	json_int_t files, bytes, local_files, local_bytes, pinned_files;
	json_int_t per_state[BLOB_NSTATES];
};

static void tally_set(struct control *c, struct blob_set *set, struct tally *t)
{
	memset(t, 0, sizeof(*t));
	for (size_t i = 0; i < set->n; i++) {
		struct blob_info snap;

		blob_info(c->store, set->v[i], &snap);
		t->files++;
		t->bytes += (json_int_t)snap.size;
		t->per_state[snap.state]++;
		t->pinned_files += snap.pinned;
		if (snap.state == BLOB_LOCAL) {
			t->local_files++;
			t->local_bytes += (json_int_t)snap.size;
		}
	}
}

static json_t *tally_json(const struct tally *t)
{
	json_t *states = json_object();

	for (int st = 0; st < BLOB_NSTATES; st++)
		if (t->per_state[st])
			json_object_set_new(states, blob_state_name((enum blob_state)st),
					    json_integer(t->per_state[st]));
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:o}", "files", t->files, "bytes", t->bytes,
			 "local_files", t->local_files, "local_bytes", t->local_bytes,
			 "pinned_files", t->pinned_files, "states", states);
}

/* One repo: totals, and one line per revision. */
static json_t *repo_json(struct control *c, const char *repo)
{
	char snaps[PATH_MAX], path[PATH_MAX * 2];
	struct blob_set set = {0};
	struct tally t;
	json_t *o, *revs = json_array();
	DIR *d;
	struct dirent *de;

	collect(c->roots, c->store, NULL, repo, &set);
	blob_set_unique(&set);
	tally_set(c, &set, &t);
	o = tally_json(&t);
	json_object_set_new(o, "repo", json_string(repo));
	snprintf(snaps, sizeof(snaps), "%s/snapshots", repo);
	snprintf(path, sizeof(path), "%s/%s", c->roots->path[0], snaps);
	d = opendir(path);
	while (d && (de = readdir(d))) {
		char rel[PATH_MAX * 2];
		json_t *r;

		if (de->d_name[0] == '.')
			continue;
		snprintf(rel, sizeof(rel), "%s/%s", snaps, de->d_name);
		blob_set_clear(&set);
		collect(c->roots, c->store, NULL, rel, &set);
		blob_set_unique(&set);
		tally_set(c, &set, &t);
		r = tally_json(&t);
		json_object_set_new(r, "rev", json_string(de->d_name));
		json_array_append_new(revs, r);
	}
	if (d)
		closedir(d);
	json_object_set_new(o, "revisions", revs);
	blob_set_free(&set);
	return o;
}

#define HELD_LIST_MAX 200 /* status lists at most this many blobs kept on the NAS */

struct sums {
	json_int_t local_bytes, nas_bytes, opens, held;
	json_t *copies, *flagged, *held_list;
};

static void sum_blob(void *arg, const struct blob_info *b)
{
	struct sums *s = arg;

	s->local_bytes += (json_int_t)b->local_bytes;
	s->nas_bytes += (json_int_t)b->nas_bytes;
	s->opens += (json_int_t)b->opens;
	if (b->state == BLOB_COPYING)
		json_array_append_new(s->copies, json_pack("{s:s, s:s, s:s, s:I, s:I}", "key",
			b->key, "id", b->id, "state", blob_state_name(b->state),
			"bytes_done", (json_int_t)b->bytes_done, "size", (json_int_t)b->size));
	if (b->state == BLOB_MISMATCH || b->state == BLOB_FAILED)
		json_array_append_new(s->flagged, json_pack("{s:s, s:s, s:s, s:s}", "key", b->key,
			"id", b->id, "state", blob_state_name(b->state), "reason", b->reason));
	/* Why what was wanted is not local: the operator's first question. */
	if (b->hold != HOLD_NONE && b->state == BLOB_NAS && s->held++ < HELD_LIST_MAX)
		json_array_append_new(s->held_list, json_pack("{s:s, s:s, s:s, s:s, s:I, s:s?}",
			"key", b->key, "id", b->id,
			"hold", b->hold == HOLD_EXCLUDED ? "excluded" : "no_room",
			"reason", b->reason, "size", (json_int_t)b->size, "name", b->name));
}

static json_t *policy_json(const struct policy_opts *p)
{
	json_t *ex;

	if (!p)
		return json_pack("{s:b}", "auto", 0);
	ex = json_array();
	for (size_t i = 0; i < p->nexclude; i++)
		json_array_append_new(ex, json_string(p->exclude[i]));
	return json_pack("{s:b, s:I, s:I, s:f, s:b, s:o, s:I, s:I, s:I, s:f}",
		"auto", p->auto_on, "auto_bytes", (json_int_t)p->auto_bytes,
		"auto_opens", (json_int_t)p->auto_opens, "auto_mbps", (double)p->auto_bw / 1e6,
		"siblings", p->siblings, "exclude", ex, "store_max", (json_int_t)p->store_max,
		"min_free", (json_int_t)p->min_free, "min_free_pct", (json_int_t)p->min_free_pct,
		"ref_poll", p->ref_poll);
}

/* The ref pins, with how much of their revisions is local. */
static json_t *refs_json(struct control *c)
{
	size_t n = 0;
	struct pin *v = c->pins ? pins_list(c->pins, &n) : NULL;
	json_t *out = json_array();

	for (size_t i = 0; v && i < n; i++) {
		const char *revs[2] = { v[i].commit, v[i].pending };
		struct tally t[2];
		json_t *o;

		for (int k = 0; k < 2; k++) {
			struct blob_set set = {0};
			char rel[PATH_MAX];

			memset(&t[k], 0, sizeof(t[k]));
			if (!*revs[k])
				continue;
			snprintf(rel, sizeof(rel), "%s/snapshots/%s", v[i].repo, revs[k]);
			collect(c->roots, c->store, NULL, rel, &set);
			blob_set_unique(&set);
			tally_set(c, &set, &t[k]);
			blob_set_free(&set);
		}
		o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I}", "repo", v[i].repo,
			      "ref", v[i].ref, "commit", v[i].commit, "pending", v[i].pending,
			      "reason", v[i].reason, "files", t[0].files,
			      "local_files", t[0].local_files, "pending_files", t[1].files,
			      "pending_local_files", t[1].local_files);
		json_array_append_new(out, o);
	}
	free(v);
	return out;
}

static json_t *control_status(struct control *c, json_t *req)
{
	const char *path = json_string_value(json_object_get(req, "path"));
	char norm[PATH_MAX], repo[PATH_MAX];
	struct sums sums = { .copies = json_array(), .flagged = json_array(),
			     .held_list = json_array() };
	struct store_usage u;
	json_t *repos = json_array(), *rep;
	uint64_t evictable = 0, room;

	if (path && (path[0] == '/' || path_normalize(path, norm, sizeof(norm)) < 0)) {
		json_decref(repos);
		json_decref(sums.copies);
		json_decref(sums.flagged);
		json_decref(sums.held_list);
		return error_reply(EINVAL, "%s: not a path inside the mount %s", path, c->mount);
	}
	if (path && *norm) {
		struct ns_entry *e = malloc(sizeof(*e));
		int r = e ? ns_classify(c->roots, norm, e) : -ENOMEM;

		free(e);
		if (r < 0) {
			json_decref(repos);
			json_decref(sums.copies);
			json_decref(sums.flagged);
			json_decref(sums.held_list);
			return error_reply(-r, "%s: %s", norm, strerror(-r));
		}
		snprintf(repo, sizeof(repo), "%.*s", (int)strcspn(norm, "/"), norm);
		json_array_append_new(repos, repo_json(c, repo));
	} else {
		DIR *d = opendir(c->roots->path[0]);
		struct dirent *de;

		while (d && (de = readdir(d)))
			if (de->d_name[0] != '.' && strstr(de->d_name, "--") &&
			    de->d_type == DT_DIR)
				json_array_append_new(repos, repo_json(c, de->d_name));
		if (d)
			closedir(d);
	}
	store_each(c->store, sum_blob, &sums);
	store_usage(c->store, &u);
	room = store_room(c->store, &evictable);
	rep = json_pack("{s:b, s:s, s:s, s:s, s:o, s:o, s:{s:I, s:I, s:I}, s:o, s:o, s:I}",
		"ok", 1, "nas", c->roots->path[0], "local", c->local, "mount", c->mount,
		"repos", repos, "copies", sums.copies,
		"served", "local_bytes", sums.local_bytes, "nas_bytes", sums.nas_bytes,
		"opens", sums.opens,
		"flagged", sums.flagged, "held", sums.held_list, "held_total", sums.held);
	if (!rep)
		return NULL;
	json_object_set_new(rep, "store", json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
		"s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
		"blobs", (json_int_t)u.blobs, "bytes", (json_int_t)u.bytes,
		"free_bytes", (json_int_t)u.free_bytes, "queued", (json_int_t)u.queued,
		"copying", (json_int_t)u.copying, "used_bytes", (json_int_t)u.used,
		"limit_bytes", (json_int_t)u.limit, "min_free_bytes", (json_int_t)u.floor,
		"fs_bytes", (json_int_t)u.fs_bytes, "reserved_bytes", (json_int_t)u.reserved,
		"held_bytes", (json_int_t)u.held, "pinned_bytes", (json_int_t)u.pinned_bytes,
		"open_bytes", (json_int_t)u.open_bytes, "available_bytes", (json_int_t)room,
		"evictable_bytes", (json_int_t)evictable));
	json_object_set_new(rep, "policy", policy_json(pol_of(c)));
	json_object_set_new(rep, "ref_pins", refs_json(c));
	json_object_set_new(rep, "auto", json_pack("{s:I, s:I, s:I}",
		"queued", (json_int_t)c->store->auto_queued,
		"no_room", (json_int_t)c->store->no_room,
		"excluded", (json_int_t)c->store->excluded));
	json_object_set_new(rep, "counters", json_pack("{s:I, s:I, s:I, s:I}",
		"promoted", (json_int_t)c->store->promoted,
		"evicted", (json_int_t)c->store->evicted,
		"demoted", (json_int_t)c->store->demoted,
		"failed", (json_int_t)c->store->failed));
	return rep;
}

static json_t *op_status(struct control *c, json_t *req, const char *op)
{
	(void)op;
	return control_status(c, req);
}

static json_t *op_promote_req(struct control *c, json_t *req, const char *op)
{
	(void)op;
	return op_promote(c, req);
}

static json_t *op_progress_req(struct control *c, json_t *req, const char *op)
{
	(void)op;
	return op_progress(c, req);
}

static json_t *op_doctor(struct control *c, json_t *req, const char *op)
{
	const char *path = json_string_value(json_object_get(req, "path"));
	char norm[PATH_MAX];

	(void)op;
	if (path && (path[0] == '/' || path_normalize(path, norm, sizeof(norm)) < 0))
		return error_reply(EINVAL, "%s: not a path inside the mount %s", path, c->mount);
	return doctor_reply(c->roots, c->store, path ? norm : "");
}

static json_t *op_stats(struct control *c, json_t *req, const char *op)
{
	(void)op;
	return metrics_reply(c->store, req);
}

/* pin and unpin: of blobs, or with "ref" a ref pin */
static json_t *op_pin(struct control *c, json_t *req, const char *op)
{
	if (json_object_get(req, "ref"))
		return op_ref(c, req, !strcmp(op, "pin"));
	return op_each(c, req, op);
}

static const struct control_op {
	const char *name;
	json_t *(*fn)(struct control *c, json_t *req, const char *op);
	int changes;  /* changes state: root or the mount's owner only */
} control_ops[] = {
	{ "status", op_status, 0 },
	{ "promote", op_promote_req, 1 }, /* a dry run changes nothing: see below */
	{ "progress", op_progress_req, 0 },
	{ "doctor", op_doctor, 0 },
	{ "stats", op_stats, 0 },
	{ "evict", op_each, 1 },
	{ "verify", op_each, 1 },
	{ "pin", op_pin, 1 },
	{ "unpin", op_pin, 1 },
};

char *control_handle(struct control *c, const char *line, size_t len, uid_t peer)
{
	json_error_t jerr;
	json_t *req = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr), *rep;
	const struct control_op *o = NULL;
	const char *op = NULL;
	char *out;

	if (req && json_is_object(req) && (op = json_string_value(json_object_get(req, "op"))))
		for (size_t i = 0; i < sizeof(control_ops) / sizeof(control_ops[0]) && !o; i++)
			if (!strcmp(control_ops[i].name, op))
				o = &control_ops[i];
	if (!req || !json_is_object(req)) {
		rep = error_reply(EINVAL, "malformed request: %s", req ? "not an object" : jerr.text);
	} else if (!op) {
		rep = error_reply(EINVAL, "request has no \"op\"");
	} else if (!o) {
		rep = error_reply(EINVAL, "unknown op \"%s\"", op);
	} else if (o->changes && !(o->fn == op_promote_req &&
				  json_is_true(json_object_get(req, "dry_run"))) &&
		   peer != 0 && peer != c->owner) {
		rep = error_reply(EPERM, "%s: only root or the mount's owner (uid %u) may do this",
				  op, (unsigned)c->owner);
	} else {
		rep = o->fn(c, req, op);
		/* One index write for the whole request, however many blobs it
		 * touched; durable before the reply. */
		if (o->changes)
			store_sync(c->store);
	}
	json_decref(req);
	if (!rep)
		rep = error_reply(ENOMEM, "out of memory");
	out = json_dumps(rep, JSON_COMPACT);
	json_decref(rep);
	return out;
}

static void serve_one(struct control *c, int fd)
{
	char *buf = malloc(CONTROL_MAX_REQUEST + 1), *rep = NULL;
	struct timeval tv = { .tv_sec = 5 };
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	size_t len = 0;
	char *nl = NULL;

	if (!buf)
		return;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
		free(buf);
		return;
	}
	while (len < CONTROL_MAX_REQUEST && !nl) {
		ssize_t n = read(fd, buf + len, CONTROL_MAX_REQUEST - len);

		if (n <= 0)
			break;
		buf[len + (size_t)n] = '\0';
		nl = memchr(buf + len, '\n', (size_t)n);
		len += (size_t)n;
	}
	if (!nl && len >= CONTROL_MAX_REQUEST) {
		json_t *e = error_reply(E2BIG, "request larger than %d bytes", CONTROL_MAX_REQUEST);

		rep = json_dumps(e, JSON_COMPACT);
		json_decref(e);
	} else if (len > 0) {
		rep = control_handle(c, buf, nl ? (size_t)(nl - buf) : len, cred.uid);
	}
	if (rep) {
		size_t rl = strlen(rep);

		rep[rl] = '\0';
		if (write(fd, rep, rl) == (ssize_t)rl)
			(void)!write(fd, "\n", 1);
	}
	free(rep);
	free(buf);
}

struct conn {
	struct control *c;
	int fd;
};

/* One thread per client: a long "verify --full" must not hold up the
 * progress polls of a "promote --wait". */
static void *serve_conn(void *arg)
{
	struct conn *k = arg;
	struct control *c = k->c;

	serve_one(c, k->fd);
	close(k->fd);
	free(k);
	pthread_mutex_lock(&c->lock);
	c->active--;
	pthread_cond_broadcast(&c->idle);
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

static void *serve(void *arg)
{
	struct control *c = arg;
	struct pollfd pfd[2] = {
		{ .fd = c->listen_fd, .events = POLLIN },
		{ .fd = c->wake[0], .events = POLLIN },
	};

	for (;;) {
		struct conn *k;
		pthread_t t;
		int fd;

		if (poll(pfd, 2, -1) < 0)
			continue;
		if (pfd[1].revents)
			break;
		fd = accept4(c->listen_fd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		k = malloc(sizeof(*k));
		pthread_mutex_lock(&c->lock);
		c->active++;
		pthread_mutex_unlock(&c->lock);
		if (k) {
			k->c = c;
			k->fd = fd;
			if (pthread_create(&t, NULL, serve_conn, k) == 0) {
				pthread_detach(t);
				continue;
			}
			free(k);
		}
		serve_one(c, fd); /* no thread to be had: serve it here */
		close(fd);
		pthread_mutex_lock(&c->lock);
		c->active--;
		pthread_mutex_unlock(&c->lock);
	}
	/* The store goes away after us: wait for the clients being served. */
	pthread_mutex_lock(&c->lock);
	while (c->active)
		pthread_cond_wait(&c->idle, &c->lock);
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

int control_bind(struct control *c)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int r;

	if (snprintf(c->sock_path, sizeof(c->sock_path), "%s/wfs.sock", c->local) >=
	    (int)sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, c->sock_path);
	c->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->listen_fd < 0)
		return -errno;
	unlink(c->sock_path); /* a stale socket: the store lock says we own it */
	if (bind(c->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    chmod(c->sock_path, 0666) < 0 || listen(c->listen_fd, 64) < 0 ||
	    pipe2(c->wake, O_CLOEXEC) < 0) {
		r = -errno;
		close(c->listen_fd);
		c->listen_fd = -1;
		return r;
	}
	return 0;
}

int control_start(struct control *c)
{
	int r;

	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->idle, NULL);
	r = pthread_create(&c->thread, NULL, serve, c);

	if (r)
		return -r;
	c->running = 1;
	return 0;
}

void control_stop(struct control *c)
{
	if (!c->running) {
		if (c->listen_fd > 0) { /* bound, never served */
			close(c->listen_fd);
			close(c->wake[0]);
			close(c->wake[1]);
			unlink(c->sock_path);
			c->listen_fd = -1;
		}
		return;
	}
	(void)!write(c->wake[1], "x", 1);
	pthread_join(c->thread, NULL);
	close(c->listen_fd);
	close(c->wake[0]);
	close(c->wake[1]);
	unlink(c->sock_path);
	c->running = 0;
}
