/* fetch_range.c - the verified copy of one byte range; see fetch_range.h. */
#include "fetch_range.h"
#include "clock.h"
#include "durable.h"
#include "hash.h"
#include "nasopen.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CHUNK ((size_t)1 << 20)

/* a throttled read loop still looks at the cancel flag and the rate this
 * often (a chunk at a low rate takes seconds) */
#define MAX_NAP 0.1

/* Seconds @bw_limit (not 0) still asks after @done bytes since @t0: how
 * far the loop is ahead of the cap (<= 0: not ahead). */
static double ahead_s(uint64_t bw_limit, uint64_t done, const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)done / (double)bw_limit - (double)(now.tv_sec - t0->tv_sec) -
	       (double)(now.tv_nsec - t0->tv_nsec) / 1e9;
}

/* Sleep as long as @bw_limit asks after @done bytes since @t0, at most
 * MAX_NAP: 1 when there is more to wait, 0 when the next read may start. */
static int throttle(uint64_t bw_limit, uint64_t done, const struct timespec *t0)
{
	struct timespec ts;
	double left, nap;

	if (!bw_limit || (left = ahead_s(bw_limit, done, t0)) <= 0)
		return 0;
	nap = left > MAX_NAP ? MAX_NAP : left;
	ts.tv_sec = (time_t)nap;
	ts.tv_nsec = (long)((nap - (double)ts.tv_sec) * 1e9);
	nanosleep(&ts, NULL);
	return left > nap;
}

/* Read @n bytes at @off of @fd, whole or an error: -ESTALE when the file
 * ends first. */
static int read_all(int fd, char *p, size_t n, uint64_t off)
{
	ssize_t got = durable_pread_fd(fd, p, n, (off_t)off);

	return got < 0 ? (int)got : (size_t)got < n ? -ESTALE : 0;
}

/* A descriptor of @fd's file that reads the disk itself (O_DIRECT), or -1
 * where its filesystem takes no O_DIRECT (tmpfs). */
static int direct_twin(int fd)
{
	char self[64];

	snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
	return open(self, O_RDONLY | O_CLOEXEC | O_DIRECT);
}

/* [@pos, @pos + @n) of @dfd (O_DIRECT) into @buf (FETCH_DIO_ALIGN-aligned,
 * room for @n + FETCH_DIO_ALIGN bytes), by the FETCH_DIO_ALIGN blocks that
 * cover it; the bytes start at @buf + *@at.  0, or -errno (-ESTALE: the file ends first). */
static int read_direct(int dfd, char *buf, size_t n, uint64_t pos, size_t *at)
{
	uint64_t from = pos & ~(uint64_t)(FETCH_DIO_ALIGN - 1);
	size_t want = ((size_t)(pos - from) + n + FETCH_DIO_ALIGN - 1) & ~(FETCH_DIO_ALIGN - 1);
	ssize_t got = durable_pread_fd(dfd, buf, want, (off_t)from);

	*at = (size_t)(pos - from);
	return got < 0 ? (int)got : (size_t)got < *at + n ? -ESTALE : 0;
}

