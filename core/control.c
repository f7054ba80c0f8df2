/* control.c - the control server's requests: each checked (JSON, the op,
 * who may, whether the NAS it needs is there) and dispatched through one
 * table; the handlers of the requests that act on blobs (promote, evict,
 * pin, verify, progress, ref pins) and of sync.  "status" is status.c,
 * "doctor" doctor.c, "stats" metrics.c; the request's PATHs
 * control_paths.c; the socket, its threads and limits
 * control_server.c.  See control.h.
 *
 * While the NAS is down (nasgate.h) the requests that walk it are refused
 * at once (EHOSTDOWN) instead of holding a worker in the kernel for as
 * long as it hangs, and "status" runs as a quick request that does not
 * touch it (status.c): so that status and progress answer during an
 * outage even with every slow worker stuck in a walk begun before it.
 */
#include "control_int.h"
#include "reply.h"
#include "status.h"
#include "doctor.h"
#include "metrics.h"
#include "collect.h"
#include "nasgate.h"
#include "peeras.h"
#include "pins.h"
#include "path.h"
#include "record.h"
#include "jbytes.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* sync waits this long for the local record's rebuild (a walk of the repos
 * that hold a local blob; it goes on after, on the record's thread). */
#define SYNC_TIMEOUT_MS 10000

static const struct policy_opts *pol_of(struct control *c)
{
	return c->store->opt.policy;
}

/* Collect the blobs of every path of the request into @set. */
static json_t *gather(struct control *c, json_t *req, struct blob_set *set)
{
	json_t *err = NULL, *paths = control_req_paths(c, req, &err), *p;
	size_t i;

	if (!paths)
		return err;
	json_array_foreach(paths, i, p) {
		size_t n0 = set->n;
		int r = collect(c->roots, c->store, pol_of(c), json_string_value(p), set);

		if (r < 0)
			err = control_collect_error(json_string_value(p), r);
		else if (set->n == n0)
			err = control_link_error(c, json_string_value(p));
		if (err)
			break;
	}
	json_decref(paths);
	blob_set_unique(set);
	return err;
}

static json_t *excluded_json(struct control *c, const struct blob_set *set, size_t i)
{
	struct blob_info in;

	blob_info(c->store, set->v[i], &in);
	return json_pack("{s:o, s:o, s:o?, s:o, s:I}", "key", reply_path(in.key),
			 "id", reply_path(in.id), "path", reply_path(set->name[i]),
			 "glob", reply_path(set->glob[i]), "size", (json_int_t)in.size);
}

/* A file the store has no blob for, as reply_blob would show its blob. */
static json_t *nas_json(const struct nas_file *f, int excluded)
{
	if (excluded)
		return json_pack("{s:o, s:o, s:o?, s:o, s:I}", "key", reply_path(f->key),
				 "id", reply_path(f->id), "path", reply_path(f->name),
				 "glob", reply_path(f->glob), "size", (json_int_t)f->size);
	return json_pack("{s:o, s:o, s:s, s:I, s:I, s:b, s:[], s:s}", "key", reply_path(f->key),
			 "id", reply_path(f->id),
			 "state", blob_state_name(BLOB_NAS), "size", (json_int_t)f->size,
			 "bytes_done", (json_int_t)0, "pinned", 0, "pinned_by", "reason", "");
}

/* One PATH of a promote: its blobs added to @set, each with the exclusion
 * glob that matched it (if any), and on a dry run the files the store does
 * not know added to @nas.  A PATH whose every file is excluded is named in
 * @refused with how many there are, unless @force.  Returns NULL, or the
 * error reply. */
