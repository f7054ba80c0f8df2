/* ctl_promote.c - wfsctl promote; see ctl_promote.h. */
#include "ctl_promote.h"
#include "ctl_conn.h"
#include "ctl_fmt.h"
#include "clock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

/* Poll interval of --wait at most: fast enough for a live bar, slow enough
 * that a status round trip per poll costs the daemon nothing.  Polls come
 * sooner where the copies should end sooner (next_poll_ns). */
#define POLL_NS 250000000L
/* ... and at least: the first poll's wait, doubled until the rate is known,
 * and the floor once the copies should be done (the final fsync, re-read
 * and rename take a few ms more). */
#define POLL_FIRST_NS 10000000L
#define POLL_MIN_NS 5000000L
/* ... and, after a slow poll, at most this (next_poll_ns). */
#define POLL_SLOW_NS 2000000000L
/* A progress poll the daemon turned away (EAGAIN) is sent again this late. */
#define POLL_BUSY_NS 100000000L
/* Without a terminal, a progress line every this many seconds (a log file
 * wants a heartbeat, not 4 lines a second). */
#define PLAIN_EVERY 2.0

enum blob_fate blob_fate(const char *state)
{
	if (!strcmp(state, "local"))
		return FATE_LOCAL;
	if (!strcmp(state, "nas"))
		return FATE_DROPPED;
	/* Only the in-flight states of the protocol keep --wait waiting: a
	 * state it does not define must end the wait, not hang it. */
	if (!strcmp(state, "queued") || !strcmp(state, "copying"))
		return FATE_PENDING;
	return FATE_FAILED;
}

/* Is a blob in @state at promote one the daemon copies?  Not a local one,
 * nor one flagged mismatch: it never queues that (its bytes_to_copy leaves
 * it out too), its NAS bytes not being what its name says. */
static bool to_copy(const char *state)
{
	return blob_fate(state) != FATE_LOCAL && strcmp(state, "mismatch");
}

void rate_add(struct rate *r, double t, uint64_t bytes)
{
	r->t[r->next] = t;
	r->bytes[r->next] = bytes;
	r->next = (r->next + 1) % RATE_SAMPLES;
	if (r->n < RATE_SAMPLES)
		r->n++;
}

double rate_get(const struct rate *r)
{
	size_t newest = (r->next + RATE_SAMPLES - 1) % RATE_SAMPLES;
	size_t oldest = r->n < RATE_SAMPLES ? 0 : r->next;
	double dt;

	if (r->n < 2)
		return 0;
	dt = r->t[newest] - r->t[oldest];
	if (dt <= 0 || r->bytes[newest] < r->bytes[oldest])
		return 0;
	return (double)(r->bytes[newest] - r->bytes[oldest]) / dt;
}

void progress_line(char *buf, size_t sz, uint64_t done, uint64_t total,
		   double rate, size_t nlocal, size_t nblobs, size_t cols)
{
	enum { WIDTH = 24, NARROWEST = 4 };
	char bar[WIDTH + 1], d[32], t[32], eta[32], text[192];
	double frac = total ? (double)(done > total ? total : done) / (double)total : 1.0;
	size_t width = WIDTH, len, i;

	fmt_duration(rate > 0 ? (double)(total - (done > total ? total : done)) / rate : -1,
		     eta, sizeof(eta));
	len = (size_t)snprintf(text, sizeof(text), "%3.0f%%  %s / %s  %.1f MiB/s  ETA %s  %zu/%zu local",
			       frac * 100.0, fmt_bytes(done, d, sizeof(d)),
			       fmt_bytes(total, t, sizeof(t)), rate / (1024.0 * 1024.0), eta,
			       nlocal, nblobs);
	/* "[bar] " around the text, within cols - 1 (a line as wide as the
	 * terminal may wrap, and \r goes back to its last row only) */
	if (cols > 1 && len + WIDTH + 3 > cols - 1)
		width = cols - 1 > len + 3 + NARROWEST ? cols - 1 - len - 3 : 0;
	for (i = 0; i < width; i++)
		bar[i] = i < (size_t)(frac * (double)width) ? '#' : '-';
	bar[width] = '\0';
	snprintf(buf, cols > 1 && cols < sz ? cols : sz, "%s%s%s%s", width ? "[" : "", bar,
		 width ? "] " : "", text);
}

static double now(void)
{
	return (double)mono_ns() / 1e9;
}

