/* index.c - atomic JSON state index; see index.h. */
#include "index.h"
#include "jbytes.h"
#include "jline.h"
#include "jtext.h"
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

static const char *str_or(const struct jflat *o, const char *k, const char *dflt)
{
	const char *v = jflat_str(o, k);

	return v ? v : dflt;
}

/* The ref pin field @k of @o as bytes (jbytes.h: a string, or "<k>_hex"),
 * in *@out (malloc'ed, the caller frees it); NULL when absent or not a
 * name (malformed hex, a NUL inside).  0 or -ENOMEM. */
static int ref_bytes(json_t *o, const char *k, char **out)
{
	const char *v = json_string_value(json_object_get(o, k));
	char hexk[32];
	size_t n;
	int r;

	*out = NULL;
	if (v)
		return (*out = strdup(v)) ? 0 : -ENOMEM;
	snprintf(hexk, sizeof(hexk), "%s_hex", k);
	v = json_string_value(json_object_get(o, hexk));
	r = v ? jbytes_unhex(v, out, &n) : 0;
	if (r == -EINVAL || (!r && *out && strlen(*out) != n)) {
		free(*out);
		*out = NULL;
		r = 0;
	}
	return r;
}

static const char *const ref_fields[4] = { "repo", "ref", "commit", "pending" };

static int read_refs(const struct jflat *head, const struct index_cb *cb)
{
	json_t *refs = jflat_tree(head, "refs"), *o;
	size_t i;
	int r = 0;

	if (!cb->ref || !json_is_array(refs))
		return 0;
	json_array_foreach(refs, i, o) {
		char *f[4] = { 0 };

		for (int k = 0; !r && k < 4; k++)
			r = ref_bytes(o, ref_fields[k], &f[k]);
		if (!r && f[0] && f[1]) {
			struct index_ref ref = { f[0], f[1], f[2] ? f[2] : "", f[3] ? f[3] : "" };

			r = cb->ref(cb->arg, &ref);
		}
		for (int k = 0; k < 4; k++)
			free(f[k]);
		if (r < 0)
			break;
	}
	return r;
}

/* The name @field of @o (plain or _hex), in @buf (malloc'ed, the caller
 * frees it), or @dflt when absent or not a name (a NUL inside).  *@oom set
 * when memory ran out: the record is not absent then, and skipping it
 * would have its copy discarded as an orphan. */
