/* test_part_crash.c - a kill -9 while a blob with local ranges becomes
 * whole, from them or by a copy from the NAS (store_part.c), unmounted: whatever instant the daemon dies at,
 * the restart finds the ranges the index on disk names, or the copy it
 * records -- never a loss of verified local bytes.  The store runs in a
 * child that kills itself at the instant (--wrap), the parent restarts it. */
#include "check.h"
#include "check_store.h"
#include "hash.h"
#include "store.h"
#include "store_int.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define HALF ((uint64_t)2 << 20)
#define SIZE (2 * HALF)

/* Linked with --wrap=rename and --wrap=unlink: once a copy went into
 * data/, the process kills itself (a kill -9) at kill_at: 1, the rename
 * that puts an index in place; 2, an unlink in parts/.  3: that rename
 * fails (EIO).  4: as 1, but every index write before the copy went into
 * data/ fails (none lands after the ranges were verified).  At 1 the copy
 * workers' index writes (thread wfs-copy) fail: the index the ranges are
 * named in before they become the copy is the range worker's own (adopt,
 * store_part_copy.c), not a worker's write that may or may not come first. */
static atomic_int kill_at, renamed_data;

static int on_copy_worker(void)
{
	char name[16] = "";

	pthread_getname_np(pthread_self(), name, sizeof(name));
	return !strcmp(name, "wfs-copy");
}

int __real_rename(const char *from, const char *to);
int __wrap_rename(const char *from, const char *to);
int __wrap_rename(const char *from, const char *to)
{
	size_t n = strlen(to);
	int index = n > 11 && !strcmp(to + n - 11, "/index.json"), at = atomic_load(&kill_at), r;

	if (index && (at == 1 || at == 4) && atomic_load(&renamed_data))
		kill(getpid(), SIGKILL);
	if (index && (at == 3 || at == 4 || (at == 1 && on_copy_worker()))) {
		errno = EIO;
		return -1;
	}
	r = __real_rename(from, to);
	if (r == 0 && atomic_load(&kill_at) && strstr(to, "/data/"))
		atomic_store(&renamed_data, 1);
	return r;
}

int __real_unlink(const char *path);
int __wrap_unlink(const char *path);
int __wrap_unlink(const char *path)
{
	if (atomic_load(&kill_at) == 2 && atomic_load(&renamed_data) && strstr(path, "/parts/"))
		kill(getpid(), SIGKILL);
	return __real_unlink(path);
}

static char top[PATH_MAX], nas[PATH_MAX + 8], local[PATH_MAX + 8];

static int open_store(struct store *s)
{
	struct store_opts opt = { .workers = 1 };

	return store_open(s, local, &opt, NULL) == 0 && store_start(s) == 0;
}

static struct blob *blob_at(struct store *s, const char *path)
{
	struct stat st;

	if (stat(path, &st) < 0)
		return NULL;
	return store_blob(s, path, &st, "");
}

/* A NAS file of SIZE bytes (seeded @seed) in @buf, at @path; @part: the
 * name its partial file has. */
static void nas_file(unsigned seed, char *buf, char *path, size_t psz, char *part, size_t sz)
{
	char h[33];

	check_pattern_fill(buf, SIZE, seed);
	snprintf(path, psz, "%s/f%u", nas, seed);
	check_write_file(path, buf, SIZE);
	xxh128_hex_of(path, strlen(path), h);
	snprintf(part, sz, "%s/parts/%s", local, h);
}

static int wait_local(struct blob *b)
{
	int64_t end = store_now_ms() + 30000;

	while (blob_state(b) != BLOB_LOCAL && store_now_ms() < end)
		usleep(2000);
	return blob_state(b) == BLOB_LOCAL;
}

/* Are the first @len bytes of @file @buf's? */
static int same_bytes_at(const char *file, const char *buf, size_t len)
{
	char *got = malloc(len);
	int fd = open(file, O_RDONLY), ok;

	ok = got && fd >= 0 && pread(fd, got, len, 0) == (ssize_t)len && !memcmp(got, buf, len);
	if (fd >= 0)
		close(fd);
	free(got);
	return ok;
}

/* Are the SIZE bytes of @file @buf? */
static int same_bytes(const char *file, const char *buf)
{
	return same_bytes_at(file, buf, SIZE);
}

/* In a child, on the store closed here: the first half of the file at
 * @path local as a range, recorded; then the rest asked (@whole: the
 * whole file promoted instead), the child killed at @at (kill_at).  1
 * when it was. */
static int killed(struct store *s, const char *path, int at, int whole)
{
	struct brange half[] = { { 0, HALF } }, all[] = { { 0, SIZE } };
	struct blob *b;
	int status = 0;
	pid_t pid;

	store_close(s);
	fflush(stdout);
	if ((pid = fork()) == 0) {
		if (!open_store(s) || !(b = blob_at(s, path)) ||
		    store_part_request(s, b, half, 1, 0) != (int64_t)HALF || !wait_parts(s, b) ||
		    store_sync(s) < 0)
			_exit(3);
		atomic_store(&kill_at, at);
		if (whole)
			store_promote(s, b, 0, 1);
		else
			store_part_request(s, b, all, 1, 0);
		wait_local(b);
		store_sync(s); /* its index write, if the worker's did not come first */
		_exit(4); /* not killed */
	}
	return pid > 0 && waitpid(pid, &status, 0) == pid && WIFSIGNALED(status) &&
	       WTERMSIG(status) == SIGKILL;
}