static json_t *promote_collect(struct control *c, const char *rel, int dry, int force,
			       struct blob_set *set, struct blob_set *one, struct nas_set *nas,
			       json_t *refused)
{
	const char *glob = NULL, *name = NULL;
	size_t nex = 0, nas0 = nas->n, found;
	json_t *err;
	int r;

	blob_set_clear(one);
	r = dry ? collect_peek(c->roots, c->store, pol_of(c), rel, one, nas)
		: collect(c->roots, c->store, pol_of(c), rel, one);
	if (r < 0)
		return control_collect_error(rel, r);
	for (size_t k = nas0; k < nas->n; k++) {
		nex += nas->v[k].glob != NULL;
		if (!glob) {
			glob = nas->v[k].glob;
			name = nas->v[k].name;
		}
	}
	for (size_t k = 0; k < one->n; k++) {
		nex += one->glob[k] != NULL;
		if (blob_set_add(set, one->v[k]) < 0)
			return reply_error(ENOMEM, "out of memory");
		/* keep the exclusion with the blob */
		set->glob[set->n - 1] = one->glob[k];
		set->name[set->n - 1] = one->name[k];
		one->name[k] = NULL;
		if (k == 0) {
			glob = set->glob[set->n - 1];
			name = set->name[set->n - 1];
		}
	}
	found = one->n + nas->n - nas0;
	if (!found && (err = control_link_error(c, rel)))
		return err;
	if (!force && found && nex == found)
		json_array_append_new(refused, json_pack("{s:o, s:o, s:o?, s:I}",
			"path", reply_path(rel), "glob", reply_path(glob),
			"name", reply_path(name), "count", (json_int_t)found));
	return NULL;
}

/* What a promote of @set and @nas does (nothing on a dry run), and its
 * reply: the blobs, the excluded ones left on the NAS, the bytes to copy
 * and the room for them. */
static json_t *promote_reply(struct control *c, const struct blob_set *set,
			     const struct nas_set *nas, int pin, int dry, int force,
			     json_t *refused)
{
	json_t *list = json_array(), *excl = json_array();
	/* one request, one time: its blobs do not evict each other for room
	 * (store.h, blob.want_ns), however long queueing them takes */
	uint64_t need = 0, evictable = 0, room, asked = store_now_ns();
	size_t i;

	for (i = 0; i < set->n; i++) {
		struct blob_info snap;

		if (set->glob[i] && !force) {
			json_array_append_new(excl, excluded_json(c, set, i));
			continue;
		}
		blob_info(c->store, set->v[i], &snap);
		if (snap.state != BLOB_LOCAL && snap.state != BLOB_MISMATCH)
			need += snap.size;
		if (!dry && snap.state != BLOB_MISMATCH)
			store_promote_at(c->store, set->v[i], pin, 1, asked);
		json_array_append_new(list, reply_blob(c->store, set->v[i]));
	}
	for (i = 0; i < nas->n; i++) {
		int skip = nas->v[i].glob && !force;

		json_array_append_new(skip ? excl : list, nas_json(&nas->v[i], skip));
		need += skip ? 0 : nas->v[i].size;
	}
	room = store_room(c->store, &evictable);
	return json_pack("{s:b, s:o, s:I, s:I, s:I, s:b, s:o, s:O}", "ok", 1, "blobs", list,
			 "bytes_to_copy", (json_int_t)need, "space_available", (json_int_t)room,
			 "evictable_bytes", (json_int_t)evictable, "dry_run", dry, "excluded", excl,
			 "refused", refused);
}

/* Promote every blob under the paths.  An excluded name keeps its blob on
 * the NAS unless "force": a path that is all excluded is refused (named in
 * "refused"), excluded blobs inside a larger path are skipped (listed in
 * "excluded").  A dry run (open to every local user) changes nothing, not
 * even the blob table: it walks with collect_peek, and files the store
 * does not know are reported from @nas. */
