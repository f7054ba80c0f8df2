/* fetch.c - the verified copy's entry points: fetch_copy_verify() and
 * fetch_hash_file() set a job up (the source opened and checked, the copy
 * created and its space reserved, the slot memory), run it through the
 * pipeline (fetch_pipeline.c, where the design is described) and check
 * its end.  Also the job's failure (its first cause and reason) and the
 * WFS_FETCH_PROFILE report.  What the fetch files share is in fetch_int.h.
 */
#include "fetch.h"
#include "fetch_int.h"
#include "hash.h"
#include "nasopen.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SEG_MIN ((uint64_t)4 << 20)
#define SEG_MAX ((uint64_t)256 << 20)

void (*fetch_test_durable)(const char *tmp_path, uint64_t durable);

/* ---- the job's failure ---- */

static void __attribute__((format(printf, 3, 0)))
vfail(struct job *j, int err, const char *fmt, va_list ap)
{
	if (j->err)
		return;  /* the first cause is the one worth reporting */
	j->err = err;
	vsnprintf(j->res->reason, sizeof(j->res->reason), fmt, ap);
}

void job_fail(struct job *j, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfail(j, err, fmt, ap);
	va_end(ap);
}

/* The source itself failed (a NAS error): as fail, and said so in
 * res->src_err when it is the first cause. */
void job_fail_src(struct job *j, int err, const char *fmt, ...)
{
	va_list ap;

	if (!j->err)
		j->res->src_err = err;
	va_start(ap, fmt);
	vfail(j, err, fmt, ap);
	va_end(ap);
}

void job_fail_write(struct job *j, int err, const char *what)
{
	if (err == -ENOSPC)
		job_fail(j, err, "no space left on %s", j->dir);
	else if (err == -EDQUOT)
		job_fail(j, err, "disk quota exceeded on %s", j->dir);
	else
		job_fail(j, err, "%s %s: %s", what, j->ver.path, strerror(-err));
}

/* ---- the job ---- */

/* The slots a stream of a file of `size` bytes can use at once: no more
 * than it has chunks (the over-read past a short file's end included).
 * A hub has many files of a few KiB; 24 MiB of slots for each would be
 * allocated, touched and freed for nothing. */
static unsigned slots_for(uint64_t size, unsigned most)
{
	uint64_t chunks = size / CHUNK + 1;

	return chunks < most ? (unsigned)chunks : most;
}

/* A slot's bytes: a chunk and the block of the over-read, or for a file
 * shorter than a chunk, the file and that block. */
static size_t slot_bytes(uint64_t size)
{
	return size < CHUNK ? round_up(size + 1, ALIGN) : SLOT_BYTES;
}

static void stream_init(struct stream *s, int fd, const char *path, struct slot *slots,
			unsigned n, unsigned char *mem, size_t stride)
{
	s->fd = fd;
	s->path = path;
	s->slots = slots;
	s->n = n;
	for (unsigned i = 0; i < n; i++) {
		slots[i].st = s;
		slots[i].buf = mem + (size_t)i * stride;
	}
}

/* O_DIRECT where the filesystem takes it; 1 when on. */
static int try_direct(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	return fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
}

static struct job *job_new(uint64_t size, struct fetch_progress *prog, struct fetch_result *res)
{
	struct job *j = calloc(1, sizeof(*j));

	if (!j)
		return NULL;
	j->size = size;
	j->prog = prog;
	j->res = res;
	j->src.fd = j->ver.fd = -1;
	j->hs.efd = -1;
	return j;
}

static void job_free(struct job *j, void *mem)
{
	hasher_stop(&j->hs, 1);
	eng_exit(&j->eng);
	content_hash_free(&j->ch);
	content_hash_free(&j->vh);
	sample_hash_free(&j->sh);
	if (j->src.fd >= 0)
		close(j->src.fd);
	if (j->ver.fd >= 0)
		close(j->ver.fd);
	/* Reads and writes the broken ring still had in flight are not
	 * stopped by its close: a read the kernel finishes later (an io-wq
	 * worker on a slow NFS file) would land in memory given out again.
	 * Their buffers are left allocated (a rare, bounded leak). */
	if (!j->ring_broken)
		free(mem);
	free(j);
}

