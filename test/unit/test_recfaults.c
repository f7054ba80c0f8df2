/* test_recfaults.c - the store's record when its file or its NAS fails
 * it, without mounting: a damaged record.json is set aside and a newer one
 * left alone (also over the size cap), hostile entries are refused, one
 * that cannot be read is left in place; a refs file rewritten as the
 * build reads it keeps its bytes with their own file's attributes, and a
 * NAS unmounted under a build leaves the last one kept. */
#include "check_record.h"
#include "collect.h"
#include "record.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

/* --wrap=durable_read: with read_fails set, the next read of a file
 * whole (record.json's load) fails with that errno, once. */
static _Atomic int read_fails;
int __real_durable_read(const char *path, size_t max, char **out, size_t *len);
int __wrap_durable_read(const char *path, size_t max, char **out, size_t *len);

int __wrap_durable_read(const char *path, size_t max, char **out, size_t *len)
{
	int e = atomic_exchange(&read_fails, 0);

	return e ? -e : __real_durable_read(path, max, out, len);
}

static void write_record(const char *dir, const char *text)
{
	char p[PATH_MAX * 2];

	snprintf(p, sizeof(p), "%s/" RECORD_FILE, dir);
	check_write_file(p, text, strlen(text));
}

static int exists(const char *dir, const char *name)
{
	char p[PATH_MAX * 2];

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return access(p, F_OK) == 0;
}

/* A record over the size cap (sparse): a later wfs's (whose cap may be
 * larger) is left as it is, any other set aside. */
static void over_cap(struct check_count *c, struct logs *lg)
{
	static const char *const heads[] = { "{\"built\":1,\"nas\":\"/n\",\"version\":98,"
					     "\"entries\":[\n",
					     "{\"built\":1,\"nas\":\"/n\",\"version\":1,"
					     "\"entries\":[\n" };
	char dir[PATH_MAX * 2], p[PATH_MAX * 2];
	struct record r;
	struct stat st;

	for (int i = 0; i < 2; i++) {
		snprintf(dir, sizeof(dir), "%s/overcap%d", top, i);
		mkdir(dir, 0700);
		write_record(dir, heads[i]);
		snprintf(p, sizeof(p), "%s/" RECORD_FILE, dir);
		CHECK(c, truncate(p, RECORD_MAX_BYTES + 1) == 0, "over the cap: %s", strerror(errno));
		CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && !record_has_any(&r),
		      "over the cap, version %s: opens empty", i ? "1" : "98");
		if (!i)
			CHECK(c, logged(lg, "is of version 98, newer than this wfs") &&
			      stat(p, &st) == 0 && st.st_size == RECORD_MAX_BYTES + 1 &&
			      !exists(dir, RECORD_FILE ".damaged"),
			      "over the cap, a later version: left as it is");
		else
			CHECK(c, !exists(dir, RECORD_FILE) && exists(dir, RECORD_FILE ".damaged"),
			      "over the cap, this version: set aside");
		record_close(&r);
	}
}

/* A damaged file, a newer version, a read-only store, hostile entries. */
static void damage(struct check_count *c, struct logs *lg, struct store *s,
		   const struct hub_roots *roots)
{
	char dir[PATH_MAX * 2], *before, *after;
	struct record r;

	snprintf(dir, sizeof(dir), "%s/damaged", top);
	mkdir(dir, 0700);
	write_record(dir, "{\"version\": 1, \"entries\": [");
	CHECK(c, record_open(&r, dir, 1, log_line, lg) == 0 && !record_has_any(&r) &&
	      exists(dir, RECORD_FILE) && !exists(dir, RECORD_FILE ".damaged"),
	      "read-only: damaged file left in place");
	record_close(&r);
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && !record_has_any(&r) &&
	      !exists(dir, RECORD_FILE) && exists(dir, RECORD_FILE ".damaged") &&
	      logged(lg, "moved aside"), "damaged: set aside and logged");
	record_close(&r);

	snprintf(dir, sizeof(dir), "%s/newer", top);
	mkdir(dir, 0700);
	write_record(dir, "{\"version\": 99, \"entries\": [{\"path\": \"\", \"kind\": \"dir\", "
		     "\"mode\": 16877, \"size\": 0, \"ino\": 1}]}");
	before = slurp(dir);
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && !record_has_any(&r) &&
	      !exists(dir, RECORD_FILE ".damaged") && logged(lg, "version 99"),
	      "a newer version is not read");
	CHECK(c, record_rebuild(&r, roots, s) == 0 && record_has_any(&r), "newer: builds in memory");
	after = slurp(dir);
	CHECK(c, !strcmp(before, after), "a newer version is never replaced");
	free(before);
	free(after);
	record_close(&r);

	/* Names a hostile file must not make the mount show. */
	snprintf(dir, sizeof(dir), "%s/hostile", top);
	mkdir(dir, 0700);
