/* range.h - byte ranges of one file: the vocabulary of partial copies.
 *
 * A range is [off, off + len) with len > 0.  A "set" is an array of ranges
 * sorted by offset, pairwise disjoint; adjacent ranges may stay apart
 * (each verified copy of a range keeps its own hash, store_part.c).  Pure
 * functions, no I/O, no allocation unless said.
 */
#ifndef WFS_RANGE_H
#define WFS_RANGE_H

#include <stddef.h>
#include <stdint.h>

struct brange {
	uint64_t off, len;
};

/* A verified range of a partial copy, and its bytes' XXH3-128 (the store
 * keeps them, the index records them). */
struct part_range {
	uint64_t off, len;
	char xxh[33];
};

/* Sort @v and merge overlapping or adjacent ranges; zero-length ranges
 * are dropped.  Returns the new count (<= @n). */
size_t brange_normalize(struct brange *v, size_t n);

/* Bytes covered by the set @v (sorted, disjoint). */
uint64_t brange_total(const struct brange *v, size_t n);

/* The parts of [@off, @off + @len) that the set @v (sorted, disjoint)
 * does not cover, in order, written to @out (room for @cap).  Returns the
 * number of gaps (which may exceed @cap: only @cap are written). */
size_t brange_gaps(const struct brange *v, size_t n, uint64_t off, uint64_t len,
		   struct brange *out, size_t cap);

/* The same gaps in an array of their own (malloc'ed: the caller frees
 * it), *@ng of them; NULL with errno ENOMEM. */
struct brange *brange_gaps_alloc(const struct brange *v, size_t n, uint64_t off, uint64_t len,
				 size_t *ng);

/* Does the set @v (sorted, disjoint) cover [@off, @off + @len) whole? */
int brange_covers(const struct brange *v, size_t n, uint64_t off, uint64_t len);

/* Parse a size: decimal digits with an optional K, M, G or T suffix
 * (binary: 1024, 1024^2, ...; "KiB", "MiB", "GiB", "TiB" too).  Returns 0,
 * or -EINVAL (not a number, unknown suffix) / -ERANGE (past 2^64-1). */
int brange_parse_size(const char *s, uint64_t *out);

/* Parse "OFFSET:LENGTH" (each as brange_parse_size; LENGTH > 0).  Returns
 * 0 or -EINVAL / -ERANGE (offset + length past 2^64-1). */
int brange_parse(const char *s, struct brange *out);

#endif
