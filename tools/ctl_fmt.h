/* ctl_fmt.h - output helpers for wfsctl: human byte counts, plain-ASCII
 * tables, and tolerant readers for fields of daemon replies.
 *
 * Functions that fail return -errno.
 */
#ifndef WFS_CTL_FMT_H
#define WFS_CTL_FMT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fmt.h" /* fmt_bytes (core/fmt.c) */

/* "0:05", "12:34", "1:02:03"; returns @buf. */
const char *fmt_duration(double seconds, char *buf, size_t sz);

/* A table printed with columns padded to their widest cell, two spaces
 * apart.  Cells are copied, so callers may pass stack buffers. */
struct table {
	size_t ncols;
	const char *const *hdr;
	const char *align; /* one 'l' or 'r' per column */
	char **cells;      /* nrows * ncols */
	size_t nrows, cap;
};

void table_init(struct table *t, size_t ncols, const char *const *hdr,
		const char *align);
/* Append one row of exactly t->ncols cells (NULL prints as ""). */
int table_add(struct table *t, const char *const *row);
/* Print header and rows, each line prefixed by @indent. */
void table_print(const struct table *t, FILE *f, const char *indent);
void table_free(struct table *t);

/* Field readers that never fail: a missing or mistyped field reads as
 * 0 / "" so a reply from a newer or older daemon still prints. */
uint64_t jget_u64(const json_t *obj, const char *key);
const char *jget_str(const json_t *obj, const char *key);
bool jget_bool(const json_t *obj, const char *key);
/* How many entries the list @key of @obj stands for: its "<key>_total"
 * (a daemon lists only the first ones), at least the list's length (an
 * older daemon sent no total). */
uint64_t jget_total(const json_t *obj, const char *key);

/* "2026-11-30 22:41:07", local time, of CLOCK_REALTIME seconds; returns @buf. */
const char *fmt_time(int64_t t, char *buf, size_t sz);

/* How long ago @t was: "12 s", "3 min 4 s", "2 h 5 min", "3 d 4 h". */
const char *fmt_ago(int64_t t, char *buf, size_t sz);

/* The NAS's state of a reply's "nas" object: "up", or "DOWN since
 * 2026-11-30 22:41:07 (12 s): REASON; 3 calls timed out, 41 requests
 * answered from the local record, 2 refused". */
const char *fmt_nas(const json_t *nas, char *buf, size_t sz);

/* A reply's "record" object: "12 files, 40 names, built 2026-11-30 22:40:01
 * (3 min ago)", "0 files (not built yet)" or "none kept". */
const char *fmt_record(const json_t *rec, char *buf, size_t sz);

/* How a blob of a reply is named to a person: its key (the NAS path,
 * which for hub blobs ends in the id), plus "(id ID)" where it does not;
 * control characters as in fmt_text. */
const char *fmt_blob(const json_t *blob, char *buf, size_t sz);

/* @s (a NAS name, a link's target, a reason from the daemon; NULL: "")
 * for a person's terminal, in @buf (cut to @sz): control characters (C0,
 * DEL) as '?', as table cells show them, so that a name holding a newline
 * or an escape sequence can neither forge a line nor drive the terminal.
 * Returns @buf. */
#define FMT_TEXT 4096
const char *fmt_text(const char *s, char *buf, size_t sz);

#endif
