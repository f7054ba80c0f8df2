/* nasopen.c - see nasopen.h. */
#include "nasopen.h"
#include "path.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/openat2.h>

/* "" or "a/b/c" made of plain names only. */
static int plain_names(const char *p)
{
	if (!*p)
		return 0;
	for (;;) {
		const char *e = strchrnul(p, '/');
		size_t n = (size_t)(e - p);

		if (!n || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
			return -EINVAL;
		if (!*e)
			return 0;
		p = e + 1;
	}
}

/* The walk openat2 would do, one openat(O_NOFOLLOW) per component: every
 * directory on the way is opened O_PATH without following a link, so a
 * link anywhere fails.  @path is relative to @dirfd, or absolute. */
static int walk_open(int dirfd, const char *path, int flags)
{
	int cur = dirfd, fd;

	if (path[0] == '/') {
		cur = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (cur < 0)
			return -errno;
		path++;
	}
	for (;;) {
		const char *e = strchrnul(path, '/');
		char comp[NAME_MAX + 1];
		struct stat st;

		if ((size_t)(e - path) > NAME_MAX) {
			fd = -ENAMETOOLONG;
			break;
		}
		memcpy(comp, path, (size_t)(e - path));
		comp[e - path] = '\0';
		if (!*e) {
			fd = openat(cur, comp, flags);
			fd = fd < 0 ? -errno : fd;
			break;
		}
		fd = openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			fd = -errno;
			/* a link met with O_NOFOLLOW|O_DIRECTORY says ENOTDIR */
			if (fd == -ENOTDIR && fstatat(cur, comp, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
			    S_ISLNK(st.st_mode))
				fd = -ELOOP;
			break;
		}
		if (cur != dirfd)
			close(cur);
		cur = fd;
		path = e + 1;
	}
	if (cur != dirfd)
		close(cur);
	return fd;
}

/* Open @path (relative to @dirfd, or absolute with @dirfd AT_FDCWD) with
 * no link followed, and with @beneath never above @dirfd. */
static int open_nolinks(int dirfd, const char *path, int flags, int beneath)
{
	struct open_how how = {
		.flags = (uint64_t)flags,
		.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
			   (beneath ? RESOLVE_BENEATH : 0),
	};
	int fd;

	/* Asked each time, not remembered: no state outside the daemon's
	 * context, and where the call is missing its refusal costs less than
	 * the walk that follows. */
	fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
	if (fd >= 0)
		return fd;
	if (!OPENAT2_REFUSED(errno))
		return -errno;
	/* Without openat2 the names were checked plain (no ".."), so a walk
	 * that follows no link stays beneath @dirfd too. */
	return walk_open(dirfd, path, flags);
}

/* A regular file: looked at through O_PATH first (opening that has no
 * effect on a FIFO or device), then opened O_NONBLOCK so that a FIFO
 * swapped in meanwhile cannot make the open wait; both must be one inode. */
static int open_regular(int dirfd, const char *path, int flags, int beneath)
{
	struct stat pst, st;
	int pfd, fd, fl;

	pfd = open_nolinks(dirfd, path, O_PATH | O_NOFOLLOW | O_CLOEXEC, beneath);
	if (pfd < 0)
		return pfd;
	if (fstat(pfd, &pst) < 0)
		fd = -errno;
	else if (S_ISLNK(pst.st_mode)) /* O_PATH|O_NOFOLLOW opens the link itself */
		fd = -ELOOP;
	else if (S_ISDIR(pst.st_mode))
		fd = -EISDIR;
	else if (!S_ISREG(pst.st_mode))
		fd = -ENXIO;
	else
		fd = open_nolinks(dirfd, path, flags | O_NONBLOCK, beneath);
	close(pfd);
	if (fd < 0)
		return fd;
	if (fstat(fd, &st) < 0 || st.st_dev != pst.st_dev || st.st_ino != pst.st_ino ||
	    !S_ISREG(st.st_mode)) {
		close(fd);
		return -ESTALE;
	}
	fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
		fl = -errno;
		close(fd);
		return fl;
	}
	return fd;
}

int nas_open(const struct hub_roots *roots, const char *phys_path, int flags)
{
	const char *path = phys_path, *rest = "";
	int dirfd = AT_FDCWD, beneath = 0, fd;

	if (phys_path[0] != '/' || (flags & (O_ACCMODE | O_CREAT | O_TRUNC | O_PATH)) ||
	    plain_names(phys_path + 1) < 0)
		return -EINVAL;
	if (roots) {
		int root = hub_root_of(roots, phys_path, &rest);

		if (root < 0)
			return -EXDEV;
		/* The root itself is canonical (hub_roots_add): no link in it. */
		dirfd = open_nolinks(AT_FDCWD, roots->path[root],
				     O_PATH | O_DIRECTORY | O_CLOEXEC, 0);
		if (dirfd < 0)
			return dirfd;
		path = *rest ? rest : ".";
		beneath = 1;
	}
	flags |= O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY;
	/* With O_DIRECTORY the kernel refuses anything but a directory before
	 * any driver's open runs. */
	if (flags & O_DIRECTORY)
		fd = open_nolinks(dirfd, path, flags, beneath);
	else
		fd = open_regular(dirfd, path, flags, beneath);
	if (dirfd >= 0)
		close(dirfd);
	return fd;
}

DIR *nas_opendir(const struct hub_roots *roots, const char *phys_path)
{
	int fd = nas_open(roots, phys_path, O_RDONLY | O_DIRECTORY);
	DIR *d;

	if (fd < 0) {
		errno = -fd;
		return NULL;
	}
	d = fdopendir(fd);
	if (!d) {
		int err = errno;

		close(fd);
		errno = err;
	}
	return d;
}

int nas_dirent_is_dir(DIR *d, const struct dirent *de)
{
	struct stat st;

	if (de->d_type != DT_UNKNOWN)
		return de->d_type == DT_DIR;
	return fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	       S_ISDIR(st.st_mode);
}
