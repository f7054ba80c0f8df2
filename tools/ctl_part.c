/* ctl_part.c - wfsctl promote --range / --part: local copies of byte ranges
 * of one file (the daemon's "promote" with "ranges" or "part"). */
#include "ctl_cmds.h"
#include "ctl_conn.h"
#include "ctl_fmt.h"
#include "ctl_promote.h"
#include "clock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define POLL_NS 250000000L

static json_t *request(const struct ctl_opts *o, const struct ctl_target *t)
{
	json_t *req = json_pack("{s:s, s:b, s:b, s:b}", "op", "promote", "pin", o->pin,
				"dry_run", o->dry_run, "force", o->force);
	json_t *list = json_array();

	if (!req || !list || ctl_req_paths(req, t, false)) {
		json_decref(req);
		json_decref(list);
		return NULL;
	}
	if (o->part_n) {
		json_decref(list);
		json_object_set_new(req, "part", json_pack("[I, I]", (json_int_t)o->part_k,
							   (json_int_t)o->part_n));
		return req;
	}
	for (size_t i = 0; i < o->nranges; i++)
		json_array_append_new(list, json_pack("[I, I]", (json_int_t)o->ranges[i].off,
						      (json_int_t)o->ranges[i].len));
	json_object_set_new(req, "ranges", list);
	return req;
}

static void print_reply(const json_t *rep, bool dry)
{
	const json_t *ranges = json_object_get(rep, "ranges"), *r;
	char a[32], b[32], c[32], d[32], path[FMT_TEXT];
	size_t i;

	fmt_text(jget_str(rep, "path"), path, sizeof(path));
	printf("%s%s: %zu range%s, %s of %s; %s to copy, %s available\n", dry ? "dry run: " : "",
	       path, json_array_size(ranges), json_array_size(ranges) == 1 ? "" : "s",
	       fmt_bytes(jget_u64(rep, "bytes"), a, sizeof(a)),
	       fmt_bytes(jget_u64(rep, "size"), b, sizeof(b)),
	       fmt_bytes(jget_u64(rep, "bytes_to_copy"), c, sizeof(c)),
	       fmt_bytes(jget_u64(rep, "space_available"), d, sizeof(d)));
	if (jget_u64(rep, "bytes_to_copy") > jget_u64(rep, "space_available"))
		fprintf(stderr, "wfsctl: promote: %s: %s to copy but %s available: the ranges that "
			"do not fit stay on the NAS (\"no room\")\n", path,
			fmt_bytes(jget_u64(rep, "bytes_to_copy"), a, sizeof(a)),
			fmt_bytes(jget_u64(rep, "space_available"), d, sizeof(d)));
	if (!dry)
		return;
	json_array_foreach(ranges, i, r)
		printf("  %llu:%llu\n", (unsigned long long)json_integer_value(json_array_get(r, 0)),
		       (unsigned long long)json_integer_value(json_array_get(r, 1)));
}

/* A reply's [[off, len], ...] as a set of ranges (normalised; malloc'ed,
 * *@n of them; NULL when out of memory). */
static struct brange *ranges_of(const json_t *list, size_t *n)
{
	struct brange *v = malloc((json_array_size(list) + 1) * sizeof(*v));
	const json_t *r;
	size_t i;

	*n = 0;
	if (!v)
		return NULL;
	json_array_foreach(list, i, r)
		v[(*n)++] = (struct brange){ (uint64_t)json_integer_value(json_array_get(r, 0)),
					     (uint64_t)json_integer_value(json_array_get(r, 1)) };
	*n = brange_normalize(v, *n);
	return v;
}

/* Is every range of @want inside the blob's local ranges (or the blob
 * local whole)? */
static bool covered(const json_t *blob, const json_t *want)
{
	struct brange *have, *w;
	size_t nh, nw;
	bool ok;

	if (!strcmp(jget_str(blob, "state"), "local"))
		return true;
	have = ranges_of(json_object_get(json_object_get(blob, "part"), "ranges"), &nh);
	w = ranges_of(want, &nw);
	ok = have && w;
	if (!ok)
		fprintf(stderr, "wfsctl: out of memory\n");
	for (size_t i = 0; ok && i < nw; i++)
		ok = brange_covers(have, nh, w[i].off, w[i].len);
	free(have);
	free(w);
	return ok;
}

