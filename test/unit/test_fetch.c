/* test_fetch.c - the verified copy and its hashes, on a real disk.
 *
 * /var/tmp rather than /tmp: the copy is re-read with O_DIRECT, and that path
 * only means something on a block device.  Every copy test runs twice, with
 * io_uring and with the synchronous fallback (WFS_FETCH_NO_URING).
 *
 * `test_fetch --bench ...` measures promotion speed instead (see bench()).
 */
#include "check.h"
#include "fetch.h"
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

static unsigned char *pattern(size_t n, uint64_t seed)
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

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
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
	unsigned char *buf = pattern(n, 42);
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
	unsigned char *buf = pattern(n, n + 1), *back;
	struct fetch_progress prog = { 0, 0 };
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
	int what;  /* 0 cancel, 1 append, 2 truncate */
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
	unsigned char *buf = pattern(n, 9);
	struct fetch_progress prog = { 0, 0 };
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

static void test_failures(struct check_count *c)
{
	char src[PATH_MAX], tmp[PATH_MAX], name[65];
	size_t n = (1 << 20) + 5, got;
	unsigned char *buf = pattern(n, 5), *back;
	struct fetch_progress prog = { 0, 0 };
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

	/* 2 chunks at 16 MiB/s: the first starts at once, the second 1/16 s later */
	path_of(tmp, "throttled");
	t0 = now_s();
	r = fetch_copy_verify(src, n, tmp, NULL, 16 << 20, NULL, &res);
	CHECK(c, r == 0 && now_s() - t0 >= 0.06, "bw limit: %d %.3f s", r, now_s() - t0);
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
	unsigned char *buf = pattern(n, 11);
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
		0, 1, 4095, 4096, 4097, (1 << 20) + 1, (9 << 20) + 123,
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
	test_reread(c);
}

/* ---- --bench: promotion speed against the SHA-256 rate, same run ----
 *
 *   test_fetch --bench SRC_DIR DST_DIR [--mib N] [--files K] [--workers W]
 *              [--repeat R] [--no-id]
 *
 * K files of N MiB (pseudo-random bytes, named by their SHA-256, made once
 * under SRC_DIR/bench-N-K and reused) are copied into DST_DIR by W threads
 * (as the store's copy workers: each takes the next file), R times.  Before
 * each round: sync, caches dropped (when root), then the SHA-256 rate of one
 * core and of all cores (OpenSSL over a 1 MiB buffer in memory) measured.
 * Prints each round and the medians: MB/s (total bytes / wall time), its
 * ratio to one-core SHA-256 (K = 1) or to all-core SHA-256 (K > 1), the CPU
 * the process used, and how busy the machine's cores were.  --no-id: no
 * content address (XXH3 only).  Use a memory-backed rig for figures (an ext4
 * on `losetup --direct-io=on` over a tmpfs file for each of SRC_DIR and
 * DST_DIR). */

struct bench_sha {
	double secs;
	uint64_t bytes;
	pthread_barrier_t *go;
};

static void *bench_sha_thread(void *arg)
{
	struct bench_sha *b = arg;
	size_t n = 1 << 20;
	unsigned char *buf = pattern(n, 7), d[EVP_MAX_MD_SIZE];
	unsigned int len;
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	double t0;

	EVP_DigestInit_ex(c, EVP_sha256(), NULL);
	EVP_DigestUpdate(c, buf, n);  /* warm */
	if (b->go)
		pthread_barrier_wait(b->go);
	t0 = now_s();
	b->bytes = 0;
	while (now_s() - t0 < b->secs) {
		for (int i = 0; i < 16; i++)
			EVP_DigestUpdate(c, buf, n);
		b->bytes += 16 * (uint64_t)n;
	}
	b->secs = now_s() - t0;
	EVP_DigestFinal_ex(c, d, &len);
	EVP_MD_CTX_free(c);
	free(buf);
	return NULL;
}

/* SHA-256 bytes/s of @threads threads hashing at once (summed). */
static double bench_sha_rate(int threads)
{
	pthread_t t[64];
	struct bench_sha b[64];
	pthread_barrier_t go;
	double sum = 0;

	if (threads > 64)
		threads = 64;
	pthread_barrier_init(&go, NULL, (unsigned)threads);
	for (int i = 0; i < threads; i++) {
		b[i] = (struct bench_sha){ 0.6, 0, &go };
		pthread_create(&t[i], NULL, bench_sha_thread, &b[i]);
	}
	for (int i = 0; i < threads; i++) {
		pthread_join(t[i], NULL);
		sum += (double)b[i].bytes / b[i].secs;
	}
	pthread_barrier_destroy(&go);
	return sum;
}

