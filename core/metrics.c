/* metrics.c - counters and gauges for operators; see metrics.h. */
#include "metrics.h"
#include "durable.h"
#include "record.h"
#include "reply.h"
#include "thread.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#ifndef WFS_VERSION
#define WFS_VERSION "unknown"
#endif

const char *const metrics_fail_reason[STORE_FAIL_N] = {
	[STORE_FAIL_NO_SPACE] = "no_space",
	[STORE_FAIL_SOURCE_CHANGED] = "source_changed",
	[STORE_FAIL_IO] = "io_error",
	[STORE_FAIL_OTHER] = "other",
};

const char *const metrics_route_name[STORE_ROUTES] = {
	[STORE_ROUTE_PASSTHROUGH] = "passthrough",
	[STORE_ROUTE_IO_URING] = "io_uring",
	[STORE_ROUTE_FUSE_URING] = "fuse_uring",
};

const char *const metrics_route_state[STORE_ROUTE_STATES] = {
	[STORE_ROUTE_STARTING] = "starting",
	[STORE_ROUTE_ON] = "on",
	[STORE_ROUTE_OFF] = "off",
	[STORE_ROUTE_NOT_OFFERED] = "not_offered",
	[STORE_ROUTE_REFUSED] = "refused",
};

/* ---- collecting ---- */

static void sum_blob(void *arg, const struct blob_info *b)
{
	struct metrics *m = arg;

	m->served_local_bytes += b->local_bytes;
	m->served_nas_bytes += b->nas_bytes;
	m->opens += b->opens;
	if ((unsigned)b->state < BLOB_NSTATES)
		m->blobs_by_state[b->state]++;
	m->blobs_known++;
}

void metrics_collect_nas(struct nas_gate *g, struct record *r, struct metrics_nas *out)
{
	memset(out, 0, sizeof(*out));
	nas_gate_stats(g, &out->gate); /* NULL: up, all 0 */
	out->timeout_ms = g ? g->timeout_ms : 0;
	if (!r)
		return;
	out->recorded = 1;
	/* Its figures only, under its lock: never its table, never the NAS, so
	 * that this answers during an outage and while a rebuild walks. */
	pthread_mutex_lock(&r->lock);
	out->record_files = r->files;
	out->record_entries = r->entries;
	out->record_built = r->built_at;
	out->record_builds = r->built_gen;
	out->record_looks = r->looks;
	pthread_mutex_unlock(&r->lock);
}

int metrics_readahead_now(const char *path, uint64_t *kb)
{
	FILE *f = fopen(path, "re");
	int r;

	if (!f)
		return -errno;
	r = fscanf(f, "%" SCNu64, kb) == 1 ? 0 : -EINVAL;
	fclose(f);
	return r;
}

/* What the daemon asked of the mount's read-ahead, and the value in
 * effect, read from its file each time: someone else may have set it
 * since (an operator outside a container whose /sys refused the daemon). */
static void collect_readahead(struct store *s, struct metrics *m)
{
	store_get_readahead(s, &m->readahead);
	m->readahead_known = m->readahead.path[0] &&
			     metrics_readahead_now(m->readahead.path, &m->readahead_kb) == 0;
	if (!m->readahead_known)
		m->readahead_kb = 0;
	m->readahead_bytes = m->readahead_kb * 1024;
}

