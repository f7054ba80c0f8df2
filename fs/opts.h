/* opts.h - the wfs command line: every -o option in one table of rows
 * (core/policy.h has the row format and the value syntax of each kind),
 * parsed with libfuse's option parser.
 *
 * A bad value is refused here, before anything is opened or mounted, with
 * a message on stderr that names the option and what it accepts.  Options
 * that are not wfs's go on to FUSE (which refuses the ones it does not know
 * either), and the fstab-only words (defaults, nofail, noauto, auto, user,
 * users, nouser, _netdev, rw, comment=, x-*) are dropped.
 */
#ifndef WFS_OPTS_H
#define WFS_OPTS_H

#include <stdio.h>

struct fuse_args;
struct wfs_opts;

/* What the command line asks for. */
enum opts_action { OPTS_MOUNT, OPTS_HELP, OPTS_VERSION };

/* The defaults, as --help shows them; opts_free() releases what parsing
 * allocated. */
void opts_init(struct wfs_opts *o);
void opts_free(struct wfs_opts *o);

/* Parse @args (the daemon's argc/argv, FUSE_ARGS_INIT) into @o.  On
 * return @args holds what goes to fuse_session_new(): argv[0] and the -o
 * options that are FUSE's (free it with fuse_opt_free_args()).  Returns an
 * enum opts_action, or -EINVAL after printing why on stderr (-ENOMEM). */
int opts_parse(struct wfs_opts *o, struct fuse_args *args);

/* The --help text: usage, then every option with its default. */
void opts_usage(FILE *f);

#endif
