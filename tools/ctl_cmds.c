/* ctl_cmds.c - wfsctl status, evict, pin, unpin, verify; see ctl_cmds.h. */
#include "ctl_cmds.h"
#include "ctl_conn.h"
#include "ctl_fmt.h"
#include "jbytes.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ctl_req_paths(json_t *req, const struct ctl_target *t, bool root_if_none)
{
	json_t *a = json_array(), *h = json_array();
	bool text = true, ok = a && h;

	for (size_t i = 0; ok && i < t->nrel; i++) {
		json_t *s = json_string(t->rel[i]); /* NULL: not UTF-8 */

		text = text && s;
		ok = !(s && json_array_append_new(a, s)) &&
		     !json_array_append_new(h, jbytes_hex(t->rel[i], strlen(t->rel[i])));
	}
	if (ok && !t->nrel && root_if_none)
		ok = !json_array_append_new(a, json_string(""));
	if (ok)
		ok = !json_object_set(req, text ? "paths" : "paths_hex", text ? a : h);
	json_decref(a);
	json_decref(h);
	return ok ? 0 : -ENOMEM;
}

int ctl_req_path(json_t *req, const char *rel)
{
	return jbytes_set(req, "path", rel, strlen(rel));
}

static int oom(void)
{
	fprintf(stderr, "wfsctl: out of memory\n");
	return 1;
}

/* Resolve the paths, send @req (plus "paths" when @with_paths) and get an
 * ok reply.  Returns 0, or 1 with the reason printed. */
static int simple_call(const struct ctl_opts *o, const char *cmd, json_t *req,
		       bool with_paths, struct ctl_reply *rep)
{
	struct ctl_target t;
	int r;

	if (!req)
		return oom();
	if (ctl_target_resolve(o->conn, &t, o->socket, o->paths, o->npaths)) {
		json_decref(req);
		return 1;
	}
	/* No PATH (verify): the mount root, which covers every blob. */
	if (with_paths && ctl_req_paths(req, &t, true)) {
		json_decref(req);
		ctl_target_free(&t);
		return oom();
	}
	r = ctl_call(o->conn, t.socket, cmd, req, o->json, rep);
	json_decref(req);
	ctl_target_free(&t);
	if (r)
		return 1;
	if (o->json)
		ctl_print_raw(rep);
	return 0;
}

/* ---- status ---- */

/* "local=3 nas=9": the pipeline's states first, in its order, then any state
 * this wfsctl does not know, so a newer daemon's states still show. */
static void states_cell(const json_t *states, char *buf, size_t sz)
{
	static const char *const order[] = { "nas", "queued", "copying", "local",
					     "mismatch", "failed" };
	size_t len = 0, i;
	const char *k;
	json_t *v;

	buf[0] = '\0';
	for (i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		uint64_t n = jget_u64(states, order[i]);

		if (n && len < sz)
			len += (size_t)snprintf(buf + len, sz - len, "%s%s=%llu",
						len ? " " : "", order[i], (unsigned long long)n);
	}
	json_object_foreach((json_t *)states, k, v) {
		int known = 0;

		for (i = 0; i < sizeof(order) / sizeof(order[0]); i++)
			known |= !strcmp(k, order[i]);
		if (!known && json_integer_value(v) > 0 && len < sz)
			len += (size_t)snprintf(buf + len, sz - len, "%s%s=%lld",
						len ? " " : "", k, (long long)json_integer_value(v));
	}
}

static int add_count_row(struct table *tb, const char *name, const json_t *o,
			 const char *states)
{
	char files[24], local[24], pinned[24], bytes[32], lbytes[32];
	const char *row[7] = { name, files, local, pinned, bytes, lbytes, states };

	snprintf(files, sizeof(files), "%llu", (unsigned long long)jget_u64(o, "files"));
	snprintf(local, sizeof(local), "%llu", (unsigned long long)jget_u64(o, "local_files"));
	snprintf(pinned, sizeof(pinned), "%llu", (unsigned long long)jget_u64(o, "pinned_files"));
	fmt_bytes(jget_u64(o, "bytes"), bytes, sizeof(bytes));
	fmt_bytes(jget_u64(o, "local_bytes"), lbytes, sizeof(lbytes));
	return table_add(tb, row);
}