struct bench_run {
	char (*paths)[PATH_MAX];
	char (*ids)[65];
	const char *dst;
	uint64_t size;
	int files, no_id;
	_Atomic int next;
	_Atomic int failed;
};

static void *bench_worker(void *arg)
{
	struct bench_run *r = arg;
	int i;

	while ((i = atomic_fetch_add(&r->next, 1)) < r->files) {
		char tmp[PATH_MAX];
		struct fetch_result res;
		int e;

		/* removed by bench_clean() once the clock stops: wfs renames
		 * a verified copy, the figure has no unlink in it */
		snprintf(tmp, sizeof(tmp), "%s/bench-%d.part", r->dst, i);
		e = fetch_copy_verify(r->paths[i], r->size, tmp, r->no_id ? NULL : r->ids[i], 0,
				      NULL, &res);
		if (e || res.id_check != (r->no_id ? -1 : 1)) {
			fprintf(stderr, "copy %s: %d %s (id_check %d)\n", r->paths[i], e, res.reason,
				res.id_check);
			atomic_store(&r->failed, 1);
		}
	}
	return NULL;
}

/* Make (or find) file @i of the set: pseudo-random bytes, named by SHA-256. */
static int bench_file(const char *dir, uint64_t size, int i, char path[PATH_MAX], char id[65])
{
	char mark[PATH_MAX + 8], tmp[PATH_MAX];
	size_t n = 1 << 20;
	unsigned char *buf = malloc(n), d[EVP_MAX_MD_SIZE];
	unsigned int len;
	uint64_t x = 0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1), *w = (uint64_t *)buf;
	EVP_MD_CTX *c;
	FILE *f;
	int fd;

	snprintf(mark, sizeof(mark), "%s/%d.id", dir, i);
	f = fopen(mark, "r");
	if (f) {
		int ok = fscanf(f, "%64s", id) == 1;
		struct stat st;

		fclose(f);
		snprintf(path, PATH_MAX, "%s/%s", dir, id);
		if (ok && stat(path, &st) == 0 && (uint64_t)st.st_size == size) {
			free(buf);
			return 0;
		}
	}
	snprintf(tmp, sizeof(tmp), "%s/%d.new", dir, i);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0) {
		perror(tmp);
		free(buf);
		return -1;
	}
	c = EVP_MD_CTX_new();
	EVP_DigestInit_ex(c, EVP_sha256(), NULL);
	for (uint64_t off = 0; off < size; off += n) {
		size_t m = size - off < n ? (size_t)(size - off) : n;

		for (size_t k = 0; k < n / 8; k++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			w[k] = x;
		}
		EVP_DigestUpdate(c, buf, m);
		if (write(fd, buf, m) != (ssize_t)m) {
			perror(tmp);
			close(fd);
			free(buf);
			return -1;
		}
	}
	EVP_DigestFinal_ex(c, d, &len);
	EVP_MD_CTX_free(c);
	for (unsigned k = 0; k < len; k++)
		sprintf(id + 2 * k, "%02x", d[k]);
	fsync(fd);
	close(fd);
	snprintf(path, PATH_MAX, "%s/%s", dir, id);
	if (rename(tmp, path) < 0) {
		perror(path);
		free(buf);
		return -1;
	}
	f = fopen(mark, "w");
	if (f) {
		fprintf(f, "%s\n", id);
		fclose(f);
	}
	free(buf);
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* busy and total jiffies of all cores, from /proc/stat */
static void cpu_jiffies(double *busy, double *total)
{
	unsigned long long v[10] = { 0 };
	FILE *f = fopen("/proc/stat", "r");

	*busy = *total = 0;
	if (!f)
		return;
	if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
		   &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9]) >= 8) {
		for (int i = 0; i < 8; i++)
			*total += (double)v[i];
		*busy = *total - (double)v[3] - (double)v[4];
	}
	fclose(f);
}