static int oom(void)
{
	fprintf(stderr, "wfsctl: out of memory\n");
	return 1;
}

/* ---- the promote reply ---- */

static void print_dry_run(const json_t *rep)
{
	static const char *const hdr[] = { "SIZE", "STATE", "BLOB" };
	uint64_t need = jget_u64(rep, "bytes_to_copy"), avail = jget_u64(rep, "space_available");
	const json_t *blobs = json_object_get(rep, "blobs");
	size_t i, ncopy = 0, nmismatch = 0;
	struct table tb;
	char a[32], b[32];
	json_t *bl;

	table_init(&tb, 3, hdr, "rll");
	json_array_foreach(blobs, i, bl) {
		char name[1024];
		const char *state = jget_str(bl, "state");
		const char *row[3] = { a, state, fmt_blob(bl, name, sizeof(name)) };

		fmt_bytes(jget_u64(bl, "size"), a, sizeof(a));
		nmismatch += !strcmp(state, "mismatch");
		ncopy += to_copy(state);
		if (table_add(&tb, row)) {
			table_free(&tb);
			oom();
			return;
		}
	}
	table_print(&tb, stdout, "");
	table_free(&tb);
	printf("\ndry run: would copy %zu of %zu blob%s, %s; %s available\n", ncopy,
	       json_array_size(blobs), json_array_size(blobs) == 1 ? "" : "s",
	       fmt_bytes(need, a, sizeof(a)), fmt_bytes(avail, b, sizeof(b)));
	if (nmismatch)
		printf("%zu mismatch%s not copied: the NAS content does not hash to its "
		       "name\n", nmismatch, nmismatch == 1 ? "" : "es");
	if (need > avail)
		printf("NOT ENOUGH SPACE: %s more than available; what does not fit "
		       "would stay on the NAS\n", fmt_bytes(need - avail, a, sizeof(a)));
}

static void print_queued(const json_t *rep, bool waiting)
{
	uint64_t need = jget_u64(rep, "bytes_to_copy"), avail = jget_u64(rep, "space_available");
	const json_t *blobs = json_object_get(rep, "blobs");
	size_t i, nlocal = 0, n = json_array_size(blobs);
	char a[32], b[32];
	json_t *bl;

	json_array_foreach(blobs, i, bl)
		nlocal += blob_fate(jget_str(bl, "state")) == FATE_LOCAL;
	printf("promote: %zu blob%s, %s to copy (%zu already local)\n", n,
	       n == 1 ? "" : "s", fmt_bytes(need, a, sizeof(a)), nlocal);
	if (need > avail)
		fprintf(stderr, "wfsctl: promote: %s to copy but %s available: what "
			"does not fit stays on the NAS (see wfsctl status)\n",
			fmt_bytes(need, a, sizeof(a)), fmt_bytes(avail, b, sizeof(b)));
	/* --wait reports these with the rest at the end */
	json_array_foreach(blobs, i, bl) {
		enum blob_fate f = blob_fate(jget_str(bl, "state"));
		char name[1024], state[64], why[FMT_TEXT];

		if (!waiting && (f == FATE_FAILED || f == FATE_DROPPED))
			fprintf(stderr, "wfsctl: promote: %s: not queued (%s)%s%s\n",
				fmt_blob(bl, name, sizeof(name)),
				fmt_text(jget_str(bl, "state"), state, sizeof(state)),
				*jget_str(bl, "reason") ? ": " : "",
				fmt_text(jget_str(bl, "reason"), why, sizeof(why)));
	}
}

/* ---- --wait ---- */

/* The width of the terminal on stderr (0: unknown). */
static size_t term_cols(void)
{
	struct winsize ws;

	return ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 ? ws.ws_col : 0;
}

void bar_show(struct bar *b, uint64_t done, uint64_t total, size_t nlocal, size_t nblobs,
	      bool final)
{
	char line[256];
	double t = now();
	size_t len;

	if (!b->on)
		return;
	if (!b->tty && !final && t - b->last_plain < PLAIN_EVERY)
		return;
	b->last_plain = t;
	progress_line(line, sizeof(line), done, total, rate_get(&b->rate), nlocal, nblobs,
		      b->tty ? term_cols() : 0);
	len = strlen(line);
	if (b->tty) {
		/* Overwrite in place: pad with blanks rather than an escape
		 * sequence, so the line stays plain ASCII on any terminal. */
		fprintf(stderr, "\r%s%*s", line,
			b->last_len > len ? (int)(b->last_len - len) : 0, "");
		if (final)
			fputc('\n', stderr);
		b->last_len = final ? 0 : len;
	} else {
		fprintf(stderr, "%s\n", line);
	}
	fflush(stderr);
}

