/* ctl_stats.c - wfsctl stats: the daemon's counters and gauges, as a table,
 * as the daemon's JSON reply (--json) or as Prometheus text (--prometheus,
 * for a scrape script or node-exporter's textfile collector). */
#include "ctl_cmds.h"
#include "ctl_conn.h"
#include "ctl_fmt.h"
#include "ctl_path.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* @obj's entries joined by @sep into @buf, each as @entry writes it
 * (returning 0 leaves one out); @none when none is written. */
static void object_cell(const json_t *obj, char *buf, size_t sz, const char *sep,
			const char *none, int (*entry)(const char *k, json_t *v, char *out, size_t n))
{
	size_t len = 0;
	const char *k;
	json_t *v;
	char one[256];

	buf[0] = '\0';
	json_object_foreach((json_t *)obj, k, v) {
		if (entry(k, v, one, sizeof(one)) && len < sz)
			len += (size_t)snprintf(buf + len, sz - len, "%s%s", len ? sep : "", one);
	}
	if (!len)
		snprintf(buf, sz, "%s", none);
}

/* "io_error=2": a count, if not 0 */
static int count_entry(const char *k, json_t *v, char *out, size_t n)
{
	snprintf(out, n, "%s=%lld", k, (long long)json_integer_value(v));
	return json_integer_value(v) > 0;
}

/* "no_space=1 io_error=2", the non-zero entries of an object of counts. */
static void counts_cell(const json_t *obj, char *buf, size_t sz)
{
	object_cell(obj, buf, sz, " ", "-", count_entry);
}

/* "io_uring refused (Operation not permitted)", "fuse_uring not offered" */
static int route_entry(const char *k, json_t *v, char *out, size_t n)
{
	const char *err = jget_str(v, "error");
	char state[32];

	/* the state's own word, "not_offered" read as "not offered" */
	snprintf(state, sizeof(state), "%s", jget_str(v, "state"));
	for (char *c = state; *c; c++)
		*c = *c == '_' ? ' ' : *c;
	snprintf(out, n, "%s %s%s%s%s", k, state, *err ? " (" : "", err, *err ? ")" : "");
	return 1;
}

/* "passthrough on, io_uring refused (Operation not permitted), fuse_uring
 * off": the daemon's "routes", in its order; "" from an older daemon. */
static void routes_cell(const json_t *routes, char *buf, size_t sz)
{
	object_cell(routes, buf, sz, ", ", "", route_entry);
}

/* "4096 KiB"; "128 KiB, not the 4096 asked: Read-only file system (write
 * 4096 to PATH from outside)"; "" from an older daemon. */
static void readahead_cell(const json_t *ra, char *buf, size_t sz)
{
	uint64_t kb = jget_u64(ra, "kb"), want = jget_u64(ra, "wanted");
	const char *err = jget_str(ra, "error"), *path = jget_str(ra, "path");
	int len;

	buf[0] = '\0';
	if (!ra)
		return;
	len = json_is_integer(json_object_get(ra, "kb")) ?
	      snprintf(buf, sz, "%llu KiB", (unsigned long long)kb) :
	      snprintf(buf, sz, "not known");
	if (!want)
		snprintf(buf + len, sz - (size_t)len, " (the kernel's: -o readahead_kb=0)");
	else if (kb != want && *err)
		snprintf(buf + len, sz - (size_t)len, ", not the %llu asked: %s (write %llu to "
			 "%s from outside)", (unsigned long long)want, err,
			 (unsigned long long)want, *path ? path : "the bdi's read_ahead_kb");
	else if (kb != want)
		snprintf(buf + len, sz - (size_t)len, ", not the %llu asked (changed since)",
			 (unsigned long long)want);
}

