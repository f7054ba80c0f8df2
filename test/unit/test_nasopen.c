/* test_nasopen.c - nas_open's contract (core/nasopen.h), on a real tree:
 * no link followed in any component, nothing above the root, no FIFO or
 * device opened, the documented code for each refusal.
 *
 *   test_nasopen                      openat2 as the kernel has it
 *   test_nasopen --refused=ENOSYS     under `confine --openat2=ENOSYS`
 *   test_nasopen --refused=EPERM      under `confine --openat2=EPERM`
 *
 * With --refused the test first checks that openat2 really fails with that
 * code (so the walk of nasopen.c is what answers, not openat2), then makes
 * the same checks: both ways must give the same answers.
 */
#include "check.h"
#include "nasopen.h"
#include "resolve.h"

#include <dirent.h>
#include <limits.h>
#include <linux/openat2.h>
#include <sys/syscall.h>

static struct check_count cnt;

struct tree {
	char dir[64];     /* the test's directory */
	char hub[PATH_MAX]; /* its root, canonical */
	struct hub_roots roots;
};

/* hub/a/b/file ("abc"), hub/a/dir/, hub/a/lnkfile -> b/file, hub/lnkdir
 * -> a, hub/a/fifo, outside/secret */
static void make_tree(struct tree *t)
{
	char p[PATH_MAX];

	strcpy(t->dir, "/tmp/wfs-nasopen-XXXXXX");
	check_tmpdir(t->dir);
	check_mk(t->dir, "hub");
	check_mk(t->dir, "hub/a");
	check_mk(t->dir, "hub/a/b");
	check_mk(t->dir, "hub/a/dir");
	check_mk(t->dir, "outside");
	check_put(t->dir, "hub/a/b/file", "abc");
	check_put(t->dir, "outside/secret", "secret");
	check_ln(t->dir, "b/file", "hub/a/lnkfile");
	check_ln(t->dir, "a", "hub/lnkdir");
	check_path(p, sizeof(p), t->dir, "hub/a/fifo");
	if (mkfifo(p, 0644) < 0) {
		perror(p);
		exit(2);
	}
	check_path(p, sizeof(p), t->dir, "hub");
	if (!realpath(p, t->hub))
		exit(2);
	memset(&t->roots, 0, sizeof(t->roots));
	if (hub_roots_add(&t->roots, t->hub) < 0)
		exit(2);
}

/* nas_open(@roots, hub/@rel, @flags): the descriptor, or -errno */
static int open_in(const struct tree *t, int with_roots, const char *rel, int flags)
{
	char p[PATH_MAX + 64];

	snprintf(p, sizeof(p), "%s%s%s", t->hub, *rel ? "/" : "", rel);
	return nas_open(with_roots ? &t->roots : NULL, p, flags);
}

/* A refusal: @want from nas_open of hub/@rel, with the roots and without. */
static void check_refused(const struct tree *t, const char *rel, int flags, int want)
{
	for (int with_roots = 1; with_roots >= 0; with_roots--) {
		int fd = open_in(t, with_roots, rel, flags);

		CHECK(&cnt, fd == want, "%s (flags %#x, %s): %s, want %s", rel, flags,
		      with_roots ? "roots" : "no roots", fd < 0 ? strerror(-fd) : "opened",
		      strerror(-want));
		if (fd >= 0)
			close(fd);
	}
}

/* The file opened, read right, blocking and close-on-exec. */
static void check_file(const struct tree *t, int with_roots)
{
	char buf[8] = { 0 };
	int fd = open_in(t, with_roots, "a/b/file", 0);

	CHECK(&cnt, fd >= 0, "a/b/file: %s", strerror(-fd));
	if (fd < 0)
		return;
	CHECK(&cnt, read(fd, buf, sizeof(buf)) == 3 && !strcmp(buf, "abc"), "a/b/file's bytes");
	CHECK(&cnt, !(fcntl(fd, F_GETFL) & O_NONBLOCK), "O_NONBLOCK left on");
	CHECK(&cnt, fcntl(fd, F_GETFD) & FD_CLOEXEC, "no FD_CLOEXEC");
	CHECK(&cnt, write(fd, "x", 1) < 0 && errno == EBADF, "opened for writing");
	close(fd);
}

static void check_dirs(const struct tree *t)
{
	struct dirent *e;
	struct stat st;
	int fd, seen = 0;
	DIR *d;

	fd = open_in(t, 1, "a/dir", O_DIRECTORY);
	CHECK(&cnt, fd >= 0 && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode), "a/dir: %s",
	      strerror(-fd));
	if (fd >= 0)
		close(fd);
	fd = open_in(t, 1, "", O_DIRECTORY); /* the root itself */
	CHECK(&cnt, fd >= 0, "the root: %s", strerror(-fd));
	if (fd >= 0)
		close(fd);
	d = nas_opendir(&t->roots, t->hub);
	CHECK(&cnt, d != NULL, "nas_opendir: %s", strerror(errno));
	while (d && (e = readdir(d)))
		seen += !strcmp(e->d_name, "a") || !strcmp(e->d_name, "lnkdir");
	CHECK(&cnt, seen == 2, "the root's listing: %d of a, lnkdir", seen);
	if (d)
		closedir(d);
	errno = 0;
	CHECK(&cnt, !nas_opendir(&t->roots, "/nowhere/at/all") && errno == EXDEV,
	      "nas_opendir outside the roots: %s", strerror(errno));
}

