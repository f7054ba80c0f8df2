/* fetch_int.h - internal to the fetch files (fetch.c, fetch_pipeline.c,
 * fetch_engine.c, fetch_hasher.c); nothing else includes it (the interface
 * is fetch.h).
 *
 * fetch.c owns the job: its set-up, fetch_copy_verify() and
 * fetch_hash_file(), its failure record and the profile report
 * (WFS_FETCH_PROFILE).  fetch_pipeline.c owns the pipeline (the source and
 * verification streams over one ring of slots, the syncs, the throttle);
 * the design is described at its top.  fetch_engine.c owns the engine: the
 * operations on io_uring, or the same operations done synchronously.
 * fetch_hasher.c owns the content-address hasher, the thread that hashes
 * the source slots.  This header holds what they share: the sizes, the
 * slot, stream, hasher, engine, profile and job structures, and the
 * functions each offers the others.
 */
#ifndef WFS_FETCH_INT_H
#define WFS_FETCH_INT_H

#include "clock.h"
#include "fetch.h"
#include "hash.h"

#include <limits.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#define CHUNK ((size_t)1 << 20)
#define ALIGN FETCH_DIO_ALIGN
/* source slots: reads in flight, chunks waiting for the hasher, writes in
 * flight (a write of 1 MiB into fallocated space takes several ms) */
#define NSRC 16
#define NVER 8  /* verification reads in flight */
/* room for the over-read that shows a source longer than expected */
#define SLOT_BYTES (CHUNK + ALIGN)
#define MAX_OPS (NSRC + NVER + 4)
/* Files shorter than this take plain buffers: registering the slots (a
 * chunk's pages pinned per slot, up to 24 MiB, ~1-5 ms here) costs more
 * than a few chunks' copy saves, and a hub has many small files (configs, tokenizers). */
#define FIXED_MIN ((uint64_t)8 * CHUNK)

enum { OP_READ = 0, OP_WRITE = 1, OP_SYNC = 2, OP_WAKE = 3 };
enum { SLOT_FREE, SLOT_READING, SLOT_READY, SLOT_WRITING, SLOT_WRITTEN };

/* WFS_FETCH_PROFILE: where the time of a copy goes (fetch.c reports it) */
struct prof {
	int64_t t0, cpu0;
	int64_t hash_here;  /* this thread hashing the source (no hasher) */
	int64_t hash_ver;   /* this thread hashing the re-read */
	int64_t wait;       /* this thread waiting for the ring or the hasher */
	int64_t sync_t, sync_sum, final_t, final_sum;
	unsigned syncs, waits;
};

struct slot {
	struct stream *st;
	unsigned char *buf;
	uint64_t off;   /* file offset of buf[0] */
	size_t want;    /* bytes of the file this slot carries */
	size_t got;     /* bytes moved so far by the current operation */
	int state;
	int direct;     /* the current operation was issued with O_DIRECT */
};

struct stream {
	int fd;
	int direct;
	int is_src;
	const char *path;
	struct slot *slots;
	unsigned n;
	uint64_t sub;    /* next offset to read */
	uint64_t hashed; /* next offset to hash */
	uint64_t done;   /* source: next offset not yet written */
	uint64_t limit;  /* reads stop here (verification: the durable prefix) */
};

/* The hasher: when the blob's name is a content address, the source bytes
 * are hashed (content address and XXH3-128) on a thread of their own.  The
 * copying thread hands it each source slot as soon as the slot is read, in
 * offset order, and issues the slot's write at the same time; the hasher
 * hashes the slots in the order handed, so each hash sees the bytes in
 * offset order exactly as read.  Nothing writes to a slot's buffer while the
 * hasher holds it: a source slot is reused only once it is both written and
 * hashed (done).  While the copying thread waits for the hasher it keeps a
 * read of an eventfd in flight, which the hasher writes to once it is a few
 * slots further (hasher_wait), so one wait serves the ring and the hasher.
 * Without a content address, XXH3 alone is cheap enough for the copying
 * thread. */