static json_t *op_promote(struct control *c, json_t *req)
{
	struct blob_set set = {0}, one = {0};
	struct nas_set nas = {0};
	int pin = json_is_true(json_object_get(req, "pin"));
	int dry = json_is_true(json_object_get(req, "dry_run"));
	int force = json_is_true(json_object_get(req, "force"));
	json_t *err = NULL, *paths = control_req_paths(c, req, &err), *p, *refused;
	size_t i;

	if (!paths)
		return err;
	if (json_object_get(req, "ranges") || json_object_get(req, "part")) {
		err = control_promote_part(c, req, paths);
		json_decref(paths);
		return err;
	}
	refused = json_array();
	json_array_foreach(paths, i, p) {
		err = promote_collect(c, json_string_value(p), dry, force, &set, &one, &nas,
				      refused);
		if (err)
			break;
	}
	if (!err) {
		blob_set_unique(&set);
		nas_set_unique(&nas);
		err = promote_reply(c, &set, &nas, pin, dry, force, refused);
	}
	json_decref(refused);
	json_decref(paths);
	blob_set_free(&one);
	blob_set_free(&set);
	nas_set_free(&nas);
	return err;
}

/* The blobs' states, and the NAS's (a waiting wfsctl says why copies
 * stand still: the copies wait for the NAS). */
static json_t *op_progress(struct control *c, json_t *req)
{
	json_t *keys = json_object_get(req, "keys"), *k, *list = json_array();
	struct metrics_nas mn;
	size_t i;

	/* (the store's word on any key, whatever the NAS lets the asker see:
	 * the promote --wait of those who may promote polls it) */
	if (peer_as_other()) {
		json_decref(list);
		return reply_error(EPERM, "progress: only root or the mount's owner (uid %u), who "
				   "may promote, may ask it", (unsigned)c->owner);
	}
	if (!json_is_array(keys)) {
		json_decref(list);
		return reply_error(EINVAL, "\"keys\" must be a list");
	}
	json_array_foreach(keys, i, k) {
		const char *key = json_string_value(k);
		struct blob *b = key ? store_find(c->store, key) : NULL;
		char raw[PATH_MAX];

		/* a key a reply escaped (a name that is not UTF-8) */
		if (!b && key && reply_unescape(key, raw, sizeof(raw)) == 1)
			b = store_find(c->store, raw);
		if (b)
			json_array_append_new(list, reply_blob(c->store, b));
		else
			json_array_append_new(list, json_pack("{s:o, s:s, s:s}", "key",
				reply_path(key ? key : ""), "state", "unknown",
				"reason", "no such blob"));
	}
	metrics_collect_nas(c->gate, NULL, &mn);
	return json_pack("{s:b, s:o, s:o*}", "ok", 1, "blobs", list, "nas", metrics_nas_json(&mn));
}