static void check_all(const struct tree *t)
{
	char p[PATH_MAX + 64], longname[NAME_MAX + 2];
	double t0;
	int fd;

	check_file(t, 1);
	check_file(t, 0);
	check_dirs(t);
	/* links: the last component, a directory on the way, a directory wanted */
	check_refused(t, "a/lnkfile", 0, -ELOOP);
	check_refused(t, "lnkdir/b/file", 0, -ELOOP);
	check_refused(t, "lnkdir/dir", O_DIRECTORY, -ELOOP);
	check_refused(t, "lnkdir", O_DIRECTORY, -ENOTDIR);
	/* kinds */
	check_refused(t, "a/dir", 0, -EISDIR);
	check_refused(t, "a/b/file", O_DIRECTORY, -ENOTDIR);
	check_refused(t, "a/b/file/x", 0, -ENOTDIR);
	check_refused(t, "a/missing", 0, -ENOENT);
	t0 = check_now_s();
	check_refused(t, "a/fifo", 0, -ENXIO);
	CHECK(&cnt, check_now_s() - t0 < 5, "a FIFO's open waited %.1f s", check_now_s() - t0);
	fd = nas_open(NULL, "/dev/null", 0);
	CHECK(&cnt, fd == -ENXIO, "/dev/null: %s", fd < 0 ? strerror(-fd) : "opened");
	/* spellings */
	check_refused(t, "a/../a/b/file", 0, -EINVAL);
	check_refused(t, "a//b/file", 0, -EINVAL);
	check_refused(t, "a/./b/file", 0, -EINVAL);
	check_refused(t, "a/b/file", O_WRONLY, -EINVAL);
	check_refused(t, "a/b/file", O_CREAT, -EINVAL);
	fd = nas_open(&t->roots, "a/b/file", 0);
	CHECK(&cnt, fd == -EINVAL, "a relative path: %s", fd < 0 ? strerror(-fd) : "opened");
	memset(longname, 'n', NAME_MAX + 1);
	longname[NAME_MAX + 1] = '\0';
	snprintf(p, sizeof(p), "a/%s/file", longname);
	check_refused(t, p, 0, -ENAMETOOLONG);
	/* the root's bounds: outside it, and ".." that would climb out */
	snprintf(p, sizeof(p), "%s/outside/secret", t->dir);
	fd = nas_open(&t->roots, p, 0);
	CHECK(&cnt, fd == -EXDEV, "outside the roots: %s", fd < 0 ? strerror(-fd) : "opened");
	snprintf(p, sizeof(p), "%s/../outside/secret", t->hub);
	fd = nas_open(&t->roots, p, 0);
	CHECK(&cnt, fd == -EINVAL, "\"..\" out of the root: %s", fd < 0 ? strerror(-fd) : "opened");
}

/* Under `confine --openat2=ERRNO`: openat2 itself must fail with @want,
 * else this run would test openat2 again and not the walk. */
static int openat2_refused_with(int want)
{
	struct open_how how = { .flags = O_RDONLY | O_CLOEXEC, .resolve = RESOLVE_NO_SYMLINKS };
	long fd = syscall(SYS_openat2, AT_FDCWD, "/", &how, sizeof(how));

	if (fd >= 0)
		close((int)fd);
	CHECK(&cnt, fd < 0 && errno == want, "openat2 under the filter: %s, want %s",
	      fd < 0 ? strerror(errno) : "opened", strerror(want));
	return fd < 0 && errno == want;
}

int main(int argc, char **argv)
{
	struct tree t;

	alarm(60);
	if (argc > 1) {
		int want = !strcmp(argv[1], "--refused=ENOSYS") ? ENOSYS
			   : !strcmp(argv[1], "--refused=EPERM") ? EPERM : 0;

		if (!want) {
			fprintf(stderr, "usage: test_nasopen [--refused=ENOSYS|--refused=EPERM]\n");
			return 2;
		}
		if (!openat2_refused_with(want)) {
			printf("%d passed, %d failed\n", cnt.passed, cnt.failed);
			return 1;
		}
	}
	make_tree(&t);
	check_all(&t);
	check_rmtree(t.dir);
	printf("%d passed, %d failed\n", cnt.passed, cnt.failed);
	return cnt.failed ? 1 : 0;
}