void metrics_collect(const struct metrics_src *src, struct metrics *m)
{
	struct store *s = src->store;
	struct store_usage u;

	memset(m, 0, sizeof(*m));
	store_each(s, sum_blob, m);
	store_usage(s, &u);
	m->store_blobs = u.blobs;
	m->store_bytes = u.bytes;
	m->free_bytes = u.free_bytes;
	m->queued = u.queued;
	m->copying = u.copying;
	m->limit = u.limit;
	m->floor = u.floor;
	m->reserved = u.reserved;
	m->pinned_bytes = u.pinned_bytes;
	m->auto_queued = s->auto_queued;
	m->held_no_room = s->no_room;
	m->held_excluded = s->excluded;
	m->passthrough_opens = s->passthrough_opens;
	m->listed_ahead = s->listed_ahead;
	m->listed_ahead_taken = s->listed_ahead_taken;
	m->dir_attrs_refreshed = s->dir_attrs_refreshed;
	m->uring_requests = s->uring_requests;
	m->nas_reads_ring = s->nas_reads_ring;
	m->nas_reads_handed = s->nas_reads_handed;
	for (int i = 0; i < STORE_ROUTES; i++) {
		m->route_state[i] = atomic_load(&s->route_state[i]);
		m->route_err[i] = atomic_load(&s->route_err[i]);
		m->route_on[i] = m->route_state[i] == STORE_ROUTE_ON;
	}
	collect_readahead(s, m);
	m->fs_nodes = s->fs_nodes;
	m->promotions_started = s->started;
	m->promotions_verified = s->promoted;
	m->promotions_cancelled = s->cancelled;
	for (int i = 0; i < STORE_FAIL_N; i++) {
		m->failed_by[i] = s->failed_by[i];
		m->promotions_failed += m->failed_by[i];
	}
	m->mismatches = s->mismatches;
	m->demotions = s->demoted;
	m->evictions = s->evicted;
	m->index_writes = s->index_writes;
	m->retries = s->retries;
	m->local_read_errors = s->local_read_errors;
	m->part_files = u.parts;
	m->part_bytes = u.part_bytes;
	m->part_read_bytes = s->part_local_read;
	m->part_copied = s->part_copied;
	m->part_failed = s->part_failed;
	m->part_copied_bytes = s->part_bytes_copied;
	metrics_collect_nas(src->gate, src->record, &m->nas);
}

/* ---- the figures ----
 * Every scalar of struct metrics, once: its Prometheus family (with a label
 * for a family of several rows, which are adjacent; the family's type and
 * help on its first row; NULL: JSON only) and its place in the JSON object
 * ("a.b": key b of object a).  The two arrays (failed by reason, blobs by
 * state) and the NAS's state are written by hand below. */
struct figure {
	const char *prom, *type, *label, *label_val, *help;
	const char *json;
	size_t off;
};

#define AT(field) offsetof(struct metrics, field)

