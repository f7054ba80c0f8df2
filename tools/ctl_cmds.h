/* ctl_cmds.h - wfsctl's commands.  Each takes the parsed command line and
 * returns the process exit status: 0 done, 1 failed (the reason is already
 * on stderr).  Usage errors (exit 2) are caught before they run.
 */
#ifndef WFS_CTL_CMDS_H
#define WFS_CTL_CMDS_H

#include "ctl_path.h"
#include "range.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

struct ctl_opts {
	const char *socket; /* --socket, or NULL to find it from the mount */
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

/* The resolved paths as a JSON array of strings, or NULL (out of memory). */
json_t *ctl_paths_json(const struct ctl_target *t);

#endif