#define D(p) "{\"path\": \"" p "\", \"kind\": \"dir\", \"mode\": 16877, \"size\": 0, \"ino\": 2}"
#define F(p) "{\"path\": \"" p "\", \"kind\": \"file\", \"mode\": 33206, \"size\": 3, " \
	     "\"ino\": 3, \"backing\": \"/x\", \"data\": \"abc\"}"
	write_record(dir, "{\"version\": 2, \"nas\": \"/n\", \"entries\": [" D("") ", "
		     D("models--a--b") ", " F("models--a--b/f") ", " D("..") ", " D("../up") ", "
		     D("/abs") ", " D("models--a--b//c") ", " D("models--a--b/./d") ", "
		     D("models--a--b/e/..") ", " F("models--a--b/orphan/x") ", " D("models--a--b") ", "
		     "{\"path\": \"models--a--b/g\", \"kind\": \"file\", \"mode\": 16877, "
		     "\"size\": 0, \"ino\": 4, \"backing\": \"/x\"}, "
		     "{\"path\": \"models--a--b/h\", \"kind\": \"file\", \"mode\": 33188, "
		     "\"size\": 0, \"ino\": 5}, "
		     "{\"path_hex\": \"6d6f64656c732d2d612d2d622fff\", \"kind\": \"link\", "
		     "\"link_state\": \"resolved\", \"mode\": 41471, \"size\": 1, \"ino\": 6, "
		     "\"target\": \"f\"}]}");
	/* (the good names with them are not trusted either: a listing short
	 * of what the file lost would look whole while the NAS is down) */
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0, "hostile: opens");
	CHECK(c, !record_has_any(&r) && look(&r, "models--a--b/f") == -ENOENT &&
	      look(&r, "..") == -ENOENT && exists(dir, RECORD_FILE ".damaged") &&
	      !exists(dir, RECORD_FILE) && logged(lg, "damaged entries"),
	      "hostile: set aside whole, nothing served from it: %s", list(&r, ""));
	record_close(&r);
	/* one damaged entry among good ones is enough */
	snprintf(dir, sizeof(dir), "%s/onebad", top);
	mkdir(dir, 0700);
	write_record(dir, "{\"version\": 2, \"nas\": \"/n\", \"entries\": [" D("") ", "
		     D("models--a--b") ", " F("models--a--b/f") ", " F("models--a--b/orphan/x")
		     "]}");
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && !record_has_any(&r) &&
	      exists(dir, RECORD_FILE ".damaged"), "one entry with no recorded parent: the "
	      "record set aside whole: %s", list(&r, ""));
	record_close(&r);
	/* a NAS file id with its top bit set, as record_write writes it (the
	 * int64 of its bits): read back as written (it set the record aside) */
	snprintf(dir, sizeof(dir), "%s/bigino", top);
	mkdir(dir, 0700);
	write_record(dir, "{\"version\": 2, \"nas\": \"/n\", \"entries\": [" D("") ", "
		     D("models--a--b") ", {\"path\": \"models--a--b/f\", \"kind\": \"file\", "
		     "\"mode\": 33188, \"size\": 3, \"ino\": -9223372036854775803, "
		     "\"dev\": -2, \"backing\": \"/x\", \"data\": \"abc\"}]}");
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && look(&r, "models--a--b/f") == 0 &&
	      (uint64_t)ent.e.st.st_ino == (1ULL << 63 | 5) &&
	      (uint64_t)ent.e.st.st_dev == (uint64_t)-2 && !exists(dir, RECORD_FILE ".damaged"),
	      "an inode number with the top bit set: loaded (%s)", list(&r, "models--a--b"));
	record_close(&r);
	/* a record that cannot be read (EIO) says nothing
	 * of what it holds: left in place, not set aside */
	snprintf(dir, sizeof(dir), "%s/unreadable", top);
	mkdir(dir, 0700);
	write_record(dir, "{\"version\": 2, \"nas\": \"/n\", \"entries\": [" D("") "]}");
	atomic_store(&read_fails, EIO);
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && !record_has_any(&r) &&
	      exists(dir, RECORD_FILE) && !exists(dir, RECORD_FILE ".damaged") &&
	      logged(lg, "cannot be read"), "a read error: left in place, said");
	record_close(&r);
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && record_has_any(&r),
	      "read at the next open");
	record_close(&r);
	/* the write bits of a good record's entry are never shown */
	snprintf(dir, sizeof(dir), "%s/modes", top);
	mkdir(dir, 0700);
	write_record(dir, "{\"version\": 2, \"nas\": \"/n\", \"entries\": [" D("") ", "
		     D("models--a--b") ", " F("models--a--b/f") "]}");
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && look(&r, "models--a--b/f") == 0 &&
	      !(ent.e.st.st_mode & 0222) && ent.has_data && ent.data_len == 3,
	      "write bits never shown");
	record_close(&r);
}