static int print_repos(const json_t *repos, bool revisions, bool cut)
{
	static const char *const hdr[] = { "REPO", "FILES", "LOCAL", "PINNED", "BYTES",
					   "LOCAL-BYTES", "STATES" };
	struct table tb;
	size_t i, j;
	json_t *repo, *rev;
	int r = 0;

	if (!json_array_size(repos)) {
		printf("repos: none here\n");
		return 0;
	}
	table_init(&tb, 7, hdr, "lrrrrrl");
	json_array_foreach(repos, i, repo) {
		char states[512], name[1024];

		states_cell(json_object_get(repo, "states"), states, sizeof(states));
		/* (marked only when others come from the NAS: all from the
		 * record, the line above the table says so) */
		snprintf(name, sizeof(name), "%s%s", jget_str(repo, "repo"),
			 cut && !strcmp(jget_str(repo, "from"), "record") ? " (record)" : "");
		r = add_count_row(&tb, name, repo, states);
		if (r || !revisions)
			continue;
		json_array_foreach(json_object_get(repo, "revisions"), j, rev) {
			char name[128];

			snprintf(name, sizeof(name), "  rev %s", jget_str(rev, "rev"));
			r = add_count_row(&tb, name, rev, "");
			if (r)
				break;
		}
		if (r)
			break;
	}
	if (!r)
		table_print(&tb, stdout, "");
	table_free(&tb);
	return r;
}

static int print_copies(const json_t *copies)
{
	static const char *const hdr[] = { "DONE", "SIZE", "PCT", "BLOB" };
	struct table tb;
	json_t *c;
	size_t i;
	int r = 0;

	if (!json_array_size(copies))
		return 0;
	printf("\ncopies in flight: %zu\n", json_array_size(copies));
	table_init(&tb, 4, hdr, "rrrl");
	json_array_foreach(copies, i, c) {
		uint64_t done = jget_u64(c, "bytes_done"), size = jget_u64(c, "size");
		char d[32], s[32], pct[16], name[1024];
		const char *row[4] = { d, s, pct, fmt_blob(c, name, sizeof(name)) };

		fmt_bytes(done, d, sizeof(d));
		fmt_bytes(size, s, sizeof(s));
		snprintf(pct, sizeof(pct), "%.0f%%",
			 size ? 100.0 * (double)(done > size ? size : done) / (double)size : 100.0);
		r = table_add(&tb, row);
		if (r)
			break;
	}
	if (!r)
		table_print(&tb, stdout, "  ");
	table_free(&tb);
	return r;
}

/* "limit 20.0 GiB" / "no limit" */
static const char *size_or(uint64_t n, const char *none, char *buf, size_t sz)
{
	if (!n) {
		snprintf(buf, sz, "%s", none);
		return buf;
	}
	return fmt_bytes(n, buf, sz);
}

static void print_store(const json_t *store)
{
	char a[32], b[32], c[32], d[32];
	uint64_t used = jget_u64(store, "used_bytes"), limit = jget_u64(store, "limit_bytes");

	printf("\nstore: %llu blobs, %s used", (unsigned long long)jget_u64(store, "blobs"),
	       fmt_bytes(used ? used : jget_u64(store, "bytes"), a, sizeof(a)));
	if (limit)
		printf(" of %s (store_max, %.0f%%)", fmt_bytes(limit, b, sizeof(b)),
		       100.0 * (double)used / (double)limit);
	else
		printf(" (no store_max)");
	printf("; %s free on its filesystem, %s kept free (min_free)\n",
	       fmt_bytes(jget_u64(store, "free_bytes"), c, sizeof(c)),
	       fmt_bytes(jget_u64(store, "min_free_bytes"), d, sizeof(d)));
	printf("       room for new copies %s (+%s by evicting unpinned, unopened copies); "
	       "pinned %s, open %s\n",
	       fmt_bytes(jget_u64(store, "available_bytes"), a, sizeof(a)),
	       fmt_bytes(jget_u64(store, "evictable_bytes"), b, sizeof(b)),
	       fmt_bytes(jget_u64(store, "pinned_bytes"), c, sizeof(c)),
	       fmt_bytes(jget_u64(store, "open_bytes"), d, sizeof(d)));
	if (jget_u64(store, "reserved_bytes") || jget_u64(store, "held_bytes"))
		printf("       %s reserved by copies in flight, %s held by evicted copies "
		       "still open\n", fmt_bytes(jget_u64(store, "reserved_bytes"), a, sizeof(a)),
		       fmt_bytes(jget_u64(store, "held_bytes"), b, sizeof(b)));
	if (jget_u64(store, "queued") || jget_u64(store, "copying"))
		printf("       %llu queued, %llu copying\n",
		       (unsigned long long)jget_u64(store, "queued"),
		       (unsigned long long)jget_u64(store, "copying"));
}