static json_t *op_each(struct control *c, json_t *req, const char *op)
{
	struct blob_set set = {0};
	int force = json_is_true(json_object_get(req, "force"));
	int full = json_is_true(json_object_get(req, "full"));
	json_t *err = gather(c, req, &set), *skipped = json_array(), *demoted = json_array();
	json_int_t count = 0, ref_kept = 0, changed = 0;

	if (err)
		goto out;
	for (size_t i = 0; i < set.n; i++) {
		struct blob *b = set.v[i];
		struct blob_info in;
		char reason[512];

		if (store_stopping(c->store))
			break; /* the daemon stops: a verify --full ends at its blob */
		blob_info(c->store, b, &in);
		if (!strcmp(op, "evict")) {
			/* not even --force of a ref pin's blob: the ref pin would
			 * copy it back at its next look (store_evict) */
			int r = store_evict(c->store, b, force);

			if (r == -EBUSY) {
				blob_info(c->store, b, &in); /* why it was kept: a pin may be new */
				json_array_append_new(skipped, json_pack("{s:o, s:o, s:s}",
					"key", reply_path(in.key), "id", reply_path(in.id),
					"reason", in.pin_why & PIN_REF ? "pinned by a ref pin, which "
					"would copy it back (wfsctl unpin --ref REF REPO drops that "
					"pin; wfsctl status lists it)" : "pinned (evict --force to drop "
					"it)"));
			} else if (r > 0) {
				count++;
			}
		} else if (!strcmp(op, "pin") || !strcmp(op, "unpin")) {
			/* the hand pin only: a ref pin's blobs stay pinned until
			 * unpin --ref (store.h PIN_REF) */
			changed += store_pin_why(c->store, b, PIN_HAND, !strcmp(op, "pin"));
			ref_kept += !strcmp(op, "unpin") && (in.pin_why & PIN_REF);
			count++;
		} else {
			int (*check)(struct store *, struct blob *, int, char *, size_t) =
				in.state == BLOB_LOCAL ? store_verify : store_part_verify;

			if (in.state != BLOB_LOCAL && !in.part_bytes)
				continue;
			count++;
			if (check(c->store, b, full, reason, sizeof(reason)) > 0)
				json_array_append_new(demoted, json_pack("{s:o, s:o, s:o}",
					"key", reply_path(in.key), "id", reply_path(in.id),
					"reason", reply_path(reason)));
		}
	}
	if (!strcmp(op, "evict"))
		err = json_pack("{s:b, s:I, s:O}", "ok", 1, "evicted", count, "skipped", skipped);
	else if (!strcmp(op, "verify"))
		err = json_pack("{s:b, s:I, s:O}", "ok", 1, "checked", count, "demoted", demoted);
	else if (!strcmp(op, "unpin"))
		err = json_pack("{s:b, s:I, s:I, s:I}", "ok", 1, "count", count, "changed", changed,
				"ref_pinned", ref_kept);
	else /* pin */
		err = json_pack("{s:b, s:I, s:I}", "ok", 1, "count", count, "changed", changed);
out:
	json_decref(skipped);
	json_decref(demoted);
	blob_set_free(&set);
	return err;
}

/* Why pin --ref found nothing to pin: no such repo, no such ref, or a
 * revision with no snapshot (yet). */
static json_t *ref_missing(struct control *c, const char *repo, const char *ref)
{
	struct ns_entry *e = malloc(sizeof(*e));
	char rel[PATH_MAX];
	int r;

	if (!e)
		return reply_error(ENOMEM, "out of memory");
	r = ns_classify(c->roots, repo, e);
	if (r == 0 && e->kind == NS_DIR) {
		snprintf(rel, sizeof(rel), "%s/refs/%s", repo, ref);
		r = ns_classify(c->roots, rel, e) == 0 && e->kind == NS_FILE ? 1 : 0;
	}
	free(e);
	if (r < 0)
		return reply_error(ENOENT, "%s: no such repo in the mount", repo);
	if (r == 0)
		return reply_error(ENOENT, "%s: no refs/%s", repo, ref);
	return reply_error(ENOENT, "%s: refs/%s names a revision with no snapshot", repo, ref);
}

