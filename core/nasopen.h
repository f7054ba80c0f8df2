/* nasopen.h - the one way the daemon opens a file or directory of the NAS.
 *
 * The daemon runs as root.  A path it resolved a moment ago (every link
 * followed, or shown as a link, by the rules of ns.h) may since have had a
 * component swapped for a link by anyone who can write on the NAS;
 * following it would hand a reader a file they could not read themselves.
 * So no link is followed in any component, and the walk cannot leave the
 * root the path lies in.  A FIFO, socket or device is never opened: an open
 * of a FIFO for reading waits for a writer, a device's open is the driver's
 * to define.
 */
#ifndef WFS_NASOPEN_H
#define WFS_NASOPEN_H

#include <dirent.h>

#include "resolve.h"

/* Open @phys_path for reading and return the descriptor.
 *
 * Preconditions: @phys_path is absolute and physical (as hub_resolve's
 * out->real or a root joined with a physical relative path): no ".", ".."
 * or empty components.  With @roots it must lie inside one of them, and is
 * walked from that root's directory with openat2(RESOLVE_BENEATH |
 * RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS); @roots NULL (a caller that
 * only kept the path) walks every component from "/" with
 * RESOLVE_NO_SYMLINKS.  Where openat2 is refused (OPENAT2_REFUSED) the
 * same walk is made with one openat(O_NOFOLLOW) per component.
 *
 * @flags: O_RDONLY (0) plus any of O_DIRECTORY (a directory is wanted; else
 * a regular file), O_DIRECT, O_NOATIME.  O_CLOEXEC, O_NOFOLLOW and O_NOCTTY
 * are always added.  A regular file is first looked at through an O_PATH
 * descriptor, then opened O_NONBLOCK (a FIFO swapped in between cannot make
 * the open wait) and must be the same inode; O_NONBLOCK is cleared before
 * the descriptor is returned.
 *
 * Returns the descriptor, or:
 *   -ELOOP     a component is a link (now): refused, never followed
 *   -EXDEV     @phys_path is not inside any of @roots
 *   -EINVAL    not absolute, a ".", ".." or empty component, or @flags ask
 *              for writing
 *   -EISDIR    a directory where a file was wanted
 *   -ENOTDIR   not a directory where one was wanted (a link there too), or
 *              a component is not a directory
 *   -ENXIO     a FIFO, socket or device: never opened
 *   -ESTALE    the name changed to another file while it was opened
 *   other      -errno of the failing call (ENOENT, EACCES, ENAMETOOLONG, ...;
 *              EINVAL also where the filesystem refuses O_DIRECT) */
int nas_open(const struct hub_roots *roots, const char *phys_path, int flags);

/* The directory @phys_path opened as nas_open(O_DIRECTORY) opens it, for
 * readdir: a DIR, or NULL with errno set. */
DIR *nas_opendir(const struct hub_roots *roots, const char *phys_path);

/* Is @de, read from @d, a directory (not a link to one)?  Where readdir
 * does not say (DT_UNKNOWN: NFS without READDIRPLUS, some FUSE servers),
 * the entry is looked at itself; 0 when that look fails. */
int nas_dirent_is_dir(DIR *d, const struct dirent *de);

/* Whether openat2's @err says the call itself was refused, not the open:
 * ENOSYS on a kernel before 5.6 or under a seccomp profile that answers
 * calls it does not list so; EPERM under one that answers them so
 * (Docker's default profile does, and listed openat2 only from 20.10;
 * systemd-nspawn refused openat2 with EPERM until 2021).  Whoever falls
 * back to a walk of its own on it loses nothing where the open itself
 * failed EPERM (a fanotify or LSM refusal): the walk's open fails the
 * same way. */
#define OPENAT2_REFUSED(err) ((err) == ENOSYS || (err) == EPERM)

#endif
