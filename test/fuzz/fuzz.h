/* fuzz.h - what the libFuzzer targets in test/fuzz/ share: a private
 * temporary directory per process, files written in one call, trees
 * removed without following links, and a trap that says why.
 *
 * Each target is one .c file defining LLVMFuzzerTestOneInput (and most
 * LLVMFuzzerInitialize); test/fuzz/run builds them with clang
 * -fsanitize=fuzzer,address,undefined against core/ (and fs/opts.c).
 */
#ifndef WFS_FUZZ_H
#define WFS_FUZZ_H

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A violated invariant: say which (stderr, shown when the crash input is
 * replayed) and stop with a crash libFuzzer records. */
#define FUZZ_ASSERT(cond, ...)                                                  \
	do {                                                                    \
		if (!(cond)) {                                                  \
			fprintf(stderr, "fuzz invariant violated at %s:%d: ",   \
				__FILE__, __LINE__);                            \
			fprintf(stderr, __VA_ARGS__);                           \
			fprintf(stderr, "\n");                                  \
			__builtin_trap();                                       \
		}                                                               \
	} while (0)

/* Setting up the fixture failed: not a finding, the run cannot go on. */
#define FUZZ_SETUP(cond, what)                                                  \
	do {                                                                    \
		if (!(cond)) {                                                  \
			perror("fuzz setup: " what);                            \
			exit(2);                                                \
		}                                                               \
	} while (0)

static char fuzz_base[PATH_MAX]; /* this process's directory, canonical */

static inline int fuzz_rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	if (flag == FTW_DP)
		return rmdir(p) < 0 && errno != ENOENT ? -1 : 0;
	return unlink(p) < 0 && errno != ENOENT ? -1 : 0;
}

/* Remove @dir and everything under it; links are removed, not followed. */
static inline void fuzz_rm_tree(const char *dir)
{
	nftw(dir, fuzz_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static inline void fuzz_cleanup(void)
{
	if (fuzz_base[0])
		fuzz_rm_tree(fuzz_base);
}

/* $TMPDIR (else /tmp)/wfs-fuzz-@name-XXXXXX, removed at exit. */
static inline const char *fuzz_make_base(const char *name)
{
	const char *tmp = getenv("TMPDIR");
	char templ[PATH_MAX];
	char *real;

	snprintf(templ, sizeof(templ), "%s/wfs-fuzz-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", name);
	FUZZ_SETUP(mkdtemp(templ), "mkdtemp");
	real = realpath(templ, NULL);
	FUZZ_SETUP(real, "realpath");
	snprintf(fuzz_base, sizeof(fuzz_base), "%s", real);
	free(real);
	atexit(fuzz_cleanup);
	return fuzz_base;
}

/* Write @n bytes to @path (created or truncated). */
static inline void fuzz_write(const char *path, const void *buf, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	FUZZ_SETUP(fd >= 0, "open for writing");
	FUZZ_SETUP(n == 0 || write(fd, buf, n) == (ssize_t)n, "write");
	close(fd);
}

/* mkdir -p of @path (made of plain directories). */
static inline void fuzz_mkdirs(const char *path)
{
	char p[PATH_MAX];

	snprintf(p, sizeof(p), "%s", path);
	for (char *s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = '\0';
		FUZZ_SETUP(mkdir(p, 0755) == 0 || errno == EEXIST, "mkdir");
		*s = '/';
	}
	FUZZ_SETUP(mkdir(p, 0755) == 0 || errno == EEXIST, "mkdir");
}

#endif
