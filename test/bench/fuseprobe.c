/* fuseprobe.c - what the FUSE transport itself costs on this machine.
 *
 * A one-file FUSE server with nothing behind it but a backing file: every
 * READ is a pread() of that file (O_DIRECT, as wfs reads the NAS) into a
 * buffer of ours, answered over one of two transports:
 *
 *   classic  read() a request from /dev/fuse, writev() the reply (what
 *            libfuse 3.14, and so wfs, does);
 *   splice   classic, but a READ is answered by splice(2): the header
 *            vmspliced into a pipe, the backing file's bytes spliced after
 *            it, the pipe spliced into /dev/fuse with SPLICE_F_MOVE, so the
 *            kernel may move the pages (read O_DIRECT into fresh pages)
 *            into the mount's page cache instead of copying them -- a
 *            reply without the daemon's copy (its pipe of 2 MiB needs
 *            fs.pipe-max-size >= 2097152 or CAP_SYS_RESOURCE);
 *   uring    the kernel's FUSE-over-io_uring (protocol 7.42, kernel >= 6.14
 *            with /sys/module/fuse/parameters/enable_uring set): one queue a
 *            CPU, each served by threads pinned to that CPU, a request read
 *            from and its reply written into buffers registered with the
 *            kernel, the READ's pread() landing in the reply buffer itself.
 *
 * So they differ only in the transport, and a read through one,
 * against the backing file read directly, says what a daemon-served read
 * costs before wfs does any work of its own.  bench.py does not run it;
 * its figures are quoted in the README ("The two NAS routes").
 *
 *   fuseprobe serve classic|splice|uring BACKING MOUNTPOINT   (foreground, until unmounted)
 *   fuseprobe rand FILE COUNT        4 KiB preads at random 4 KiB offsets: IOPS
 *   fuseprobe seq FILE               1 MiB reads start to end: MB/s
 *
 * The FUSE and io_uring layouts are the kernel's include/uapi/linux/fuse.h
 * (7.42) and io_uring.h; the few the system headers lack are fs/fuse_abi.h's.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "fuse_abi.h"

#define PROBE_MAX_WRITE (1u << 20)
#define PROBE_THREADS 4 /* classic: readers of /dev/fuse; uring: threads a queue */
#define NO_REPLY 1

struct probe {
	int devfd;
	int backing;
	struct stat st;
	int uring;
	int splice; /* classic, a READ's reply spliced from the backing file */
	int ncpu;
};

static void fill_attr(const struct probe *p, uint64_t ino, struct fuse_attr *a)
{
	memset(a, 0, sizeof(*a));
	a->ino = ino;
	if (ino == FUSE_ROOT_ID) {
		a->mode = S_IFDIR | 0755;
		a->nlink = 2;
	} else {
		a->mode = S_IFREG | 0444;
		a->nlink = 1;
		a->size = (uint64_t)p->st.st_size;
		a->blocks = (uint64_t)p->st.st_blocks;
	}
	a->blksize = 4096;
}

/* Answer one request: the bytes of the reply's body written to @out (at
 * most @cap), -errno, or NO_REPLY.  @op is the opcode's fixed argument,
 * @payload what follows it (a LOOKUP's name). */
static int handle(struct probe *p, const struct fuse_in_header *in, const void *op,
		  const char *payload, char *out, size_t cap)
{
	switch (in->opcode) {
	case FUSE_LOOKUP: {
		struct fuse_entry_out *e = (void *)out;

		if (in->nodeid != FUSE_ROOT_ID || strcmp(payload, "f"))
			return -ENOENT;
		memset(e, 0, sizeof(*e));
		e->nodeid = 2;
		e->generation = 1;
		e->entry_valid = e->attr_valid = 3600;
		fill_attr(p, 2, &e->attr);
		return sizeof(*e);
	}
	case FUSE_GETATTR: {
		struct fuse_attr_out *a = (void *)out;

		memset(a, 0, sizeof(*a));
		a->attr_valid = 3600;
		fill_attr(p, in->nodeid, &a->attr);
		return sizeof(*a);
	}
	case FUSE_OPEN: {
		struct fuse_open_out *o = (void *)out;

		memset(o, 0, sizeof(*o));
		o->open_flags = FOPEN_KEEP_CACHE;
		return sizeof(*o);
	}
	case FUSE_READ: {
		const struct fuse_read_in *r = op;
		size_t len = r->size < cap ? r->size : cap;
		ssize_t n = pread(p->backing, out, (len + 4095) & ~(size_t)4095, (off_t)r->offset);

		if (n < 0)
			return -errno;
		return (size_t)n < len ? (int)n : (int)len;
	}
	case FUSE_STATFS: {
		struct fuse_statfs_out *s = (void *)out;

		memset(s, 0, sizeof(*s));
		s->st.bsize = s->st.frsize = 4096;
		s->st.namelen = 255;
		return sizeof(*s);
	}
	case FUSE_RELEASE:
	case FUSE_FLUSH:
	case FUSE_RELEASEDIR:
		return 0;
	case FUSE_FORGET:
	case FUSE_BATCH_FORGET:
	case FUSE_INTERRUPT:
		return NO_REPLY;
	default:
		return -ENOSYS;
	}
}

