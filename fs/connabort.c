/* connabort.c - see connabort.h. */
#include "connabort.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

/* A path field of /proc/self/mountinfo as the path it is: the kernel
 * writes space, tab, newline and backslash as octal escapes (\040). */
static char *mountinfo_unescape(char *s)
{
	char *out = s;

	for (const char *p = s; *p; out++) {
		if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] >= '0' && p[2] <= '7' &&
		    p[3] >= '0' && p[3] <= '7') {
			*out = (char)((p[1] - '0') << 6 | (p[2] - '0') << 3 | (p[3] - '0'));
			p += 4;
		} else {
			*out = *p++;
		}
	}
	*out = '\0';
	return s;
}

/* The newest mount on @mnt: its device, and whether it is a FUSE one.
 * Returns 0 or -ENOENT (nothing mounted there) or -errno. */
static int newest_mount(const char *mnt, struct conn_id *c, int *fuse)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char *line = NULL, *point = NULL;
	size_t cap = 0;
	int r = -ENOENT;

	if (!f)
		return -errno;
	while (getline(&line, &cap, f) > 0) {
		unsigned m1, m2;
		const char *sep;

		free(point);
		point = NULL;
		/* the last match is the newest mount on that path */
		if (sscanf(line, "%*d %*d %u:%u %*s %ms", &m1, &m2, &point) == 3 &&
		    !strcmp(mountinfo_unescape(point), mnt)) {
			sep = strstr(line, " - ");
			*fuse = sep && (!strncmp(sep + 3, "fuse ", 5) || !strncmp(sep + 3, "fuse.", 5));
			c->major = m1;
			c->minor = m2;
			r = 0;
		}
	}
	free(point);
	free(line);
	fclose(f);
	return r;
}

int conn_find(const char *mnt, struct conn_id *c)
{
	int fuse = 0, r = newest_mount(mnt, c, &fuse);

	c->known = r == 0 && fuse;
	return r < 0 ? r : fuse ? 0 : -ENOENT;
}

/* Is @mnt's newest mount the connection @c: 1 yes, 0 another mount, or
 * -ENOENT (nothing mounted there) or -errno. */
static int newest_is(const struct conn_id *c, const char *mnt)
{
	struct conn_id now;
	int fuse = 0, r = newest_mount(mnt, &now, &fuse);

	if (r < 0)
		return r;
	return fuse && now.major == c->major && now.minor == c->minor;
}

int conn_gone_from(const struct conn_id *c, const char *mnt)
{
	int r = c->known ? newest_is(c, mnt) : 1;

	return r == 0 || r == -ENOENT;
}

/* The connection is ended: the device polls POLLERR. */
static int ended(int devfd)
{
	struct pollfd p = { .fd = devfd };

	return poll(&p, 1, 0) == 1 && (p.revents & POLLERR);
}

static int fusectl_abort(const struct conn_id *c)
{
	char path[96];
	int fd, r = 0;

	/* fusectl names a connection by the kernel's dev_t: MKDEV(major, minor) */
	snprintf(path, sizeof(path), "/sys/fs/fuse/connections/%u/abort",
		 c->major << 20 | c->minor);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (write(fd, "1", 1) != 1)
		r = -errno;
	close(fd);
	return r;
}

int conn_abort(const struct conn_id *c, const char *mnt, int devfd, char *how, size_t howsz)
{
	int r, ctl;

	if (!c->known) {
		snprintf(how, howsz, "its device was not found in /proc/self/mountinfo at mount");
		return -ENOENT;
	}
	ctl = fusectl_abort(c);
	if (ctl == 0 && ended(devfd)) {
		snprintf(how, howsz, "fusectl abort of connection %u", c->major << 20 | c->minor);
		return 0;
	}
	r = newest_is(c, mnt);
	if (r != 1) {
		snprintf(how, howsz, "fusectl: %s; no forced umount: %s", strerror(ctl ? -ctl : EIO),
			 r < 0 ? "not mounted any more" : "another mount is on top of it");
		return ended(devfd) ? 0 : -ESTALE;
	}
	r = umount2(mnt, MNT_FORCE) < 0 ? -errno : 0;
	if (ended(devfd)) {
		snprintf(how, howsz, "forced umount%s", r == 0 ? "" : " (the mount is busy: "
			 "left to the lazy unmount)");
		return r == 0;
	}
	snprintf(how, howsz, "fusectl: %s; forced umount: %s", strerror(ctl ? -ctl : EIO),
		 strerror(r ? -r : EIO));
	return r ? r : -EIO;
}
