/* index.c - atomic JSON state index; see index.h. */
#include "index.h"
#include "jbytes.h"
#include "durable.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* NAS names are bytes (jbytes.h: "<field>_hex" when not UTF-8). */
static int set_name(json_t *o, const char *field, const char *s)
{
	return jbytes_set(o, field, s, strlen(s));
}

/* The name @field of @o (plain or _hex), in @buf (malloc'ed, the caller
 * frees it), or @dflt when absent or not a name (a NUL inside).  *@oom set
 * when memory ran out: the record is not absent then, and skipping it
 * would have its copy discarded as an orphan. */
static const char *get_name(json_t *o, const char *field, const char *dflt, char **buf,
			    int *oom)
{
	size_t n;
	int e = jbytes_get(o, field, buf, &n);

	if (e == -ENOMEM)
		*oom = 1;
	if (e < 0)
		return dflt;
	if (strlen(*buf) != n) {
		free(*buf);
		*buf = NULL;
		return dflt;
	}
	return *buf;
}

/* A reason is text for people: bytes that are not UTF-8 become '?'. */
static json_t *text_json(const char *s)
{
	json_t *v = json_string(s);
	char *c;

	if (v || !(c = strdup(s)))
		return v;
	for (char *p = c; *p; p++)
		if ((unsigned char)*p >= 0x80)
			*p = '?';
	v = json_string(c);
	free(c);
	return v;
}

/* A "partial" record's ranges, malloc'ed (NULL when none, not a list, or no memory;
 * an entry that is not {off, len, xxh} ends the list there: the reader
 * checks what it gets). */
static struct part_range *read_ranges(json_t *o, size_t *n)
{
	json_t *list = json_object_get(o, "ranges"), *e;
	struct part_range *v;
	size_t i;

	*n = 0;
	if (!json_is_array(list) || !json_array_size(list) ||
	    !(v = calloc(json_array_size(list), sizeof(*v))))
		return NULL;
	json_array_foreach(list, i, e) {
		const char *x = json_string_value(json_object_get(e, "xxh"));
		json_int_t off = json_integer_value(json_object_get(e, "off"));
		json_int_t len = json_integer_value(json_object_get(e, "len"));

		if (!x || strlen(x) != 32 || off < 0 || len <= 0)
			break; /* (the ranges before it stand; store_part.c checks them) */
		v[*n] = (struct part_range){ (uint64_t)off, (uint64_t)len, "" };
		snprintf(v[(*n)++].xxh, sizeof(v->xxh), "%s", x);
	}
	return v;
}

/* 0, or -ENOMEM (the record is there, but could not be read whole). */
static int read_part(json_t *o, struct index_rec *rec, struct part_range **buf)
{
	*buf = read_ranges(o, &rec->nranges);
	if (!*buf && json_array_size(json_object_get(o, "ranges")))
		return -ENOMEM; /* (read_ranges' other NULL: no ranges at all) */
	rec->ranges = *buf;
	rec->part_ino = (uint64_t)int_or(o, "part_ino");
	rec->part_mtime = (struct timespec){ (time_t)int_or(o, "part_mtime_s"),
					     (long)int_or(o, "part_mtime_ns") };
	rec->part_ctime = (struct timespec){ (time_t)int_or(o, "part_ctime_s"),
					     (long)int_or(o, "part_ctime_ns") };
	return 0;
}

static json_t *part_json(const struct index_rec *e)
{
	json_t *o = json_pack("{s:[], s:I, s:I, s:I, s:I, s:I}", "ranges",
		"part_ino", (json_int_t)e->part_ino,
		"part_mtime_s", (json_int_t)e->part_mtime.tv_sec,
		"part_mtime_ns", (json_int_t)e->part_mtime.tv_nsec,
		"part_ctime_s", (json_int_t)e->part_ctime.tv_sec,
		"part_ctime_ns", (json_int_t)e->part_ctime.tv_nsec);
	json_t *list = json_object_get(o, "ranges");

	for (size_t i = 0; o && i < e->nranges; i++)
		if (json_array_append_new(list, json_pack("{s:I, s:I, s:s}",
			"off", (json_int_t)e->ranges[i].off, "len", (json_int_t)e->ranges[i].len,
			"xxh", e->ranges[i].xxh)) < 0) {
			json_decref(o);
			return NULL;
		}
	return o;
}

