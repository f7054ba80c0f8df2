/* durable.c - see durable.h. */
#include "durable.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int durable_fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), r = 0;

	if (fd < 0)
		return -errno;
	if (fsync(fd) < 0)
		r = -errno;
	close(fd);
	return r;
}

/* rename(2) that never replaces @to: RENAME_NOREPLACE, or where the
 * filesystem has none, a link and an unlink. */
static int rename_noreplace(const char *from, const char *to)
{
	if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno != EINVAL && errno != ENOSYS)
		return -errno;
	if (link(from, to) < 0)
		return -errno;
	return unlink(from) < 0 ? -errno : 0;
}

/* The @n-th name a file @path is set aside as: @path.damaged, then
 * @path.damaged.1 ... */
static void aside_name(const char *path, int n, char *aside, size_t sz)
{
	if (n)
		snprintf(aside, sz, "%s.damaged.%d", path, n);
	else
		snprintf(aside, sz, "%s.damaged", path);
}

int durable_set_aside(const char *path, char *aside, size_t sz)
{
	int r = -EEXIST;

	for (int n = 0; n < DURABLE_ASIDE_NAMES && r == -EEXIST; n++) {
		aside_name(path, n, aside, sz);
		r = rename_noreplace(path, aside);
	}
	return r;
}

int durable_aside_found(const char *path, char *aside, size_t sz)
{
	for (int n = 0; n < DURABLE_ASIDE_NAMES; n++) {
		aside_name(path, n, aside, sz);
		if (access(aside, F_OK) == 0)
			return 1;
	}
	return 0;
}

/* Write all @len bytes: write(2) when @off < 0, else pwrite from @off on.
 * 0, or -errno (-EIO: the file took nothing). */
static int write_full(int fd, const char *p, size_t len, off_t off)
{
	while (len) {
		ssize_t n = off < 0 ? write(fd, p, len) : pwrite(fd, p, len, off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		p += n;
		len -= (size_t)n;
		off += off < 0 ? 0 : n;
	}
	return 0;
}

int durable_pwrite_fd(int fd, const void *buf, size_t len, off_t off)
{
	return write_full(fd, buf, len, off);
}

/* "@path.<pid>.tmp" into @tmp. */
static int tmp_name(const char *path, char tmp[PATH_MAX])
{
	return snprintf(tmp, PATH_MAX, "%s.%d.tmp", path, (int)getpid()) >= PATH_MAX ?
		-ENAMETOOLONG : 0;
}

int durable_begin(const char *path, mode_t mode)
{
	char tmp[PATH_MAX];
	int fd, r = tmp_name(path, tmp);

	if (r < 0)
		return r;
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
	if (fd < 0)
		return -errno;
	if (fchmod(fd, mode) < 0) {
		r = -errno;
		close(fd);
		unlink(tmp);
		return r;
	}
	return fd;
}

int durable_end(const char *path, int fd, int r, int sync)
{
	char tmp[PATH_MAX], dir[PATH_MAX];
	const char *slash;

	tmp_name(path, tmp); /* (it fit at durable_begin) */
	if (r == 0 && sync && fsync(fd) < 0)
		r = -errno;
	if (close(fd) < 0 && r == 0)
		r = -errno;
	if (r == 0 && rename(tmp, path) < 0)
		r = -errno;
	if (r < 0) {
		unlink(tmp);
		return r;
	}
	if (!sync)
		return 0;
	slash = strrchr(path, '/');
	if (!slash)
		return durable_fsync_dir(".");
	snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
	return durable_fsync_dir(dir);
}

int durable_replace(const char *path, const void *data, size_t len, mode_t mode, int sync)
{
	int fd = durable_begin(path, mode);

	if (fd < 0)
		return fd;
	return durable_end(path, fd, write_full(fd, data, len, -1), sync);
}

/* Read until @cap bytes or end of file: read(2) when @off < 0, else pread
 * from @off on. */
static ssize_t read_full(int fd, void *buf, size_t cap, off_t off)
{
	size_t got = 0;

	while (got < cap) {
		ssize_t n = off < 0 ? read(fd, (char *)buf + got, cap - got)
				    : pread(fd, (char *)buf + got, cap - got, off + (off_t)got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (ssize_t)got;
}

ssize_t durable_read_fd(int fd, void *buf, size_t cap)
{
	return read_full(fd, buf, cap, -1);
}

ssize_t durable_pread_fd(int fd, void *buf, size_t cap, off_t off)
{
	return read_full(fd, buf, cap, off);
}

int durable_read(const char *path, size_t max, char **out, size_t *len)
{
	/* O_NONBLOCK: a FIFO in the file's place must not hang the open
	 * (refused below as not a regular file) */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK), r = 0;
	struct stat st;
	ssize_t got = 0;
	char *buf = NULL;

	if (fd < 0)
		return errno == ENOENT ? 1 : -errno;
	if (fstat(fd, &st) < 0)
		r = -errno;
	else if (!S_ISREG(st.st_mode))
		r = -EINVAL;
	else if ((uint64_t)st.st_size > max)
		r = -EFBIG;
	else if (!(buf = malloc((size_t)st.st_size + 1)))
		r = -ENOMEM;
	/* One byte more than the size: a file that grew is seen. */
	if (!r && (got = durable_read_fd(fd, buf, (size_t)st.st_size + 1)) < 0)
		r = (int)got;
	close(fd);
	if (!r && got > st.st_size)
		r = -EFBIG; /* it grew while read */
	if (r) {
		free(buf);
		return r;
	}
	buf[got] = '\0';
	*out = buf;
	*len = (size_t)got;
	return 0;
}