const char *bar_break(const struct bar *b)
{
	return b->on && b->tty && b->last_len ? "\n" : "";
}

struct waiter {
	struct ctl_conn *conn;
	const char *sock;
	bool json;
	struct bar bar;
	json_t *keys;     /* distinct keys of the promoted blobs */
	json_t *copying;  /* key -> true: blobs to copy at promote (not local, not mismatch) */
	uint64_t total;   /* bytes of those */
	size_t ncopy;     /* how many */
	bool settled;     /* the wait saw every blob settle (not cut short) */
	bool nas_down;    /* the last poll said so (and it was said on stderr) */
	double start;
};

void note_nas(const json_t *nas, const struct bar *bar, bool *down)
{
	const char *state = jget_str(nas, "state");
	char why[FMT_TEXT];

	if (!strcmp(state, "down") && !*down) {
		fprintf(stderr, "%swfsctl: promote: the NAS is %s: the copies wait for it (those "
			"not started yet start once it answers)\n",
			bar_break(bar), fmt_nas(nas, why, sizeof(why)));
		*down = true;
	} else if (!strcmp(state, "up") && *down) {
		fprintf(stderr, "%swfsctl: promote: the NAS answers again\n", bar_break(bar));
		*down = false;
	}
}

static int waiter_init(struct waiter *w, const json_t *promoted)
{
	json_t *bl;
	size_t i;

	w->keys = json_array();
	w->copying = json_object();
	if (!w->keys || !w->copying)
		return -ENOMEM;
	json_array_foreach(json_object_get(promoted, "blobs"), i, bl) {
		const char *key = jget_str(bl, "key");
		bool copies = to_copy(jget_str(bl, "state"));

		if (json_object_get(w->copying, key))
			continue;
		if (json_array_append_new(w->keys, json_string(key)) ||
		    json_object_set_new(w->copying, key, json_boolean(copies)))
			return -ENOMEM;
		if (copies) {
			w->total += jget_u64(bl, "size");
			w->ncopy++;
		}
	}
	return 0;
}

/* Report every blob that will not become local; returns how many. */
static size_t report_failures(const json_t *blobs, const json_t *seen_keys)
{
	size_t i, bad = 0;
	const char *key;
	json_t *bl, *v;

	json_array_foreach(blobs, i, bl) {
		const char *state = jget_str(bl, "state"), *reason = jget_str(bl, "reason");
		enum blob_fate f = blob_fate(state);
		char name[1024], st[64], why[FMT_TEXT];

		if (f != FATE_FAILED && f != FATE_DROPPED)
			continue;
		bad++;
		fprintf(stderr, "wfsctl: promote: %s: %s: %s\n", fmt_blob(bl, name, sizeof(name)),
			f == FATE_DROPPED ? "dropped, still served from the NAS" :
			!strcmp(state, "unknown") ? "no longer known to the daemon" :
			*state ? fmt_text(state, st, sizeof(st)) : "no state",
			*reason ? fmt_text(reason, why, sizeof(why)) : "no reason given");
	}
	json_object_foreach((json_t *)seen_keys, key, v)
		if (!json_is_true(v)) {
			char k[FMT_TEXT];

			bad++;
			fprintf(stderr, "wfsctl: promote: %s: the daemon no longer reports "
				"this blob\n", fmt_text(key, k, sizeof(k)));
		}
	return bad;
}

/* Keys per progress request: a repo can have thousands of blobs, and one
 * request must stay under the daemon's 64 KiB limit -- in count, and in
 * bytes (a key is a NAS path: a file deep in a snapshot, escaped, can take
 * hundreds), with room for the rest of the request. */
#define PROGRESS_BATCH 200
#define PROGRESS_BYTES (CTL_REQUEST_MAX - 1024)

/* The bytes of @s as a JSON string (jansson's escapes at most). */
static size_t json_str_len(const char *s)
{
	size_t n = 2;

	for (; *s; s++)
		n += *s == '"' || *s == '\\' ? 2 : (unsigned char)*s < 0x20 ? 6 : 1;
	return n;
}