/* pin/unpin --ref: {"op":"pin","ref":"main","paths":["<repo>"]} */
static json_t *op_ref(struct control *c, json_t *req, int pin)
{
	const char *ref = json_string_value(json_object_get(req, "ref"));
	json_t *err = NULL, *paths = control_req_paths(c, req, &err), *rep;
	char repo[PATH_MAX], commit[NAME_MAX + 1] = "";
	const char *rel;
	int r;

	if (!paths)
		return err;
	rel = json_array_size(paths) == 1 ? json_string_value(json_array_get(paths, 0)) : NULL;
	if (!ref || !*ref || !rel || !*rel) {
		json_decref(paths);
		/* (wfsctl prefixes its command: "wfsctl: pin: --ref needs ...") */
		return reply_error(EINVAL, "--ref needs a ref name and one repo (a PATH in it; "
				   "the mount root is none)");
	}
	snprintf(repo, sizeof(repo), "%.*s", (int)strcspn(rel, "/"), rel);
	json_decref(paths);
	if (!c->pins)
		return reply_error(ENOTSUP, "ref pins are not available on this mount");
	r = pin ? pins_pin(c->pins, repo, ref, commit, sizeof(commit))
		: pins_unpin(c->pins, repo, ref);
	if (r == -ENOENT && pin)
		return ref_missing(c, repo, ref);
	if (r == -ENOENT)
		return reply_error(ENOENT, "%s: refs/%s is not pinned", repo, ref);
	if (r == -EINVAL)
		return reply_error(EINVAL, "%s: refs/%s: not a ref name (main, refs/pr/1: no "
				   "'.' or '..' component, no '/' at either end)", repo, ref);
	if (r == -EMEDIUMTYPE)
		return control_collect_error(repo, r);
	if (r == -EHOSTDOWN)
		return reply_error(EHOSTDOWN, "%s: refs/%s: the NAS is down (it stopped answering "
				   "while ref pins were being worked on); run it again once it "
				   "answers", repo, ref);
	if (r < 0)
		return reply_error(-r, "%s: refs/%s: %s", repo, ref, strerror(-r));
	rep = json_pack("{s:b, s:o, s:o, s:I}", "ok", 1, "repo", reply_path(repo),
			"ref", reply_path(ref), "count", (json_int_t)r);
	if (rep && pin)
		json_object_set_new(rep, "commit", reply_path(commit));
	return rep;
}

/* status and doctor take one "path" (none: the whole mount): a list, or a
 * "path" that is no string, was answered for the whole mount as if none
 * were given. */
static json_t *one_path_only(json_t *req, const char *op)
{
	json_t *p = json_object_get(req, "path");

	if (json_object_get(req, "paths"))
		return reply_error(EINVAL, "%s takes one \"path\" (or none: the whole mount), "
				   "not \"paths\"", op);
	if (p && !json_is_string(p))
		return reply_error(EINVAL, "%s: \"path\" must be a string", op);
	return NULL;
}

static json_t *op_status(struct control *c, json_t *req, const char *op)
{
	json_t *err = one_path_only(req, op);

	return err ? err : status_reply(c, req, 1);
}

/* status while the NAS is down: from the record and the store only */
static json_t *op_status_offline(struct control *c, json_t *req, const char *op)
{
	json_t *err = one_path_only(req, op);

	return err ? err : status_reply(c, req, 0);
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
	json_t *err = one_path_only(req, op);
	char norm[PATH_MAX];

	if (err)
		return err;
	if (path && (path[0] == '/' || path_normalize(path, norm, sizeof(norm)) < 0))
		return reply_error(EINVAL, "%s: not a path inside the mount %s", path, c->mount);
	return doctor_reply(c->roots, c->store, path ? norm : "");
}

static json_t *op_stats(struct control *c, json_t *req, const char *op)
{
	const struct metrics_src src = { c->store, c->gate, c->record };

	(void)op;
	return metrics_reply(&src, req);
}

/* "2026-11-30 22:41:07: <reason>" of an outage, for messages. */
static void down_since(struct control *c, char *buf, size_t sz)
{
	struct nas_gate_stats st;
	time_t t;
	struct tm tm;
	char when[32] = "?";

	nas_gate_stats(c->gate, &st);
	t = (time_t)st.since;
	if (st.since && localtime_r(&t, &tm))
		strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
	snprintf(buf, sz, "since %s%s%s", when, *st.reason ? ": " : "", st.reason);
}

static json_t *sync_error(struct control *c, int r)
{
	char why[256];

	if (r == -EHOSTDOWN) {
		down_since(c, why, sizeof(why));
		return reply_error(EHOSTDOWN, "sync: the NAS is down (%s): the local record could "
				   "not be refreshed; it keeps what it held", why);
	}
	if (r == -ETIMEDOUT)
		return reply_error(ETIMEDOUT, "sync: the local record's rebuild took over %d s: "
				   "it goes on, and replaces the record when it ends",
				   SYNC_TIMEOUT_MS / 1000);
	if (r == -ESRCH)
		return reply_error(ESRCH, "sync: the local record's rebuild thread is not running: "
				   "the record keeps what it held");
	return reply_error(-r, "sync: the local record could not be refreshed: %s; it keeps "
			   "what it held", strerror(-r));
}