static void print_policy(const json_t *pol, const json_t *counts)
{
	const json_t *ex = json_object_get(pol, "exclude");
	char a[32];
	json_t *g;
	size_t i;

	if (!pol)
		return;
	if (!jget_bool(pol, "auto")) {
		printf("auto-promotion: off\n");
	} else {
		printf("auto-promotion: on, hot after %s", size_or(jget_u64(pol, "auto_bytes"),
		       "-", a, sizeof(a)));
		if (jget_u64(pol, "auto_opens"))
			printf(" or %llu opens", (unsigned long long)jget_u64(pol, "auto_opens"));
		printf(" from the NAS; ");
		if (json_real_value(json_object_get(pol, "auto_mbps")) > 0)
			printf("%.0f MB/s cap", json_real_value(json_object_get(pol, "auto_mbps")));
		else
			printf("no bandwidth cap");
		printf("; sibling shards %s; %llu queued, %llu kept for lack of room, %llu "
		       "excluded so far\n", jget_bool(pol, "siblings") ? "on" : "off",
		       (unsigned long long)jget_u64(counts, "queued"),
		       (unsigned long long)jget_u64(counts, "no_room"),
		       (unsigned long long)jget_u64(counts, "excluded"));
	}
	if (json_array_size(ex)) {
		char glob[FMT_TEXT];

		printf("excluded (kept on the NAS):");
		json_array_foreach(ex, i, g)
			printf(" %s", fmt_text(json_string_value(g), glob, sizeof(glob)));
		putchar('\n');
	}
}

static void print_refs(const json_t *refs)
{
	json_t *r;
	size_t i;

	if (!json_array_size(refs))
		return;
	printf("\nref pins:\n");
	json_array_foreach(refs, i, r) {
		char repo[FMT_TEXT], ref[FMT_TEXT], why[FMT_TEXT], rev[FMT_TEXT];

		/* the revisions too are read from the NAS's refs files */
		printf("  %s refs/%s -> %s (%llu/%llu local)",
		       fmt_text(jget_str(r, "repo"), repo, sizeof(repo)),
		       fmt_text(jget_str(r, "ref"), ref, sizeof(ref)),
		       *jget_str(r, "commit") ? fmt_text(jget_str(r, "commit"), rev, sizeof(rev))
					      : "(none yet)",
		       (unsigned long long)jget_u64(r, "local_files"),
		       (unsigned long long)jget_u64(r, "files"));
		if (*jget_str(r, "pending"))
			printf("; moving to %s (%llu/%llu local)",
			       fmt_text(jget_str(r, "pending"), rev, sizeof(rev)),
			       (unsigned long long)jget_u64(r, "pending_local_files"),
			       (unsigned long long)jget_u64(r, "pending_files"));
		putchar('\n');
		if (*jget_str(r, "reason"))
			printf("      %s\n", fmt_text(jget_str(r, "reason"), why, sizeof(why)));
	}
}

/* Blobs that were wanted (hot, asked for) and stay on the NAS, and why. */
static void print_held(const json_t *held, uint64_t total)
{
	json_t *h;
	size_t i;

	if (!json_array_size(held))
		return;
	printf("\nnot local (%llu), served from the NAS:\n", (unsigned long long)total);
	json_array_foreach(held, i, h) {
		char name[FMT_TEXT], sz[32], why[FMT_TEXT];

		printf("  %-8s %s  %s: %s\n", jget_str(h, "hold"),
		       fmt_bytes(jget_u64(h, "size"), sz, sizeof(sz)),
		       *jget_str(h, "name") ? fmt_text(jget_str(h, "name"), name, sizeof(name)) :
		       fmt_blob(h, name, sizeof(name)),
		       fmt_text(jget_str(h, "reason"), why, sizeof(why)));
	}
	if (total > json_array_size(held))
		printf("  ... and %llu more\n", (unsigned long long)(total - json_array_size(held)));
}