/* kill -9 after ranges covering a blob became its copy in data/, before
 * an index recorded it: the index on disk names the ranges (adopt writes
 * it before it hashes them whole), and the restart finds
 * them -- the blob is made whole again from them, nothing read again from
 * the NAS.  Once an index records the copy the partial file goes, and the
 * restart after that serves the copy at once. */
static void test_before_index(struct check_count *c, struct store *s)
{
	char *buf = malloc(SIZE), path[PATH_MAX + 16], part[PATH_MAX + 64], copy[PATH_MAX + 64];
	struct store_usage u0, u;
	struct blob *b = NULL;
	struct stat st;

	nas_file(1, buf, path, sizeof(path), part, sizeof(part));
	store_usage(s, &u0);
	CHECK(c, killed(s, path, 1, 0), "killed between the publish and the index write");
	CHECK(c, open_store(s) && (b = blob_at(s, path)), "reopened");
	CHECK(c, b && wait_local(b), "whole again, from the ranges the index names");
	CHECK(c, atomic_load(&s->part_bytes_copied) == 0 && atomic_load(&s->started) == 0,
	      "nothing read again from the NAS: %llu bytes",
	      (unsigned long long)atomic_load(&s->part_bytes_copied));
	CHECK(c, b && store_local_path(s, b, copy, sizeof(copy)) == 0 && same_bytes(copy, buf),
	      "its bytes the NAS's");
	CHECK(c, store_sync(s) == 0 && lstat(part, &st) < 0 && errno == ENOENT &&
	      stat(copy, &st) == 0 && (st.st_mode & 07777) == 0400 && st.st_nlink == 1,
	      "recorded: the partial file gone, the copy 0400 (%o, %u links)",
	      (unsigned)(st.st_mode & 07777), (unsigned)st.st_nlink);
	store_usage(s, &u);
	CHECK(c, u.used == u0.used + store_charge(s, SIZE) && u.part_bytes == u0.part_bytes &&
	      u.held == u0.held, "counted once: %llu more", (unsigned long long)(u.used - u0.used));
	store_close(s);
	CHECK(c, open_store(s) && (b = blob_at(s, path)) && blob_state(b) == BLOB_LOCAL,
	      "the next restart serves the copy at once (not re-hashed)");
	if (b)
		store_evict(s, b, 0);
	free(buf);
}

/* The same kill, but no index was written since the first range: the one
 * on disk names that range alone.  The restart serves it, re-hashed (the
 * link moved the file's ctime), and removes the copy no index names; only
 * the range verified since is lost, and asking for it again reads it
 * alone from the NAS. */
static void test_before_any_index(struct check_count *c, struct store *s)
{
	struct brange all[] = { { 0, SIZE } };
	char *buf = malloc(SIZE), path[PATH_MAX + 16], part[PATH_MAX + 64], copy[PATH_MAX + 64];
	struct store_usage u0, u;
	struct blob_info in = { 0 };
	struct blob *b = NULL;
	struct stat st = { 0 };

	nas_file(5, buf, path, sizeof(path), part, sizeof(part));
	store_usage(s, &u0);
	CHECK(c, killed(s, path, 4, 0), "killed between the publish and the index write, no "
	      "index written since the first range");
	CHECK(c, open_store(s) && (b = blob_at(s, path)) && wait_parts(s, b), "reopened");
	if (b)
		blob_info(s, b, &in);
	CHECK(c, b && blob_state(b) == BLOB_NAS && in.part_n == 1 && in.part_bytes == HALF &&
	      !in.part_unproven, "the range the index names serves: %zu ranges, %llu bytes",
	      in.part_n, (unsigned long long)in.part_bytes);
	CHECK(c, lstat(part, &st) == 0 && st.st_nlink == 1 && same_bytes_at(part, buf, HALF),
	      "its bytes the NAS's, the copy no index names gone (%u links)",
	      (unsigned)st.st_nlink);
	store_usage(s, &u);
	CHECK(c, u.parts == u0.parts + 1 && u.part_bytes == u0.part_bytes + HALF &&
	      atomic_load(&s->part_bytes_copied) == 0 && atomic_load(&s->started) == 0,
	      "counted as the range alone, nothing read from the NAS: %llu bytes",
	      (unsigned long long)(u.part_bytes - u0.part_bytes));
	CHECK(c, b && store_part_request(s, b, all, 1, 0) == (int64_t)HALF && wait_local(b) &&
	      atomic_load(&s->part_bytes_copied) == HALF &&
	      store_local_path(s, b, copy, sizeof(copy)) == 0 && same_bytes_at(copy, buf, SIZE),
	      "asked for whole: the rest alone read from the NAS, its bytes the NAS's");
	CHECK(c, store_sync(s) == 0 && lstat(part, &st) < 0 && errno == ENOENT &&
	      stat(copy, &st) == 0 && st.st_nlink == 1, "recorded: the partial file gone");
	if (b)
		store_evict(s, b, 0);
	free(buf);
}

