/* test_fetch.c - the verified copy and its hashes, on a real disk.
 *
 * /var/tmp rather than /tmp: the copy is re-read with O_DIRECT, and that path
 * only means something on a block device.  Every copy test runs twice, with
 * io_uring and with the synchronous fallback (WFS_FETCH_NO_URING).
 *
 * `test_fetch --bench ...` measures promotion speed instead (fetch_bench.h).
 */
#include "check.h"
#include "fetch.h"
#include "fetch_bench.h"
#include "fetch_range.h"
#include "hash.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char top[256];  /* short, so that every path built under it fits */


/* The whole file, or NULL; *n gets its size. */
static unsigned char *get(const char *path, size_t *n)
{
	struct stat st;
	unsigned char *b;
	int fd = open(path, O_RDONLY);

	if (fd < 0 || fstat(fd, &st) < 0)
		return NULL;
	b = malloc((size_t)st.st_size + 1);
	*n = (size_t)st.st_size;
	if (*n && pread(fd, b, *n, 0) != (ssize_t)*n) {
		free(b);
		b = NULL;
	}
	close(fd);
	return b;
}

static int exists(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0;
}

static void path_of(char *out, const char *name)
{
	snprintf(out, PATH_MAX, "%s/%s", top, name);
}

static void digest_hex(const EVP_MD *md, const char *prefix, size_t plen,
		       const void *buf, size_t n, char *out)
{
	unsigned char d[EVP_MAX_MD_SIZE];
	unsigned int len;
	EVP_MD_CTX *c = EVP_MD_CTX_new();

	EVP_DigestInit_ex(c, md, NULL);
	EVP_DigestUpdate(c, prefix, plen);
	EVP_DigestUpdate(c, buf, n);
	EVP_DigestFinal_ex(c, d, &len);
	EVP_MD_CTX_free(c);
	for (unsigned i = 0; i < len; i++)
		sprintf(out + 2 * i, "%02x", d[i]);
}

static void sha256_hex(const void *buf, size_t n, char out[65])
{
	digest_hex(EVP_sha256(), "", 0, buf, n, out);
}

static void git_sha1_hex(const void *buf, size_t n, char out[41])
{
	char hdr[32];
	int h = snprintf(hdr, sizeof(hdr), "blob %zu", n);

	digest_hex(EVP_sha1(), hdr, (size_t)h + 1, buf, n, out);
}

static void test_hash(struct check_count *c)
{
	struct content_hash h;
	char x[33], y[33];
	int m = 7;

	/* `printf 'hello\n' | git hash-object --stdin`, and sha256sum */
	CHECK(c, content_hash_init(&h, "ce013625030ba8dba906f756967f9e9ca394464a", 6) == 0, "init");
	content_hash_update(&h, "hel", 3);
	content_hash_update(&h, "lo\n", 3);
	CHECK(c, content_hash_final(&h, x, &m) == 0 && m == 1, "git sha1 of hello: %d %s", m, h.id_hex);
	content_hash_free(&h);
	content_hash_init(&h, "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03", 6);
	content_hash_update(&h, "hello\n", 6);
	content_hash_final(&h, y, &m);
	CHECK(c, m == 1, "sha256 of hello: %s", h.id_hex);
	CHECK(c, strcmp(x, y) == 0, "xxh independent of the name");
	content_hash_free(&h);
	content_hash_init(&h, "model.safetensors", 6);
	content_hash_update(&h, "hello\n", 6);
	content_hash_final(&h, y, &m);
	CHECK(c, m == -1 && h.id_hex[0] == '\0', "not a content address: %d", m);
	content_hash_free(&h);
	/* upper-case hex is not a hub content address */
	content_hash_init(&h, "CE013625030BA8DBA906F756967F9E9CA394464A", 6);
	content_hash_update(&h, "hello\n", 6);
	content_hash_final(&h, y, &m);
	CHECK(c, m == -1, "upper case: %d", m);
	content_hash_free(&h);
	content_hash_init(&h, NULL, 6);
	content_hash_update(&h, "hello\n", 6);
	content_hash_final(&h, y, &m);
	xxh128_hex_of("hello\n", 6, x);
	CHECK(c, m == -1 && strcmp(x, y) == 0 && strlen(x) == 32, "xxh128 helper %s %s", x, y);
	content_hash_free(&h);
	xxh128_hex_of("", 0, x);
	/* the published XXH3-128 of the empty input, canonical form */
	CHECK(c, strcmp(x, "99aa06d3014798d86001c324468d497f") == 0, "xxh128 empty %s", x);
}