static void print_stats(const json_t *m)
{
	const json_t *served = json_object_get(m, "served");
	const json_t *prom = json_object_get(m, "promotions");
	const json_t *store = json_object_get(m, "store");
	const json_t *queue = json_object_get(m, "queue");
	uint64_t sl = jget_u64(served, "local_bytes"), sn = jget_u64(served, "nas_bytes");
	char a[32], b[32], cell[512], line[1024];

	printf("wfs %s: counters since the daemon started\n\n", jget_str(m, "version"));
	printf("served          %s local, %s from the NAS", fmt_bytes(sl, a, sizeof(a)),
	       fmt_bytes(sn, b, sizeof(b)));
	if (sl + sn)
		printf(" (%.0f%% local)", 100.0 * (double)sl / (double)(sl + sn));
	printf("\nopens           %llu (%llu by passthrough)\n",
	       (unsigned long long)jget_u64(m, "opens"),
	       (unsigned long long)jget_u64(m, "passthrough_opens"));
	if (json_object_get(m, "nas_reads")) /* an older daemon has none */
		printf("nas reads       %llu on the reading thread's io_uring, %llu handed to "
		       "NAS threads\n",
		       (unsigned long long)jget_u64(json_object_get(m, "nas_reads"), "ring"),
		       (unsigned long long)jget_u64(json_object_get(m, "nas_reads"), "handed_off"));
	routes_cell(json_object_get(m, "routes"), line, sizeof(line));
	if (*line)
		printf("routes          %s\n", line);
	readahead_cell(json_object_get(m, "readahead"), line, sizeof(line));
	if (*line)
		printf("read-ahead      %s\n", line);
	printf("promotions      %llu started, %llu verified, %llu failed, %llu cancelled",
	       (unsigned long long)jget_u64(prom, "started"),
	       (unsigned long long)jget_u64(prom, "verified"),
	       (unsigned long long)jget_u64(prom, "failed"),
	       (unsigned long long)jget_u64(prom, "cancelled"));
	if (json_object_get(prom, "retries"))
		printf(", %llu retried by the daemon",
		       (unsigned long long)jget_u64(prom, "retries"));
	putchar('\n');
	counts_cell(json_object_get(prom, "failed_by_reason"), cell, sizeof(cell));
	printf("  failed by     %s\n", cell);
	counts_cell(json_object_get(prom, "held"), cell, sizeof(cell));
	printf("  held back     %s  (stayed on the NAS)\n", cell);
	printf("  automatic     %llu queued because hot\n",
	       (unsigned long long)jget_u64(prom, "auto_queued"));
	printf("queue           %llu queued, %llu in flight\n",
	       (unsigned long long)jget_u64(queue, "queued"),
	       (unsigned long long)jget_u64(queue, "in_flight"));
	printf("mismatches      %llu%s\n", (unsigned long long)jget_u64(m, "mismatches"),
	       jget_u64(m, "mismatches") ? "  !!! the NAS holds wrong bytes: see wfsctl status" : "");
	printf("demotions       %llu\n", (unsigned long long)jget_u64(m, "demotions"));
	printf("evictions       %llu\n", (unsigned long long)jget_u64(m, "evictions"));
	printf("store           %llu blobs, %s used, %s free",
	       (unsigned long long)jget_u64(store, "blobs"),
	       fmt_bytes(jget_u64(store, "bytes"), a, sizeof(a)),
	       fmt_bytes(jget_u64(store, "free_bytes"), b, sizeof(b)));
	if (jget_u64(store, "limit"))
		printf("; limit %s", fmt_bytes(jget_u64(store, "limit"), a, sizeof(a)));
	if (jget_u64(store, "free_floor"))
		printf("; floor %s", fmt_bytes(jget_u64(store, "free_floor"), a, sizeof(a)));
	if (jget_u64(store, "reserved"))
		printf("; %s reserved", fmt_bytes(jget_u64(store, "reserved"), a, sizeof(a)));
	if (jget_u64(store, "pinned_bytes"))
		printf("; %s pinned", fmt_bytes(jget_u64(store, "pinned_bytes"), a, sizeof(a)));
	putchar('\n');
	counts_cell(json_object_get(m, "blobs"), cell, sizeof(cell));
	printf("blobs by state  %s\n", cell);
	if (json_object_get(m, "partial")) {
		const json_t *pt = json_object_get(m, "partial");

		printf("partial files   %llu, %s in local ranges; %s read from them; %llu ranges "
		       "verified (%s), %llu failed\n", (unsigned long long)jget_u64(pt, "files"),
		       fmt_bytes(jget_u64(pt, "bytes"), a, sizeof(a)),
		       fmt_bytes(jget_u64(pt, "read_local_bytes"), b, sizeof(b)),
		       (unsigned long long)jget_u64(pt, "ranges_verified"),
		       fmt_bytes(jget_u64(pt, "bytes_copied"), cell, sizeof(cell)),
		       (unsigned long long)jget_u64(pt, "ranges_failed"));
	}
	if (json_object_get(m, "local_read_errors"))
		printf("local reads     %llu failed (the copies demoted)\n",
		       (unsigned long long)jget_u64(m, "local_read_errors"));
	/* absent from an older daemon's reply */
	if (json_is_object(json_object_get(m, "nas")))
		printf("nas             %s\n", fmt_nas(json_object_get(m, "nas"), line,
						       sizeof(line)));
	if (json_object_get(m, "record"))
		printf("local record    %s\n", fmt_record(json_object_get(m, "record"), line,
						       sizeof(line)));
}

