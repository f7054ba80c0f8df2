/* A read-back reads the disk, not the page cache: on a small ext4 image
 * on a loop device, one byte of a file's blocks is changed on the disk
 * once the write is durable (through the image file under the loop
 * device, which the mounted file's page cache does not see).
 *   - a range (fetch_range.h): the byte changed right after fdatasync
 *     (--wrap=fdatasync); fetch_range_verify must fail (-EIO), wherever in
 *     the range the byte is -- in its first and last pages too, which a
 *     range not on page boundaries shares with other bytes -- and a later
 *     fetch_hash_range (the start-up re-hash, verify --full) must see it;
 *   - a whole copy (fetch.h): the byte changed from fetch_test_durable, once
 *     the prefix holding it is durable and before it is re-read;
 *     fetch_copy_verify must fail with -EIO and leave no copy, with each
 *     engine: io_uring, the synchronous one (WFS_FETCH_NO_URING) and a file
 *     under a chunk (always synchronous); in its first page, a page inside
 *     and its last, partial page (with io_uring the first is in a segment
 *     made durable by a periodic fdatasync, the others by the final fsync);
 *   - an existing copy (fetch_hash_file, the start-up re-hash and scrub):
 *     written, its byte changed right after fdatasync, its old bytes still
 *     in the page cache; the hash must be that of the bytes on the disk,
 *     not of the bytes written, with each engine.
 * Needs root, mkfs.ext4 and losetup (skipped, exit 77, without them). */
#include "check.h"
#include "fetch.h"
#include "fetch_range.h"
#include "hash.h"

#include <liburing.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mount.h>

#define IMAGE_MIB 64
#define SRC_SIZE ((size_t)64 << 10)
#define RANGE_OFF ((uint64_t)1000)
#define RANGE_LEN ((uint64_t)3 * 4096 + 100)
/* a whole copy of 1 MiB or more goes through io_uring (unless
 * WFS_FETCH_NO_URING); this one has a periodic fdatasync (at 4 MiB, the
 * smallest segment) before the final fsync, and a partial last page */
#define BIG_SIZE (((size_t)5 << 20) + 123)
/* under a chunk (1 MiB): always the synchronous engine */
#define SMALL_SIZE (((size_t)64 << 10) + 100)

struct damage {
	const char *image;  /* the loop device's backing file */
	long long at;       /* the file offset to change on the disk, or -1 */
	int done;
	int whole;          /* changed by durable_hook (a whole copy), not fdatasync */
	uint64_t durable;   /* a whole copy: the durable prefix when it was changed */
};

static struct damage dmg = { .at = -1 };

int __real_fdatasync(int fd);

/* Where the file's byte @logical is on its filesystem's device, or -1. */
static long long physical(int fd, long long logical)
{
	char b[sizeof(struct fiemap) + 32 * sizeof(struct fiemap_extent)];
	struct fiemap *fm = (struct fiemap *)b;

	memset(b, 0, sizeof(b));
	fm->fm_length = ~0ULL;
	fm->fm_flags = FIEMAP_FLAG_SYNC;
	fm->fm_extent_count = 32;
	if (ioctl(fd, FS_IOC_FIEMAP, fm) < 0)
		return -1;
	for (unsigned i = 0; i < fm->fm_mapped_extents; i++) {
		struct fiemap_extent *e = &fm->fm_extents[i];

		if ((unsigned long long)logical >= e->fe_logical &&
		    (unsigned long long)logical < e->fe_logical + e->fe_length)
			return (long long)(e->fe_physical + ((unsigned long long)logical - e->fe_logical));
	}
	return -1;
}

/* Change the byte dmg.at of the file open as @fd on the disk (xor 0x5a),
 * through the image file; dmg.done says whether it was. */
static void change_on_disk(int fd)
{
	long long p = physical(fd, dmg.at);
	int img = open(dmg.image, O_RDWR);
	unsigned char c;

	if (p >= 0 && img >= 0 && pread(img, &c, 1, p) == 1) {
		c ^= 0x5a;
		dmg.done = pwrite(img, &c, 1, p) == 1 && fsync(img) == 0;
	}
	if (img >= 0)
		close(img);
	dmg.at = -1;
}

int __wrap_fdatasync(int fd)
{
	int r = __real_fdatasync(fd);

	if (r < 0 || dmg.at < 0 || dmg.whole)
		return r;
	change_on_disk(fd);
	return r;
}