/* {"op":"sync"}: the index written, and the local record rebuilt now (a
 * walk of the repos that hold a local blob, on the record's own thread),
 * so that a NAS outage from now on hides nothing promoted before it.
 * wfsctl promote --wait sends it once its copies have settled.  With the
 * NAS down it does not wait: the rebuild could not reach it.  The reply,
 * ok or not, says what the record holds. */
static json_t *op_sync(struct control *c, json_t *req, const char *op)
{
	struct metrics_nas mn;
	json_t *rep;
	int r = store_sync(c->store), rr = 0;

	(void)req;
	(void)op;
	if (c->record)
		rr = nas_gate_up(c->gate) ? record_sync(c->record, SYNC_TIMEOUT_MS) : -EHOSTDOWN;
	metrics_collect_nas(c->gate, c->record, &mn);
	if (r < 0)
		rep = reply_error(-r, "sync: cannot write the index in %s: %s", c->local,
				  strerror(-r));
	else if (rr < 0)
		rep = sync_error(c, rr);
	else
		rep = json_pack("{s:b}", "ok", 1);
	if (rep && (json_object_set_new(rep, "record_files", json_integer((json_int_t)mn.record_files)) ||
		    json_object_set_new(rep, "record", metrics_record_json(&mn)))) {
		json_decref(rep);
		return NULL;
	}
	return rep;
}

/* pin and unpin: of blobs, or with "ref" a ref pin */
static json_t *op_pin(struct control *c, json_t *req, const char *op)
{
	if (json_object_get(req, "ref"))
		return op_ref(c, req, !strcmp(op, "pin"));
	return op_each(c, req, op);
}

/* Who may do what (README.md "Control protocol"): name, handler, changes
 * (root or the mount's owner only), slow, lingers (see struct control_op). */
static const struct control_op control_ops[] = {
	{ "status", op_status, 0, 1, 0 },
	{ "promote", op_promote_req, 1, 1, 0 }, /* a dry run changes nothing: see below */
	{ "progress", op_progress_req, 0, 0, 0 },
	{ "doctor", op_doctor, 0, 1, 0 },
	{ "stats", op_stats, 0, 0, 0 },
	{ "evict", op_each, 1, 1, 0 },
	{ "verify", op_each, 1, 1, 0 },
	{ "pin", op_pin, 1, 1, 0 },
	{ "unpin", op_pin, 1, 1, 0 },
	{ "sync", op_sync, 1, 0, 1 }, /* waits for the record's thread, never walks itself */
};

/* status while the NAS is down: quick, it does not walk (see above) */
static const struct control_op status_offline = { "status", op_status_offline, 0, 0, 0 };

/* The refusal of @op, a request that walks the NAS, while it is down. */
static json_t *down_refusal(struct control *c, const char *op)
{
	char why[256];

	down_since(c, why, sizeof(why));
	return reply_error(EHOSTDOWN, "%s: the NAS is down (%s): %s walks the NAS tree, so it "
			   "is refused until the NAS answers again: run it again then (wfsctl "
			   "status shows its state)", op, why, op);
}

static json_t *op_refused_down(struct control *c, json_t *req, const char *op)
{
	(void)op;
	return down_refusal(c, json_string_value(json_object_get(req, "op")));
}

/* A walk queued before the NAS went down, refused when a worker takes it */
static const struct control_op refused_down = { "refused", op_refused_down, 0, 0, 0 };

/* The op to run while the NAS is down, or NULL with *@rep a refusal: the
 * slow ops are the ones that walk the NAS. */