struct hasher {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct slot *q[NSRC];   /* handed over, oldest first (lock) */
	unsigned head, n;       /* (lock) */
	int stop;               /* no more slots will come (lock) */
	_Atomic int abort;      /* the copy failed: only drain the queue */
	_Atomic uint64_t done;  /* bytes [0, done) of the source are hashed */
	_Atomic uint64_t wake_at; /* write efd once done reaches it (0: no) */
	struct content_hash *ch;
	int efd;
	int started;            /* running (until hasher_stop) */
	int ran;
	/* copying thread only */
	uint64_t posted;        /* bytes handed over */
	uint64_t seen;          /* done, when src_reap() last looked */
	int waiting;            /* a read of efd is in flight */
	uint64_t efd_buf;
	int prof;
	int64_t idle_ns, cpu_ns, rq_ns;  /* with prof: read after the join */
};

struct engine {
	struct io_uring ring;
	int uring;
	int fixed;  /* the slot memory is registered with the ring: buffer 0 */
	/* without io_uring, operations run at submission; their results wait here */
	struct {
		uint64_t ud;
		int res;
	} q[MAX_OPS];
	unsigned qh, qn;
	unsigned inflight;
};

struct job {
	struct engine eng;
	struct stream src, ver;   /* ver.fd is the copy (or the scrubbed file) */
	struct stat src_st;       /* the source as opened: it must be so at the end */
	struct slot slots[NSRC + NVER];
	uint64_t size;
	int copying;              /* fetch_copy_verify, not fetch_hash_file */
	uint64_t seg;             /* make the copy durable every this many bytes */
	uint64_t sync_asked;
	unsigned syncs;           /* syncs in flight */
	int finalized;            /* source fully written; final fsync issued */
	int final_synced;
	struct content_hash ch;   /* source bytes: xxh + content address (hasher) */
	struct sample_hash sh;
	struct content_hash vh;   /* bytes read back */
	struct hasher hs;
	double rate, tokens;
	struct timespec last;
	int64_t wait_ns;          /* > 0: reads wait this long for tokens */
	struct fetch_progress *prog;
	struct fetch_result *res;
	char dir[PATH_MAX];
	int err;
	int ring_broken;          /* the ring failed with reads or writes in flight */
	struct prof *prof;        /* WFS_FETCH_PROFILE: where the time goes */
};

static inline size_t round_up(size_t n, size_t a)
{
	return (n + a - 1) / a * a;
}

/* fetch.c: the job fails with -errno @err and a reason (only the first
 * cause is kept); _src: the source itself failed (a NAS error: also in
 * res->src_err); _write: a write to the copy failed ("no space left on
 * <dir>", or @what and the copy's path). */
void job_fail(struct job *j, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void job_fail_src(struct job *j, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void job_fail_write(struct job *j, int err, const char *what);

/* fetch_pipeline.c: drive the job's streams until every byte is copied,
 * made durable and re-read (or, fetch_hash_file, read), or it failed
 * (j->err). */
void job_run(struct job *j);
/* fetch_pipeline.c: after job_run, how long the rate in force still asks
 * before another read (fetch_result.owed_ns). */
uint64_t throttle_owed_ns(const struct job *j);

/* fetch_engine.c: io_uring for a file of @size bytes, unless it is under
 * one CHUNK (or WFS_FETCH_NO_URING, or no ring can be made): then each
 * operation runs at submission. */
void eng_init(struct engine *e, uint64_t size);
void eng_fixed(struct engine *e, void *mem, size_t len);
void eng_exit(struct engine *e);
void eng_rw(struct engine *e, int write, int fd, void *buf, size_t len,
	    uint64_t off, uint64_t ud);
void eng_sync(struct engine *e, int fd, int datasync, uint64_t ud);
void eng_wake(struct engine *e, int fd, uint64_t *buf, uint64_t ud);
int eng_next(struct engine *e, int block, int64_t timeout_ns, uint64_t *ud, int *res);

/* fetch_hasher.c */
int hasher_start(struct hasher *h, struct content_hash *ch);
void hasher_post(struct hasher *h, struct slot *sl);
uint64_t hasher_done(struct hasher *h);
void hasher_stop(struct hasher *h, int abort);

#endif
