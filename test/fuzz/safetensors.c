/* safetensors.c - fuzz the safetensors header reader: the input is the
 * header's JSON, handed to safetensors_part_mem() with the data at 8 + its
 * length, for every part K of N, N from a hash of the input (1 to 8), and
 * a file size also from the hash: 64 bytes of data (most offsets fall past
 * the end), 1 MiB of data, or 2^64-1 bytes (offsets near 2^63 still fit,
 * the row arithmetic is pushed to its limits).
 *
 * Checked: whether a header is taken does not depend on K of N; a refusal
 * leaves no ranges and says why in printable ASCII; a part is a normalized
 * set (sorted, merged: not even adjacent, no empty range) within [0, size)
 * whose first range covers the header [0, data start); and the parts 1..N
 * together are exactly part 1 of 1 (the header and every tensor whole).
 */
#include "fuzz.h"

#include "safetensors.h"

#define MAX_N 8

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ULL;
	return h;
}

/* A result of safetensors_part_mem: its return code, the ranges and why. */
static void check_result(int r, const struct brange *v, size_t nv, const char *why,
			 uint64_t ds, uint64_t size, unsigned k, unsigned n)
{
	for (const char *p = why; *p; p++)
		FUZZ_ASSERT(*p >= 0x20 && *p < 0x7f, "part %u/%u: why has byte 0x%02x", k, n,
			    (unsigned char)*p);
	if (r < 0) {
		FUZZ_ASSERT(r == -EINVAL || r == -ENOMEM, "part %u/%u: returned %d", k, n, r);
		FUZZ_ASSERT(!v && !nv && *why, "part %u/%u: refused (%d) with ranges or no reason",
			    k, n, r);
		return;
	}
	FUZZ_ASSERT(r == 0 && !*why, "part %u/%u: returned %d, why \"%s\"", k, n, r, why);
	FUZZ_ASSERT(v && nv && v[0].off == 0 && v[0].len >= ds,
		    "part %u/%u: the first range does not cover the header [0, %llu)", k, n,
		    (unsigned long long)ds);
	for (size_t i = 0; i < nv; i++) {
		FUZZ_ASSERT(v[i].len && v[i].off <= size && v[i].len <= size - v[i].off,
			    "part %u/%u: range %zu [%llu,+%llu) empty or past %llu", k, n, i,
			    (unsigned long long)v[i].off, (unsigned long long)v[i].len,
			    (unsigned long long)size);
		FUZZ_ASSERT(i == 0 || v[i].off > v[i - 1].off + v[i - 1].len,
			    "part %u/%u: range %zu not after the one before, apart", k, n, i);
	}
}

static int same(const struct brange *a, size_t na, const struct brange *b, size_t nb)
{
	if (na != nb)
		return 0;
	for (size_t i = 0; i < na; i++)
		if (a[i].off != b[i].off || a[i].len != b[i].len)
			return 0;
	return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint64_t room[] = { 64, 1 << 20 };
	uint64_t h = fnv1a(data, size), ds = 8 + (uint64_t)size, fsize;
	unsigned n = 1 + (unsigned)(h % MAX_N);
	struct brange *whole, *all = NULL;
	size_t nwhole, nall = 0;
	char why[256];
	int r0;

	if (size > 65536)
		return -1;
	fsize = (h >> 8) % 3 == 2 ? UINT64_MAX : ds + room[(h >> 8) % 3];
	r0 = safetensors_part_mem((const char *)data, size, ds, fsize, 1, 1, &whole, &nwhole, why,
				  sizeof(why));
	check_result(r0, whole, nwhole, why, ds, fsize, 1, 1);
	for (unsigned k = 1; k <= n; k++) {
		struct brange *v, *grown;
		size_t nv;
		int r = safetensors_part_mem((const char *)data, size, ds, fsize, k, n, &v, &nv,
					     why, sizeof(why));

		check_result(r, v, nv, why, ds, fsize, k, n);
		/* (running out of memory is the one outcome that may differ) */
		FUZZ_ASSERT((r == 0) == (r0 == 0) || r == -ENOMEM || r0 == -ENOMEM,
			    "part %u/%u: %d, part 1/1: %d", k, n, r, r0);
		if (r)
			continue;
		grown = realloc(all, (nall + nv) * sizeof(*all));
		FUZZ_SETUP(grown, "realloc");
		all = grown;
		memcpy(all + nall, v, nv * sizeof(*v));
		nall += nv;
		free(v);
	}
	if (!r0) {
		nall = brange_normalize(all, nall);
		FUZZ_ASSERT(same(all, nall, whole, nwhole),
			    "the %u parts together (%zu ranges) are not part 1/1 (%zu ranges)", n,
			    nall, nwhole);
	}
	free(all);
	free(whole);
	return 0;
}