static const struct figure figures[] = {
	{ "wfs_served_bytes_total", "counter", "source", "local",
	  "Bytes of weight data (files under a repo's blobs/ or snapshots/) read through the "
	  "mount, by where they were served from.",
	  "served.local_bytes", AT(served_local_bytes) },
	{ "wfs_served_bytes_total", NULL, "source", "nas", NULL,
	  "served.nas_bytes", AT(served_nas_bytes) },
	{ "wfs_opens_total", "counter", NULL, NULL,
	  "Opens of weight data (files under a repo's blobs/ or snapshots/) in the mount.",
	  "opens", AT(opens) },
	{ "wfs_passthrough_opens_total", "counter", NULL, NULL,
	  "Opens served by FUSE passthrough (the kernel reads the local copy, or the NAS "
	  "file with nas_passthrough).",
	  "passthrough_opens", AT(passthrough_opens) },
	{ "wfs_listings_ahead_total", "counter", NULL, NULL,
	  "Directories listed from the NAS ahead of a tree walk, before it asked.",
	  "listings.ahead", AT(listed_ahead) },
	{ "wfs_listings_ahead_taken_total", "counter", NULL, NULL,
	  "Directories listed ahead that the walk then read (the rest was NAS work wasted).",
	  "listings.ahead_taken", AT(listed_ahead_taken) },
	{ "wfs_listings_attrs_refreshed_total", "counter", NULL, NULL,
	  "Stats of a listed directory through the mount, so that the kernel holds its "
	  "attributes again.",
	  "listings.attrs_refreshed", AT(dir_attrs_refreshed) },
	{ "wfs_fuse_uring_requests_total", "counter", NULL, NULL,
	  "FUSE requests taken through io_uring (-o fuse_uring) rather than /dev/fuse.",
	  "fuse_uring_requests", AT(uring_requests) },
	{ "wfs_nas_reads_total", "counter", "route", "ring",
	  "NAS reads of FUSE requests, by how they were made (ring: on the reading thread's "
	  "own io_uring; handed_off: on a NAS thread, by -o nas_read_ring=off or where "
	  "io_uring is not available).",
	  "nas_reads.ring", AT(nas_reads_ring) },
	{ "wfs_nas_reads_total", NULL, "route", "handed_off", NULL,
	  "nas_reads.handed_off", AT(nas_reads_handed) },
	{ "wfs_route_on", "gauge", "route", "passthrough",
	  "1 while a route is in use: passthrough (the kernel reads local copies itself), "
	  "io_uring (NAS reads and copies), fuse_uring (requests through io_uring); 0 where "
	  "turned off, not offered by the kernel, refused (a seccomp filter, a capability) "
	  "or not settled yet (wfsctl stats says which).",
	  "routes.passthrough.on", AT(route_on[STORE_ROUTE_PASSTHROUGH]) },
	{ "wfs_route_on", NULL, "route", "io_uring", NULL,
	  "routes.io_uring.on", AT(route_on[STORE_ROUTE_IO_URING]) },
	{ "wfs_route_on", NULL, "route", "fuse_uring", NULL,
	  "routes.fuse_uring.on", AT(route_on[STORE_ROUTE_FUSE_URING]) },
	{ "wfs_readahead_bytes", "gauge", NULL, NULL,
	  "The mount's read-ahead as the kernel has it now (0: not known); wfsctl stats "
	  "says what the daemon asked and why a setting failed.",
	  "readahead.bytes", AT(readahead_bytes) },
	{ NULL, NULL, NULL, NULL, NULL, "readahead.kb", AT(readahead_kb) },
	{ "wfs_fs_nodes", "gauge", NULL, NULL,
	  "Inodes the daemon keeps for names the kernel looked up and has not forgotten.",
	  "fs_nodes", AT(fs_nodes) },
	{ "wfs_index_writes_total", "counter", NULL, NULL,
	  "Writes of the local store's index (one per request or batch of copies).",
	  "index_writes", AT(index_writes) },
	{ "wfs_promotions_started_total", "counter", NULL, NULL,
	  "Promotions (verified copies to the local store) started.",
	  "promotions.started", AT(promotions_started) },
	{ "wfs_promotions_verified_total", "counter", NULL, NULL,
	  "Promotions that ended with a verified local copy.",
	  "promotions.verified", AT(promotions_verified) },
	{ NULL, NULL, NULL, NULL, NULL, "promotions.failed", AT(promotions_failed) },
	{ "wfs_promotions_auto_queued_total", "counter", NULL, NULL,
	  "Blobs queued for promotion by themselves (read often from the NAS).",
	  "promotions.auto_queued", AT(auto_queued) },
	{ "wfs_promotions_held_total", "counter", "reason", "no_room",
	  "Promotions not made: the blob stays on the NAS, by reason (no_room: the size "
	  "limit or free-space floor; excluded: an exclusion glob).",
	  "promotions.held.no_room", AT(held_no_room) },
	{ "wfs_promotions_held_total", NULL, "reason", "excluded", NULL,
	  "promotions.held.excluded", AT(held_excluded) },
	{ "wfs_promotions_cancelled_total", "counter", NULL, NULL,
	  "Promotions cancelled (evicted while copying, or shutdown).",
	  "promotions.cancelled", AT(promotions_cancelled) },
	{ "wfs_promotion_retries_total", "counter", NULL, NULL,
	  "Failed copies the daemon queued again by itself (automatic promotions and ref "
	  "pins, with backoff; at once when the NAS is back).",
	  "promotions.retries", AT(retries) },
	{ "wfs_verification_mismatches_total", "counter", NULL, NULL,
	  "Copies whose content did not match the blob's content-address name "
	  "(the NAS holds wrong bytes under that name).", "mismatches", AT(mismatches) },
	{ "wfs_demotions_total", "counter", NULL, NULL,
	  "Local copies dropped because the source changed or the copy failed a check.",
	  "demotions", AT(demotions) },
	{ "wfs_evictions_total", "counter", NULL, NULL, "Local copies evicted.",
	  "evictions", AT(evictions) },
	{ "wfs_store_blobs", "gauge", NULL, NULL, "Verified local copies in the local store.",
	  "store.blobs", AT(store_blobs) },
	{ "wfs_store_bytes", "gauge", NULL, NULL, "Bytes of verified local copies.",
	  "store.bytes", AT(store_bytes) },
	{ "wfs_store_free_bytes", "gauge", NULL, NULL,
	  "Free bytes on the file system of the local store (for unprivileged users).",
	  "store.free_bytes", AT(free_bytes) },
	{ "wfs_store_limit_bytes", "gauge", NULL, NULL,
	  "Size limit of the local store (0: none but the free-space floor).",
	  "store.limit", AT(limit) },
	{ "wfs_store_free_floor_bytes", "gauge", NULL, NULL,
	  "Free space the local store always leaves on its file system.",
	  "store.free_floor", AT(floor) },
	{ "wfs_store_reserved_bytes", "gauge", NULL, NULL, "Space reserved by copies in flight.",
	  "store.reserved", AT(reserved) },
	{ "wfs_store_pinned_bytes", "gauge", NULL, NULL,
	  "Bytes of pinned local copies (never evicted for room).",
	  "store.pinned_bytes", AT(pinned_bytes) },
	{ "wfs_promotion_queue_depth", "gauge", NULL, NULL, "Blobs queued for promotion.",
	  "queue.queued", AT(queued) },
	{ "wfs_promotions_in_flight", "gauge", NULL, NULL, "Blobs being copied or verified.",
	  "queue.in_flight", AT(copying) },
	{ "wfs_local_read_errors_total", "counter", NULL, NULL,
	  "Reads of a local copy that failed: the copy was demoted, its reads go to the NAS.",
	  "local_read_errors", AT(local_read_errors) },
	{ "wfs_partial_files", "gauge", NULL, NULL,
	  "Files with verified local ranges that are not local whole.",
	  "partial.files", AT(part_files) },
	{ "wfs_partial_bytes", "gauge", NULL, NULL, "Bytes of the verified local ranges.",
	  "partial.bytes", AT(part_bytes) },
	{ "wfs_range_bytes_local_total", "counter", NULL, NULL,
	  "Bytes of reads served from verified local ranges of partial files.",
	  "partial.read_local_bytes", AT(part_read_bytes) },
	{ "wfs_ranges_verified_total", "counter", NULL, NULL, "Ranges copied and verified.",
	  "partial.ranges_verified", AT(part_copied) },
	{ "wfs_ranges_failed_total", "counter", NULL, NULL, "Range copies that failed.",
	  "partial.ranges_failed", AT(part_failed) },
	{ "wfs_range_bytes_copied_total", "counter", NULL, NULL,
	  "Bytes of ranges copied and verified.", "partial.bytes_copied", AT(part_copied_bytes) },
};

