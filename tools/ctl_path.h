/* ctl_path.h - from command-line PATHs to the daemon's socket and
 * mount-relative paths.
 *
 * The mount root carries the xattr user.wfs.socket (the socket's absolute
 * path), so wfsctl finds the daemon from any path inside the mount.
 * Functions that fail print the reason (naming the path) and return -errno.
 */
#ifndef WFS_CTL_PATH_H
#define WFS_CTL_PATH_H

#include <stddef.h>

struct ctl_conn; /* ctl_conn.h */

#define CTL_SOCKET_XATTR "user.wfs.socket"

struct ctl_target {
	char *socket; /* where to send requests */
	char *root;   /* the mount root found, or NULL (only with --socket) */
	char **rel;   /* mount-relative paths: no leading '/', "" = the root */
	size_t nrel;
};

/* Resolve @args (as typed; globs not matching a file literally are
 * expanded) into @t, within @c's timeout (ctl_watchdog_arm).  With
 * @socket_opt NULL the socket is found from the mount above the first
 * path, or above the cwd when there is none; every path must lie in that
 * one mount.  With @socket_opt, a path with no mount above it is taken as
 * already relative to the mount root. */
int ctl_target_resolve(struct ctl_conn *c, struct ctl_target *t, const char *socket_opt,
		       char *const *args, size_t nargs);

void ctl_target_free(struct ctl_target *t);

#endif