static void *xalign(size_t len)
{
	void *b = NULL;

	if (posix_memalign(&b, 4096, len)) {
		perror("posix_memalign");
		exit(1);
	}
	return b;
}

/* ---- io_uring transport ---- */

struct ring_thread {
	struct probe *p;
	int qid;
	struct io_uring ring;
	struct uring_req_header *hdr;
	char *payload;
};

static void queue_cmd(struct ring_thread *t, unsigned cmd_op, uint64_t commit_id,
		      struct iovec *iov)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&t->ring);
	struct uring_cmd_req *req;

	if (!sqe) { /* one command in flight a ring: never */
		fprintf(stderr, "fuseprobe: queue %d: no free SQE\n", t->qid);
		exit(1);
	}
	memset((char *)sqe, 0, 2 * sizeof(*sqe)); /* an SQE128 slot */
	sqe->opcode = IORING_OP_URING_CMD;
	sqe->fd = t->p->devfd;
	sqe->cmd_op = cmd_op;
	if (iov) {
		sqe->addr = (uint64_t)(uintptr_t)iov;
		sqe->len = 2;
	}
	req = (struct uring_cmd_req *)sqe->cmd;
	req->qid = (uint16_t)t->qid;
	req->commit_id = commit_id;
}

static void *ring_serve(void *arg)
{
	struct ring_thread *t = arg;
	struct iovec iov[2] = {
		{ t->hdr, sizeof(*t->hdr) },
		{ t->payload, PROBE_MAX_WRITE },
	};
	cpu_set_t cpus;

	CPU_ZERO(&cpus);
	CPU_SET(t->qid, &cpus);
	sched_setaffinity(0, sizeof(cpus), &cpus);
	queue_cmd(t, FUSE_ABI_URING_REGISTER, 0, iov);
	for (;;) {
		struct io_uring_cqe *cqe;
		struct fuse_in_header in;
		struct fuse_out_header *oh = (void *)t->hdr->in_out;
		int r;

		if (io_uring_submit_and_wait(&t->ring, 1) < 0 ||
		    io_uring_wait_cqe(&t->ring, &cqe) < 0)
			break;
		r = cqe->res;
		io_uring_cqe_seen(&t->ring, cqe);
		if (r < 0) {
			if (r != -ENOTCONN && r != -ECONNABORTED && r != -ECANCELED)
				fprintf(stderr, "fuseprobe: queue %d: %s\n", t->qid, strerror(-r));
			break;
		}
		memcpy(&in, t->hdr->in_out, sizeof(in));
		t->payload[t->hdr->ent.payload_sz < PROBE_MAX_WRITE ? t->hdr->ent.payload_sz
								  : PROBE_MAX_WRITE - 1] = '\0';
		r = handle(t->p, &in, t->hdr->op_in, t->payload, t->payload, PROBE_MAX_WRITE);
		if (r == NO_REPLY)
			r = 0; /* not expected here: the kernel sends those on /dev/fuse */
		memset(oh, 0, sizeof(*oh));
		oh->unique = in.unique;
		oh->error = r < 0 ? r : 0;
		oh->len = sizeof(*oh) + (uint32_t)(r > 0 ? r : 0);
		t->hdr->ent.payload_sz = r > 0 ? (uint32_t)r : 0;
		queue_cmd(t, FUSE_ABI_URING_COMMIT_AND_FETCH, in.unique, NULL);
	}
	return NULL;
}

static void start_rings(struct probe *p)
{
	for (int q = 0; q < p->ncpu; q++) {
		for (int i = 0; i < PROBE_THREADS; i++) {
			struct ring_thread *t = calloc(1, sizeof(*t));
			pthread_t th;
			int r;

			t->p = p;
			t->qid = q;
			t->hdr = xalign(sizeof(*t->hdr));
			t->payload = xalign(PROBE_MAX_WRITE);
			r = io_uring_queue_init(4, &t->ring, IORING_SETUP_SQE128);
			if (r < 0) {
				fprintf(stderr, "fuseprobe: io_uring_queue_init: %s\n", strerror(-r));
				exit(1);
			}
			pthread_create(&th, NULL, ring_serve, t);
			pthread_detach(th);
		}
	}
}