static uint64_t figure_value(const struct metrics *m, const struct figure *f)
{
	return *(const uint64_t *)(const void *)((const char *)m + f->off);
}

/* ---- Prometheus text ---- */

struct buf {
	char *p;
	size_t len, cap;
	int oom;
};

static void put(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->oom)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->oom = 1;
			return;
		}
		if (b->p && b->len + (size_t)n < b->cap) {
			b->len += (size_t)n;
			return;
		}
		size_t cap = b->cap ? b->cap : 4096;
		while (cap <= b->len + (size_t)n)
			cap *= 2;
		char *p = realloc(b->p, cap);

		if (!p) {
			b->oom = 1;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
}

static void family(struct buf *b, const char *name, const char *type, const char *help)
{
	put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample(struct buf *b, const char *name, uint64_t v)
{
	put(b, "%s %llu\n", name, (unsigned long long)v);
}

/* A family of one unlabelled sample. */
static void metric(struct buf *b, const char *name, const char *type, const char *help,
		   uint64_t v)
{
	family(b, name, type, help);
	sample(b, name, v);
}

/* Label values here are fixed words (states, reasons) and the version:
 * escape anyway, as the format requires. */
static void sample_l(struct buf *b, const char *name, const char *label, const char *val,
		     uint64_t v)
{
	put(b, "%s{%s=\"", name, label);
	for (const char *c = val; *c; c++) {
		if (*c == '\\' || *c == '"')
			put(b, "\\%c", *c);
		else if (*c == '\n')
			put(b, "\\n");
		else
			put(b, "%c", *c);
	}
	put(b, "\"} %llu\n", (unsigned long long)v);
}

/* The NAS's state and the local record: alert on wfs_nas_up == 0, and on
 * wfs_nas_stuck_calls > 0 (threads held by a hung NAS). */
static void prometheus_nas(struct buf *b, const struct metrics_nas *n)
{
	metric(b, "wfs_nas_up", "gauge",
	       "1 while the NAS answers, 0 while it is down (local revisions are then served "
	       "from the local record, everything else fails with EIO).", (uint64_t)!!n->gate.up);
	metric(b, "wfs_nas_outages_total", "counter",
	       "Times the NAS was marked down (a call past its deadline, or unreachable).",
	       n->gate.outages);
	metric(b, "wfs_nas_timeouts_total", "counter",
	       "NAS calls that passed their deadline (nas_timeout).", n->gate.timeouts);
	metric(b, "wfs_nas_failed_down_total", "counter",
	       "NAS calls refused at once because the NAS was down.", n->gate.failed_down);
	metric(b, "wfs_nas_busy_total", "counter",
	       "NAS calls given up after nas_timeout waiting for a free NAS thread while the "
	       "threads answered others (a slow NAS with more calls than threads; not an outage).",
	       n->gate.busy);
	metric(b, "wfs_nas_from_record_total", "counter",
	       "Requests answered from the local record instead of the NAS.",
	       n->gate.from_record);
	metric(b, "wfs_nas_stuck_calls", "gauge",
	       "NAS calls past their deadline still running (each holds a NAS thread).",
	       n->gate.stuck);
	metric(b, "wfs_record_files", "gauge",
	       "Files in the local record (the local copies, and the repos' refs): what the "
	       "mount shows of them while the NAS is down.", n->record_files);
}

char *metrics_prometheus(const struct metrics *m)
{
	struct buf b = {0};

	family(&b, "wfs_info", "gauge", "wfs daemon running (always 1), with its version.");
	sample_l(&b, "wfs_info", "version", WFS_VERSION, 1);
	for (size_t i = 0; i < sizeof(figures) / sizeof(figures[0]); i++) {
		const struct figure *f = &figures[i];

		if (!f->prom)
			continue;
		if (f->type)
			family(&b, f->prom, f->type, f->help);
		if (f->label)
			sample_l(&b, f->prom, f->label, f->label_val, figure_value(m, f));
		else
			sample(&b, f->prom, figure_value(m, f));
	}
	family(&b, "wfs_promotions_failed_total", "counter",
	       "Promotions that failed, by reason; the blob stays on the NAS.");
	for (int i = 0; i < STORE_FAIL_N; i++)
		sample_l(&b, "wfs_promotions_failed_total", "reason", metrics_fail_reason[i],
			 m->failed_by[i]);
	family(&b, "wfs_blobs", "gauge",
	       "Blobs the daemon knows (opened, promoted or indexed), by state.");
	for (int st = 0; st < BLOB_NSTATES; st++)
		sample_l(&b, "wfs_blobs", "state", blob_state_name((enum blob_state)st),
			 m->blobs_by_state[st]);
	prometheus_nas(&b, &m->nas);
	if (b.oom) {
		free(b.p);
		return NULL;
	}
	return b.p;
}

/* ---- JSON ---- */

json_t *metrics_nas_json(const struct metrics_nas *n)
{
	const struct nas_gate_stats *g = &n->gate;

	/* the reason may quote a NAS path: any bytes */
	return json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:I}",
		"state", g->up ? "up" : "down", "since", (json_int_t)g->since,
		"outages", (json_int_t)g->outages, "timeouts", (json_int_t)g->timeouts,
		"failed_down", (json_int_t)g->failed_down, "busy", (json_int_t)g->busy,
		"from_record", (json_int_t)g->from_record, "stuck", (json_int_t)g->stuck,
		"reason", reply_path(g->reason), "timeout_ms", (json_int_t)n->timeout_ms);
}