static const struct control_op *nas_down_op(struct control *c, const struct control_op *o,
					    json_t **rep)
{
	if (o->fn == op_status)
		return &status_offline;
	*rep = down_refusal(c, o->name);
	return NULL;
}

const struct control_op *control_recheck(struct control *c, const struct control_op *o)
{
	if (!o->slow || nas_gate_up(c->gate))
		return o;
	return o->fn == op_status ? &status_offline : &refused_down;
}

/* One name of "path_hex" / "paths_hex" as a byte string (json_t), or NULL
 * with *@why. */
static json_t *hex_name(json_t *v, const char **why)
{
	const char *hex = json_string_value(v);
	char *raw = NULL;
	size_t len = 0;
	json_t *out;
	int r = hex ? jbytes_unhex(hex, &raw, &len) : -EINVAL;

	if (r == 0 && (!len || memchr(raw, '\0', len)))
		r = -EINVAL;
	*why = r == -ENOMEM ? "out of memory" :
	       "\"path_hex\" and \"paths_hex\" hold names in hex, two digits a byte (no NUL)";
	/* _nocheck: the bytes of a NAS name, which need not be UTF-8; the
	 * handlers read them (json_string_value), nothing serialises them */
	out = r == 0 ? json_stringn_nocheck(raw, len) : NULL;
	free(raw);
	return out;
}

/* NAS names are bytes, JSON strings UTF-8: a name that is not UTF-8 comes
 * as "path_hex" / "paths_hex" (jbytes.h: the bytes in hex), instead of
 * "path" / "paths".  Taken into "path" / "paths" as byte strings here, so
 * every handler reads the name as it reads any other.  0, or -EINVAL with
 * *@why. */
static int req_hex_names(json_t *req, const char **why)
{
	json_t *h = json_object_get(req, "path_hex"), *hs = json_object_get(req, "paths_hex");
	json_t *one, *list, *e;
	size_t i;

	if ((h && json_object_get(req, "path")) || (hs && json_object_get(req, "paths"))) {
		*why = "give a name as \"path\" (\"paths\") or as \"path_hex\" (\"paths_hex\"), "
		       "not both";
		return -EINVAL;
	}
	if (h && (!(one = hex_name(h, why)) || json_object_set_new(req, "path", one)))
		return -EINVAL;
	if (!hs)
		return 0;
	if (json_is_string(hs))
		return (one = hex_name(hs, why)) && !json_object_set_new(req, "paths", one) ? 0 :
		       -EINVAL;
	if (!json_is_array(hs) || !(list = json_array())) {
		*why = "\"paths_hex\" must be a list of names in hex";
		return -EINVAL;
	}
	json_array_foreach(hs, i, e)
		if (!(one = hex_name(e, why)) || json_array_append_new(list, one)) {
			json_decref(list);
			return -EINVAL;
		}
	return json_object_set_new(req, "paths", list) ? -EINVAL : 0;
}

int control_privileged(const struct control *c, uid_t uid)
{
	return uid == 0 || uid == c->owner;
}

/* A dry run of promote changes nothing, so anyone may ask for one -- but
 * not one with "part": that reads the file's own safetensors header (as
 * root), and the reply (its ranges, its tensors, or why the header is not
 * one) tells what the file holds, to a peer who may not be allowed to
 * read it.  "ranges" reads nothing: the file's size, as status shows. */
static int open_to_all(const struct control_op *o, json_t *req)
{
	return o->fn == op_promote_req && json_is_true(json_object_get(req, "dry_run")) &&
	       !json_object_get(req, "part");
}