/* ---- /dev/fuse transport (INIT always comes this way) ---- */

static int reply_init(struct probe *p, const struct fuse_in_header *in,
		      const struct fuse_init_in *ii)
{
	struct fuse_init_out o;
	struct fuse_out_header oh = { .len = sizeof(oh) + sizeof(o), .unique = in->unique };
	struct iovec iov[2] = { { &oh, sizeof(oh) }, { &o, sizeof(o) } };

	memset(&o, 0, sizeof(o));
	o.major = FUSE_KERNEL_VERSION;
	o.minor = ii->minor;
	o.max_readahead = ii->max_readahead;
	o.flags = FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_MAX_PAGES;
	if (ii->flags & FUSE_ABI_INIT_EXT) {
		o.flags |= FUSE_ABI_INIT_EXT;
		if (p->uring) {
			if (!(ii->flags2 & FUSE_ABI_INIT2_OVER_IO_URING)) {
				fprintf(stderr, "fuseprobe: the kernel does not offer FUSE over "
						"io_uring (enable_uring off?)\n");
				return -1;
			}
			o.flags2 = FUSE_ABI_INIT2_OVER_IO_URING;
		}
	}
	o.max_background = 64; /* as wfs */
	o.congestion_threshold = 48;
	o.max_write = PROBE_MAX_WRITE;
	o.time_gran = 1;
	o.max_pages = PROBE_MAX_WRITE / 4096;
	if (writev(p->devfd, iov, 2) < 0) {
		perror("fuseprobe: INIT reply");
		return -1;
	}
	if (p->uring)
		start_rings(p);
	return 0;
}

/* A READ answered by splice: the header vmspliced into a pipe, the
 * backing file's bytes spliced after it (O_DIRECT: copy_splice_read reads
 * them into fresh pages), the pipe spliced into /dev/fuse with
 * SPLICE_F_MOVE, so that the kernel may move those pages into the mount's
 * page cache instead of copying them. */
static int splice_read(struct probe *p, int pfd[2], const struct fuse_in_header *in,
		       const struct fuse_read_in *r)
{
	static __thread struct fuse_out_header oh;
	uint64_t size = (uint64_t)p->st.st_size;
	size_t want = r->offset >= size ? 0 : (size - r->offset < r->size ? size - r->offset : r->size);
	struct iovec iov = { &oh, sizeof(oh) };
	loff_t off = (loff_t)r->offset;
	size_t got = 0;

	oh.unique = in->unique;
	oh.error = 0;
	oh.len = (uint32_t)(sizeof(oh) + want);
	if (vmsplice(pfd[1], &iov, 1, 0) != (ssize_t)sizeof(oh))
		return -errno;
	while (got < want) {
		ssize_t n = splice(p->backing, &off, pfd[1], NULL, ((want - got) + 4095) & ~(size_t)4095,
				   SPLICE_F_MOVE);

		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		got += (size_t)n;
	}
	if (splice(pfd[0], NULL, p->devfd, NULL, sizeof(oh) + want, SPLICE_F_MOVE) < 0)
		return -errno;
	return 0;
}

