/* index.c - atomic JSON state index; see index.h. */
#include "index.h"
#include "durable.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define INDEX_VERSION 1

static const char *str_or(json_t *o, const char *k, const char *dflt)
{
	const char *v = json_string_value(json_object_get(o, k));

	return v ? v : dflt;
}

static int64_t int_or(json_t *o, const char *k)
{
	return (int64_t)json_integer_value(json_object_get(o, k));
}

static int read_refs(json_t *root, const struct index_cb *cb)
{
	json_t *refs = json_object_get(root, "refs"), *o;
	size_t i;
	int r = 0;

	if (!cb->ref || !json_is_array(refs))
		return 0;
	json_array_foreach(refs, i, o) {
		struct index_ref ref = {
			.repo = str_or(o, "repo", NULL),
			.ref = str_or(o, "ref", NULL),
			.commit = str_or(o, "commit", ""),
			.pending = str_or(o, "pending", ""),
		};

		if (!ref.repo || !ref.ref)
			continue;
		r = cb->ref(cb->arg, &ref);
		if (r < 0)
			break;
	}
	return r;
}

int index_read(const char *path, const struct index_cb *cb)
{
	json_error_t err;
	json_t *root, *blobs, *o;
	size_t i;
	int r = 0;

	root = json_load_file(path, 0, &err);
	if (!root)
		return access(path, F_OK) < 0 && errno == ENOENT ? 0 : -EINVAL;
	if (json_integer_value(json_object_get(root, "version")) != INDEX_VERSION ||
	    !json_is_array(blobs = json_object_get(root, "blobs"))) {
		json_decref(root);
		return -EINVAL;
	}
	json_array_foreach(blobs, i, o) {
		struct index_rec rec = {
			.key = str_or(o, "key", NULL),
			.id = str_or(o, "id", ""),
			.state = str_or(o, "state", "nas"),
			.xxh = str_or(o, "xxh", ""),
			.sample = str_or(o, "sample", ""),
			.reason = str_or(o, "reason", ""),
			.size = (uint64_t)int_or(o, "size"),
			.mtime = { (time_t)int_or(o, "mtime_s"), (long)int_or(o, "mtime_ns") },
			.ctime = { (time_t)int_or(o, "ctime_s"), (long)int_or(o, "ctime_ns") },
			.last_used = int_or(o, "last_used"),
			.use_ns = (uint64_t)int_or(o, "last_used_ns"),
			.pinned = json_is_true(json_object_get(o, "pinned")),
		};

		if (!rec.key)
			continue;
		r = cb->blob(cb->arg, &rec);
		if (r < 0)
			break;
	}
	if (r >= 0)
		r = read_refs(root, cb);
	json_decref(root);
	return r;
}

int index_write(const char *path, const struct index_rec *recs, size_t n,
		const struct index_ref *refs, size_t nrefs)
{
	json_t *root = json_object(), *blobs = json_array(), *jrefs;
	char *text;
	int r;

	if (!root || !blobs) {
		json_decref(root);
		json_decref(blobs);
		return -ENOMEM;
	}
	json_object_set_new(root, "version", json_integer(INDEX_VERSION));
	for (size_t i = 0; i < n; i++) {
		const struct index_rec *e = &recs[i];
		json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, "
				      "s:I, s:b}",
			"key", e->key, "id", e->id, "state", e->state, "xxh", e->xxh,
			"sample", e->sample, "reason", e->reason,
			"size", (json_int_t)e->size,
			"mtime_s", (json_int_t)e->mtime.tv_sec, "mtime_ns", (json_int_t)e->mtime.tv_nsec,
			"ctime_s", (json_int_t)e->ctime.tv_sec, "ctime_ns", (json_int_t)e->ctime.tv_nsec,
			"last_used", (json_int_t)e->last_used,
			"last_used_ns", (json_int_t)e->use_ns, "pinned", e->pinned);

		if (!o || json_array_append_new(blobs, o) < 0) {
			json_decref(root);
			json_decref(blobs);
			return -ENOMEM;
		}
	}
	json_object_set_new(root, "blobs", blobs);
	jrefs = json_array();
	for (size_t i = 0; jrefs && i < nrefs; i++)
		json_array_append_new(jrefs, json_pack("{s:s, s:s, s:s, s:s}", "repo", refs[i].repo,
			"ref", refs[i].ref, "commit", refs[i].commit, "pending", refs[i].pending));
	if (!jrefs || json_array_size(jrefs) != nrefs) {
		json_decref(jrefs);
		json_decref(root);
		return -ENOMEM;
	}
	json_object_set_new(root, "refs", jrefs);
	text = json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS);
	json_decref(root);
	if (!text)
		return -ENOMEM;
	r = durable_replace(path, text, strlen(text), 0644, 1);
	free(text);
	return r;
}
