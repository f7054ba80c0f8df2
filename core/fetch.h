/* fetch.h - the verified copy: NAS file -> local temporary file.
 *
 * A copy is only worth publishing once it is proven equal to what was read
 * and, where the blob's name is a content address, to what the hub named.
 * fetch_copy_verify() does all of that in one pass over the source; the
 * caller only renames the result into the store.
 *
 * Functions return 0 or -errno and never exit.  Both are blocking and meant
 * for a worker thread; another thread may watch or cancel them through
 * struct fetch_progress.  A call holds 1 MiB I/O buffers, 24 for a copy and
 * 8 for a hash, registered with its io_uring where locked memory allows;
 * fetch_copy_verify() of a blob of 1 MiB or more named by a content
 * address also runs one thread of its own for the call (the hasher, below).
 *
 * A file under 1 MiB is copied without io_uring (plain pread/pwrite/fsync,
 * one operation at a time, the same semantics) and hashed on the calling
 * thread: its operations each wait on the one before, and a ring or a
 * thread would add only its own cost.
 *
 * Diagnostics, from the environment: with WFS_FETCH_NO_URING the io_uring
 * pipeline is not used for any file (same as when io_uring is unavailable:
 * plain pread/pwrite with the same semantics, one operation at a time); with
 * WFS_FETCH_PROFILE each fetch_copy_verify() writes one line to stderr: its
 * time and rate, this thread's CPU, hashing and waiting, the hasher's CPU,
 * idle time and time runnable without a CPU, the syncs and the final
 * re-read (test_fetch --bench measures copies with it).
 */
#ifndef WFS_FETCH_H
#define WFS_FETCH_H

#include <stdatomic.h>
#include <stdint.h>

struct fetch_progress {
	_Atomic uint64_t bytes_done;  /* copy: bytes written (and hashed);
				       * hash: bytes hashed */
	_Atomic int cancel;           /* set non-zero to abort (-ECANCELED) */
	_Atomic uint64_t rate;        /* copy, source hash: 0 keeps the call's @bw_limit;
				       * else the cap from the next read on (bytes/s,
				       * FETCH_RATE_NONE: none) -- see fetch_copy_verify */
};

/* prog->rate: no cap from the next read on (0 means "the call's own"). */
#define FETCH_RATE_NONE UINT64_MAX

/* What the copy and its read-back align O_DIRECT buffers, offsets and
 * lengths to: the largest logical block size of a local disk. */
#define FETCH_DIO_ALIGN ((size_t)4096)

/* xxh, sample and id_check are filled once the whole source has been read,
 * so also when the copy fails after that (e.g. -EBADMSG). */
struct fetch_result {
	char xxh[33];     /* XXH3-128 of the source bytes (= of the copy when 0) */
	char sample[33];  /* source_sample() of those same bytes */
	int id_check;     /* 1 content address matches, 0 mismatch, -1 n/a */
	char reason[256]; /* why it failed, for status/doctor/log; "" on success */
	int src_err;      /* -errno of the source's open, read or stat when that is
			   * what failed (a NAS error, for the caller to report to
			   * the NAS gate); 0 otherwise */
	uint64_t owed_ns; /* a capped call: how long the cap still asks before the
			   * next read (a call may read its first chunk at once,
			   * ahead of the cap); 0 without a cap */
};