static void test_sample(struct check_count *c)
{
	char p[PATH_MAX], a[33], b[33], d[33];
	size_t n = (1 << 20) + 77;
	unsigned char *buf = check_pattern(n, 42);
	int fd;

	path_of(p, "sample");
	check_write_file(p, buf, n);
	fd = open(p, O_RDONLY);
	CHECK(c, source_sample(fd, n, a) == 0, "sample");
	close(fd);
	buf[n / 2] ^= 1;  /* in the middle region */
	check_write_file(p, buf, n);
	fd = open(p, O_RDONLY);
	CHECK(c, source_sample(fd, n, b) == 0 && strcmp(a, b) != 0, "middle byte changes sample");
	close(fd);
	buf[n / 2] ^= 1;
	buf[100000] ^= 1;  /* between head and middle: not sampled, by design */
	check_write_file(p, buf, n);
	fd = open(p, O_RDONLY);
	CHECK(c, source_sample(fd, n, d) == 0 && strcmp(a, d) == 0, "unsampled byte");
	CHECK(c, source_sample(fd, n + 1, d) == -ENODATA, "file shorter than size");
	close(fd);
	/* a small file is hashed whole, so any byte counts */
	check_write_file(p, buf, 1000);
	fd = open(p, O_RDONLY);
	source_sample(fd, 1000, a);
	close(fd);
	buf[999] ^= 1;
	check_write_file(p, buf, 1000);
	fd = open(p, O_RDONLY);
	source_sample(fd, 1000, b);
	CHECK(c, strcmp(a, b) != 0, "small file last byte");
	close(fd);
	free(buf);
}

/* Copy @n pattern bytes named @name; check everything a caller relies on. */
static void copy_ok(struct check_count *c, size_t n, const char *dir_src, const char *id_kind)
{
	char src[PATH_MAX], tmp[PATH_MAX], want[33], samp[33], name[65] = "", again[33];
	unsigned char *buf = check_pattern(n, n + 1), *back;
	struct fetch_progress prog = { 0, 0, 0 };
	struct fetch_result res;
	struct stat st;
	size_t got = 0;
	int r, fd;

	if (id_kind && strcmp(id_kind, "sha256") == 0)
		sha256_hex(buf, n, name);
	else if (id_kind)
		git_sha1_hex(buf, n, name);
	snprintf(src, sizeof(src), "%s/src-%zu", dir_src, n);
	path_of(tmp, "tmp-copy");
	check_write_file(src, buf, n);
	r = fetch_copy_verify(src, n, tmp, name, 0, &prog, &res);
	CHECK(c, r == 0, "copy %zu: %d %s", n, r, res.reason);
	back = get(tmp, &got);
	CHECK(c, back && got == n && memcmp(back, buf, n) == 0, "bytes equal (%zu)", n);
	xxh128_hex_of(buf, n, want);
	CHECK(c, strcmp(res.xxh, want) == 0, "xxh %zu: %s vs %s", n, res.xxh, want);
	CHECK(c, res.id_check == (id_kind ? 1 : -1), "id_check %zu: %d", n, res.id_check);
	CHECK(c, res.reason[0] == '\0', "reason empty: %s", res.reason);
	CHECK(c, atomic_load(&prog.bytes_done) == n, "progress %zu", (size_t)prog.bytes_done);
	CHECK(c, stat(tmp, &st) == 0 && (st.st_mode & 07777) == 0444, "mode 0444");
	fd = open(src, O_RDONLY);
	source_sample(fd, n, samp);
	close(fd);
	CHECK(c, strcmp(samp, res.sample) == 0, "sample %zu: %s vs %s", n, samp, res.sample);
	CHECK(c, fetch_hash_file(tmp, again, NULL) == 0 && strcmp(again, want) == 0, "rehash %zu", n);
	unlink(tmp);
	unlink(src);
	free(back);
	free(buf);
}