/* fetch_test_durable (fetch.h): the prefix [0, @durable) of the copy is
 * durable and not yet re-read. */
static void durable_hook(const char *tmp_path, uint64_t durable)
{
	int fd;

	if (dmg.at < 0 || (uint64_t)dmg.at >= durable)
		return;
	fd = open(tmp_path, O_RDONLY);
	if (fd < 0) {
		dmg.at = -1;
		return;
	}
	dmg.durable = durable;
	change_on_disk(fd);
	close(fd);
}

static int sh(const char *cmd)
{
	int r = system(cmd);

	return r == 0 ? 0 : -1;
}

/* Copy the range of @src into a fresh file in @mnt, the byte at @at (or
 * none, -1) changed on the disk after the fdatasync: fetch_range_verify's
 * result, and whether a later fetch_hash_range agrees with its hash. */
static int copy_range(struct check_count *c, const char *src, const char *mnt, long long at,
		      int *rehash_same)
{
	char dst[4200], again[33];
	struct fetch_result res;
	int fd, r;

	snprintf(dst, sizeof(dst), "%s/part", mnt);
	unlink(dst);
	fd = open(dst, O_RDWR | O_CREAT, 0600);
	CHECK(c, fd >= 0 && ftruncate(fd, (off_t)SRC_SIZE) == 0, "%s: %s", dst, strerror(errno));
	if (fd < 0)
		return -EBADF;
	dmg.at = at;
	dmg.done = 0;
	memset(&res, 0, sizeof(res));
	r = fetch_range_verify(src, SRC_SIZE, fd, RANGE_OFF, RANGE_LEN, 0, NULL, &res);
	CHECK(c, at < 0 || dmg.done, "the byte at %lld could not be changed on the disk", at);
	*rehash_same = r == 0 && fetch_hash_range(fd, RANGE_OFF, RANGE_LEN, again) == 0 &&
		       !strcmp(again, res.xxh);
	if (r < 0)
		fprintf(stderr, "  (byte %lld changed: %s)\n", at, res.reason);
	close(fd);
	unlink(dst);
	return r;
}

static void test_readback(struct check_count *c, const char *dir, const char *mnt)
{
	static const struct {
		long long at;
		const char *where;
	} cases[] = {
		{ RANGE_OFF + 10, "the range's first page" },
		{ 4096 + 10, "a page inside" },
		{ RANGE_OFF + RANGE_LEN - 50, "the range's last page" },
	};
	char src[4200];
	unsigned char *buf = malloc(SRC_SIZE);
	int same;

	for (size_t i = 0; buf && i < SRC_SIZE; i++)
		buf[i] = (unsigned char)(i * 7 + 3);
	snprintf(src, sizeof(src), "%s/src", dir);
	check_write_file(src, buf, SRC_SIZE);
	free(buf);
	CHECK(c, copy_range(c, src, mnt, -1, &same) == 0 && same, "the range, nothing changed");
	for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
		int r = copy_range(c, src, mnt, cases[i].at, &same);

		CHECK(c, r == -EIO, "a byte changed on the disk in %s (at %lld): %d, want -EIO",
		      cases[i].where, cases[i].at, r);
	}
}

/* A file @path of @n bytes, its bytes from @seed; they are returned. */
static unsigned char *make_source(const char *path, size_t n, unsigned seed)
{
	unsigned char *buf = malloc(n);

	if (!buf) {
		fprintf(stderr, "out of memory\n");
		exit(2);
	}
	for (size_t i = 0; i < n; i++)
		buf[i] = (unsigned char)(i * 7 + i / 4096 + seed);
	check_write_file(path, buf, n);
	return buf;
}

/* Copy @src (@size bytes, @want_xxh the XXH3-128 of its bytes) whole to
 * @mnt/copy, the byte at @at (or none, -1) changed on the disk once the
 * prefix holding it is durable: fetch_copy_verify's result; the rest of
 * the contract (fetch.h) is checked here. */