/* PATH only says which mount's daemon to ask, but one that names nothing
 * is a typo to hear of, as df says.  Only a name that does not exist is
 * refused: with the NAS down, a name the daemon cannot vouch for answers
 * EIO, and that is when stats is asked for.  (With --socket and a PATH
 * outside the mount there is nothing to look at.) */
static int stats_path_check(const struct ctl_opts *o, const struct ctl_target *t)
{
	char path[PATH_MAX];
	struct stat st;
	size_t i;
	int r = 0;

	for (i = 0; i < t->nrel && t->root && !r; i++) {
		if (snprintf(path, sizeof(path), "%s/%s", t->root, t->rel[i]) >= (int)sizeof(path))
			continue;
		if (ctl_watchdog_arm(o->conn, path) < 0)
			continue; /* no thread to time a hung mount out: do not look */
		if (lstat(path, &st) && (errno == ENOENT || errno == ENOTDIR))
			r = -errno;
		ctl_watchdog_disarm(o->conn);
		if (r)
			fprintf(stderr, "wfsctl: stats: %s: %s (PATH names the mount to ask; "
				"it must exist)\n", path, strerror(-r));
	}
	return r;
}

int cmd_stats(const struct ctl_opts *o)
{
	struct ctl_target t;
	struct ctl_reply rep;
	json_t *req;
	int r;

	if (o->json && o->prometheus) {
		fprintf(stderr, "wfsctl: stats: --json and --prometheus are two formats: "
			"choose one\n");
		return 2;
	}
	if (ctl_target_resolve(o->conn, &t, o->socket, o->paths, o->npaths))
		return 1;
	if (stats_path_check(o, &t)) {
		ctl_target_free(&t);
		return 1;
	}
	req = json_pack("{s:s, s:b}", "op", "stats", "prometheus", o->prometheus);
	if (!req) {
		ctl_target_free(&t);
		fprintf(stderr, "wfsctl: out of memory\n");
		return 1;
	}
	r = ctl_call(o->conn, t.socket, "stats", req, o->json, &rep);
	json_decref(req);
	ctl_target_free(&t);
	if (r)
		return 1;
	if (o->json) {
		ctl_print_raw(&rep);
	} else if (o->prometheus) {
		const char *text = json_string_value(json_object_get(rep.obj, "prometheus"));

		if (!text) {
			fprintf(stderr, "wfsctl: stats: the daemon sent no Prometheus text "
				"(an older wfs?)\n");
			ctl_reply_free(&rep);
			return 1;
		}
		fputs(text, stdout);
	} else {
		print_stats(json_object_get(rep.obj, "metrics"));
	}
	ctl_reply_free(&rep);
	return 0;
}