/* A copy that must fail with @want_err and leave no temporary file. */
static void copy_fails(struct check_count *c, const char *src, uint64_t size, const char *id,
		       uint64_t bw, struct fetch_progress *prog, int want_err, const char *why)
{
	char tmp[PATH_MAX];
	struct fetch_result res;
	int r;

	path_of(tmp, "tmp-fail");
	r = fetch_copy_verify(src, size, tmp, id, bw, prog, &res);
	CHECK(c, r == want_err, "%s: got %d (%s), want %d", why, r, res.reason, want_err);
	CHECK(c, res.reason[0] != '\0', "%s: a reason", why);
	CHECK(c, !exists(tmp), "%s: tmp file left", why);
	if (r == -EBADMSG)
		CHECK(c, res.id_check == 0 && strstr(res.reason, "does not match its name"),
		      "%s: %d %s", why, res.id_check, res.reason);
}

struct meddler {
	struct fetch_progress *prog;
	const char *path;
	int what;  /* 0 cancel, 1 append, 2 truncate, 3 lift the cap (prog->rate),
		    * 4 rewrite the last MiB in place (same size, a new mtime) */
};

/* Waits until the copy has written something, then interferes. */
static void *meddle(void *arg)
{
	struct meddler *m = arg;
	int fd;

	while (atomic_load(&m->prog->bytes_done) == 0)
		usleep(1000);
	if (m->what == 0) {
		atomic_store(&m->prog->cancel, 1);
	} else if (m->what == 3) {
		atomic_store(&m->prog->rate, FETCH_RATE_NONE);
	} else if (m->what == 4) {
		/* (the mtime set too: a rewrite within one clock tick of the
		 * file's creation could keep it) */
		struct timespec t[2] = { { 0, UTIME_OMIT }, { 1700000000, 0 } };
		struct stat st;
		char *mib = calloc(1, 1 << 20);

		fd = open(m->path, O_WRONLY);
		if (!mib || fstat(fd, &st) < 0 ||
		    pwrite(fd, mib, 1 << 20, st.st_size - (1 << 20)) != 1 << 20 ||
		    futimens(fd, t) < 0)
			perror("rewrite in place");
		close(fd);
		free(mib);
	} else {
		fd = open(m->path, O_WRONLY | O_APPEND);
		if (m->what == 1 && write(fd, "more", 4) != 4)
			perror("append");
		if (m->what == 2 && ftruncate(fd, 2 << 20) < 0)
			perror("truncate");
		close(fd);
	}
	return NULL;
}

/* @named: the source is named by its SHA-256 (hashed on the hasher thread) */
static void meddled(struct check_count *c, int what, uint64_t bw, int named, int want_err,
		    const char *why)
{
	char src[PATH_MAX], name[65];
	size_t n = 6 << 20;
	unsigned char *buf = check_pattern(n, 9);
	struct fetch_progress prog = { 0, 0, 0 };
	struct meddler m = { &prog, src, what };
	pthread_t t;

	path_of(src, "meddled");
	check_write_file(src, buf, n);
	sha256_hex(buf, n, name);
	pthread_create(&t, NULL, meddle, &m);
	/* throttled: the later chunks are read well after the meddling */
	copy_fails(c, src, n, named ? name : NULL, bw, &prog, want_err, why);
	pthread_join(t, NULL);
	unlink(src);
	free(buf);
}

/* The source rewritten in place as it is read (same size, same inode, a
 * new mtime): the copy, a range's copy and a hash of the source each fail
 * ESTALE.  (The bytes read were part old, part new, and a copy of them --
 * a file the NAS never held -- was published as verified: nothing but the
 * times tells such a rewrite, and no content address guards a name that
 * is not one.) */