static const char *get_name(const struct jflat *o, const char *field, const char *dflt, char **buf,
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
static void put_text(struct jline *l, const char *key, const char *s)
{
	char *c;

	if (jline_try_strn(l, key, s, strlen(s)) != -EINVAL)
		return;
	if (!(c = strdup(s))) {
		jline_fail(l, -ENOMEM);
		return;
	}
	for (char *p = c; *p; p++)
		if ((unsigned char)*p >= 0x80)
			*p = '?';
	jline_str(l, key, c);
	free(c);
}

/* A "partial" record's ranges, malloc'ed (NULL when none, not a list, or no memory;
 * an entry that is not {off, len, xxh} ends the list there: the reader
 * checks what it gets). */
static struct part_range *read_ranges(const struct jflat *o, size_t *n)
{
	json_t *list = jflat_tree(o, "ranges"), *e;
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
static int read_part(const struct jflat *o, struct index_rec *rec, struct part_range **buf)
{
	*buf = read_ranges(o, &rec->nranges);
	if (!*buf && json_array_size(jflat_tree(o, "ranges")))
		return -ENOMEM; /* (read_ranges' other NULL: no ranges at all) */
	rec->ranges = *buf;
	rec->part_ino = (uint64_t)jflat_int(o, "part_ino");
	rec->part_mtime = (struct timespec){ (time_t)jflat_int(o, "part_mtime_s"),
					     (long)jflat_int(o, "part_mtime_ns") };
	rec->part_ctime = (struct timespec){ (time_t)jflat_int(o, "part_ctime_s"),
					     (long)jflat_int(o, "part_ctime_ns") };
	return 0;
}

static void put_part(struct jline *l, const struct index_rec *e)
{
	json_t *list = json_array();

	for (size_t i = 0; list && i < e->nranges; i++)
		if (json_array_append_new(list, json_pack("{s:I, s:I, s:s}",
			"off", (json_int_t)e->ranges[i].off, "len", (json_int_t)e->ranges[i].len,
			"xxh", e->ranges[i].xxh)) < 0) {
			json_decref(list);
			list = NULL;
		}
	jline_int(l, "part_ctime_ns", e->part_ctime.tv_nsec);
	jline_int(l, "part_ctime_s", e->part_ctime.tv_sec);
	jline_int(l, "part_ino", (int64_t)e->part_ino);
	jline_int(l, "part_mtime_ns", e->part_mtime.tv_nsec);
	jline_int(l, "part_mtime_s", e->part_mtime.tv_sec);
	jline_tree(l, "ranges", list);
	json_decref(list);
}

/* One blob's record @o to @cb: what cb->blob returns, or -ENOMEM.  A
 * record without a key (or one that is not a string) goes with key "":
 * the caller counts it as damage, not as nothing. */
static int read_blob(const struct jflat *o, int64_t version, const struct index_cb *cb)
{
	char *key_buf, *id_buf, *name_buf;
	struct part_range *ranges = NULL;
	int oom = 0, r;
	struct index_rec rec = {
		.key = get_name(o, "key", "", &key_buf, &oom),
		.id = get_name(o, "id", "", &id_buf, &oom),
		.state = str_or(o, "state", "nas"),
		.xxh = str_or(o, "xxh", ""),
		.sample = str_or(o, "sample", ""),
		.reason = str_or(o, "reason", ""),
		.name = get_name(o, "name", "", &name_buf, &oom),
		.size = (uint64_t)jflat_int(o, "size"),
		.mtime = { (time_t)jflat_int(o, "mtime_s"), (long)jflat_int(o, "mtime_ns") },
		.ctime = { (time_t)jflat_int(o, "ctime_s"), (long)jflat_int(o, "ctime_ns") },
		.last_used = jflat_int(o, "last_used"),
		.use_ns = (uint64_t)jflat_int(o, "last_used_ns"),
		.pinned = jflat_true(o, "pinned"),
	};

	if (oom) {
		free(key_buf);
		free(id_buf);
		free(name_buf);
		return -ENOMEM;
	}
	/* Version 1 wrote no proof of the copy: none is read from it even if
	 * a hand-edited file has the fields. */
	if (version >= 2) {
		rec.copy_ino = (uint64_t)jflat_int(o, "copy_ino");
		rec.copy_mtime = (struct timespec){ (time_t)jflat_int(o, "copy_mtime_s"),
						    (long)jflat_int(o, "copy_mtime_ns") };
		rec.copy_ctime = (struct timespec){ (time_t)jflat_int(o, "copy_ctime_s"),
						    (long)jflat_int(o, "copy_ctime_ns") };
	}
	/* Before 4 "pinned" was either reason: a hand pin (index.h). */
	if (version >= 4)
		rec.ref_pinned = jflat_true(o, "ref_pinned");
	r = 0;
	if (version >= 3 && !strcmp(rec.state, "partial") && read_part(o, &rec, &ranges) < 0)
		r = -ENOMEM;
	if (!r)
		r = cb->blob(cb->arg, &rec);
	free(ranges);
	free(key_buf);
	free(id_buf);
	free(name_buf);
	return r;
}

int index_read(const char *path, const struct index_cb *cb)
{
	struct jtext_reader rd;
	struct jflat o = { 0 };
	int64_t version;
	size_t len = 0;
	char *text = NULL, why[160];
	int r;

	r = durable_read(path, INDEX_MAX_BYTES, &text, &len);
	if (r == -EFBIG && (version = jtext_head_version(path, "blobs")) > INDEX_VERSION)
		return version > INT_MAX ? INT_MAX : (int)version; /* a later wfs's cap */
	if (r)
		return r > 0 ? 0 : r;
	/* (every line is read once here: a damaged file is refused before
	 * anything is called back) */
	r = jtext_read_open(&rd, text, len, "blobs", why, sizeof(why));
	if (r < 0) {
		free(text);
		return r;
	}
	version = jflat_int(&rd.head, "version");
	if (version > INDEX_VERSION) {
		/* a later wfs wrote it: its records are not ours to read */
		r = version > INT_MAX ? INT_MAX : (int)version;
	} else if (version < 1 || !rd.list) {
		r = -EINVAL;
	} else {
		while ((r = jtext_read_next(&rd, &o)) > 0 && (r = read_blob(&o, version, cb)) >= 0)
			;
		if (r >= 0)
			r = read_refs(&rd.head, cb);
		if (r >= 0)
			r = (int)version;
	}
	jflat_free(&o);
	jtext_read_close(&rd);
	free(text);
	return r;
}

/* One blob's entry, its members put in about the order they are
 * written (jline sorts them). */
static void put_blob(struct jline *l, const struct index_rec *e)
{
	/* The copy's proof (index.h); a local copy whose identity could not
	 * be taken has none, and is re-verified at the next start-up. */
	if (e->copy_ino) {
		jline_int(l, "copy_ctime_ns", e->copy_ctime.tv_nsec);
		jline_int(l, "copy_ctime_s", e->copy_ctime.tv_sec);
		jline_int(l, "copy_ino", (int64_t)e->copy_ino);
		jline_int(l, "copy_mtime_ns", e->copy_mtime.tv_nsec);
		jline_int(l, "copy_mtime_s", e->copy_mtime.tv_sec);
	}
	jline_int(l, "ctime_ns", e->ctime.tv_nsec);
	jline_int(l, "ctime_s", e->ctime.tv_sec);
	/* NAS names are bytes (jbytes.h: "<field>_hex" when not UTF-8) */
	jbytes_put(l, "id", e->id, strlen(e->id));
	jbytes_put(l, "key", e->key, strlen(e->key));
	jline_int(l, "last_used", e->last_used);
	jline_int(l, "last_used_ns", (int64_t)e->use_ns);
	jline_int(l, "mtime_ns", e->mtime.tv_nsec);
	jline_int(l, "mtime_s", e->mtime.tv_sec);
	if (e->name && *e->name)
		jbytes_put(l, "name", e->name, strlen(e->name));
	if (e->nranges)
		put_part(l, e);
	jline_bool(l, "pinned", e->pinned);
	put_text(l, "reason", e->reason);
	jline_bool(l, "ref_pinned", e->ref_pinned);
	jline_str(l, "sample", e->sample);
	jline_int(l, "size", (int64_t)e->size);
	jline_str(l, "state", e->state);
	jline_str(l, "xxh", e->xxh);
}

/* The ref pins as JSON.  A repo's name is the NAS's bytes, not always
 * UTF-8: each field goes through jbytes (a json_pack "s" would refuse it,
 * and with it every later write of the index). */
static json_t *refs_json(const struct index_ref *refs, size_t nrefs)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < nrefs; i++) {
		const char *v[4] = { refs[i].repo, refs[i].ref, refs[i].commit, refs[i].pending };
		json_t *o = json_object();
		int r = o ? 0 : -ENOMEM;

		for (int k = 0; !r && k < 4; k++)
			r = jbytes_set(o, ref_fields[k], v[k], strlen(v[k]));
		if (r || json_array_append_new(a, o)) {
			if (r)
				json_decref(o);
			json_decref(a);
			a = NULL;
		}
	}
	return a;
}