static int open_source(struct job *j, const char *path)
{
	struct stat st;
	/* The caller resolved every link; one appearing now, in any component,
	 * is not followed.  No roots are known here: every component from "/"
	 * is checked.  A FIFO or device is never opened. */
	int fd = nas_open(NULL, path, 0);

	if (fd == -EISDIR || fd == -ENXIO) {
		job_fail(j, -EINVAL, "%s is not a regular file", path);
		return -1;
	}
	if (fd < 0) {
		job_fail_src(j, fd, "cannot open %s: %s", path, strerror(-fd));
		return -1;
	}
	j->src.fd = fd;
	j->src.direct = try_direct(fd);
	if (fstat(fd, &st) < 0) {
		job_fail_src(j, -errno, "cannot stat %s: %s", path, strerror(errno));
		return -1;
	}
	if (!S_ISREG(st.st_mode)) {
		job_fail(j, -EINVAL, "%s is not a regular file", path);
		return -1;
	}
	if ((uint64_t)st.st_size != j->size) {
		job_fail(j, -ESTALE, "%s is %" PRIu64 " bytes, expected %" PRIu64, path,
		     (uint64_t)st.st_size, j->size);
		return -1;
	}
	j->src_st = st;
	return 0;
}

/* One line: wall time and rate; this thread's CPU, hashing and waiting;
 * the hasher's CPU, its time waiting for slots and runnable without a CPU
 * (/proc schedstat); the periodic syncs (count, summed latency); the final
 * fsync and the re-read after it. */
static void prof_report(struct job *j)
{
	struct prof *p = j->prof;
	double wall = (double)(mono_ns() - p->t0) / 1e9;
	double tail = (double)(mono_ns() - p->final_t - p->final_sum) / 1e9;

	fprintf(stderr, "fetch profile %s: %.3f s, %.0f MB/s%s; copy thread cpu %.3f s (hash source "
		"%.3f, re-read %.3f, waiting %.3f s in %u waits); hasher %s cpu %.3f s, idle %.3f s, "
		"runnable %.3f s; %u syncs %.3f s; final fsync %.3f s, then re-read %.3f s\n",
		j->src.path, wall, wall > 0 ? (double)j->size / wall / 1e6 : 0.0,
		j->eng.fixed ? ", fixed buffers" : "",
		(double)(clock_ns(CLOCK_THREAD_CPUTIME_ID) - p->cpu0) / 1e9, (double)p->hash_here / 1e9,
		(double)p->hash_ver / 1e9, (double)p->wait / 1e9, p->waits,
		j->hs.ran ? "(content address)" : j->ch.md ? "not started" : "none",
		(double)j->hs.cpu_ns / 1e9, (double)j->hs.idle_ns / 1e9, (double)j->hs.rq_ns / 1e9, p->syncs,
		(double)p->sync_sum / 1e9, (double)p->final_sum / 1e9, j->err ? 0.0 : tail);
	free(p);
	j->prof = NULL;
}

int fetch_copy_verify(const char *src_path, uint64_t size, const char *tmp_path,
		      const char *expected_id, uint64_t bw_limit,
		      struct fetch_progress *prog, struct fetch_result *res)
{
	struct fetch_result spare;
	struct job *j;
	unsigned char *mem = NULL;
	unsigned nsrc = slots_for(size, NSRC), nver = slots_for(size, NVER);
	size_t stride = slot_bytes(size);
	const char *slash;
	int created = 0, err;

	if (!res)
		res = &spare;
	memset(res, 0, sizeof(*res));
	res->id_check = -1;
	j = job_new(size, prog, res);
	if (!j) {
		snprintf(res->reason, sizeof(res->reason), "out of memory");
		return -ENOMEM;
	}
	j->copying = 1;
	slash = strrchr(tmp_path, '/');
	if (!slash)
		snprintf(j->dir, sizeof(j->dir), ".");
	else
		snprintf(j->dir, sizeof(j->dir), "%.*s", slash == tmp_path ? 1 : (int)(slash - tmp_path),
			 tmp_path);
	j->src.is_src = 1;
	j->src.limit = size;
	j->src.path = src_path;
	j->ver.path = tmp_path;