json_t *metrics_refs_held_json(struct record *r)
{
	json_t *list = json_array();
	struct record_held *v = NULL;
	size_t n = 0;

	if (r)
		record_held_refs(r, &v, &n);
	for (size_t i = 0; list && i < n; i++)
		json_array_append_new(list, json_pack("{s:o, s:o, s:o}", "path",
						      reply_path(v[i].path), "shows",
						      reply_path(v[i].shows), "nas",
						      reply_path(v[i].nas)));
	free(v);
	return list;
}

json_t *metrics_record_json(const struct metrics_nas *n)
{
	return json_pack("{s:b, s:I, s:I, s:I, s:I, s:I}", "kept", n->recorded,
			 "files", (json_int_t)n->record_files,
			 "entries", (json_int_t)n->record_entries,
			 "built", (json_int_t)n->record_built,
			 "builds", (json_int_t)n->record_builds,
			 "looks", (json_int_t)n->record_looks);
}

/* The object that holds @path's last key ("a.b.c": o.a.b, made as needed),
 * that key in @key; NULL on ENOMEM. */
static json_t *json_parent(json_t *o, const char *path, char key[64])
{
	const char *dot;

	while (o && (dot = strchr(path, '.'))) {
		char name[64];
		json_t *child;

		snprintf(name, sizeof(name), "%.*s", (int)(dot - path), path);
		child = json_object_get(o, name);
		if (!child && (!(child = json_object()) || json_object_set_new(o, name, child)))
			return NULL;
		o = child;
		path = dot + 1;
	}
	snprintf(key, 64, "%s", path);
	return o;
}

