/* hash.h - the hashes that decide whether a local copy may serve reads.
 *
 * Three questions, three hashes:
 *   - is the local copy the bytes we read?    XXH3-128 of the whole content
 *     (fast enough to run on every copy and every scrub);
 *   - are those the bytes the hub named?       the blob's own content address:
 *     SHA-256 for 64-hex names (LFS), git blob SHA-1 for 40-hex names;
 *   - is the NAS file still the one we copied? a sampled XXH3-128 (size plus
 *     head, middle and tail), cheap enough to re-check at every start-up,
 *     because NFS mtimes cannot be trusted.
 *
 * Every hex string is lower case.  An XXH3-128 hex string is the canonical
 * (big-endian) form, the same text `xxhsum -H2` / `xxh128sum` prints.
 * Functions that fail return -errno and never exit.
 */
#ifndef WFS_HASH_H
#define WFS_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "path.h"

struct XXH3_state_s;
struct evp_md_ctx_st;

/* XXH3-128 (seed 0) of @n bytes at @p, as 32 hex digits.  Returns 0. */
int xxh128_hex_of(const void *p, size_t n, char out[33]);

/* Is @s such a string: exactly 32 lower-case hex digits?  What the index
 * says of a copy is checked with it before it is believed (a hand-edited
 * or damaged index may hold anything valid JSON can). */
int xxh128_hex_valid(const char *s);

/* Hashes one stream once, computing every hash its name calls for. */
struct content_hash {
	struct XXH3_state_s *xxh;
	struct evp_md_ctx_st *md;  /* NULL when the name is not a content address */
	enum hub_id_kind kind;
	char expected[65];         /* the expected id, when kind != HUB_ID_NONE */
	char id_hex[65];           /* after final: the computed address, or "" */
};

/* Start hashing a stream of @size bytes whose blob name is @expected_id
 * (NULL, "" or any name: only a 64/40 lower-hex name is checked).  The size
 * matters for a git blob SHA-1, which covers "blob <size>\0" first.  On error
 * (-ENOMEM, -EIO) nothing needs freeing. */
int content_hash_init(struct content_hash *h, const char *expected_id, uint64_t size);

/* Feed the next @n bytes of the stream, in order. */
void content_hash_update(struct content_hash *h, const void *buf, size_t n);

/* The same, one hash at a time: _xxh feeds the XXH3-128 only, _id the
 * content address only (nothing when h->md is NULL).  Each must see every
 * byte of the stream in order; the two may run on different threads (they
 * share no state), and content_hash_final() may run only once both are done
 * and their effects visible to its thread (joined, or a release/acquire). */
void content_hash_update_xxh(struct content_hash *h, const void *buf, size_t n);
void content_hash_update_id(struct content_hash *h, const void *buf, size_t n);

/* Finish: @xxh_hex gets the XXH3-128 of the stream; @id_matches (may be
 * NULL) gets 1 when the content address matches, 0 when it does not, -1 when
 * the name is not a content address.  h->id_hex then holds the address
 * computed.  Call once; content_hash_free() is still needed. */
int content_hash_final(struct content_hash *h, char xxh_hex[33], int *id_matches);

/* Release the hash state; safe on a zeroed struct and after final. */
void content_hash_free(struct content_hash *h);

/* The source identity (see source_sample) computed from a stream of bytes
 * fed in offset order; the fetcher uses it to sample the bytes it already
 * reads instead of reading the regions again. */
#define SAMPLE_REGION ((uint64_t)64 * 1024)

struct sample_hash {
	struct XXH3_state_s *xxh;
	uint64_t off[3], len[3];   /* the regions sampled, in order, disjoint */
	int n;
};

int sample_hash_init(struct sample_hash *s, uint64_t size);
/* Feed bytes [@off, @off + @n) of the file; calls must be in offset order
 * (gaps are fine: only the sampled regions are used). */
void sample_hash_feed(struct sample_hash *s, uint64_t off, const void *buf, size_t n);
int sample_hash_final(struct sample_hash *s, char out[33]);
void sample_hash_free(struct sample_hash *s);

/* The identity of a source file of @size bytes, read from @fd with pread
 * (a buffered fd: the regions are not block-aligned):
 *
 *   XXH3-128( size as 8 little-endian bytes
 *             || bytes [0, 64 KiB)                         head
 *             || bytes [(size - 64 KiB) / 2, +64 KiB)       middle
 *             || bytes [size - 64 KiB, size) )              tail
 *
 * For size <= 192 KiB the regions would overlap, so the whole content is
 * hashed after the size instead.  The size is in the hash so that two files
 * of different sizes never share a sample.  Returns 0, -errno from pread, or
 * -ENODATA when the file holds fewer than @size bytes. */
int source_sample(int fd, uint64_t size, char out[33]);

#endif