/* --wrap=durable_read_fd: when armed, the refs file rewrite_path names is
 * rewritten in place (truncated and written, as huggingface_hub does,
 * with a new mtime) just as the record's build reads it: the read gets
 * the new file's bytes from a descriptor whose attributes the walk took
 * before. */
ssize_t __real_durable_read_fd(int fd, void *buf, size_t cap);
ssize_t __wrap_durable_read_fd(int fd, void *buf, size_t cap);
static char rewrite_path[PATH_MAX * 2];
static _Atomic int rewrite_armed;

/* With vanish_armed, the first read of a marker or a file list (after the
 * walk: the build's last steps read them) takes the NAS away too, as an
 * unmount would: its directory moved aside and an empty one, the mount
 * point, in its place (what is open stays readable). */
static _Atomic int vanish_armed;

static void nas_swap(const char *from, const char *to)
{
	char a[PATH_MAX * 2], b[PATH_MAX * 2];

	snprintf(a, sizeof(a), "%s%s", nas, from);
	snprintf(b, sizeof(b), "%s%s", nas, to);
	if (rename(a, b) < 0)
		exit(2);
}

ssize_t __wrap_durable_read_fd(int fd, void *buf, size_t cap)
{
	char link[64], at[PATH_MAX];
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	if (atomic_load(&vanish_armed) && (n = readlink(link, at, sizeof(at) - 1)) > 0 &&
	    (at[n] = '\0', strstr(at, "/.no_exist/") || strstr(at, "/trees/")) &&
	    atomic_exchange(&vanish_armed, 0)) {
		nas_swap("", ".away");
		if (mkdir(nas, 0755) < 0)
			exit(2);
	}

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	if (atomic_load(&rewrite_armed) && (n = readlink(link, at, sizeof(at) - 1)) > 0 &&
	    (at[n] = '\0', !strcmp(at, rewrite_path)) && atomic_exchange(&rewrite_armed, 0)) {
		struct timespec t[2] = { { 0, UTIME_OMIT }, { 1800000000, 0 } };
		int w = open(rewrite_path, O_WRONLY | O_TRUNC);

		if (w < 0 || write(w, REV, strlen(REV)) != (ssize_t)strlen(REV) ||
		    futimens(w, t) < 0)
			exit(2);
		close(w);
	}
	return __real_durable_read_fd(fd, buf, cap);
}

/* A refs file rewritten in place as the build reads it: its bytes are kept
 * with the attributes of the file they came from (they were kept with the
 * walk's, the old mtime beside the new bytes: a reader that opened the old
 * file would be served them as its own). */
static void ref_rewritten(struct check_count *c, struct logs *lg, struct store *s,
			  const struct hub_roots *roots)
{
	char dir[PATH_MAX * 2];
	struct record r;
	struct stat st;

	snprintf(dir, sizeof(dir), "%s/rewritten", top);
	mkdir(dir, 0700);
	check_path(rewrite_path, sizeof(rewrite_path), nas, REPO "/refs/main");
	atomic_store(&rewrite_armed, 1);
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 &&
	      record_rebuild(&r, roots, s) == 0 && !atomic_load(&rewrite_armed), "built, the ref "
	      "rewritten as it was read");
	CHECK(c, stat(rewrite_path, &st) == 0 && bytes_are(&r, REPO "/refs/main", REV) &&
	      ent.e.st.st_mtim.tv_sec == st.st_mtim.tv_sec &&
	      ent.e.st.st_mtim.tv_nsec == st.st_mtim.tv_nsec, "its bytes with the mtime of the "
	      "file they came from: %lld, the file's %lld", (long long)ent.e.st.st_mtim.tv_sec,
	      (long long)st.st_mtim.tv_sec);
	/* one empty at every read is no rewrite under way: kept as it is,
	 * not a build that fails for ever */
	check_put(nas, REPO "/refs/main", "");
	CHECK(c, record_rebuild(&r, roots, s) == 0 && bytes_are(&r, REPO "/refs/main", ""),
	      "an empty refs file: built, kept empty");
	check_put(nas, REPO "/refs/main", REV);
	record_close(&r);
}

/* The NAS unmounted in the middle of a build (after the walk, as its
 * markers and file lists are read): the build fails and the record keeps
 * its last one, markers and all.  (Those read after it were taken for
 * deleted and the record published without them: with the NAS down, a
 * loader would take a file the marker says is absent at that revision for
 * one to download.) */
