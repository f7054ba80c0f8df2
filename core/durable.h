/* durable.h - replacing a file so that a crash leaves the old content or
 * the new, never a mix, and making a rename survive a crash.  The one
 * writer of whole files for the index, the record and the metrics file,
 * and the one reader of the first two.
 */
#ifndef WFS_DURABLE_H
#define WFS_DURABLE_H

#include <stddef.h>
#include <sys/types.h>

/* Write @len bytes of @data to "@path.<pid>.tmp" (created O_EXCL-free but
 * O_NOFOLLOW, mode @mode whatever the umask), with @sync: fsync it, rename
 * it over @path, then fsync @path's directory; without @sync only the
 * rename (a file readers must never see half-written, but that a crash may
 * lose).  On failure the temporary file is removed and @path is untouched.
 * Returns 0 or -errno. */
int durable_replace(const char *path, const void *data, size_t len, mode_t mode, int sync);

/* The same in steps, for a text written as it is made: durable_begin
 * creates the temporary file and returns its descriptor (or -errno); the
 * caller writes to it; durable_end(@r 0) then does the rest as
 * durable_replace does, while durable_end(@r < 0), or any failure of its
 * own, closes and removes the temporary file and leaves @path untouched.
 * durable_end returns 0 or -errno (@r when it is one). */
int durable_begin(const char *path, mode_t mode);
int durable_end(const char *path, int fd, int r, int sync);

/* Read the whole regular file @path (no link followed) into *@out
 * (malloc'ed, NUL-terminated; the caller frees it), its length in *@len.
 * One descriptor: the @max cap holds for what is read, and a file that
 * grew since its fstat is refused, never parsed cut short.  Returns 0, 1
 * when there is no such file, -EFBIG past @max, -EINVAL for no regular
 * file, or -errno. */
int durable_read(const char *path, size_t max, char **out, size_t *len);

/* Read from @fd into @buf until end of file or @cap bytes, whichever comes
 * first, going on after interrupted reads.  Returns the bytes read or
 * -errno. */
ssize_t durable_read_fd(int fd, void *buf, size_t cap);
/* The same with pread from @off (>= 0; the descriptor's offset untouched). */
ssize_t durable_pread_fd(int fd, void *buf, size_t cap, off_t off);
/* Write all @len bytes of @buf at @off (>= 0) with pwrite, going on after
 * short and interrupted writes: 0 or -errno (-EIO: nothing was taken). */
int durable_pwrite_fd(int fd, const void *buf, size_t len, off_t off);

/* fsync the directory @dir (after a rename into it).  Returns 0 or -errno. */
int durable_fsync_dir(const char *dir);

/* Move the file @path that cannot be read aside, for the operator, to the
 * first free name of @path.damaged, @path.damaged.1 ... @path.damaged.99
 * (its name into @aside): never over an earlier one, which may be the one
 * worth having (an index that still names the copies, damaged again after
 * the start that set it aside).  Returns 0 or -errno (-EEXIST: every name
 * taken). */
int durable_set_aside(const char *path, char *aside, size_t sz);
#define DURABLE_ASIDE_NAMES 100 /* @path.damaged and .1 to .99 */
/* Is a file that durable_set_aside moved from @path still there?  1 with
 * the first such name in @aside, else 0. */
int durable_aside_found(const char *path, char *aside, size_t sz);

#endif