/* Copy @src_path (@size bytes) to a new file @tmp_path and verify it:
 *   - @tmp_path is created O_EXCL (an existing one gives -EEXIST and is left
 *     alone) and its space reserved with fallocate before the first byte;
 *   - the source is read with several reads in flight (io_uring), hashed in
 *     offset order exactly as read (XXH3-128, source sample, and SHA-256 /
 *     git blob SHA-1 when @expected_id is a 64 / 40 lower-hex content
 *     address; NULL, "" or any other name skips that check) and written.
 *     With a content address, XXH3-128 and the address are computed on a
 *     hasher thread, over the very buffers read, handed over in offset
 *     order; the caller's thread drives the I/O meanwhile, and a buffer is
 *     read into again only once it is both written and hashed;
 *   - the copy is made durable (fdatasync per segment as the copy advances,
 *     fsync at the end) and each durable segment is re-read from the disk with
 *     O_DIRECT, not from the page cache, and hashed with XXH3-128; it must
 *     equal the XXH3-128 of the source read, which proves the durable copy
 *     holds the bytes the content address was computed over;
 *   - the source must hold exactly @size bytes throughout, and be the file
 *     it was when opened at the end (inode, size, mtime and ctime: a
 *     rewrite in place at the same size shows only in the times; the bytes
 *     read would be part old, part new, their hash and sample agreeing);
 *   - @src_path is absolute and physical (the caller resolved every link)
 *     and is opened with nas_open(NULL, ...) (nasopen.h): a link swapped
 *     into any of its components since is refused (-ELOOP), never followed;
 *     a directory, FIFO, socket or device is never read (-EINVAL, "is not
 *     a regular file"); a relative path or a "." or ".." component: -EINVAL.
 * O_DIRECT is used for source reads and copy writes where the filesystem
 * allows it; otherwise buffered I/O, and the pages read are dropped.
 * @bw_limit (bytes/s, 0 = unlimited) caps the source reads until another
 * thread sets prog->rate: from then on that cap holds, looked at before each
 * read and at least every 100 ms of a throttled wait, and the bytes read so
 * far are kept -- a copy sped up (or slowed) mid-way is not started again.
 * prog->rate is 0 when the call starts, unless the caller wants that cap
 * from the first read.  A call may read one chunk (1 MiB) at once, so a copy
 * smaller than that is not slowed at all: res->owed_ns says how long it ran
 * ahead of the cap, and a caller making copies one after another waits that
 * long before its next, so that the cap holds across them (store_copy.c).
 * @prog and @res may be NULL.
 *
 * Returns 0 when verified: @tmp_path is complete, mode 0444, fsynced, left for
 * the caller to rename (and to fsync the directory).  Otherwise @tmp_path is
 * unlinked (unless it already existed), res->reason says why, and:
 *   -EBADMSG    content does not match its name (res->id_check == 0)
 *   -EIO        the copy read back differs from the source, or a short write
 *   -ESTALE     the source is not @size bytes, or changed while copied
 *               ("short read on ... at offset N", or longer, or "changed
 *               during the copy": a new mtime or ctime)
 *   -ENOSPC     "no space left on <dir of @tmp_path>" (-EDQUOT: quota)
 *   -ECANCELED  prog->cancel was set
 *   other       -errno of the failing call (open, read, write, fsync, ...);
 *               a failed source read names the offset ("read error on
 *               <path> at offset N: <error>") and sets res->src_err */
int fetch_copy_verify(const char *src_path, uint64_t size, const char *tmp_path,
		      const char *expected_id, uint64_t bw_limit,
		      struct fetch_progress *prog, struct fetch_result *res);

/* Tests only (NULL otherwise): called on the copying thread each time a
 * longer prefix [0, @durable) of the copy @tmp_path is durable, before any
 * byte of it is re-read; a test damages the copy there to prove the re-read
 * is compared. */
extern void (*fetch_test_durable)(const char *tmp_path, uint64_t durable);

/* Full re-hash of an existing local copy (scrub), read with O_DIRECT where
 * possible (otherwise its cached pages are dropped before reading).  Fills
 * @xxh_hex with the XXH3-128 of the whole file.  @prog may be NULL (when
 * set, bytes_done counts bytes hashed and cancel gives -ECANCELED).  @path
 * is opened O_NOFOLLOW; not a regular file: -EINVAL; short read: -EIO. */
int fetch_hash_file(const char *path, char xxh_hex[33], struct fetch_progress *prog);

#endif
