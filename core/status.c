/* status.c - the reply to "status": per repo and revision how much is
 * local, copies in flight, what was wanted but stays on the NAS and why,
 * the store's room, the policy, the ref pins and the control server's
 * connections.  See status.h.
 *
 * Any local user may ask, so it changes nothing: the tree is walked with
 * collect_peek (files the store has no blob for count as on the NAS), never
 * collect, which would create a blob for every file walked.
 */
#include "status.h"
#include "collect.h"
#include "nasopen.h"
#include "ns.h"
#include "path.h"
#include "pins.h"
#include "reply.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tally {
	json_int_t files, bytes, local_files, local_bytes, pinned_files;
	json_int_t per_state[BLOB_NSTATES];
};

/* The files under one path: @set (blobs the store knows) and @nas (files
 * it does not: on the NAS, with the size the NAS shows). */
struct files {
	struct blob_set set;
	struct nas_set nas;
};

static void files_free(struct files *f)
{
	blob_set_free(&f->set);
	nas_set_free(&f->nas);
}

/* Tally every file under @rel (@f: scratch, reused between calls). */
static void tally_path(struct control *c, const char *rel, struct files *f, struct tally *t)
{
	memset(t, 0, sizeof(*t));
	blob_set_clear(&f->set);
	nas_set_clear(&f->nas);
	/* an error leaves what was found before it: status is a best effort */
	collect_peek(c->roots, c->store, NULL, rel, &f->set, &f->nas);
	blob_set_unique(&f->set);
	nas_set_unique(&f->nas);
	for (size_t i = 0; i < f->nas.n; i++) {
		t->files++;
		t->bytes += (json_int_t)f->nas.v[i].size;
		t->per_state[BLOB_NAS]++;
	}
	for (size_t i = 0; i < f->set.n; i++) {
		struct blob_info snap;

		blob_info(c->store, f->set.v[i], &snap);
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
	struct files f = {0};
	struct tally t;
	json_t *o, *revs = json_array();
	DIR *d;
	struct dirent *de;

	tally_path(c, repo, &f, &t);
	o = tally_json(&t);
	json_object_set_new(o, "repo", reply_path(repo));
	snprintf(snaps, sizeof(snaps), "%s/snapshots", repo);
	snprintf(path, sizeof(path), "%s/%s", c->roots->path[0], snaps);
	d = nas_opendir(c->roots, path);
	while (d && (de = readdir(d))) {
		char rel[PATH_MAX * 2];
		json_t *r;

		if (de->d_name[0] == '.')
			continue;
		snprintf(rel, sizeof(rel), "%s/%s", snaps, de->d_name);
		tally_path(c, rel, &f, &t);
		r = tally_json(&t);
		json_object_set_new(r, "rev", reply_path(de->d_name));
		json_array_append_new(revs, r);
	}
	if (d)
		closedir(d);
	json_object_set_new(o, "revisions", revs);
	files_free(&f);
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
		json_array_append_new(s->copies, json_pack("{s:o, s:o, s:s, s:I, s:I}", "key",
			reply_path(b->key), "id", reply_path(b->id), "state", blob_state_name(b->state),
			"bytes_done", (json_int_t)b->bytes_done, "size", (json_int_t)b->size));
	if (b->state == BLOB_MISMATCH || b->state == BLOB_FAILED)
		json_array_append_new(s->flagged, json_pack("{s:o, s:o, s:s, s:o}", "key",
			reply_path(b->key), "id", reply_path(b->id), "state",
			blob_state_name(b->state), "reason", reply_path(b->reason)));
	/* Why what was wanted is not local: the operator's first question. */
	if (b->hold != HOLD_NONE && b->state == BLOB_NAS && s->held++ < HELD_LIST_MAX)
		json_array_append_new(s->held_list, json_pack("{s:o, s:o, s:s, s:o, s:I, s:o?}",
			"key", reply_path(b->key), "id", reply_path(b->id),
			"hold", b->hold == HOLD_EXCLUDED ? "excluded" : "no_room",
			"reason", reply_path(b->reason), "size", (json_int_t)b->size,
			"name", reply_path(b->name)));
}

static json_t *policy_json(const struct policy_opts *p)
{
	json_t *ex;

	if (!p)
		return json_pack("{s:b}", "auto", 0);
	ex = json_array();
	for (size_t i = 0; i < p->nexclude; i++)
		json_array_append_new(ex, reply_path(p->exclude[i]));
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
	struct files f = {0};

	for (size_t i = 0; v && i < n; i++) {
		const char *revs[2] = { v[i].commit, v[i].pending };
		struct tally t[2];
		json_t *o;

		for (int k = 0; k < 2; k++) {
			char rel[PATH_MAX];

			memset(&t[k], 0, sizeof(t[k]));
			if (!*revs[k])
				continue;
			snprintf(rel, sizeof(rel), "%s/snapshots/%s", v[i].repo, revs[k]);
			tally_path(c, rel, &f, &t[k]);
		}
		o = json_pack("{s:o, s:o, s:o, s:o, s:o, s:I, s:I, s:I, s:I}",
			      "repo", reply_path(v[i].repo), "ref", reply_path(v[i].ref),
			      "commit", reply_path(v[i].commit), "pending", reply_path(v[i].pending),
			      "reason", reply_path(v[i].reason), "files", t[0].files,
			      "local_files", t[0].local_files, "pending_files", t[1].files,
			      "pending_local_files", t[1].local_files);
		json_array_append_new(out, o);
	}
	files_free(&f);
	free(v);
	return out;
}

/* The control server's connections and limits (control.h): what it holds
 * now, what it turned away. */
static json_t *control_json(struct control *c)
{
	return json_pack("{s:i, s:i, s:I, s:I, s:I, s:{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i}}",
		"connections", atomic_load_explicit(&c->conns, memory_order_relaxed),
		"connections_other", atomic_load_explicit(&c->conns_other, memory_order_relaxed),
		"accepted", (json_int_t)atomic_load_explicit(&c->accepted, memory_order_relaxed),
		"refused", (json_int_t)atomic_load_explicit(&c->refused, memory_order_relaxed),
		"timed_out", (json_int_t)atomic_load_explicit(&c->timed_out, memory_order_relaxed),
		"limits", "connections", CONTROL_MAX_CONNS,
		"connections_other", CONTROL_MAX_CONNS_OTHER,
		"connections_per_uid", CONTROL_MAX_CONNS_PER_UID, "workers", CONTROL_WORKERS,
		"workers_other", CONTROL_WORKERS_OTHER, "request_bytes", CONTROL_MAX_REQUEST,
		"request_timeout_ms", CONTROL_REQUEST_TIMEOUT_MS,
		"reply_timeout_ms", CONTROL_REPLY_TIMEOUT_MS);
}

json_t *status_reply(struct control *c, json_t *req)
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
		return reply_error(EINVAL, "%s: not a path inside the mount %s", path, c->mount);
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
			return reply_error(-r, "%s: %s", norm, strerror(-r));
		}
		snprintf(repo, sizeof(repo), "%.*s", (int)strcspn(norm, "/"), norm);
		json_array_append_new(repos, repo_json(c, repo));
	} else {
		DIR *d = nas_opendir(c->roots, c->roots->path[0]);
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
	rep = json_pack("{s:b, s:o, s:o, s:o, s:o, s:o, s:{s:I, s:I, s:I}, s:o, s:o, s:I}",
		"ok", 1, "nas", reply_path(c->roots->path[0]), "local", reply_path(c->local),
		"mount", reply_path(c->mount),
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
	json_object_set_new(rep, "policy", policy_json(c->store->opt.policy));
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
	json_object_set_new(rep, "control", control_json(c));
	return rep;
}