int index_write(const char *path, const struct index_rec *recs, size_t n,
		const struct index_ref *refs, size_t nrefs)
{
	json_t *jrefs = refs_json(refs, nrefs);
	struct jtext x = { 0 };
	struct jline l = { 0 };
	size_t len;
	int fd = durable_begin(path, 0600), r = 0, e;

	if (fd < 0) {
		json_decref(jrefs);
		return fd;
	}
	jtext_stream(&x, fd);
	/* {"refs":[..],"version":N,"blobs":[ then a blob a line */
	jtext_open_new(&x, jrefs ? json_pack("{s:o, s:i}", "refs", jrefs, "version",
					     INDEX_VERSION) : NULL);
	jtext_str(&x, "\"blobs\":[\n");
	/* (past the cap, no more lines: the write is refused below) */
	for (size_t i = 0; !x.err && x.out + x.n <= (size_t)INDEX_MAX_BYTES && i < n; i++) {
		put_blob(&l, &recs[i]);
		r = jline_write(&l, &x);
		jtext_str(&x, i + 1 < n ? ",\n" : "\n");
	}
	jline_free(&l);
	jtext_str(&x, "]}\n");
	e = jtext_end(&x, &len);
	/* (a line that could not be made says why; the text's own failure
	 * is a write's or memory's) */
	r = r < 0 ? r : e < 0 ? e : len > (size_t)INDEX_MAX_BYTES ? -EFBIG : 0;
	return durable_end(path, fd, r, 1);
}