/* The NAS's state and the local record (absent from an older daemon's
 * reply: nothing printed); while the NAS is down, what the figures below
 * are. */
static void print_nas(const json_t *st)
{
	const json_t *nas = json_object_get(st, "nas"), *rec = json_object_get(st, "record");
	char buf[1024];
	json_t *h;
	size_t i;

	if (json_is_object(nas))
		printf("NAS: %s\n", fmt_nas(nas, buf, sizeof(buf)));
	if (rec)
		printf("local record: %s\n", fmt_record(rec, buf, sizeof(buf)));
	json_array_foreach(json_object_get(rec, "refs_held"), i, h) {
		char path[FMT_TEXT], nrev[FMT_TEXT], srev[FMT_TEXT];

		printf("  %s: the NAS names %s, not all local yet; while the NAS is down it "
		       "shows %s (all local)\n", fmt_text(jget_str(h, "path"), path, sizeof(path)),
		       fmt_text(jget_str(h, "nas"), nrev, sizeof(nrev)),
		       fmt_text(jget_str(h, "shows"), srev, sizeof(srev)));
	}
	if (jget_u64(st, "walk_cut_s"))
		printf("the NAS answers slowly: its walk stopped after %llu s; the repos marked "
		       "(record) are what the local\nrecord and the store know (the files with a "
		       "local copy and the blobs known)\n",
		       (unsigned long long)jget_u64(st, "walk_cut_s"));
	else if (!strcmp(jget_str(st, "from"), "record"))
		printf("the NAS is down: the figures below are what the local record and the "
		       "store know\n(the files with a local copy and the blobs known), not the "
		       "NAS tree\n");
}

/* Files with local ranges: local bytes of the whole, and the ranges. */
static void print_partial(const json_t *list)
{
	const json_t *f, *r;
	size_t i, k;

	if (!json_array_size(list))
		return;
	printf("\npartial files (local ranges; the rest read from the NAS): %zu\n",
	       json_array_size(list));
	json_array_foreach(list, i, f) {
		char a[32], b[32], name[1024], why[FMT_TEXT];

		printf("  %s: %s of %s local in %llu range%s%s%s%s\n", fmt_blob(f, name, sizeof(name)),
		       fmt_bytes(jget_u64(f, "local_bytes"), a, sizeof(a)),
		       fmt_bytes(jget_u64(f, "size"), b, sizeof(b)),
		       (unsigned long long)jget_u64(f, "nranges"),
		       jget_u64(f, "nranges") == 1 ? "" : "s",
		       jget_bool(f, "copying") ? ", copying" : "",
		       *jget_str(f, "reason") ? "; last failure: " : "",
		       fmt_text(jget_str(f, "reason"), why, sizeof(why)));
		json_array_foreach(json_object_get(f, "ranges"), k, r) {
			if (k == 8) {
				printf("    ... %zu more\n", json_array_size(json_object_get(f, "ranges")) - 8);
				break;
			}
			printf("    %llu:%llu\n",
			       (unsigned long long)json_integer_value(json_array_get(r, 0)),
			       (unsigned long long)json_integer_value(json_array_get(r, 1)));
		}
	}
}