int progress_poll(struct ctl_conn *c, const char *sock, const json_t *req, bool json,
		  const struct bar *bar, struct ctl_reply *rep)
{
	double give_up = now() + c->timeout_s;

	for (;;) {
		int r = ctl_exchange(c, sock, req, rep);
		const struct timespec ts = { 0, POLL_BUSY_NS };

		if (r || json_is_true(json_object_get(rep->obj, "ok")) ||
		    strcmp(jget_str(rep->obj, "errno"), "EAGAIN") ||
		    (c->timeout_s && now() >= give_up))
			return ctl_report(c, sock, "promote", json, bar_break(bar), r, rep);
		ctl_reply_free(rep);
		nanosleep(&ts, NULL);
	}
}

/* One progress poll of every key, in batches; the replies' "blobs" are
 * merged into @rep (whose raw line is rebuilt for --json). */
static int progress_all(struct waiter *w, struct ctl_reply *rep)
{
	size_t n = json_array_size(w->keys);
	json_t *all = json_array();

	if (!all)
		return oom();
	for (size_t at = 0, next; at < n || at == 0; at = next) {
		json_t *keys = json_array(), *req;
		struct ctl_reply part = { 0 };
		size_t bytes = 0;
		int r;

		for (next = at; next < n && next < at + PROGRESS_BATCH; next++) {
			bytes += json_str_len(json_string_value(json_array_get(w->keys, next))) + 1;
			if (next > at && bytes > PROGRESS_BYTES)
				break; /* the next request takes it */
			json_array_append(keys, json_array_get(w->keys, next));
		}
		req = json_pack("{s:s,s:o}", "op", "progress", "keys", keys);
		r = req ? progress_poll(w->conn, w->sock, req, w->json, &w->bar, &part) : -ENOMEM;
		json_decref(req);
		if (r) {
			json_decref(all);
			return r;
		}
		json_array_extend(all, json_object_get(part.obj, "blobs"));
		if (!rep->obj) {
			*rep = part;
		} else {
			ctl_reply_free(&part);
		}
		if (n == 0)
			break;
	}
	json_object_set_new(rep->obj, "blobs", all);
	free(rep->raw);
	rep->raw = json_dumps(rep->obj, JSON_COMPACT);
	return rep->raw ? 0 : oom();
}

/* How long to wait before the next poll.  Polling every POLL_NS made
 * promote --wait return up to that late (a 1.4 GB blob on NVMe-class
 * disks: 1.015 s where the copy took ~0.96 s).  So the wait is the time
 * the copies should still take at the rate seen (POLL_FIRST_NS, doubled
 * per poll, while no rate is known), within POLL_MIN_NS .. POLL_NS, and
 * never under four times what the last poll took (over POLL_NS too: a
 * poll of 40,000 blobs takes ~0.3 s of the daemon's time and wfsctl's;
 * up to POLL_SLOW_NS: one poll slowed by a busy daemon delays the end
 * that long at most), so that thousands of blobs polled in batches keep
 * the cost small. */
static long next_poll_ns(const struct waiter *w, uint64_t done, int polls, double cost)
{
	double rate = rate_get(&w->bar.rate), ns;

	if (rate > 0)
		ns = (double)(w->total > done ? w->total - done : 0) / rate * 1e9;
	else
		ns = (double)POLL_FIRST_NS * (double)(1L << (polls < 8 ? polls : 8));
	if (ns < POLL_MIN_NS)
		ns = POLL_MIN_NS;
	if (ns > POLL_NS)
		ns = POLL_NS;
	if (ns < 4 * cost * 1e9)
		ns = 4 * cost * 1e9 < POLL_SLOW_NS ? 4 * cost * 1e9 : POLL_SLOW_NS;
	return (long)ns;
}

int print_wait_outcome(struct ctl_reply *rep, size_t nlocal, size_t bad)
{
	char *raw;

	if (json_object_set_new(rep->obj, "local", json_integer((json_int_t)nlocal)) ||
	    json_object_set_new(rep->obj, "failed", json_integer((json_int_t)bad)) ||
	    !(raw = json_dumps(rep->obj, JSON_COMPACT)))
		return -ENOMEM;
	free(rep->raw);
	rep->raw = raw;
	ctl_print_raw(rep);
	return 0;
}