static void rewritten_in_place(struct check_count *c)
{
	char src[PATH_MAX], tmp[PATH_MAX];
	size_t n = 6 << 20;
	unsigned char *buf = check_pattern(n, 13);
	struct fetch_progress prog = { 0, 0, 0 };
	struct meddler m = { &prog, src, 4 };
	struct fetch_result res;
	pthread_t t;
	int fd, r;

	path_of(src, "inplace");
	path_of(tmp, "tmp-inplace");
	for (int call = 0; call < 3; call++) {
		check_write_file(src, buf, n);
		memset(&prog, 0, sizeof(prog));
		pthread_create(&t, NULL, meddle, &m);
		if (call == 0) {
			r = fetch_copy_verify(src, n, tmp, NULL, 8 << 20, &prog, &res);
			CHECK(c, !exists(tmp), "rewritten in place: no copy left");
		} else if (call == 1) {
			fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
			r = fd < 0 || ftruncate(fd, (off_t)n) < 0 ? -errno :
			    fetch_range_verify(src, n, fd, 0, n, 8 << 20, &prog, &res);
			close(fd);
			unlink(tmp);
		} else {
			r = fetch_hash_source(src, n, NULL, 8 << 20, &prog, &res);
		}
		pthread_join(t, NULL);
		CHECK(c, r == -ESTALE && strstr(res.reason, "written in place"),
		      "%s of a source rewritten in place: %d (%s)", call == 0 ? "copy" :
		      call == 1 ? "range copy" : "hash", r, res.reason);
		unlink(src);
	}
	free(buf);
}

/* A cap lifted mid-way (prog->rate): the copy, and the hash of a source,
 * go on uncapped and still come out right.  At @bw the whole would take
 * 20 s; 10 s allowed for the rest. */
static void lifted(struct check_count *c)
{
	char src[PATH_MAX], tmp[PATH_MAX], name[65], want[33];
	size_t n = 6 << 20, got = 0;
	uint64_t bw = 256 << 10;
	unsigned char *buf = check_pattern(n, 11), *back;
	struct fetch_progress prog = { 0, 0, 0 };
	struct meddler m = { &prog, src, 3 };
	struct fetch_result res;
	pthread_t t;
	double t0, took;
	int r;

	path_of(src, "lifted");
	path_of(tmp, "tmp-lifted");
	check_write_file(src, buf, n);
	sha256_hex(buf, n, name);
	xxh128_hex_of(buf, n, want);
	t0 = check_now_s();
	pthread_create(&t, NULL, meddle, &m);
	r = fetch_copy_verify(src, n, tmp, name, bw, &prog, &res);
	took = check_now_s() - t0;
	pthread_join(t, NULL);
	back = get(tmp, &got);
	CHECK(c, r == 0 && res.id_check == 1 && !strcmp(res.xxh, want) && back && got == n &&
	      !memcmp(back, buf, n), "cap lifted mid-copy: %d %s", r, res.reason);
	CHECK(c, took < 10, "cap lifted mid-copy: %zu bytes in %.2f s", n, took);
	free(back);
	unlink(tmp);

	atomic_store(&prog.bytes_done, 0);
	atomic_store(&prog.rate, 0);
	t0 = check_now_s();
	pthread_create(&t, NULL, meddle, &m);
	r = fetch_hash_source(src, n, name, bw, &prog, &res);
	took = check_now_s() - t0;
	pthread_join(t, NULL);
	CHECK(c, r == 0 && res.id_check == 1 && !strcmp(res.xxh, want), "cap lifted mid-hash: "
	      "%d %s", r, res.reason);
	CHECK(c, took < 10, "cap lifted mid-hash: %zu bytes in %.2f s", n, took);
	unlink(src);
	free(buf);
}

