/* ctl_cmds.h - wfsctl's commands.  Each takes the parsed command line and
 * returns the process exit status: 0 done, 1 failed (the reason is already
 * on stderr).  Usage errors (exit 2) are caught before they run.
 */
#ifndef WFS_CTL_CMDS_H
#define WFS_CTL_CMDS_H

#include "ctl_conn.h"
#include "ctl_path.h"
#include "range.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

struct ctl_opts {
	struct ctl_conn *conn; /* main's: the timeout, and whether it passed */
	const char *socket; /* --socket, or NULL to find it from the mount */
	long timeout;       /* --timeout SECONDS (0: none), -1: not given */
	bool json;          /* print the daemon's reply instead of tables */
	bool wait, pin, dry_run, force, full;
	bool prometheus;    /* stats --prometheus */
	const char *ref;    /* pin/unpin --ref REF */
	struct brange *ranges; /* promote --range OFF:LEN (repeatable) */
	size_t nranges;
	unsigned part_k, part_n; /* promote --part K/N (0: none) */
	char **paths;       /* PATH arguments as typed */
	size_t npaths;
};

int cmd_status(const struct ctl_opts *o);
int cmd_evict(const struct ctl_opts *o);
int cmd_pin(const struct ctl_opts *o);
int cmd_unpin(const struct ctl_opts *o);
int cmd_verify(const struct ctl_opts *o);
int cmd_promote(const struct ctl_opts *o); /* ctl_promote.c */
int cmd_promote_part(const struct ctl_opts *o); /* ctl_part.c: --range, --part */
int cmd_stats(const struct ctl_opts *o);   /* ctl_stats.c */
int cmd_doctor(const struct ctl_opts *o);  /* ctl_doctor.c */

/* Name the resolved paths in @req: "paths", a list of strings -- or, when
 * one is not UTF-8 (JSON strings are; names are bytes), "paths_hex", the
 * same list in hex (jbytes.h).  No path: [""], the mount root, with
 * @root_if_none.  0, or -ENOMEM. */
int ctl_req_paths(json_t *req, const struct ctl_target *t, bool root_if_none);

/* Name one path in @req: "path", or "path_hex" when it is not UTF-8.
 * 0, or -ENOMEM. */
int ctl_req_path(json_t *req, const char *rel);

#endif