/* Poll progress until every blob is local, failed or dropped. */
static int wait_all(struct waiter *w)
{
	struct ctl_reply rep = { 0 };
	int ret = 1, polls = 0;

	w->start = now();
	for (;;) {
		json_t *blobs, *bl, *seen = json_object();
		size_t i, nlocal = 0, pending = 0, bad;
		uint64_t done = 0;
		double t0 = now();

		ctl_reply_free(&rep);
		if (!seen || progress_all(w, &rep)) {
			json_decref(seen);
			break;
		}
		/* Keys the reply leaves out count as lost, not as pending
		 * forever. */
		json_array_foreach(w->keys, i, bl)
			json_object_set_new(seen, json_string_value(bl), json_false());
		blobs = json_object_get(rep.obj, "blobs");
		json_array_foreach(blobs, i, bl) {
			const char *key = jget_str(bl, "key");
			enum blob_fate f = blob_fate(jget_str(bl, "state"));
			uint64_t size = jget_u64(bl, "size"), d = jget_u64(bl, "bytes_done");

			if (!json_object_get(seen, key))
				continue; /* not ours */
			json_object_set_new(seen, key, json_true());
			nlocal += f == FATE_LOCAL;
			pending += f == FATE_PENDING;
			/* a copy that failed, was dropped or flagged brought
			 * nothing local, whatever it had read */
			if (json_is_true(json_object_get(w->copying, key)))
				done += f == FATE_LOCAL ? size : f != FATE_PENDING ? 0 :
					d > size ? size : d;
		}
		rate_add(&w->bar.rate, now(), done);
		if (pending) {
			long ns = next_poll_ns(w, done, polls++, now() - t0);
			const struct timespec ts = { ns / 1000000000L, ns % 1000000000L };

			note_nas(json_object_get(rep.obj, "nas"), &w->bar, &w->nas_down);

			json_decref(seen);
			bar_show(&w->bar, done, w->total, nlocal, json_array_size(w->keys), false);
			nanosleep(&ts, NULL);
			continue;
		}
		bar_show(&w->bar, done, w->total, nlocal, json_array_size(w->keys), true);
		w->settled = true;
		bad = report_failures(blobs, seen);
		json_decref(seen);
		if (w->json && print_wait_outcome(&rep, nlocal, bad) < 0) {
			ret = oom();
			break;
		}
		if (bad) {
			fprintf(stderr, "wfsctl: promote: %zu of %zu blob%s did not become local\n",
				bad, json_array_size(w->keys), json_array_size(w->keys) == 1 ? "" : "s");
		} else {
			double dt = now() - w->start;
			char a[32], dur[32];

			if (!w->json)
				printf("promote: %zu blob%s local; %s copied in %s (%.1f MiB/s)\n",
				       nlocal, nlocal == 1 ? "" : "s",
				       fmt_bytes(w->total, a, sizeof(a)),
				       fmt_duration(dt, dur, sizeof(dur)),
				       dt > 0 ? (double)w->total / dt / (1024.0 * 1024.0) : 0.0);
			ret = 0;
		}
		break;
	}
	ctl_reply_free(&rep);
	return ret;
}

/* Once the copies have settled: ask the daemon to refresh its local record
 * now rather than within its next rebuild, so that when promote --wait
 * returns a NAS outage no longer hides what it promoted.  A failure is a
 * warning: the copies are local all the same. */
void sync_record(struct ctl_conn *c, const char *sock)
{
	json_t *req = json_pack("{s:s}", "op", "sync");
	struct ctl_reply rep;
	char text[FMT_TEXT];
	const char *err;
	int r = req ? ctl_exchange(c, sock, req, &rep) : -ENOMEM;

	json_decref(req);
	if (r) {
		fprintf(stderr, "wfsctl: promote: warning: could not ask the daemon to refresh "
			"its local record: %s\n", strerror(-r));
		return;
	}
	err = jget_str(rep.obj, "error");
	/* an older daemon keeps no record: nothing to refresh */
	if (!jget_bool(rep.obj, "ok") && strncmp(err, "unknown op", 10))
		fprintf(stderr, "wfsctl: promote: warning: %s [%s]\n"
			"wfsctl: promote: the copies are local; until the daemon's next rebuild "
			"of its local record a NAS outage would hide them from the mount\n",
			*err ? fmt_text(err, text, sizeof(text)) : "the local record was not refreshed",
			jget_str(rep.obj, "errno"));
	ctl_reply_free(&rep);
}

/* Exclusion globs keep some paths on the NAS: say which were skipped, and
 * refuse (exit 1) the PATHs that were nothing but excluded. */