const struct control_op *control_check(struct control *c, const char *line, size_t len,
				       uid_t peer, json_t **req, json_t **rep)
{
	json_error_t jerr;
	const struct control_op *o = NULL;
	const char *op = NULL, *why = NULL;

	*rep = NULL;
	*req = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
	if (*req && json_is_object(*req) && (op = json_string_value(json_object_get(*req, "op"))))
		for (size_t i = 0; i < sizeof(control_ops) / sizeof(control_ops[0]) && !o; i++)
			if (!strcmp(control_ops[i].name, op))
				o = &control_ops[i];
	if (!*req || !json_is_object(*req))
		*rep = reply_error(EINVAL, "malformed request: %s", *req ? "not an object" : jerr.text);
	else if (!op)
		*rep = reply_error(EINVAL, "request has no \"op\"");
	else if (!o)
		*rep = reply_error(EINVAL, "unknown op \"%s\"", op);
	else if (req_hex_names(*req, &why) < 0)
		*rep = reply_error(EINVAL, "%s: %s", op, why);
	else if (o->changes && !open_to_all(o, *req) && !control_privileged(c, peer))
		/* "OP: ...": wfsctl adds no "OP: " of its own before it */
		*rep = reply_error(EPERM, "%s: only root or the mount's owner (uid %u) may do this%s",
				   op, (unsigned)c->owner,
				   o->fn == op_promote_req && json_object_get(*req, "part") ?
				   " with \"part\" (it reads the file's header, a dry run too)" : "");
	else if (!o->slow || nas_gate_up(c->gate))
		return o;
	else if ((o = nas_down_op(c, o, rep)))
		return o;
	json_decref(*req);
	*req = NULL;
	return NULL;
}

/* @rep of a request whose change the index could not record (@err): not
 * ok, with the reason, whatever else it says (README.md "The local
 * store": the write is tried again, and lost if the daemon dies first). */
static json_t *unrecorded(struct control *c, json_t *rep, const char *op, int err)
{
	json_t *e = reply_error(-err, "%s: done, but cannot write the index %s/index.json: %s "
				"(tried again every 2 s; lost if wfs stops before it is written)",
				op, c->local, strerror(-err));

	if (!e || json_object_update(rep, e) < 0) {
		json_decref(rep);
		rep = json_incref(e);
	}
	json_decref(e);
	return rep;
}

json_t *control_run(struct control *c, const struct control_op *o, json_t *req,
		    const struct peer_id *as)
{
	int dry = open_to_all(o, req), r; /* a dry run: nothing of it to record */
	struct peer_self self = { 0 };
	json_t *rep;

	if (as && (r = peer_as_begin(as, &self)) < 0)
		return reply_error(-r, "%s: cannot take the identity of uid %u to answer it: %s",
				   o->name, (unsigned)as->uid, strerror(-r));
	rep = o->fn(c, req, o->name);
	peer_as_end(&self);

	/* One index write for the whole request, however many blobs it
	 * touched; durable before the reply. */
	if (o->changes && (r = store_sync(c->store)) < 0 && !dry && rep &&
	    json_is_true(json_object_get(rep, "ok")))
		rep = unrecorded(c, rep, o->name, r);
	return rep;
}

char *control_reply_line(json_t *rep, int nl, size_t *lenp)
{
	char *s, *t;
	size_t len;

	if (!rep)
		rep = reply_error(ENOMEM, "out of memory");
	s = rep ? json_dumps(rep, JSON_COMPACT) : NULL;
	json_decref(rep);
	if (!s)
		return NULL;
	len = strlen(s);
	if (nl) {
		t = realloc(s, len + 2);
		if (!t) {
			free(s);
			return NULL;
		}
		s = t;
		s[len++] = '\n';
		s[len] = '\0';
	}
	if (lenp)
		*lenp = len;
	return s;
}

char *control_handle(struct control *c, const char *line, size_t len, uid_t peer)
{
	json_t *req, *rep;
	const struct control_op *o = control_check(c, line, len, peer, &req, &rep);

	if (o) {
		rep = control_run(c, o, req, NULL);
		json_decref(req);
	}
	return control_reply_line(rep, 0, NULL);
}