static double cpu_self(void)
{
	struct timespec t;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* the copies of a round: wfs renames them, the bench removes them */
static void bench_clean(const char *dst, int files)
{
	for (int i = 0; i < files; i++) {
		char tmp[PATH_MAX];

		snprintf(tmp, sizeof(tmp), "%s/bench-%d.part", dst, i);
		unlink(tmp);
	}
}

static int bench(int argc, char **argv)
{
	const char *src_dir = NULL, *dst = NULL;
	int mib = 2048, files = 1, workers = 0, repeat = 5, no_id = 0;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	char dir[PATH_MAX];
	double *rate = NULL, *ratio = NULL, *sha1c = NULL, *shaall = NULL;
	struct bench_run run = { 0 };
	uint64_t size;
	int ret = 2;

	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--mib") && i + 1 < argc)
			mib = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--files") && i + 1 < argc)
			files = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--workers") && i + 1 < argc)
			workers = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
			repeat = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--no-id"))
			no_id = 1;
		else if (!src_dir)
			src_dir = argv[i];
		else if (!dst)
			dst = argv[i];
		else
			src_dir = NULL, i = argc;
	}
	if (!src_dir || !dst || mib <= 0 || files <= 0 || repeat <= 0) {
		fprintf(stderr, "usage: test_fetch --bench SRC_DIR DST_DIR [--mib N] [--files K] "
			"[--workers W] [--repeat R] [--no-id]\n");
		return 2;
	}
	if (workers <= 0)
		workers = (int)(ncpu < 2 ? 2 : ncpu);  /* copy_workers' default */
	if (workers > files)
		workers = files;
	if (workers > 64)
		workers = 64;
	size = (uint64_t)mib << 20;
	snprintf(dir, sizeof(dir), "%s/bench-%d-%d", src_dir, mib, files);
	mkdir(dir, 0755);
	run.paths = calloc((size_t)files, sizeof(*run.paths));
	run.ids = calloc((size_t)files, sizeof(*run.ids));
	rate = calloc((size_t)repeat, sizeof(double));
	ratio = calloc((size_t)repeat, sizeof(double));
	sha1c = calloc((size_t)repeat, sizeof(double));
	shaall = calloc((size_t)repeat, sizeof(double));
	if (!run.paths || !run.ids || !rate || !ratio || !sha1c || !shaall)
		goto out;
	for (int i = 0; i < files; i++)
		if (bench_file(dir, size, i, run.paths[i], run.ids[i]) < 0)
			goto out;
	run.dst = dst;
	run.size = size;
	run.files = files;
	run.no_id = no_id;
	printf("%d file(s) of %d MiB, %d worker(s), %ld cpu(s), %s, %s, %s -> %s\n", files, mib,
	       workers, ncpu, no_id ? "no content address" : "sha256 named",
	       getenv("WFS_FETCH_NO_URING") ? "no io_uring" : "io_uring", dir, dst);
	for (int k = 0; k < repeat; k++) {
		pthread_t t[64];
		double t0, wall, c0, b0, j0, b1, j1, base;
		FILE *dc;

		bench_clean(dst, files);
		sync();
		dc = fopen("/proc/sys/vm/drop_caches", "w");
		if (dc) {
			fputs("3\n", dc);
			fclose(dc);
		}
		sha1c[k] = bench_sha_rate(1);
		shaall[k] = bench_sha_rate((int)ncpu);
		atomic_store(&run.next, 0);
		atomic_store(&run.failed, 0);
		cpu_jiffies(&b0, &j0);
		c0 = cpu_self();
		t0 = now_s();
		for (int w = 0; w < workers && w < 64; w++)
			pthread_create(&t[w], NULL, bench_worker, &run);
		for (int w = 0; w < workers && w < 64; w++)
			pthread_join(t[w], NULL);
		wall = now_s() - t0;
		c0 = cpu_self() - c0;
		cpu_jiffies(&b1, &j1);
		bench_clean(dst, files);
		if (atomic_load(&run.failed)) {
			ret = 1;
			goto out;
		}
		base = files == 1 ? sha1c[k] : shaall[k];
		rate[k] = (double)size * files / wall;
		ratio[k] = rate[k] / base;
		printf("round %d: %.3f s, %.0f MB/s = %.3fx sha256 %s (%.0f MB/s; one core %.0f, "
		       "all %.0f); process cpu %.2f s; cores busy %.2f of %ld\n",
		       k + 1, wall, rate[k] / 1e6, ratio[k], files == 1 ? "one-core" : "all-core",
		       base / 1e6, sha1c[k] / 1e6, shaall[k] / 1e6, c0,
		       j1 > j0 ? (b1 - b0) / (j1 - j0) * (double)ncpu : 0.0, ncpu);
		fflush(stdout);
	}
	printf("median of %d: %.0f MB/s, ratio %.3f to sha256 %s (median one core %.0f MB/s, "
	       "all cores %.0f MB/s)\n", repeat, median(rate, repeat) / 1e6, median(ratio, repeat),
	       files == 1 ? "one-core" : "all-core", median(sha1c, repeat) / 1e6,
	       median(shaall, repeat) / 1e6);
	ret = 0;
out:
	free(run.paths);
	free(run.ids);
	free(rate);
	free(ratio);
	free(sha1c);
	free(shaall);
	return ret;
}

int main(int argc, char **argv)
{
	struct check_count c = { 0, 0 };

	if (argc > 1 && strcmp(argv[1], "--bench") == 0)
		return bench(argc, argv);

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