static void print_status(const json_t *st, bool revisions)
{
	const json_t *served = json_object_get(st, "served");
	const json_t *flagged = json_object_get(st, "flagged");
	uint64_t nflagged = jget_total(st, "flagged");
	uint64_t sl = jget_u64(served, "local_bytes"), sn = jget_u64(served, "nas_bytes");
	char a[32], b[32];
	json_t *f;
	size_t i;

	/* "nas": the NAS's path, or (newer daemons) an object with it */
	printf("wfs mount %s  (NAS %s, local store %s)\n", jget_str(st, "mount"),
	       json_is_object(json_object_get(st, "nas")) ?
	       jget_str(json_object_get(st, "nas"), "path") : jget_str(st, "nas"),
	       jget_str(st, "local"));
	print_nas(st);
	putchar('\n');
	if (print_repos(json_object_get(st, "repos"), revisions, jget_u64(st, "walk_cut_s") > 0) ||
	    print_copies(json_object_get(st, "copies")))
		fprintf(stderr, "wfsctl: status: out of memory\n");
	printf("\nserved: %s local, %s from the NAS", fmt_bytes(sl, a, sizeof(a)),
	       fmt_bytes(sn, b, sizeof(b)));
	if (sl + sn)
		printf(" (%.0f%% local)", 100.0 * (double)sl / (double)(sl + sn));
	putchar('\n');
	print_store(json_object_get(st, "store"));
	print_policy(json_object_get(st, "policy"), json_object_get(st, "auto"));
	print_refs(json_object_get(st, "ref_pins"));
	print_held(json_object_get(st, "held"), jget_u64(st, "held_total"));
	print_partial(json_object_get(st, "partial"));
	if (!nflagged)
		return;
	/* Loud on purpose: a mismatch means the NAS holds wrong bytes under a
	 * content address, which an operator has to go and fix. */
	printf("\n!!! %llu flagged blob%s, served from the NAS:\n",
	       (unsigned long long)nflagged, nflagged == 1 ? "" : "s");
	json_array_foreach(flagged, i, f) {
		char state[32], name[1024], why[FMT_TEXT];
		size_t k;

		/* a local copy that failed a read: the local disk, not the NAS */
		snprintf(state, sizeof(state), "%s", jget_bool(f, "local_error") ? "local-err" :
			 jget_str(f, "state"));
		for (k = 0; state[k]; k++)
			state[k] = (char)(state[k] >= 'a' && state[k] <= 'z' ? state[k] - 32 : state[k]);
		printf("%-8s  %s: %s\n", state[0] ? state : "FLAGGED",
		       fmt_blob(f, name, sizeof(name)),
		       *jget_str(f, "reason") ? fmt_text(jget_str(f, "reason"), why, sizeof(why)) :
		       "no reason given");
	}
	if (nflagged > json_array_size(flagged))
		printf("  ... and %llu more\n",
		       (unsigned long long)(nflagged - json_array_size(flagged)));
}

int cmd_status(const struct ctl_opts *o)
{
	struct ctl_target t;
	struct ctl_reply rep;
	json_t *req;
	bool scoped;
	int r;

	if (ctl_target_resolve(o->conn, &t, o->socket, o->paths, o->npaths))
		return 1;
	if (t.nrel > 1) {
		fprintf(stderr, "wfsctl: status: one PATH at a time (%s matched %zu)\n",
			o->paths[0], t.nrel);
		ctl_target_free(&t);
		return 1;
	}
	/* A PATH asks for that part of the hub, with its revisions; none asks
	 * for the whole mount, wherever the cwd is. */
	scoped = t.nrel == 1;
	req = json_pack("{s:s}", "op", "status");
	if (!req || (scoped && ctl_req_path(req, t.rel[0]))) {
		json_decref(req);
		ctl_target_free(&t);
		return oom();
	}
	r = ctl_call(o->conn, t.socket, "status", req, o->json, &rep);
	json_decref(req);
	ctl_target_free(&t);
	if (r)
		return 1;
	if (o->json)
		ctl_print_raw(&rep);
	else
		print_status(rep.obj, scoped);
	ctl_reply_free(&rep);
	return 0;
}

/* ---- evict, pin, unpin, verify ---- */

/* Print "wfsctl: CMD: KEY: WHAT: REASON" for each entry of @list; returns
 * how many there were. */
static size_t print_keyed(const char *cmd, const json_t *list, const char *what)
{
	json_t *e;
	size_t i;

	json_array_foreach(list, i, e) {
		char key[FMT_TEXT], why[FMT_TEXT];

		fprintf(stderr, "wfsctl: %s: %s: %s: %s\n", cmd,
			fmt_text(jget_str(e, "key"), key, sizeof(key)), what,
			*jget_str(e, "reason") ? fmt_text(jget_str(e, "reason"), why, sizeof(why)) :
			"no reason given");
	}
	return json_array_size(list);
}