static int copy_whole(struct check_count *c, const char *what, const char *src, uint64_t size,
		      const char *want_xxh, const char *mnt, long long at)
{
	char tmp[4200], again[33];
	struct fetch_result res;
	struct stat st;
	int r;

	snprintf(tmp, sizeof(tmp), "%s/copy", mnt);
	unlink(tmp);
	dmg.at = at;
	dmg.done = 0;
	dmg.whole = 1;
	dmg.durable = 0;
	r = fetch_copy_verify(src, size, tmp, NULL, 0, NULL, &res);
	dmg.whole = 0;
	CHECK(c, at < 0 || dmg.done, "%s: the byte at %lld could not be changed on the disk", what,
	      at);
	/* xxh is of the source read, also when the copy fails after that */
	CHECK(c, !strcmp(res.xxh, want_xxh), "%s: res->xxh %s, the source's %s", what, res.xxh,
	      want_xxh);
	if (r == 0) {
		CHECK(c, stat(tmp, &st) == 0 && (uint64_t)st.st_size == size &&
			 (st.st_mode & 07777) == 0444 && res.reason[0] == '\0',
		      "%s: a verified copy is complete, mode 0444, no reason", what);
		CHECK(c, at >= 0 || (fetch_hash_file(tmp, again, NULL) == 0 &&
				    !strcmp(again, want_xxh)),
		      "%s: the copy re-hashed is the source's bytes", what);
	} else {
		CHECK(c, access(tmp, F_OK) < 0 && errno == ENOENT, "%s: a failed copy is unlinked",
		      what);
		CHECK(c, res.reason[0] != '\0', "%s: a failed copy says why", what);
		fprintf(stderr, "  (%s: byte %lld changed, %llu bytes durable: %s)\n", what, at,
			(unsigned long long)dmg.durable, res.reason);
	}
	unlink(tmp);
	return r;
}

/* The whole-copy cases for one engine: @size bytes copied clean, then a
 * byte changed on the disk in its first page, a page inside and its last,
 * partial page -- each must fail the copy with -EIO. */
static void copies(struct check_count *c, const char *engine, const char *dir, const char *mnt,
		   size_t size, long long inside)
{
	const struct {
		long long at;
		const char *where;
	} cases[] = {
		{ 1000, "the first page" },
		{ inside, "a page inside" },
		{ (long long)size - 50, "the last, partial page" },
	};
	char src[4200], want[33], what[256];
	unsigned char *buf;

	snprintf(src, sizeof(src), "%s/whole-src", dir);
	buf = make_source(src, size, 1);
	xxh128_hex_of(buf, size, want);
	free(buf);
	snprintf(what, sizeof(what), "%s, %zu bytes, nothing changed", engine, size);
	CHECK(c, copy_whole(c, what, src, size, want, mnt, -1) == 0, "%s: not verified", what);
	for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
		int r;

		snprintf(what, sizeof(what), "%s, %zu bytes, a byte changed on the disk in %s (at %lld)",
			 engine, size, cases[i].where, cases[i].at);
		r = copy_whole(c, what, src, size, want, mnt, cases[i].at);
		CHECK(c, r == -EIO, "%s: %d, want -EIO", what, r);
	}
	unlink(src);
}

/* fetch_hash_file of a file of @size bytes written to @mnt, the byte at
 * @at (or none, -1) changed on the disk right after its fdatasync, its old
 * bytes still in the page cache: the hash must be of the bytes on the
 * disk. */
static void rehash(struct check_count *c, const char *engine, const char *mnt, size_t size,
		   long long at)
{
	char path[4200], written[33], ondisk[33], got[33] = "";
	unsigned char *buf;
	int fd, r;

	snprintf(path, sizeof(path), "%s/kept", mnt);
	buf = make_source(path, size, 2);
	xxh128_hex_of(buf, size, written);
	if (at >= 0)
		buf[at] ^= 0x5a;
	xxh128_hex_of(buf, size, ondisk);
	fd = open(path, O_RDWR);
	CHECK(c, fd >= 0, "%s: %s", path, strerror(errno));
	if (fd < 0) {
		free(buf);
		return;
	}
	/* the pages written are in the cache; read them once more, as a
	 * reader of the copy would have */
	CHECK(c, pread(fd, buf, size, 0) == (ssize_t)size, "%s: read", path);
	dmg.at = at;
	dmg.done = 0;
	CHECK(c, fdatasync(fd) == 0, "%s: fdatasync: %s", path, strerror(errno));
	close(fd);
	CHECK(c, at < 0 || dmg.done, "%s: the byte at %lld could not be changed on the disk", engine,
	      at);
	r = fetch_hash_file(path, got, NULL);
	if (at < 0)
		CHECK(c, r == 0 && !strcmp(got, written),
		      "%s, %zu bytes, nothing changed: fetch_hash_file %d, %s, want %s", engine, size,
		      r, got, written);
	else
		CHECK(c, r == 0 && strcmp(got, written) != 0 && !strcmp(got, ondisk),
		      "%s, %zu bytes, a byte changed on the disk at %lld: fetch_hash_file %d, %s; the "
		      "bytes written %s, on the disk %s", engine, size, at, r, got, written, ondisk);
	free(buf);
	unlink(path);
}

