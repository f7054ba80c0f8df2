/* check.h - the smallest test harness: CHECK() counts, main() reports. */
#ifndef WFS_CHECK_H
#define WFS_CHECK_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

struct check_count {
	int passed, failed;
};

#define CHECK(cnt, cond, ...)                                                  \
	do {                                                                   \
		if (cond) {                                                    \
			(cnt)->passed++;                                       \
		} else {                                                       \
			(cnt)->failed++;                                       \
			fprintf(stderr, "%s:%d: FAIL %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                          \
			fputc('\n', stderr);                                   \
		}                                                              \
	} while (0)

/* Make the test's private directory from the template @tmpl (".../X"s),
 * in place: a test that cannot ends the program (exit 2). */
static inline void check_tmpdir(char *tmpl)
{
	if (!mkdtemp(tmpl)) {
		perror(tmpl);
		exit(2);
	}
}

/* Remove the test's directory and all in it; a failure is said, not
 * counted (the results stand). */
static inline void check_rmtree(const char *dir)
{
	char cmd[4200];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
}

/* Write @n bytes of @buf to @path (created or truncated): a fixture the
 * test cannot do without, so a failure ends the test program (exit 2). */
static inline void check_write_file(const char *path, const void *buf, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	if (fd < 0 || (n && write(fd, buf, n) != (ssize_t)n) || close(fd) < 0) {
		perror(path);
		exit(2);
	}
}

/* A fixture tree under @root, by relative paths (fixtures too: a failure
 * ends the program, exit 2). */
static inline void check_path(char *out, size_t sz, const char *root, const char *rel)
{
	if (snprintf(out, sz, "%s/%s", root, rel) >= (int)sz) {
		fprintf(stderr, "fixture path too long: %s/%s\n", root, rel);
		exit(2);
	}
}

static inline void check_mk(const char *root, const char *rel)
{
	char p[8192];

	check_path(p, sizeof(p), root, rel);
	if (mkdir(p, 0755) < 0 && errno != EEXIST) {
		perror(p);
		exit(2);
	}
}

static inline void check_put(const char *root, const char *rel, const char *content)
{
	char p[8192];

	check_path(p, sizeof(p), root, rel);
	check_write_file(p, content, strlen(content));
}

static inline void check_ln(const char *root, const char *target, const char *rel)
{
	char p[8192];

	check_path(p, sizeof(p), root, rel);
	if (symlink(target, p) < 0) {
		perror(p);
		exit(2);
	}
}

/* @n bytes (malloc'ed: the caller frees them) of a xorshift sequence @seed
 * picks: no two pages alike. */
static inline unsigned char *check_pattern(size_t n, uint64_t seed)
{
	unsigned char *b = malloc(n ? n : 1);
	uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;

	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		b[i] = (unsigned char)x;
	}
	return b;
}

/* The monotonic clock, in seconds. */
static inline double check_now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* @n bytes of a pattern @seed picks (no two seeds alike, no page alike)
 * into @buf. */
static inline void check_pattern_fill(char *buf, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		buf[i] = (char)(seed * 131 + i * 7 + i / 4093);
}

/* @n bytes of @seed's pattern at @root/@rel: blobs of a size without
 * keeping them in the test. */
static inline void check_put_pattern(const char *root, const char *rel, size_t n,
				     unsigned seed)
{
	char p[8192], *buf = malloc(n ? n : 1);

	if (!buf)
		exit(2);
	check_pattern_fill(buf, n, seed);
	check_path(p, sizeof(p), root, rel);
	check_write_file(p, buf, n);
	free(buf);
}

/* Does the file @path hold @n bytes of @seed's pattern, and no more? */
static inline int check_holds_pattern(const char *path, size_t n, unsigned seed)
{
	char *got = malloc(n + 1), *want = malloc(n ? n : 1);
	FILE *f = fopen(path, "rb");
	int same = got && want && f && fread(got, 1, n + 1, f) == n;

	if (same) {
		check_pattern_fill(want, n, seed);
		same = !memcmp(got, want, n);
	}
	if (f)
		fclose(f);
	free(got);
	free(want);
	return same;
}

/* mkdir -p @root/@rel. */
static inline void check_mkdirs(const char *root, const char *rel)
{
	char cmd[8300];

	snprintf(cmd, sizeof(cmd), "mkdir -p '%s/%s'", root, rel);
	if (system(cmd) != 0)
		exit(2);
}

/* Regular files under @dir (-1: cannot tell). */
static inline int check_count_files(const char *dir)
{
	char cmd[8300];
	FILE *f;
	int n = -1;

	snprintf(cmd, sizeof(cmd), "find '%s' -type f | wc -l", dir);
	f = popen(cmd, "r");
	if (f && fscanf(f, "%d", &n) != 1)
		n = -1;
	if (f)
		pclose(f);
	return n;
}

#endif