static void test_failures(struct check_count *c)
{
	char src[PATH_MAX], tmp[PATH_MAX], name[65];
	size_t n = (1 << 20) + 5, got;
	unsigned char *buf = check_pattern(n, 5), *back;
	struct fetch_progress prog = { 0, 0, 0 };
	struct fetch_result res;
	double t0;
	int r;

	path_of(src, "named");
	check_write_file(src, buf, n);
	sha256_hex(buf, n, name);
	name[0] = name[0] == '0' ? '1' : '0';
	copy_fails(c, src, n, name, 0, NULL, -EBADMSG, "wrong sha256 name");
	git_sha1_hex(buf, n, name);
	name[39] = name[39] == '0' ? '1' : '0';
	copy_fails(c, src, n, name, 0, NULL, -EBADMSG, "wrong git sha1 name");

	atomic_store(&prog.cancel, 1);
	copy_fails(c, src, n, NULL, 0, &prog, -ECANCELED, "cancelled before start");
	copy_fails(c, src, n + 1, NULL, 0, NULL, -ESTALE, "size differs");
	/* a source one byte longer than said, at the sizes where a copy's
	 * slots are cut to the file (one short chunk) */
	{
		static const size_t small[] = { 0, 1, 4095, 4096, (1 << 20) - 1, 1 << 20 };
		char longer[PATH_MAX];

		path_of(longer, "longer");
		for (size_t i = 0; i < sizeof(small) / sizeof(small[0]); i++) {
			check_write_file(longer, buf, small[i] + 1);
			copy_fails(c, longer, small[i], NULL, 0, NULL, -ESTALE, "source a byte longer");
		}
		unlink(longer);
	}
	path_of(tmp, "no-such-source");
	copy_fails(c, tmp, n, NULL, 0, NULL, -ENOENT, "missing source");
	copy_fails(c, top, 4096, NULL, 0, NULL, -EINVAL, "directory source");
	path_of(tmp, "link-to-named");
	CHECK(c, symlink(src, tmp) == 0, "symlink");
	copy_fails(c, tmp, n, NULL, 0, NULL, -ELOOP, "source is a symlink");
	CHECK(c, fetch_hash_file(tmp, name, NULL) == -ELOOP, "hash a symlink");
	unlink(tmp);

	/* A failure of the source is the NAS's (src_err: the caller tells the
	 * NAS gate); one of the local side is not. */
	{
		char missing[PATH_MAX], out[PATH_MAX];

		path_of(missing, "no-such-source");
		path_of(out, "tmp-src-err");
		r = fetch_copy_verify(missing, n, out, NULL, 0, NULL, &res);
		CHECK(c, r == -ENOENT && res.src_err == -ENOENT && strstr(res.reason, missing),
		      "missing source: src_err %d, %s", res.src_err, res.reason);
		r = fetch_copy_verify(src, n + 1, out, NULL, 0, NULL, &res);
		CHECK(c, r == -ESTALE && res.src_err == 0, "a size that differs is no NAS error: %d",
		      res.src_err);
	}
	path_of(tmp, "exists");
	check_write_file(tmp, "keep", 4);
	r = fetch_copy_verify(src, n, tmp, NULL, 0, NULL, &res);
	back = get(tmp, &got);
	CHECK(c, r == -EEXIST && res.src_err == 0, "existing tmp: %d (src_err %d)", r, res.src_err);
	CHECK(c, back && got == 4 && memcmp(back, "keep", 4) == 0, "existing tmp untouched");
	free(back);
	unlink(tmp);

	/* the whole copy would take 1.5 s at 4 MiB/s: -ECANCELED (checked by
	 * meddled) proves it stopped before the end; no timing asserted. */
	meddled(c, 0, 4 << 20, 0, -ECANCELED, "cancelled mid-copy");
	meddled(c, 0, 4 << 20, 1, -ECANCELED, "cancelled mid-copy, named");
	meddled(c, 1, 8 << 20, 0, -ESTALE, "source grew");
	meddled(c, 2, 8 << 20, 1, -ESTALE, "source shrank, named");
	rewritten_in_place(c);

	/* 2 chunks at 16 MiB/s: the first starts at once, the second 1/16 s later */
	path_of(tmp, "throttled");
	t0 = check_now_s();
	r = fetch_copy_verify(src, n, tmp, NULL, 16 << 20, NULL, &res);
	CHECK(c, r == 0 && check_now_s() - t0 >= 0.06, "bw limit: %d %.3f s", r, check_now_s() - t0);
	atomic_store(&prog.cancel, 1);
	CHECK(c, fetch_hash_file(tmp, name, &prog) == -ECANCELED, "hash cancelled");
	unlink(tmp);
	unlink(src);
	free(buf);

	CHECK(c, fetch_hash_file(src, name, NULL) == -ENOENT, "hash missing file");
	CHECK(c, fetch_hash_file(top, name, NULL) == -EINVAL, "hash a directory");
}