static void *classic_serve(void *arg)
{
	struct probe *p = arg;
	size_t bufsize = PROBE_MAX_WRITE + 4096;
	char *buf = xalign(bufsize), *out = xalign(PROBE_MAX_WRITE);
	int pfd[2] = { -1, -1 };

	if (p->splice && (pipe2(pfd, O_CLOEXEC) < 0 ||
			  fcntl(pfd[0], F_SETPIPE_SZ, 2 * PROBE_MAX_WRITE) < 0)) {
		perror("fuseprobe: pipe");
		exit(1);
	}
	for (;;) {
		ssize_t n = read(p->devfd, buf, bufsize);
		const struct fuse_in_header *in = (void *)buf;
		struct fuse_out_header oh;
		struct iovec iov[2];
		int r;

		if (n < 0) {
			if (errno == EINTR || errno == ENOENT || errno == EAGAIN)
				continue;
			if (errno != ENODEV)
				perror("fuseprobe: read /dev/fuse");
			exit(0);
		}
		buf[n < (ssize_t)bufsize ? n : (ssize_t)bufsize - 1] = '\0';
		if (in->opcode == FUSE_INIT) {
			if (reply_init(p, in, (const void *)(in + 1)) < 0)
				exit(1);
			continue;
		}
		if (in->opcode == FUSE_DESTROY)
			exit(0);
		if (p->splice && in->opcode == FUSE_READ) {
			if ((r = splice_read(p, pfd, in, (const void *)(in + 1))) < 0) {
				fprintf(stderr, "fuseprobe: splice: %s\n", strerror(-r));
				exit(1);
			}
			continue;
		}
		r = handle(p, in, in + 1, (const char *)(in + 1), out, PROBE_MAX_WRITE);
		if (r == NO_REPLY)
			continue;
		oh.unique = in->unique;
		oh.error = r < 0 ? r : 0;
		oh.len = sizeof(oh) + (uint32_t)(r > 0 ? r : 0);
		iov[0] = (struct iovec){ &oh, sizeof(oh) };
		iov[1] = (struct iovec){ out, r > 0 ? (size_t)r : 0 };
		if (writev(p->devfd, iov, r > 0 ? 2 : 1) < 0 && errno != ENOENT)
			perror("fuseprobe: reply");
	}
	return NULL;
}

static int serve(const char *mode, const char *backing, const char *mnt)
{
	struct probe p = { .uring = !strcmp(mode, "uring"), .splice = !strcmp(mode, "splice"),
			   .ncpu = (int)sysconf(_SC_NPROCESSORS_CONF) };
	char opts[256];
	pthread_t th;

	if (!p.uring && !p.splice && strcmp(mode, "classic")) {
		fprintf(stderr, "fuseprobe: unknown transport %s (classic, splice or uring)\n", mode);
		return 2;
	}
	p.backing = open(backing, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (p.backing < 0 || fstat(p.backing, &p.st) < 0) {
		fprintf(stderr, "fuseprobe: %s: %s\n", backing, strerror(errno));
		return 1;
	}
	p.devfd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	if (p.devfd < 0) {
		perror("fuseprobe: /dev/fuse");
		return 1;
	}
	snprintf(opts, sizeof(opts),
		 "fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other,max_read=%u", p.devfd,
		 PROBE_MAX_WRITE);
	if (mount("fuseprobe", mnt, "fuse.fuseprobe", MS_NOSUID | MS_NODEV | MS_RDONLY, opts) < 0) {
		fprintf(stderr, "fuseprobe: mount %s: %s\n", mnt, strerror(errno));
		return 1;
	}
	for (int i = 1; i < PROBE_THREADS; i++)
		pthread_create(&th, NULL, classic_serve, &p);
	classic_serve(&p);
	return 0;
}

/* ---- the readers ---- */

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int read_file(const char *kind, const char *path, long count)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	char *buf = xalign(1 << 20);
	uint64_t x = 0x9e3779b97f4a7c15ull, bytes = 0;
	double t0;

	if (fd < 0 || fstat(fd, &st) < 0) {
		fprintf(stderr, "fuseprobe: %s: %s\n", path, strerror(errno));
		return 1;
	}
	t0 = now_s();
	if (!strcmp(kind, "rand")) {
		uint64_t pages = (uint64_t)st.st_size / 4096;

		for (long i = 0; i < count; i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			if (pread(fd, buf, 4096, (off_t)((x % pages) * 4096)) != 4096) {
				fprintf(stderr, "fuseprobe: short read of %s\n", path);
				return 1;
			}
		}
		printf("%.0f\n", (double)count / (now_s() - t0));
	} else {
		ssize_t n;

		while ((n = read(fd, buf, 1 << 20)) > 0)
			bytes += (uint64_t)n;
		if (n < 0 || bytes != (uint64_t)st.st_size) {
			fprintf(stderr, "fuseprobe: reading %s: %s\n", path,
				n < 0 ? strerror(errno) : "short");
			return 1;
		}
		printf("%.0f\n", (double)bytes / 1e6 / (now_s() - t0));
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "serve"))
		return serve(argv[2], argv[3], argv[4]);
	if (argc == 4 && !strcmp(argv[1], "rand"))
		return read_file("rand", argv[2], atol(argv[3]));
	if (argc == 3 && !strcmp(argv[1], "seq"))
		return read_file("seq", argv[2], 0);
	fprintf(stderr, "usage: fuseprobe serve classic|splice|uring BACKING MOUNTPOINT\n"
			"       fuseprobe rand FILE COUNT\n"
			"       fuseprobe seq FILE\n");
	return argc == 2 && !strcmp(argv[1], "--help") ? 0 : 2;
}