int cmd_evict(const struct ctl_opts *o)
{
	struct ctl_reply rep;
	size_t skipped;
	uint64_t n;

	if (simple_call(o, "evict", json_pack("{s:s,s:b}", "op", "evict", "force", o->force),
			true, &rep))
		return 1;
	n = jget_u64(rep.obj, "evicted");
	if (!o->json)
		printf("evicted %llu blob%s%s\n", (unsigned long long)n, n == 1 ? "" : "s",
		       n ? "; reads go to the NAS again" : "");
	skipped = print_keyed("evict", json_object_get(rep.obj, "skipped"), "not evicted");
	ctl_reply_free(&rep);
	/* Some copies were kept (pinned, or open without --force): the request
	 * was not carried out in full, which scripts must be able to see. */
	return skipped ? 1 : 0;
}

static int pin_call(const struct ctl_opts *o, const char *op, const char *done)
{
	struct ctl_reply rep;
	uint64_t n, kept, changed;

	if (o->ref) {
		char repo[FMT_TEXT], ref[FMT_TEXT], rev[FMT_TEXT];
		json_t *valid = json_string(o->ref); /* NULL: not UTF-8 */

		fmt_text(o->ref, ref, sizeof(ref));
		if (!valid) {
			/* the protocol's "ref" is a JSON string (it said "out of memory") */
			fprintf(stderr, "wfsctl: %s --ref: the ref name given is not UTF-8 (the "
				"hub's ref names are)\n", op);
			return 1;
		}
		json_decref(valid);
		if (simple_call(o, op, json_pack("{s:s, s:s}", "op", op, "ref", o->ref), true, &rep))
			return 1;
		n = jget_u64(rep.obj, "count");
		/* the repo is a NAS name: no control character reaches the terminal */
		fmt_text(jget_str(rep.obj, "repo"), repo, sizeof(repo));
		if (!o->json && !strcmp(op, "pin"))
			printf("pinned %s refs/%s (revision %s, %llu blob%s); it follows the ref\n",
			       repo, ref, fmt_text(jget_str(rep.obj, "commit"), rev, sizeof(rev)),
			       (unsigned long long)n, n == 1 ? "" : "s");
		else if (!o->json)
			printf("dropped the pin of %s refs/%s; %llu blob%s unpinned\n",
			       repo, ref, (unsigned long long)n, n == 1 ? "" : "s");
		ctl_reply_free(&rep);
		return 0;
	}
	if (simple_call(o, op, json_pack("{s:s}", "op", op), true, &rep))
		return 1;
	n = jget_u64(rep.obj, "count");
	/* an older daemon sends no "changed": every blob it covered changed */
	changed = json_object_get(rep.obj, "changed") ? jget_u64(rep.obj, "changed") : n;
	kept = jget_u64(rep.obj, "ref_pinned");
	if (!o->json) {
		if (changed == n)
			printf("%s %llu blob%s", done, (unsigned long long)n, n == 1 ? "" : "s");
		else
			printf("%s %llu of %llu blob%s (the other %llu %s)", done,
			       (unsigned long long)changed, (unsigned long long)n, n == 1 ? "" : "s",
			       (unsigned long long)(n - changed), !strcmp(op, "pin") ?
			       "already pinned" : "not pinned by hand");
		if (kept)
			printf("; %llu still pinned by a ref pin (unpin --ref drops it)",
			       (unsigned long long)kept);
		printf("\n");
	}
	ctl_reply_free(&rep);
	return 0;
}

int cmd_pin(const struct ctl_opts *o)
{
	return pin_call(o, "pin", "pinned");
}

int cmd_unpin(const struct ctl_opts *o)
{
	return pin_call(o, "unpin", "unpinned");
}

int cmd_verify(const struct ctl_opts *o)
{
	struct ctl_reply rep;
	size_t demoted;
	uint64_t n;

	if (simple_call(o, "verify", json_pack("{s:s,s:b}", "op", "verify", "full", o->full),
			true, &rep))
		return 1;
	n = jget_u64(rep.obj, "checked");
	demoted = json_array_size(json_object_get(rep.obj, "demoted"));
	if (!o->json)
		printf("checked %llu blob%s%s; %zu demoted\n", (unsigned long long)n,
		       n == 1 ? "" : "s", o->full ? " (local copies re-hashed)" : "", demoted);
	print_keyed("verify", json_object_get(rep.obj, "demoted"), "demoted, served from the NAS again");
	ctl_reply_free(&rep);
	return demoted ? 1 : 0;
}