/* One progress poll of @key: its blob in the reply. */
static json_t *poll_blob(const struct ctl_opts *o, const char *sock, const char *key,
			 const struct bar *bar, struct ctl_reply *rep)
{
	json_t *req = json_pack("{s:s, s:[s]}", "op", "progress", "keys", key);
	int r = req ? progress_poll(o->conn, sock, req, o->json, bar, rep) : -ENOMEM;

	json_decref(req);
	return r ? NULL : json_array_get(json_object_get(rep->obj, "blobs"), 0);
}

/* Poll until no range of the file is queued, copying or re-hashed; 0 when
 * every range asked for is local then. */
static int wait_ranges(const struct ctl_opts *o, const char *sock, const json_t *promoted)
{
	const json_t *want = json_object_get(promoted, "ranges");
	struct bar bar = { .tty = isatty(STDERR_FILENO) };
	struct ctl_reply rep = { 0 };
	json_t *blob, *part;
	char path[FMT_TEXT], text[FMT_TEXT];
	bool done, nas_down = false;
	uint64_t total = jget_u64(promoted, "bytes_to_copy"), copied = 0;
	int ret = 1;

	/* as for whole files (ctl_promote.c): with --json, for a person only */
	bar.on = (!o->json || bar.tty) && jget_u64(promoted, "bytes_to_copy");
	for (;;) {
		const struct timespec ts = { 0, POLL_NS };

		ctl_reply_free(&rep);
		if (!(blob = poll_blob(o, sock, jget_str(promoted, "key"), &bar, &rep)))
			return 1;
		part = json_object_get(blob, "part");
		done = !jget_bool(part, "copying") && !jget_bool(part, "unproven");
		if (part) {
			copied = jget_u64(part, "done_bytes");
			total = jget_u64(part, "want_bytes");
		} else if (!strcmp(jget_str(blob, "state"), "local")) {
			copied = total; /* the ranges made the whole copy: no "part" now */
		}
		rate_add(&bar.rate, (double)mono_ns() / 1e9, copied);
		bar_show(&bar, copied, total, done && covered(blob, want), 1, done);
		if (done)
			break;
		note_nas(json_object_get(rep.obj, "nas"), &bar, &nas_down);
		nanosleep(&ts, NULL);
	}
	/* as a whole promote --wait: what is local shows during an outage */
	if (jget_u64(promoted, "bytes_to_copy"))
		sync_record(o->conn, sock);
	if (o->json && print_wait_outcome(&rep, covered(blob, want), !covered(blob, want)) < 0) {
		fprintf(stderr, "wfsctl: out of memory\n");
		ctl_reply_free(&rep);
		return 1;
	}
	fmt_text(jget_str(promoted, "path"), path, sizeof(path));
	if (covered(blob, want)) {
		if (!o->json)
			printf("promote: %s: every range local (%s)\n", path,
			       jget_str(blob, "state"));
		ret = 0;
	} else {
		const char *why = jget_str(part, "reason");

		fprintf(stderr, "wfsctl: promote: %s: not every range became local: %s\n", path,
			fmt_text(*why ? why : jget_str(blob, "reason"), text, sizeof(text)));
	}
	ctl_reply_free(&rep);
	return ret;
}

int cmd_promote_part(const struct ctl_opts *o)
{
	struct ctl_target t;
	struct ctl_reply rep;
	json_t *req;
	int ret;

	if (ctl_target_resolve(o->conn, &t, o->socket, o->paths, o->npaths))
		return 1;
	req = request(o, &t);
	if (!req) {
		ctl_target_free(&t);
		fprintf(stderr, "wfsctl: out of memory\n");
		return 1;
	}
	ret = ctl_call(o->conn, t.socket, "promote", req, o->json, &rep) ? 1 : 0;
	json_decref(req);
	if (ret == 0) {
		/* an excluded FILE: refused (nothing queued) unless --force */
		bool refused = json_array_size(json_object_get(rep.obj, "refused")) > 0;

		if (o->json && (!o->wait || refused))
			ctl_print_raw(&rep);
		else if (!o->json && (o->dry_run || !refused))
			print_reply(rep.obj, o->dry_run);
		if (refused)
			ret = report_excluded(rep.obj, o->json) ? 1 : 0;
		else if (o->wait)
			ret = wait_ranges(o, t.socket, rep.obj);
		ctl_reply_free(&rep);
	}
	ctl_target_free(&t);
	return ret;
}
