/* control_part.c - "promote" with "ranges" or "part": local copies of
 * byte ranges of one file (store.h, partial copies).  See control_int.h.
 *
 *   {"op":"promote", "paths":["<file>"], "ranges":[[off, len], ...]}
 *   {"op":"promote", "paths":["<file>"], "part":[k, n]}   (safetensors)
 * with "pin", "dry_run" as for whole promotions.  The reply names the
 * file, every range asked for (normalised), the bytes they hold, the bytes
 * still to copy, and the blob (its "part" object says what is local).
 */
#include "control_int.h"
#include "reply.h"
#include "collect.h"
#include "nasopen.h"
#include "safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The one file @rel names: its key and size, and its blob (NULL on a dry
 * run for a file the store does not know); the exclusion glob one of its
 * names matches (collect.h), and that name.  NULL with *@err. */
struct one_file {
	struct blob *b;
	char key[PATH_MAX];
	uint64_t size;
	const char *glob;
	char name[PATH_MAX];
};

static json_t *find_file(struct control *c, const char *rel, int dry, struct one_file *f)
{
	struct blob_set set = { 0 };
	struct nas_set nas = { 0 };
	json_t *err = NULL;
	int r = dry ? collect_peek(c->roots, c->store, c->store->opt.policy, rel, &set, &nas)
		    : collect(c->roots, c->store, c->store->opt.policy, rel, &set);

	if (r < 0)
		err = control_collect_error(rel, r);
	else if (set.n + nas.n == 0 && (err = control_link_error(c, rel)) != NULL)
		; /* a link that leads to no file: err says which */
	else if (set.n + nas.n != 1)
		err = reply_error(EINVAL, "%s: --range and --part take one file, not %zu", rel,
				  set.n + nas.n);
	else if (set.n) {
		struct blob_info in;

		f->b = set.v[0];
		blob_info(c->store, f->b, &in);
		snprintf(f->key, sizeof(f->key), "%s", in.key);
		f->size = in.size;
		f->glob = set.glob[0];
		snprintf(f->name, sizeof(f->name), "%s", set.glob[0] ? set.name[0] : "");
	} else {
		snprintf(f->key, sizeof(f->key), "%s", nas.v[0].key);
		f->size = nas.v[0].size;
		f->glob = nas.v[0].glob;
		snprintf(f->name, sizeof(f->name), "%s", nas.v[0].glob ? nas.v[0].name : "");
	}
	blob_set_free(&set);
	nas_set_free(&nas);
	return err;
}

/* The ranges of "part": [k, n] from the file's own safetensors header. */
static json_t *part_ranges(const char *rel, const struct one_file *f, json_t *part,
			   struct brange **v, size_t *n)
{
	json_int_t k = json_integer_value(json_array_get(part, 0));
	json_int_t of = json_integer_value(json_array_get(part, 1));
	char why[512] = "";
	int fd, r;

	if (json_array_size(part) != 2 || k < 1 || of < 1 || k > of || of > 1 << 20)
		return reply_error(EINVAL, "%s: --part K/N: 1 <= K <= N (N at most 1048576)", rel);
	fd = nas_open(NULL, f->key, 0);
	if (fd < 0)
		return reply_error(-fd, "%s: cannot open %s: %s", rel, f->key, strerror(-fd));
	r = safetensors_part(fd, f->size, (unsigned)k, (unsigned)of, v, n, why, sizeof(why));
	close(fd);
	if (r < 0)
		return reply_error(-r, "%s: not a safetensors file we can split: %s", rel,
				   why[0] ? why : strerror(-r));
	return NULL;
}

/* The ranges of "ranges": [[off, len], ...], each inside the file. */
static json_t *list_ranges(const char *rel, const struct one_file *f, json_t *list,
			   struct brange **v, size_t *n)
{
	json_t *e;
	size_t i;

