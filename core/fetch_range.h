/* fetch_range.h - the verified copy of one byte range of a NAS file into
 * a partial copy (store_part.c), the range counterpart of fetch_copy_verify.
 *
 * The bytes are read once from the source, hashed (XXH3-128) in offset
 * order as read, and written at the same offsets into the partial copy;
 * the written range is made durable, its pages dropped, read back from the
 * disk and hashed again; the two hashes must be equal.  The source's
 * identity (hash.h, source_sample: size plus head, middle and tail) is
 * taken by the same call, so a range and the identity it is kept under
 * come from one open of the source.  A range has no content address of
 * its own: what proves it is the NAS's bytes is the identity, re-checked
 * as for whole copies (store_verify.c).
 *
 * Blocking, for a worker thread; one 1 MiB buffer; plain pread/pwrite
 * (ranges are written where they belong, which the fetcher's O_DIRECT
 * pipeline, built for whole files, does not do).
 */
#ifndef WFS_FETCH_RANGE_H
#define WFS_FETCH_RANGE_H

#include "fetch.h"

#include <stdint.h>

/* Copy bytes [@off, @off + @len) of @src_path, a regular file of @size
 * bytes, into @dst_fd (open read-write; its size is the caller's, at least
 * @off + @len) at the same offsets, and verify them.
 *   - @src_path is absolute and physical and opened with nas_open(NULL, ..)
 *     (nasopen.h): a link in any component is refused (-ELOOP);
 *   - the source must be @size bytes when opened, and after the last read
 *     the same file unchanged (inode, size, mtime, ctime: a rewrite in
 *     place at the same size shows only in the times), else -ESTALE; the
 *     sample is taken between the two looks; @off + @len <= @size (-EINVAL);
 *   - @bw_limit (bytes/s, 0 none) caps the source reads, or prog->rate
 *     once set (fetch.h), the first chunk read at once: res->owed_ns is
 *     how far the call ran ahead of the cap, for the caller to wait out
 *     before its next (fetch.h); @prog (may be NULL) counts bytes written
 *     and may cancel (-ECANCELED);
 *   - durability: fdatasync(@dst_fd) before the re-read.
 * Returns 0 with res->xxh the XXH3-128 of the range and res->sample the
 * source's identity; or -errno with res->reason saying why:
 *   -EIO        the range read back differs from what was read, or a short
 *               write
 *   -ESTALE     the source is not @size bytes, or changed while read
 *   -ENOSPC     no space left for the range (-EDQUOT: quota)
 *   -ECANCELED  prog->cancel was set
 *   other       the -errno of the failing call; a failed source read sets
 *               res->src_err and names the offset.
 * Bytes of the range written before a failure are the caller's to discard
 * (they never serve: the caller records only verified ranges). */
int fetch_range_verify(const char *src_path, uint64_t size, int dst_fd, uint64_t off,
		       uint64_t len, uint64_t bw_limit, struct fetch_progress *prog,
		       struct fetch_result *res);

/* Read the whole of the NAS file @src_path (@size bytes) and hash it as
 * fetch_copy_verify hashes a source -- res->xxh, res->sample and, when
 * @expected_id is a content address, res->id_check -- writing nothing: for
 * a blob whose bytes may be a local copy's already (the store compares
 * res->xxh with it).  Opened, sized, throttled (@bw_limit, or prog->rate
 * once set, as fetch_copy_verify), counted and cancelled (@prog, may be
 * NULL) as fetch_range_verify; returns 0, or
 * -EBADMSG (the content address does not match), -ESTALE (not @size bytes,
 * or changed while read, as fetch_range_verify), -ECANCELED, -EINVAL (not a regular file), or the -errno of
 * the open or a read (res->src_err set, res->reason naming the offset). */
int fetch_hash_source(const char *src_path, uint64_t size, const char *expected_id,
		      uint64_t bw_limit, struct fetch_progress *prog, struct fetch_result *res);

/* XXH3-128 of bytes [@off, @off + @len) of @fd, read from the disk: by a
 * second descriptor of the file opened O_DIRECT (the 4 KiB blocks that
 * cover the range), or, where the filesystem takes no O_DIRECT, buffered
 * after the range's pages are dropped.  0, or -errno (-EIO: short). */
int fetch_hash_range(int fd, uint64_t off, uint64_t len, char xxh_hex[33]);

/* Hash the whole of @path (@size bytes; read from the disk: O_DIRECT where
 * the filesystem allows it, else its pages dropped) as fetch_copy_verify
 * hashes a source: res->xxh (XXH3-128), res->sample (its identity) and,
 * when @expected_id is a content address, res->id_check.  For a partial
 * copy that covers its blob: adopted as the blob's copy without copying.
 * Returns 0, -EBADMSG (the content address does not match), -EIO (shorter
 * than @size), or the -errno of open or read. */
int fetch_verify_file(const char *path, uint64_t size, const char *expected_id,
		      struct fetch_result *res);

#endif
