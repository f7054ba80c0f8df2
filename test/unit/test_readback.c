/* A range's read-back reads the disk, not the page cache (fetch_range.h):
 * on a small ext4 image on a loop device, one byte of the range's blocks
 * is changed on the disk right after fdatasync (--wrap=fdatasync writes
 * the image file under the loop device, which the mounted file's page
 * cache does not see).  fetch_range_verify must fail (-EIO), wherever in
 * the range the byte is -- in its first and last pages too, which a range
 * not on page boundaries shares with other bytes -- and a later
 * fetch_hash_range (the start-up re-hash, verify --full) must see it.
 * Needs root, mkfs.ext4 and losetup (skipped, exit 77, without them). */
#include "check.h"
#include "fetch_range.h"

#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mount.h>

#define IMAGE_MIB 64
#define SRC_SIZE ((size_t)64 << 10)
#define RANGE_OFF ((uint64_t)1000)
#define RANGE_LEN ((uint64_t)3 * 4096 + 100)

struct damage {
	const char *image;  /* the loop device's backing file */
	long long at;       /* the file offset to change on the disk, or -1 */
	int done;
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

int __wrap_fdatasync(int fd)
{
	int r = __real_fdatasync(fd), img;
	long long p;
	unsigned char c;

	if (r < 0 || dmg.at < 0)
		return r;
	p = physical(fd, dmg.at);
	img = open(dmg.image, O_RDWR);
	if (p >= 0 && img >= 0 && pread(img, &c, 1, p) == 1) {
		c ^= 0x5a;
		dmg.done = pwrite(img, &c, 1, p) == 1 && fsync(img) == 0;
	}
	if (img >= 0)
		close(img);
	dmg.at = -1;
	return r;
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