	if (!json_is_array(list) || !json_array_size(list) || json_array_size(list) > 65536)
		return reply_error(EINVAL, "%s: \"ranges\" must be a list of 1 to 65536 "
				   "[offset, length]", rel);
	*v = calloc(json_array_size(list), sizeof(**v));
	if (!*v)
		return reply_error(ENOMEM, "out of memory");
	json_array_foreach(list, i, e) {
		json_int_t off = json_integer_value(json_array_get(e, 0));
		json_int_t len = json_integer_value(json_array_get(e, 1));

		if (!json_is_integer(json_array_get(e, 0)) || !json_is_integer(json_array_get(e, 1)) ||
		    off < 0 || len <= 0) {
			/* the entry as sent (cut short: a line holds up to 64 KiB) */
			char *as_sent = json_dumps(e, JSON_COMPACT | JSON_ENCODE_ANY);
			json_t *err = reply_error(EINVAL, "%s: range %zu (%.64s%s): not [offset, "
						  "length] with offset >= 0 and length > 0", rel,
						  i + 1, as_sent ? as_sent : "?",
						  as_sent && strlen(as_sent) > 64 ? "..." : "");

			free(as_sent);
			return err;
		}
		if ((uint64_t)off > f->size || (uint64_t)len > f->size - (uint64_t)off)
			return reply_error(EINVAL, "%s: range %lld:%lld is past the end of the file "
					   "(%llu bytes)", rel, (long long)off, (long long)len,
					   (unsigned long long)f->size);
		(*v)[i] = (struct brange){ (uint64_t)off, (uint64_t)len };
	}
	*n = i;
	return NULL;
}

/* Bytes of @v (normalised) not in @b's verified ranges now. */
static uint64_t to_copy(struct store *s, struct blob *b, const struct brange *v, size_t n)
{
	struct brange *have = NULL;
	size_t nh = 0;
	uint64_t t = 0;

	if (b && blob_state(b) == BLOB_LOCAL)
		return 0;
	if (b)
		store_part_ranges(s, b, &have, &nh);
	for (size_t i = 0; i < n; i++) {
		size_t ng = 0;
		struct brange *g = brange_gaps_alloc(have, nh, v[i].off, v[i].len, &ng);

		t += g ? brange_total(g, ng) : 0;
		free(g);
	}
	free(have);
	return t;
}

/* Ranges of a file an exclusion glob keeps on the NAS are refused, as a
 * whole promote of it is, unless "force": the reply still lists them (what
 * --force would take), names the glob in "refused", and nothing is
 * queued. */
json_t *control_promote_part(struct control *c, json_t *req, json_t *paths)
{
	const char *rel = json_string_value(json_array_get(paths, 0));
	int pin = json_is_true(json_object_get(req, "pin"));
	int dry = json_is_true(json_object_get(req, "dry_run"));
	int force = json_is_true(json_object_get(req, "force"));
	json_t *part = json_object_get(req, "part"), *err, *list, *rep, *refused;
	struct one_file f = { 0 };
	struct brange *v = NULL;
	size_t n = 0;
	uint64_t need;
	int64_t queued = 0;
	int go;

	if (json_array_size(paths) != 1 || !rel)
		return reply_error(EINVAL, "--range and --part take exactly one file");
	err = find_file(c, rel, dry, &f);
	if (!err)
		err = part ? part_ranges(rel, &f, part, &v, &n)
			   : list_ranges(rel, &f, json_object_get(req, "ranges"), &v, &n);
	if (err) {
		free(v);
		return err;
	}
	n = brange_normalize(v, n);
	refused = json_array();
	go = !f.glob || force;
	if (!go)
		json_array_append_new(refused, json_pack("{s:o, s:o, s:o, s:i}", "path",
			reply_path(rel), "glob", reply_path(f.glob), "name", reply_path(f.name),
			"count", 1));
	need = go ? to_copy(c->store, f.b, v, n) : 0;
	if (go && !dry && (queued = store_part_request(c->store, f.b, v, n, pin)) < 0) {
		free(v);
		json_decref(refused);
		if (queued == -EBUSY)
			return reply_error(EBUSY, "%s: its partial copy in %s is one index %s names, "
					   "which this run leaves as it is (not read): no range of "
					   "it is copied by this run (a whole promote still copies "
					   "the file)", rel, c->store->part_dir,
					   c->store->index_path);
		return reply_error((int)-queued, "%s: %s", rel, strerror((int)-queued));
	}
	list = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(list, json_pack("[I, I]", (json_int_t)v[i].off,
						      (json_int_t)v[i].len));
	rep = json_pack("{s:b, s:o, s:o, s:o, s:I, s:I, s:I, s:I, s:b, s:o}", "ok", 1,
			"path", reply_path(rel), "key", reply_path(f.key), "ranges", list,
			"bytes", (json_int_t)brange_total(v, n), "size", (json_int_t)f.size,
			"bytes_to_copy", (json_int_t)need,
			"space_available", (json_int_t)store_room(c->store, NULL), "dry_run", dry,
			"refused", refused);
	if (rep && f.b)
		json_object_set_new(rep, "blob", reply_blob(c->store, f.b));
	free(v);
	return rep;
}
