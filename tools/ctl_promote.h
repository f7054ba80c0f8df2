/* ctl_promote.h - wfsctl promote: queue copies, dry-run, and --wait with a
 * progress bar.  The command itself is declared in ctl_cmds.h with the
 * others; this header holds the pieces the wait loop is built from.
 */
#ifndef WFS_CTL_PROMOTE_H
#define WFS_CTL_PROMOTE_H

#include "ctl_cmds.h"
#include "ctl_conn.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where a blob stands for someone waiting on it. */
enum blob_fate {
	FATE_PENDING, /* queued, copying (which verifies as it goes) */
	FATE_LOCAL,   /* done */
	FATE_FAILED,  /* failed, mismatch, or a state outside the protocol
		       * ("unknown": the daemon no longer knows the key): it
		       * will not become local by itself */
	FATE_DROPPED, /* back to nas without becoming local */
};

enum blob_fate blob_fate(const char *state);

/* Throughput over the last few seconds, so the rate and ETA follow the
 * current speed instead of the average since start. */
#define RATE_SAMPLES 16
struct rate {
	double t[RATE_SAMPLES];
	uint64_t bytes[RATE_SAMPLES];
	size_t n, next;
};

void rate_add(struct rate *r, double t, uint64_t bytes);
double rate_get(const struct rate *r); /* bytes per second, 0 if unknown */

/* The progress bar of a --wait, on stderr: on a terminal redrawn in place
 * (blanks over the tail of a longer line before it), else a line every
 * few seconds and one at the end, for a log. */
struct bar {
	bool on, tty;
	struct rate rate;  /* the caller adds samples (rate_add) */
	double last_plain; /* when the last line went to a non-terminal */
	size_t last_len;   /* of the last terminal line, to blank its tail */
};

/* Draw the bar (nothing unless @b->on): @done of @total bytes, @nlocal of
 * @nblobs blobs local; @final ends the line. */
void bar_show(struct bar *b, uint64_t done, uint64_t total, size_t nlocal, size_t nblobs,
	      bool final);

/* What to print on stderr before a message while the bar is drawn: a
 * newline to end its line on a terminal, else nothing. */
const char *bar_break(const struct bar *b);

/* The NAS's state in a progress reply (@nas; NULL from a daemon that
 * sends none: nothing said), while copies are pending: a line on stderr
 * when the daemon finds it down (since when, why) and one when it answers
 * again, so that a bar standing still has a reason.  @*down: what was said
 * last (false before the first poll). */
void note_nas(const json_t *nas, const struct bar *bar, bool *down);

/* --wait --json: the last progress reply, with the wait's outcome added
 * ("ok" is that reply's own): "local", the blobs local (with --range:
 * whose ranges asked for are), and "failed", those that will not be (the
 * exit status is 1 then).  Printed; 0, or -ENOMEM. */
int print_wait_outcome(struct ctl_reply *rep, size_t nlocal, size_t bad);

/* The progress line, plain ASCII:
 * "[#####---------------]  25%  1.0 GiB / 4.0 GiB  312.4 MiB/s  ETA 0:10  1/4 local"
 * With @cols (a terminal's width; 0: none) it is shorter than that: the
 * bar narrows, then goes, then the tail is cut. */
void progress_line(char *buf, size_t sz, uint64_t done, uint64_t total,
		   double rate, size_t nlocal, size_t nblobs, size_t cols);

/* One progress poll of a --wait: ctl_call_ex(@c, @sock, "promote", @req, ...),
 * except that a reply refusing it for now ("errno":"EAGAIN": the daemon's
 * connection caps) is asked again, every POLL_BUSY_NS, for as long as the
 * timeout (@c->timeout_s): a wait of minutes must not fail for a moment's
 * crowd. */
int progress_poll(struct ctl_conn *c, const char *sock, const json_t *req, bool json,
		  const struct bar *bar, struct ctl_reply *rep);

/* Once copies have settled: the daemon refreshes its local record now
 * ({"op":"sync"}), so a NAS outage from then on shows what was copied; a
 * failure is a warning on stderr. */
void sync_record(struct ctl_conn *c, const char *sock);

/* A promote reply's exclusions: each refused PATH (all excluded) on stderr,
 * naming the glob and --force, and (unless @json) how many excluded blobs
 * under larger PATHs were skipped.  Returns how many PATHs were refused. */
size_t report_excluded(const json_t *rep, bool json);

#endif