/* ---- the re-read is compared ----
 * fetch_test_durable() damages the copy on the disk once a prefix holding
 * @damage_at is durable, before it is re-read: what the copy was written
 * from still hashes right, so only the re-read can tell. */
static uint64_t damage_at;
static int damaged;

static void damage(const char *tmp, uint64_t durable)
{
	unsigned char b;
	int fd;

	if (damaged || damage_at >= durable)
		return;
	chmod(tmp, 0600);  /* 0444 by the final fsync */
	fd = open(tmp, O_RDWR);
	if (fd >= 0 && pread(fd, &b, 1, (off_t)damage_at) == 1) {
		b ^= 0x5a;
		if (pwrite(fd, &b, 1, (off_t)damage_at) == 1 && fdatasync(fd) == 0)
			damaged = 1;
	}
	if (fd >= 0)
		close(fd);
	chmod(tmp, 0444);
}

static void test_reread(struct check_count *c)
{
	char src[PATH_MAX], tmp[PATH_MAX], name[65];
	size_t n = (9 << 20) + 123;  /* durable at 4 MiB, 8 MiB, then whole */
	unsigned char *buf = check_pattern(n, 11);
	const uint64_t at[] = { 1000, (5 << 20) + 1, n - 1 };
	struct fetch_result res;
	int r;

	path_of(src, "reread");
	path_of(tmp, "tmp-reread");
	check_write_file(src, buf, n);
	sha256_hex(buf, n, name);
	fetch_test_durable = damage;
	for (size_t i = 0; i < 2 * sizeof(at) / sizeof(at[0]); i++) {
		damage_at = at[i / 2];
		damaged = 0;
		r = fetch_copy_verify(src, n, tmp, i % 2 ? name : NULL, 0, NULL, &res);
		CHECK(c, damaged, "damaged at %llu", (unsigned long long)damage_at);
		CHECK(c, r == -EIO && strstr(res.reason, "copy does not match source"),
		      "damage at %llu found by the re-read: %d %s", (unsigned long long)damage_at, r,
		      res.reason);
		/* what was read from the source is right, and named right */
		CHECK(c, res.id_check == (i % 2 ? 1 : -1), "id_check %d", res.id_check);
		CHECK(c, !exists(tmp), "damaged copy removed");
	}
	/* the hook that damages nothing: the same copies succeed */
	damage_at = UINT64_MAX;
	damaged = 0;
	r = fetch_copy_verify(src, n, tmp, name, 0, NULL, &res);
	CHECK(c, r == 0 && !damaged, "undamaged: %d %s", r, res.reason);
	unlink(tmp);
	fetch_test_durable = NULL;
	unlink(src);
	free(buf);
}

static void run_copies(struct check_count *c)
{
	static const size_t sizes[] = {
		0, 1, 4095, 4096, 4097, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, (9 << 20) + 123,
	};
	char shm[] = "/dev/shm/wfs-test-fetch-XXXXXX";

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		copy_ok(c, sizes[i], top, NULL);
	copy_ok(c, (3 << 20) + 7, top, "sha256");
	copy_ok(c, 4097, top, "sha1");
	copy_ok(c, 0, top, "sha256");
	copy_ok(c, 0, top, "sha1");
	/* a source on tmpfs (buffered reads where O_DIRECT is refused) */
	if (mkdtemp(shm)) {
		copy_ok(c, (2 << 20) + 3, shm, "sha256");
		rmdir(shm);
	}
	test_failures(c);
	lifted(c);
	test_reread(c);
}

int main(int argc, char **argv)
{
	struct check_count c = { 0, 0 };

	if (argc > 1 && strcmp(argv[1], "--bench") == 0)
		return fetch_bench(argc, argv);

	snprintf(top, sizeof(top), "/var/tmp/wfs-test-fetch-XXXXXX");
	check_tmpdir(top);
	test_hash(&c);
	test_sample(&c);
	unsetenv("WFS_FETCH_NO_URING");
	run_copies(&c);
	setenv("WFS_FETCH_NO_URING", "1", 1);
	run_copies(&c);

	check_rmtree(top);
	printf("fetch: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