int fetch_hash_range(int fd, uint64_t off, uint64_t len, char xxh_hex[33])
{
	struct content_hash ch = { 0 }; /* no name: XXH3-128 alone */
	char *buf = NULL;
	int dfd = direct_twin(fd);
	int r = posix_memalign((void **)&buf, FETCH_DIO_ALIGN, CHUNK + FETCH_DIO_ALIGN) ? -ENOMEM
									  : content_hash_init(&ch, NULL, len);

	/* Without O_DIRECT the pages are dropped first; only whole ones go,
	 * so a range's partial first and last pages (and a large folio
	 * reaching past it) may still be read from the cache. */
	if (r == 0 && dfd < 0)
		posix_fadvise(fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
	for (uint64_t pos = off; r == 0 && pos < off + len;) {
		size_t n = off + len - pos < CHUNK ? (size_t)(off + len - pos) : CHUNK, at = 0;

		r = dfd >= 0 ? read_direct(dfd, buf, n, pos, &at) : read_all(fd, buf, n, pos);
		if (r == 0) {
			content_hash_update(&ch, buf + at, n);
			pos += n;
		}
	}
	if (r == 0) {
		r = content_hash_final(&ch, xxh_hex, NULL);
		/* the check read must not leave a second copy in the cache */
		if (dfd < 0)
			posix_fadvise(fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
	}
	if (dfd >= 0)
		close(dfd);
	content_hash_free(&ch);
	free(buf);
	return r == -ESTALE ? -EIO : r;
}

/* A read of [@pos, @pos + @n) failed with @err: the first 4 KiB piece of
 * it that fails too, for the message (a bad sector, not a 1 MiB chunk). */
static uint64_t first_bad(int fd, char *buf, uint64_t pos, size_t n, int err)
{
	for (size_t at = 0; at < n && err != -ENOTCONN && err != -ETIMEDOUT; at += 4096) {
		size_t k = n - at < 4096 ? n - at : 4096;

		if (read_all(fd, buf, k, pos + at) < 0)
			return pos + at;
	}
	return pos;
}

/* The read loop of a source: [@off, @off + @len) of @in in CHUNK pieces,
 * throttled to @bw_limit, cancellable and counted through @prog, each piece
 * handed to @use(@arg, its offset, its bytes) -- 0, or -errno to end the
 * loop (@use sets res->reason).  res->reason set on a read failure. */
static int read_source(const char *src, int in, uint64_t off, uint64_t len, uint64_t bw_limit,
		       struct fetch_progress *prog, struct fetch_result *res,
		       int (*use)(void *arg, uint64_t pos, const char *buf, size_t n), void *arg)
{
	char *buf = malloc(CHUNK);
	struct timespec t0;
	uint64_t from = off, set = 0, pos;
	int r = buf ? 0 : -ENOMEM;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (pos = off; r == 0 && pos < off + len;) {
		size_t n = off + len - pos < CHUNK ? (size_t)(off + len - pos) : CHUNK;
		uint64_t now = prog ? atomic_load_explicit(&prog->rate, memory_order_relaxed) : 0;

		if (prog && atomic_load(&prog->cancel)) {
			r = -ECANCELED;
			snprintf(res->reason, sizeof(res->reason), "copy cancelled");
			break;
		}
		if (now && now != set) {
			/* a new cap counts from here: the time spent at the old
			 * one is no credit for a burst at the new one */
			set = now;
			bw_limit = now == FETCH_RATE_NONE ? 0 : now;
			from = pos;
			clock_gettime(CLOCK_MONOTONIC, &t0);
		}
		if (throttle(bw_limit, pos - from, &t0))
			continue;
		r = read_all(in, buf, n, pos);
		if (r < 0) {
			res->src_err = r == -ESTALE ? 0 : r;
			snprintf(res->reason, sizeof(res->reason), r == -ESTALE ?
				 "short read on %s at offset %llu" : "read error on %s at offset %llu: %s",
				 src, (unsigned long long)(r == -ESTALE ? pos : first_bad(in, buf, pos, n, r)),
				 strerror(-r));
			break;
		}
		if ((r = use(arg, pos, buf, n)) < 0)
			break;
		pos += n;
		if (prog)
			atomic_fetch_add(&prog->bytes_done, n);
	}
	/* what the loop read ahead of the cap: its first chunk goes at once */
	if (bw_limit) {
		double left = ahead_s(bw_limit, pos - from, &t0);

		res->owed_ns = left > 0 ? (uint64_t)(left * 1e9) : 0;
	}
	free(buf);
	return r;
}

/* copy_range's piece: hashed, then written at its own offset. */
struct copy_piece {
	struct content_hash *ch;
	int out;
	struct fetch_result *res;
};

static int copy_piece(void *arg, uint64_t pos, const char *buf, size_t n)
{
	struct copy_piece *c = arg;
	int r;

	content_hash_update(c->ch, buf, n);
	r = durable_pwrite_fd(c->out, buf, n, (off_t)pos);
	if (r < 0)
		snprintf(c->res->reason, sizeof(c->res->reason), "write of the local range at "
			 "offset %llu: %s", (unsigned long long)pos, strerror(-r));
	return r;
}

/* The copy loop: read, hash, write.  res->reason set on failure. */
static int copy_range(const char *src, int in, int out, uint64_t off, uint64_t len,
		      uint64_t bw_limit, struct fetch_progress *prog, struct fetch_result *res)
{
	struct content_hash ch = { 0 }; /* no name: XXH3-128 alone */
	struct copy_piece c = { &ch, out, res };
	int r = content_hash_init(&ch, NULL, len);

	if (r == 0)
		r = read_source(src, in, off, len, bw_limit, prog, res, copy_piece, &c);
	if (r == 0)
		r = content_hash_final(&ch, res->xxh, NULL);
	/* what was read must not stay cached twice (the NAS client's pages) */
	posix_fadvise(in, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
	content_hash_free(&ch);
	return r;
}

/* The NAS file @src_path open for reading, or -errno with @res's reason
 * (and src_err, for the gate) filled: -EINVAL for what is no regular file. */
static int open_source(const char *src_path, struct fetch_result *res)
{
	int in = nas_open(NULL, src_path, 0);

	if (in == -EISDIR || in == -ENXIO) {
		snprintf(res->reason, sizeof(res->reason), "%s is not a regular file", src_path);
		return -EINVAL;
	}
	if (in < 0) {
		res->src_err = in;
		snprintf(res->reason, sizeof(res->reason), "open %s: %s", src_path, strerror(-in));
	}
	return in;
}

/* The source is @size bytes (its attributes into @st), and with @was (its
 * attributes when the read began) the same file unchanged: a rewrite in
 * place at the same size keeps inode and size, and the bytes read may then
 * be part old, part new, their hash and sample agreeing with them.  0, or
 * -ESTALE. */
static int same_source(int fd, uint64_t size, const char *src, const struct stat *was,
		       struct stat *st, struct fetch_result *res)
{
	if (fstat(fd, st) < 0) {
		res->src_err = -errno;
		snprintf(res->reason, sizeof(res->reason), "stat %s: %s", src, strerror(errno));
		return res->src_err;
	}
	if (!S_ISREG(st->st_mode)) {
		snprintf(res->reason, sizeof(res->reason), "%s is not a regular file", src);
		return -EINVAL;
	}
	if ((uint64_t)st->st_size != size) {
		snprintf(res->reason, sizeof(res->reason), "source %s is %llu bytes, %llu expected",
			 src, (unsigned long long)st->st_size, (unsigned long long)size);
		return -ESTALE;
	}
	if (was && !same_file_state(was, st)) {
		snprintf(res->reason, sizeof(res->reason), "source %s changed while it was read "
			 "(a new mtime or ctime: written in place)", src);
		return -ESTALE;
	}
	return 0;
}

int fetch_range_verify(const char *src_path, uint64_t size, int dst_fd, uint64_t off,
		       uint64_t len, uint64_t bw_limit, struct fetch_progress *prog,
		       struct fetch_result *res)
{
	struct fetch_result scratch;
	struct stat was, now;
	char again[33];
	int in, r;

	if (!res)
		res = &scratch;
	memset(res, 0, sizeof(*res));
	res->id_check = -1;
	if (!len || off > size || len > size - off) {
		snprintf(res->reason, sizeof(res->reason), "range %llu+%llu is not inside %s "
			 "(%llu bytes)", (unsigned long long)off, (unsigned long long)len, src_path,
			 (unsigned long long)size);
		return -EINVAL;
	}
	if ((in = open_source(src_path, res)) < 0)
		return in;
	r = same_source(in, size, src_path, NULL, &was, res);
	if (r == 0)
		r = copy_range(src_path, in, dst_fd, off, len, bw_limit, prog, res);
	if (r == 0 && (r = source_sample(in, size, res->sample)) < 0) {
		res->src_err = r == -ENODATA ? 0 : r;
		snprintf(res->reason, sizeof(res->reason), "sampling %s: %s", src_path, strerror(-r));
		r = r == -ENODATA ? -ESTALE : r;
	}
	/* the range and the sample are of one version of the file */
	if (r == 0)
		r = same_source(in, size, src_path, &was, &now, res);
	close(in);
	if (r == 0 && fdatasync(dst_fd) < 0) {
		r = -errno;
		snprintf(res->reason, sizeof(res->reason), "fdatasync of the local range: %s",
			 strerror(-r));
	}
	if (r == 0 && (r = fetch_hash_range(dst_fd, off, len, again)) < 0)
		snprintf(res->reason, sizeof(res->reason), "re-reading the local range: %s",
			 strerror(-r));
	if (r == 0 && strcmp(again, res->xxh)) {
		r = -EIO;
		snprintf(res->reason, sizeof(res->reason), "local range read back differs from the "
			 "NAS bytes (%s, read back %s)", res->xxh, again);
	}
	if (r == -ENOSPC || r == -EDQUOT)
		snprintf(res->reason, sizeof(res->reason), "no space left for the range");
	return r;
}

/* fetch_hash_source's piece: the content hashes and the source sample. */
struct hash_piece {
	struct content_hash *ch;
	struct sample_hash *sh;
};

static int hash_piece(void *arg, uint64_t pos, const char *buf, size_t n)
{
	struct hash_piece *h = arg;

	content_hash_update(h->ch, buf, n);
	sample_hash_feed(h->sh, pos, buf, n);
	return 0;
}

int fetch_hash_source(const char *src_path, uint64_t size, const char *expected_id,
		      uint64_t bw_limit, struct fetch_progress *prog, struct fetch_result *res)
{
	struct content_hash ch = { 0 };
	struct sample_hash sh = { 0 };
	struct hash_piece h = { &ch, &sh };
	struct fetch_result scratch;
	struct stat was, now;
	int in, r;

	if (!res)
		res = &scratch;
	memset(res, 0, sizeof(*res));
	res->id_check = -1;
	if ((in = open_source(src_path, res)) < 0)
		return in;
	r = same_source(in, size, src_path, NULL, &was, res);
	if (r == 0)
		r = content_hash_init(&ch, expected_id, size);
	if (r == 0)
		r = sample_hash_init(&sh, size);
	if (r == 0)
		r = read_source(src_path, in, 0, size, bw_limit, prog, res, hash_piece, &h);
	if (r == 0)
		r = content_hash_final(&ch, res->xxh, &res->id_check);
	if (r == 0)
		r = sample_hash_final(&sh, res->sample);
	if (r == 0)
		r = same_source(in, size, src_path, &was, &now, res);
	if (r == 0 && res->id_check == 0) {
		r = -EBADMSG;
		snprintf(res->reason, sizeof(res->reason), "content does not match its name: %s %s "
			 "(blob id %s)", ch.kind == HUB_ID_SHA256 ? "sha256" : "git blob sha1",
			 ch.id_hex, ch.expected);
	}
	/* what was read must not stay cached (the NAS client's pages) */
	posix_fadvise(in, 0, (off_t)size, POSIX_FADV_DONTNEED);
	content_hash_free(&ch);
	sample_hash_free(&sh);
	close(in);
	return r;
}

/* Open @path for reading from the disk: O_DIRECT, or buffered when the
 * filesystem refuses it (*@direct 0: drop the pages as they are read). */
static int open_uncached(const char *path, int *direct)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_DIRECT);

	*direct = fd >= 0;
	if (fd < 0 && errno == EINVAL)
		fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	return fd < 0 ? -errno : fd;
}

int fetch_verify_file(const char *path, uint64_t size, const char *expected_id,
		      struct fetch_result *res)
{
	struct content_hash ch = { 0 };
	struct sample_hash sh = { 0 };
	char *buf = NULL;
	int direct, fd = open_uncached(path, &direct), r;

	memset(res, 0, sizeof(*res));
	res->id_check = -1;
	if (fd < 0)
		return fd;
	r = content_hash_init(&ch, expected_id, size);
	if (r == 0)
		r = sample_hash_init(&sh, size);
	if (r == 0 && posix_memalign((void **)&buf, 4096, CHUNK))
		r = -ENOMEM;
	for (uint64_t pos = 0; r == 0 && pos < size;) {
		size_t n = size - pos < CHUNK ? (size_t)(size - pos) : CHUNK;
		/* O_DIRECT wants whole blocks: the last piece is read whole */
		size_t want = direct ? (n + 4095) & ~(size_t)4095 : n;
		ssize_t got = durable_pread_fd(fd, buf, want, (off_t)pos);

		if (got < (ssize_t)n) {
			r = got < 0 ? -errno : -EIO;
			break;
		}
		content_hash_update(&ch, buf, n);
		sample_hash_feed(&sh, pos, buf, n);
		if (!direct)
			posix_fadvise(fd, (off_t)pos, (off_t)n, POSIX_FADV_DONTNEED);
		pos += n;
	}
	if (r == 0)
		r = content_hash_final(&ch, res->xxh, &res->id_check);
	if (r == 0)
		r = sample_hash_final(&sh, res->sample);
	if (r == 0 && res->id_check == 0) {
		r = -EBADMSG;
		snprintf(res->reason, sizeof(res->reason), "content does not match its name: "
			 "%s is %s", expected_id, ch.id_hex);
	}
	content_hash_free(&ch);
	sample_hash_free(&sh);
	free(buf);
	close(fd);
	return r;
}