static void nas_vanishes(struct check_count *c, struct logs *lg, struct store *s,
			 const struct hub_roots *roots)
{
	char dir[PATH_MAX * 2];
	struct record r;
	int e;

	snprintf(dir, sizeof(dir), "%s/vanish", top);
	mkdir(dir, 0700);
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && record_rebuild(&r, roots, s) == 0 &&
	      bytes_are(&r, REPO "/refs/main", REV) &&
	      look(&r, REPO "/.no_exist/" REV "/missing.txt") == 0, "built whole");
	atomic_store(&vanish_armed, 1);
	e = record_rebuild(&r, roots, s);
	CHECK(c, !atomic_load(&vanish_armed) && e == -ENOMEDIUM, "built with the NAS unmounted "
	      "under it: %s", strerror(-e));
	CHECK(c, bytes_are(&r, REPO "/refs/main", REV) &&
	      look(&r, REPO "/.no_exist/" REV "/missing.txt") == 0 &&
	      look(&r, REPO "/.no_exist/" REV "/sub/missing.json") == 0 &&
	      bytes_are(&r, REPO "/trees/" REV ".json", tree_text) &&
	      look(&r, SNAP "/sub/dir/file") == 0, "the last build kept (%s)", list(&r, REPO));
	CHECK(c, logged(lg, "record: reading refs and markers of"), "the failure logged");
	record_close(&r);
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 &&
	      bytes_are(&r, REPO "/refs/main", REV) &&
	      look(&r, REPO "/.no_exist/" REV "/missing.txt") == 0, "and on disk");
	record_close(&r);
	if (rmdir(nas) < 0)
		exit(2);
	nas_swap(".away", "");
}

/* A record an older wfs wrote (version 1) showed a file whose way crosses
 * a directory some reader may not search as the file itself: such files
 * (bytes not NAS_HUB/<path>) are left out until the next build, the rest
 * served. */
static void version_1(struct check_count *c, struct logs *lg)
{
	char dir[PATH_MAX * 2], p[PATH_MAX * 3];
	struct record r;
	struct stat st;

	snprintf(dir, sizeof(dir), "%s/version1", top);
	mkdir(dir, 0700);
	write_record(dir, "{\"version\": 1, \"nas\": \"/n\", \"entries\": ["
		     "{\"path\": \"\", \"kind\": \"dir\", \"mode\": 16877, \"size\": 0, \"ino\": 2}, "
		     "{\"path\": \"models--a--b\", \"kind\": \"dir\", \"mode\": 16877, "
		     "\"size\": 0, \"ino\": 3}, "
		     "{\"path\": \"models--a--b/own\", \"kind\": \"file\", \"mode\": 33188, "
		     "\"size\": 3, \"ino\": 4, \"backing\": \"/n/models--a--b/own\"}, "
		     "{\"path\": \"models--a--b/linked\", \"kind\": \"file\", \"mode\": 33188, "
		     "\"size\": 3, \"ino\": 5, \"backing\": \"/n/.store/x\"}]}");
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && look(&r, "models--a--b/own") == 0 &&
	      look(&r, "models--a--b/linked") == -ENOENT && !exists(dir, RECORD_FILE ".damaged"),
	      "version 1: its own files served, those shown through a link left out (%s)",
	      list(&r, "models--a--b"));
	CHECK(c, logged(lg, "is of version 1 (an older wfs's): 1 file it"), "version 1: said");
	record_close(&r);
	snprintf(p, sizeof(p), "%s/" RECORD_FILE, dir);
	CHECK(c, stat(p, &st) == 0, "version 1: the file left for the next build to replace");
}

int main(void)
{
	struct check_count c = {0};
	struct store_opts opt = { .workers = 2 };
	struct logs lg = { .lock = PTHREAD_MUTEX_INITIALIZER };
	struct hub_roots roots = {0};
	char local[PATH_MAX * 2];
	struct store s;

	if (record_fixture("recfaults", &roots, local, sizeof(local)) < 0)
		return 2;
	/* the local revision's blobs local: a fixture the test cannot do
	 * without (exit 2) */
	if (store_open(&s, local, &opt, NULL) < 0 || store_start(&s) < 0 ||
	    !promote(&s, REPO "/blobs/" H256, H256) || !promote(&s, REPO "/blobs/" H1, H1)) {
		fprintf(stderr, "the store: %s and %s not made local\n", H256, H1);
		return 2;
	}
	damage(&c, &lg, &s, &roots);
	over_cap(&c, &lg);
	version_1(&c, &lg);
	ref_rewritten(&c, &lg, &s, &roots);
	nas_vanishes(&c, &lg, &s, &roots);
	store_close(&s);
	check_rmtree(top);
	printf("recfaults: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