/* "readahead": {"kb" (null: not known), "wanted" (null: left to the
 * kernel), "error" (of the daemon's write), "path"}; nonzero on ENOMEM */
static int readahead_json(json_t *r, const struct metrics *m)
{
	const struct store_readahead *ra = &m->readahead;
	int bad;

	bad = !m->readahead_known && (json_object_set_new(r, "kb", json_null()) ||
				      json_object_set_new(r, "bytes", json_null()));
	bad |= json_object_set_new(r, "wanted", ra->want_kb ? json_integer(ra->want_kb) :
				   json_null());
	bad |= json_object_set_new(r, "error", ra->err ? json_string(strerror(-ra->err)) :
				   json_null());
	bad |= json_object_set_new(r, "path", ra->path[0] ? json_string(ra->path) :
				   json_null());
	return bad;
}

json_t *metrics_json(const struct metrics *m)
{
	json_t *o = json_pack("{s:s}", "version", WFS_VERSION), *failed, *states, *parent;
	char key[64];
	int bad = !o;

	for (size_t i = 0; !bad && i < sizeof(figures) / sizeof(figures[0]); i++) {
		parent = json_parent(o, figures[i].json, key);
		bad = !parent || json_object_set_new(parent, key,
				json_integer((json_int_t)figure_value(m, &figures[i])));
	}
	failed = json_object();
	for (int i = 0; failed && i < STORE_FAIL_N; i++)
		bad |= json_object_set_new(failed, metrics_fail_reason[i],
					   json_integer((json_int_t)m->failed_by[i]));
	states = json_object();
	for (int st = 0; states && st < BLOB_NSTATES; st++)
		bad |= json_object_set_new(states, blob_state_name((enum blob_state)st),
					   json_integer((json_int_t)m->blobs_by_state[st]));
	if (bad || !failed || !states) {
		json_decref(failed);
		json_decref(states);
		json_decref(o);
		return NULL;
	}
	/* each call takes its value, set or not: none short-circuited */
	bad = json_object_set_new(json_object_get(o, "promotions"), "failed_by_reason", failed);
	bad |= json_object_set_new(o, "blobs", states);
	bad |= json_object_set_new(o, "nas", metrics_nas_json(&m->nas));
	bad |= json_object_set_new(o, "record", metrics_record_json(&m->nas));
	for (int i = 0; !bad && i < STORE_ROUTES; i++) {
		json_t *r = json_object_get(json_object_get(o, "routes"), metrics_route_name[i]);

		bad = json_object_set_new(r, "state",
					  json_string(metrics_route_state[m->route_state[i]]));
		bad |= json_object_set_new(r, "error", m->route_err[i] ?
					   json_string(strerror(-m->route_err[i])) : json_null());
	}
	if (!bad)
		bad = readahead_json(json_object_get(o, "readahead"), m);
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

json_t *metrics_reply(const struct metrics_src *src, const json_t *req)
{
	struct metrics m;
	json_t *rep, *mj;

	metrics_collect(src, &m);
	mj = metrics_json(&m);
	if (!mj)
		return NULL;
	rep = json_pack("{s:b, s:o}", "ok", 1, "metrics", mj);
	if (rep && json_is_true(json_object_get(req, "prometheus"))) {
		char *text = metrics_prometheus(&m);

		if (!text || json_object_set_new(rep, "prometheus", json_string(text))) {
			free(text);
			json_decref(rep);
			return NULL;
		}
		free(text);
	}
	return rep;
}

/* ---- the textfile ---- */

int metrics_write_file(const struct metrics_src *src, const char *path)
{
	struct metrics m;
	char *text;
	int r;

	metrics_collect(src, &m);
	text = metrics_prometheus(&m);
	if (!text)
		return -ENOMEM;
	/* Scrapers must never read half a file; a crash may lose it (it is
	 * rewritten every interval). */
	r = durable_replace(path, text, strlen(text), 0644, 0);
	free(text);
	return r;
}

static void wlog(struct metrics_writer *mw, int prio, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void wlog(struct metrics_writer *mw, int prio, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	if (!mw->src.store->hooks.log)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	mw->src.store->hooks.log(mw->src.store->hooks.arg, prio, msg);
}

static void write_once(struct metrics_writer *mw)
{
	int r = metrics_write_file(&mw->src, mw->path);

	if (r < 0 && r != mw->last_err)
		wlog(mw, LOG_WARNING, "cannot write metrics file %s: %s", mw->path, strerror(-r));
	else if (r == 0 && mw->last_err)
		wlog(mw, LOG_NOTICE, "metrics file %s written again", mw->path);
	mw->last_err = r;
}

static void *writer(void *arg)
{
	struct metrics_writer *mw = arg;
	struct timespec next;

	pthread_setname_np(pthread_self(), "wfs-metrics");
	clock_gettime(CLOCK_MONOTONIC, &next);
	pthread_mutex_lock(&mw->lock);
	while (!mw->stop) {
		pthread_mutex_unlock(&mw->lock);
		write_once(mw);
		pthread_mutex_lock(&mw->lock);
		next.tv_sec += mw->interval_s;
		while (!mw->stop && pthread_cond_timedwait(&mw->cond, &mw->lock, &next) != ETIMEDOUT)
			;
	}
	pthread_mutex_unlock(&mw->lock);
	return NULL;
}

int metrics_writer_start(struct metrics_writer *mw, const char *path, unsigned interval_s,
			 const struct metrics_src *src)
{
	pthread_condattr_t ca;
	int r;

	memset(mw, 0, sizeof(*mw));
	if (!path || !*path || !src || !src->store)
		return -EINVAL;
	mw->src = *src;
	mw->interval_s = interval_s ? interval_s : 1;
	mw->path = strdup(path);
	if (!mw->path)
		return -ENOMEM;
	pthread_mutex_init(&mw->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&mw->cond, &ca);
	pthread_condattr_destroy(&ca);
	r = thread_start(&mw->thread, NULL, writer, mw);
	if (r) {
		pthread_cond_destroy(&mw->cond);
		pthread_mutex_destroy(&mw->lock);
		free(mw->path);
		mw->path = NULL;
		return r;
	}
	mw->running = 1;
	return 0;
}

void metrics_writer_stop(struct metrics_writer *mw)
{
	if (!mw->running)
		return;
	pthread_mutex_lock(&mw->lock);
	mw->stop = 1;
	pthread_cond_broadcast(&mw->cond);
	pthread_mutex_unlock(&mw->lock);
	pthread_join(mw->thread, NULL);
	mw->running = 0;
	if (unlink(mw->path) < 0 && errno != ENOENT)
		wlog(mw, LOG_WARNING, "cannot remove metrics file %s: %s", mw->path,
		     strerror(errno));
	pthread_cond_destroy(&mw->cond);
	pthread_mutex_destroy(&mw->lock);
	free(mw->path);
	mw->path = NULL;
}