int index_read(const char *path, const struct index_cb *cb)
{
	json_error_t err;
	json_t *root, *blobs, *o;
	json_int_t version;
	size_t i, len = 0;
	char *text = NULL;
	int r;

	r = durable_read(path, INDEX_MAX_BYTES, &text, &len);
	if (r)
		return r > 0 ? 0 : r;
	root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
	free(text);
	if (!root)
		return -EINVAL;
	version = json_integer_value(json_object_get(root, "version"));
	if (version > INDEX_VERSION) {
		/* a later wfs wrote it: its records are not ours to read */
		json_decref(root);
		return version > INT_MAX ? INT_MAX : (int)version;
	}
	if (version < 1 || !json_is_array(blobs = json_object_get(root, "blobs"))) {
		json_decref(root);
		return -EINVAL;
	}
	json_array_foreach(blobs, i, o) {
		char *key_buf, *id_buf;
		struct part_range *ranges = NULL;
		int oom = 0, ranges_oom = 0;
		struct index_rec rec = {
			.key = get_name(o, "key", NULL, &key_buf, &oom),
			.id = get_name(o, "id", "", &id_buf, &oom),
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

		if (oom) {
			free(key_buf);
			free(id_buf);
			r = -ENOMEM;
			break;
		}
		if (!rec.key) {
			free(id_buf);
			continue;
		}
		/* Version 1 wrote no proof of the copy: none is read from it
		 * even if a hand-edited file has the fields. */
		if (version >= 2) {
			rec.copy_ino = (uint64_t)int_or(o, "copy_ino");
			rec.copy_mtime = (struct timespec){ (time_t)int_or(o, "copy_mtime_s"),
							    (long)int_or(o, "copy_mtime_ns") };
			rec.copy_ctime = (struct timespec){ (time_t)int_or(o, "copy_ctime_s"),
							    (long)int_or(o, "copy_ctime_ns") };
		}
		/* Before 4 "pinned" was either reason: a hand pin (index.h). */
		if (version >= 4)
			rec.ref_pinned = json_is_true(json_object_get(o, "ref_pinned"));
		if (version >= 3 && !strcmp(rec.state, "partial"))
			ranges_oom = read_part(o, &rec, &ranges) < 0;
		r = ranges_oom ? -ENOMEM : cb->blob(cb->arg, &rec);
		free(ranges);
		free(key_buf);
		free(id_buf);
		if (r < 0)
			break;
	}
	if (r >= 0)
		r = read_refs(root, cb);
	json_decref(root);
	return r < 0 ? r : (int)version;
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
		json_t *o = json_pack("{s:s, s:s, s:s, s:o, s:I, s:I, s:I, s:I, s:I, s:I, "
				      "s:I, s:b, s:b}",
			"state", e->state, "xxh", e->xxh,
			"sample", e->sample, "reason", text_json(e->reason),
			"size", (json_int_t)e->size,
			"mtime_s", (json_int_t)e->mtime.tv_sec, "mtime_ns", (json_int_t)e->mtime.tv_nsec,
			"ctime_s", (json_int_t)e->ctime.tv_sec, "ctime_ns", (json_int_t)e->ctime.tv_nsec,
			"last_used", (json_int_t)e->last_used,
			"last_used_ns", (json_int_t)e->use_ns, "pinned", e->pinned,
			"ref_pinned", e->ref_pinned);

		if (o && (set_name(o, "key", e->key) < 0 || set_name(o, "id", e->id) < 0)) {
			json_decref(o);
			o = NULL;
		}
		/* The copy's proof (index.h); a local copy whose identity
		 * could not be taken has none, and is re-verified at the next
		 * start-up. */
		if (o && e->copy_ino) {
			json_t *id = json_pack("{s:I, s:I, s:I, s:I, s:I}",
				"copy_ino", (json_int_t)e->copy_ino,
				"copy_mtime_s", (json_int_t)e->copy_mtime.tv_sec,
				"copy_mtime_ns", (json_int_t)e->copy_mtime.tv_nsec,
				"copy_ctime_s", (json_int_t)e->copy_ctime.tv_sec,
				"copy_ctime_ns", (json_int_t)e->copy_ctime.tv_nsec);

			if (!id || json_object_update(o, id) < 0) {
				json_decref(o);
				o = NULL;
			}
			json_decref(id);
		}
		if (o && e->nranges) {
			json_t *part = part_json(e);

			if (!part || json_object_update(o, part) < 0) {
				json_decref(o);
				o = NULL;
			}
			json_decref(part);
		}
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
	r = strlen(text) > (size_t)INDEX_MAX_BYTES ? -EFBIG :
	    durable_replace(path, text, strlen(text), 0600, 1);
	free(text);
	return r;
}