	if (content_hash_init(&j->ch, expected_id, size) < 0 || sample_hash_init(&j->sh, size) < 0 ||
	    content_hash_init(&j->vh, NULL, size) < 0 ||
	    posix_memalign((void **)&mem, ALIGN, (nsrc + nver) * stride) != 0) {
		mem = NULL;
		job_fail(j, -ENOMEM, "out of memory");
		goto out;
	}
	if (open_source(j, src_path) < 0)
		goto out;

	j->ver.fd = open(tmp_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (j->ver.fd < 0) {
		if (errno == EEXIST)
			job_fail(j, -EEXIST, "%s already exists", tmp_path);
		else
			job_fail_write(j, -errno, "cannot create");
		goto out;
	}
	created = 1;
	/* set after creation: a filesystem without direct I/O may create the
	 * file and only then refuse an O_DIRECT open */
	j->ver.direct = try_direct(j->ver.fd);
	if (size && fallocate(j->ver.fd, 0, 0, (off_t)round_up(size, ALIGN)) < 0 &&
	    errno != EOPNOTSUPP && errno != ENOSYS) {
		job_fail_write(j, -errno, "cannot reserve space for");
		goto out;
	}

	stream_init(&j->src, j->src.fd, src_path, j->slots, nsrc, mem, stride);
	stream_init(&j->ver, j->ver.fd, tmp_path, j->slots + nsrc, nver, mem + nsrc * stride, stride);
	/* about 32 syncs per file: a short tail to re-read after the last
	 * one, and few journal commits */
	j->seg = round_up(size / 32, CHUNK);
	j->seg = j->seg < SEG_MIN ? SEG_MIN : j->seg > SEG_MAX ? SEG_MAX : j->seg;
	j->rate = (double)bw_limit;
	clock_gettime(CLOCK_MONOTONIC, &j->last);
	eng_init(&j->eng, size);
	if (size >= FIXED_MIN)
		eng_fixed(&j->eng, mem, (nsrc + nver) * stride);
	if (getenv("WFS_FETCH_PROFILE") && (j->prof = calloc(1, sizeof(*j->prof)))) {
		j->hs.prof = 1;
		j->prof->t0 = mono_ns();
		j->prof->cpu0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
	}
	if (j->ch.md && size >= CHUNK) /* less is hashed here at once */
		hasher_start(&j->hs, &j->ch);
	job_run(j);
	res->owed_ns = throttle_owed_ns(j);
	hasher_stop(&j->hs, j->err != 0);
	if (j->prof)
		prof_report(j);

	if (!j->err) {
		char copy[33];

		content_hash_final(&j->vh, copy, NULL);
		if (strcmp(copy, res->xxh) != 0)
			job_fail(j, -EIO, "copy does not match source (xxh %s vs %s)", res->xxh, copy);
	}
out:
	err = j->err;
	if (err && created)
		unlink(tmp_path);
	job_free(j, mem);
	if (!err)
		res->reason[0] = '\0';
	return err;
}

int fetch_hash_file(const char *path, char xxh_hex[33], struct fetch_progress *prog)
{
	struct fetch_result scratch;
	struct stat st;
	struct job *j;
	unsigned char *mem = NULL;
	unsigned nver;
	size_t stride;
	int fd, err;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	err = fstat(fd, &st) < 0 ? -errno : !S_ISREG(st.st_mode) ? -EINVAL : 0;
	if (err) {
		close(fd);
		return err;
	}
	j = job_new((uint64_t)st.st_size, prog, &scratch);
	if (!j) {
		close(fd);
		return -ENOMEM;
	}
	j->ver.fd = fd;
	nver = slots_for(j->size, NVER);
	stride = slot_bytes(j->size);
	if (content_hash_init(&j->vh, NULL, j->size) < 0 ||
	    posix_memalign((void **)&mem, ALIGN, nver * stride) != 0) {
		mem = NULL;
		job_free(j, mem);
		return -ENOMEM;
	}
	j->ver.direct = try_direct(fd);
	if (!j->ver.direct)
		posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	stream_init(&j->ver, fd, path, j->slots, nver, mem, stride);
	j->ver.limit = j->size;
	eng_init(&j->eng, j->size);
	if (j->size >= FIXED_MIN)
		eng_fixed(&j->eng, mem, nver * stride);
	job_run(j);
	err = j->err;
	if (!err)
		content_hash_final(&j->vh, xxh_hex, NULL);
	job_free(j, mem);
	return err;
}