/* Each engine fetch.h offers: io_uring for 1 MiB or more, the synchronous
 * one with WFS_FETCH_NO_URING, and for a file under a chunk. */
static void test_whole(struct check_count *c, const char *dir, const char *mnt)
{
	static const struct {
		const char *engine;
		int no_uring;
		size_t size;
		long long inside;
	} engines[] = {
		{ "io_uring", 0, BIG_SIZE, ((long long)4 << 20) + 10 },
		{ "synchronous (WFS_FETCH_NO_URING)", 1, BIG_SIZE, ((long long)4 << 20) + 10 },
		{ "synchronous (under a chunk)", 0, SMALL_SIZE, 5 * 4096 + 10 },
	};
	struct io_uring ring;

	if (io_uring_queue_init(8, &ring, 0) < 0)
		fprintf(stderr, "  (no io_uring here: its cases run on the synchronous engine)\n");
	else
		io_uring_queue_exit(&ring);
	fetch_test_durable = durable_hook;
	for (size_t i = 0; i < sizeof(engines) / sizeof(*engines); i++) {
		const char *e = engines[i].engine;

		if (engines[i].no_uring)
			setenv("WFS_FETCH_NO_URING", "1", 1);
		else
			unsetenv("WFS_FETCH_NO_URING");
		copies(c, e, dir, mnt, engines[i].size, engines[i].inside);
		rehash(c, e, mnt, engines[i].size, -1);
		rehash(c, e, mnt, engines[i].size, 1000);
		rehash(c, e, mnt, engines[i].size, engines[i].inside);
		rehash(c, e, mnt, engines[i].size, (long long)engines[i].size - 50);
	}
	unsetenv("WFS_FETCH_NO_URING");
	fetch_test_durable = NULL;
}

int main(void)
{
	char dir[] = "/var/tmp/wfs-readback-XXXXXX", image[4200], mnt[4200], cmd[8800];
	char loop[256] = "";
	struct check_count c = { 0 };
	FILE *p;

	if (geteuid() != 0 || sh("command -v mkfs.ext4 >/dev/null && command -v losetup "
				 ">/dev/null") < 0) {
		fprintf(stderr, "skipped: needs root, mkfs.ext4 and losetup\n");
		return 77;
	}
	check_tmpdir(dir);
	snprintf(image, sizeof(image), "%s/ext4.img", dir);
	snprintf(mnt, sizeof(mnt), "%s/mnt", dir);
	snprintf(cmd, sizeof(cmd), "truncate -s %dM '%s' && mkfs.ext4 -q -b 4096 -F '%s' && "
		 "mkdir '%s'", IMAGE_MIB, image, image, mnt);
	snprintf(cmd + strlen(cmd), sizeof(cmd) - strlen(cmd), " && losetup -f --show '%s'", image);
	p = popen(cmd, "r");
	if (!p || !fgets(loop, sizeof(loop), p) || pclose(p) != 0) {
		fprintf(stderr, "could not make a loop device of %s\n", image);
		check_rmtree(dir);
		return 2;
	}
	loop[strcspn(loop, "\n")] = '\0';
	dmg.image = image;
	if (mount(loop, mnt, "ext4", 0, NULL) < 0) {
		perror(mnt);
		c.failed++;
	} else {
		test_readback(&c, dir, mnt);
		test_whole(&c, dir, mnt);
		if (umount(mnt) < 0)
			perror(mnt);
	}
	snprintf(cmd, sizeof(cmd), "losetup -d '%s'", loop);
	if (sh(cmd) < 0)
		fprintf(stderr, "could not detach %s\n", loop);
	check_rmtree(dir);
	printf("readback: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