/* kill -9 after the index recorded that copy, before the partial file's
 * name went: the restart serves the copy at once and removes the name;
 * the copy, whose ctime that moved, is proven again. */
static void test_before_unlink(struct check_count *c, struct store *s)
{
	char *buf = malloc(SIZE), path[PATH_MAX + 16], part[PATH_MAX + 64];
	struct blob *b = NULL;
	struct stat st;

	nas_file(2, buf, path, sizeof(path), part, sizeof(part));
	CHECK(c, killed(s, path, 2, 0), "killed after that index, before the partial file went");
	CHECK(c, open_store(s) && (b = blob_at(s, path)) && blob_state(b) == BLOB_LOCAL &&
	      lstat(part, &st) < 0 && errno == ENOENT, "the copy serves at once, the partial file "
	      "removed");
	store_close(s);
	CHECK(c, open_store(s) && (b = blob_at(s, path)) && blob_state(b) == BLOB_LOCAL,
	      "and the next restart too (the copy proven again)");
	if (b)
		store_evict(s, b, 0);
	free(buf);
}

/* Made whole, no index written (it fails), then evicted: the partial
 * file goes with the copy, not at some later index write. */
static void test_evicted(struct check_count *c, struct store *s)
{
	struct brange all[] = { { 0, SIZE } };
	char *buf = malloc(SIZE), path[PATH_MAX + 16], part[PATH_MAX + 64], copy[PATH_MAX + 64];
	struct blob *b;
	struct stat st;

	nas_file(3, buf, path, sizeof(path), part, sizeof(part));
	atomic_store(&kill_at, 3);
	CHECK(c, (b = blob_at(s, path)) && store_part_request(s, b, all, 1, 0) == (int64_t)SIZE &&
	      wait_local(b) && store_local_path(s, b, copy, sizeof(copy)) == 0 &&
	      lstat(part, &st) == 0, "whole, no index written: the partial file kept");
	if (b)
		store_evict(s, b, 0);
	CHECK(c, lstat(part, &st) < 0 && lstat(copy, &st) < 0, "evicted: the partial file goes "
	      "with the copy");
	atomic_store(&kill_at, 0);
	free(buf);
}

/* A blob with a local range promoted whole (a copy from the NAS), killed
 * after that copy went into data/, before an index recorded it: the
 * restart serves the range the index names, at once.  Promoted again
 * with no index written, the partial file is kept and counted as held
 * until an index records the copy. */
static void test_promoted(struct check_count *c, struct store *s)
{
	char *buf = malloc(SIZE), path[PATH_MAX + 16], part[PATH_MAX + 64];
	struct store_usage u0, u;
	struct blob_info in = { 0 };
	struct blob *b = NULL;
	struct stat st;

	nas_file(4, buf, path, sizeof(path), part, sizeof(part));
	CHECK(c, killed(s, path, 1, 1), "killed between the copy's publish and the index write");
	CHECK(c, open_store(s) && (b = blob_at(s, path)), "reopened");
	if (b)
		blob_info(s, b, &in);
	CHECK(c, b && blob_state(b) == BLOB_NAS && in.part_n == 1 && in.part_bytes == HALF &&
	      !in.part_unproven, "the recorded range serves at once: %zu ranges, %llu bytes",
	      in.part_n, (unsigned long long)in.part_bytes);
	CHECK(c, b && lstat(part, &st) == 0 && st.st_size == (off_t)SIZE, "its partial file kept");
	store_usage(s, &u0);
	atomic_store(&kill_at, 3);
	CHECK(c, b && store_promote(s, b, 0, 1) >= 0 && store_wait_settled(s, b, 30000) ==
	      BLOB_LOCAL && lstat(part, &st) == 0, "whole, no index written: the partial file kept");
	store_usage(s, &u);
	CHECK(c, u.held > u0.held, "and counted as held meanwhile");
	atomic_store(&kill_at, 0);
	CHECK(c, store_sync(s) == 0 && lstat(part, &st) < 0, "recorded: the partial file gone");
	store_usage(s, &u);
	CHECK(c, u.held == 0 && u.part_bytes == 0, "nothing held: %llu",
	      (unsigned long long)u.held);
	if (b)
		store_evict(s, b, 0);
	free(buf);
}

int main(void)
{
	struct check_count c = { 0 };
	struct store s;

	snprintf(top, sizeof(top), "/var/tmp/wfs-partcrash-XXXXXX");
	check_tmpdir(top);
	snprintf(nas, sizeof(nas), "%s/nas", top);
	snprintf(local, sizeof(local), "%s/local", top);
	mkdir(nas, 0755);
	mkdir(local, 0755);
	if (!open_store(&s))
		return 2;
	test_before_index(&c, &s);
	test_before_any_index(&c, &s);
	test_before_unlink(&c, &s);
	test_evicted(&c, &s);
	test_promoted(&c, &s);
	store_close(&s);
	check_rmtree(top);
	printf("part_crash: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
