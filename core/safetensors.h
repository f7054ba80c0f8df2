/* safetensors.h - the bytes of a safetensors file that rank K of N reads:
 * `wfsctl promote --part K/N` stages only those on local disk.
 *
 * The format: bytes 0..7 hold N, the header length (u64, little-endian);
 * bytes 8..8+N-1 a JSON object (the header); the data starts at 8+N.  Each
 * key but "__metadata__" (an object of string -> string, otherwise
 * ignored) names a tensor: {"dtype": "F32", "shape": [d0, d1, ...],
 * "data_offsets": [begin, end]}, offsets relative to the data start.
 *
 * Part K of N of a file is its header [0, 8+N) plus, for every tensor of
 * R = d0 rows, rows [floor((K-1)*R/N), floor(K*R/N)): the tensor cut along
 * its first dimension into N contiguous parts, as tensor-parallel ranks
 * take it.  Three cases are special:
 *   - a scalar (shape []) has no first dimension: it is whole in every part;
 *   - a tensor of 0 bytes, and a part of 0 rows, add nothing;
 *   - bytes no tensor names (holes between tensors) are in no part.
 *
 * The file may come from a NAS anyone may write while the daemon runs as
 * root, so everything is read from the file's own header and checked,
 * nothing guessed: the header is at most SAFETENSORS_MAX_HEADER bytes (the
 * format's own limit) of strict JSON without duplicate keys; each tensor
 * has a string dtype, a shape of integers >= 0, two integer offsets
 * begin <= end with 8+N+end within the file, and as many bytes as its
 * shape says: product(shape) * size for the dtypes of the table in
 * safetensors.c (BOOL, U8, I8, F8_E4M3, F8_E5M2, I16, U16, F16, BF16, I32,
 * U32, F32, I64, U64, F64); for any other dtype (a packed F4, say) only
 * whole rows ((end - begin) a multiple of d0; none when some dimension is
 * 0; any count for a scalar).  No two tensors share a byte (one of 0 bytes
 * has none to share, wherever it sits).  Keys of a tensor entry other than
 * the three are ignored.  Pure functions but for the pread; thread-safe.
 */
#ifndef WFS_SAFETENSORS_H
#define WFS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "range.h"

/* The longest header read (the format's limit, as safetensors' own reader). */
#define SAFETENSORS_MAX_HEADER 100000000ULL

/* The byte ranges of part @k (1-based) of @n of the safetensors file open
 * for reading on @fd, @size bytes long (its st_size).
 *
 * Preconditions: @fd readable with pread (the header is read with pread
 * only: the file offset never moves, so @fd may be shared); @out, @nout not
 * NULL; @why NULL or room for @wsz bytes.
 *
 * Returns 0 with *@out a malloc'ed set of *@nout ranges (sorted, merged by
 * brange_normalize: never empty, the first starts at 0 and covers the
 * header; the caller frees it), or, with *@out NULL and *@nout 0:
 *   -EINVAL  not a safetensors file, or not one we take: shorter than 8
 *            bytes, a header length past the end of the file, a header
 *            shorter than it says ("truncated header": the file shrank
 *            since @size), not JSON or not an object, a duplicate key, a
 *            bad "__metadata__", a bad tensor entry (any check above); or
 *            @n == 0, @k not in 1..@n
 *   -EFBIG   a header length over SAFETENSORS_MAX_HEADER (nothing more read)
 *   -ENOMEM  out of memory
 *   other    the -errno of a failed pread
 * @why (when not NULL and @wsz > 0) is always set: "" on success, else
 * what is wrong, naming the tensor, in printable ASCII (bytes of the file
 * that are not are shown as '?'). */
int safetensors_part(int fd, uint64_t size, unsigned k, unsigned n,
		     struct brange **out, size_t *nout, char *why, size_t wsz);

/* The same from a header already in memory: the @json_len bytes of JSON
 * at @json (not NUL-terminated), the data starting at @data_start (8 +
 * @json_len in a file), the file @size bytes long; for tests and the
 * fuzzer.  Part @k of @n then includes [0, @data_start) (so the set is
 * empty only when @data_start is 0 and the part has no tensor bytes).
 * Returns as safetensors_part, less the pread errors: -EFBIG when
 * @json_len is over SAFETENSORS_MAX_HEADER (the JSON is not read), -EINVAL
 * when @data_start is past @size. */
int safetensors_part_mem(const char *json, size_t json_len, uint64_t data_start, uint64_t size,
			 unsigned k, unsigned n, struct brange **out, size_t *nout,
			 char *why, size_t wsz);

#endif