size_t report_excluded(const json_t *rep, bool json)
{
	const json_t *excl = json_object_get(rep, "excluded");
	const json_t *refused = json_object_get(rep, "refused");
	uint64_t bytes = 0, in_refused = 0;
	json_t *e;
	size_t i;

	json_array_foreach(refused, i, e) {
		char path[FMT_TEXT], glob[FMT_TEXT], what[64];
		uint64_t n = jget_u64(e, "count");

		/* an older daemon sent no count: one at least */
		in_refused += n ? n : 1;
		if (n > 1)
			snprintf(what, sizeof(what), "all %llu blobs under it are",
				 (unsigned long long)n);
		else
			snprintf(what, sizeof(what), "%s", n ? "its one blob is" : "it is");
		fprintf(stderr, "wfsctl: promote: %s: nothing to promote: %s excluded by '%s' "
			"(wfs -o exclude) and kept on the NAS; --force promotes it anyway\n",
			fmt_text(jget_str(e, "path"), path, sizeof(path)), what,
			fmt_text(jget_str(e, "glob"), glob, sizeof(glob)));
	}
	/* the blobs skipped under the other PATHs */
	if (json_array_size(excl) > in_refused) {
		char a[32], path[FMT_TEXT], glob[FMT_TEXT];
		size_t n = json_array_size(excl) - in_refused;

		json_array_foreach(excl, i, e)
			bytes += jget_u64(e, "size");
		if (!json && in_refused)
			printf("promote: %zu more excluded blob%s kept on the NAS; --force to "
			       "promote them\n", n, n == 1 ? "" : "s");
		else if (!json)
			printf("promote: %zu excluded blob%s (%s) kept on the NAS (e.g. %s, by '%s'); "
			       "--force to promote them\n", n, n == 1 ? "" : "s",
			       fmt_bytes(bytes, a, sizeof(a)),
			       fmt_text(jget_str(json_array_get(excl, 0), "path"), path, sizeof(path)),
			       fmt_text(jget_str(json_array_get(excl, 0), "glob"), glob, sizeof(glob)));
	}
	return json_array_size(refused);
}

int cmd_promote(const struct ctl_opts *o)
{
	struct ctl_target t;
	struct ctl_reply rep;
	struct waiter w = { 0 };
	json_t *req;
	size_t refused;
	bool nothing;
	int ret;

	if (o->nranges || o->part_n)
		return cmd_promote_part(o);
	if (ctl_target_resolve(o->conn, &t, o->socket, o->paths, o->npaths))
		return 1;
	req = json_pack("{s:s,s:b,s:b,s:b}", "op", "promote", "pin", o->pin, "dry_run",
			o->dry_run, "force", o->force);
	if (!req || ctl_req_paths(req, &t, false)) {
		json_decref(req);
		ctl_target_free(&t);
		return oom();
	}
	ret = ctl_call(o->conn, t.socket, "promote", req, o->json, &rep) ? 1 : 0;
	json_decref(req);
	if (ret) {
		ctl_target_free(&t);
		return ret;
	}
	/* Every PATH refused (all excluded): nothing was queued, so no "0
	 * blobs" report and no wait, which would read as success. */
	nothing = !json_array_size(json_object_get(rep.obj, "blobs")) &&
		  json_array_size(json_object_get(rep.obj, "refused"));
	if (o->json && (!o->wait || nothing))
		ctl_print_raw(&rep);
	else if (o->dry_run)
		print_dry_run(rep.obj);
	else if (!o->json && !nothing)
		print_queued(rep.obj, o->wait);
	refused = report_excluded(rep.obj, o->json);
	if (o->wait && !nothing) {
		w.conn = o->conn;
		w.sock = t.socket;
		w.json = o->json;
		w.bar.tty = isatty(STDERR_FILENO);
		/* With --json the bar is for a person watching, not for logs. */
		w.bar.on = !o->json || w.bar.tty;
		ret = waiter_init(&w, rep.obj) ? oom() : 0;
		/* nothing to copy: no bar, but still one poll, so the outcome
		 * (and the --json reply) is the daemon's current word */
		w.bar.on = w.bar.on && w.total;
		if (!ret)
			ret = wait_all(&w);
		if (w.settled && w.ncopy)
			sync_record(w.conn, w.sock);
		json_decref(w.keys);
		json_decref(w.copying);
	}
	ctl_reply_free(&rep);
	ctl_target_free(&t);
	return ret ? ret : refused ? 1 : 0;
}
