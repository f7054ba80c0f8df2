/* test_bandwidth.c - promote_mbps caps the promotion reads from the NAS of
 * all copies together (README, "Mounting"), without mounting: a hub tree on
 * disk, the store's copies timed.  The caps are upper bounds, so each case
 * asserts a lower bound on the time the bytes took (a slow machine only
 * makes it longer), the one chunk each copy may read at once aside:
 *
 *   range    whole copies and a range copy (wfsctl promote --range) at once
 *   auto     an automatic copy and an explicit one at once
 *   raise    an explicit request for a blob whose automatic copy is in
 *            flight: the copy goes on at the explicit rate, not again
 *   small    many copies, and many ranges, each smaller than the chunk a
 *            copy may read at once: the cap holds across them (a worker
 *            waits out what its last copy read ahead of it)
 */
#include "check_store.h"
#include "store.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MiB (1u << 20)
#define CAP 4000000u /* promote_mbps=4 */

static char top[PATH_MAX];
static struct check_count c;

static struct blob *blob_at(struct store *s, const char *rel)
{
	return check_blob(s, top, rel, NULL, 1);
}

/* A store of its own for the case @name: LOCAL_STORE top/local-@name (its
 * path into @local), the NAS files under top/hub/@name. */
static void open_case_store(const char *name, struct store *s, struct store_opts *opt,
			    char *local, size_t lsz)
{
	char rel[PATH_MAX];

	snprintf(rel, sizeof(rel), "hub/%s", name);
	check_mkdirs(top, rel);
	snprintf(rel, sizeof(rel), "local-%s", name);
	check_store_dir(top, rel, local, lsz);
	CHECK(&c, store_open(s, local, opt, NULL) == 0 && store_start(s) == 0, "open");
}

/* Copy @nwhole explicit whole blobs of @whole bytes, @auto_b automatically
 * (0: none), and a range of @range bytes (0: none) at once, under CAP;
 * returns the seconds until all were local. */
static double timed(const char *name, size_t whole, int nwhole, size_t auto_b, size_t range)
{
	struct policy_opts pol;
	struct store_opts opt = { .workers = 2, .policy = &pol, .bw_limit = CAP };
	struct store s;
	struct blob *w[32], *a = NULL, *r = NULL;
	char local[PATH_MAX * 2], rel[PATH_MAX];
	double t0, took;

	policy_opts_init(&pol);
	pol.auto_bw = 0; /* auto_mbps=0: only promote_mbps caps */
	pol.min_free_pct = 0;
	open_case_store(name, &s, &opt, local, sizeof(local));
	for (int i = 0; i < nwhole; i++) {
		snprintf(rel, sizeof(rel), "hub/%s/w%d", name, i);
		check_put_pattern(top, rel, whole, (uint64_t)i + 1);
		w[i] = blob_at(&s, rel);
	}
	if (auto_b) {
		snprintf(rel, sizeof(rel), "hub/%s/auto", name);
		check_put_pattern(top, rel, auto_b, 77);
		a = blob_at(&s, rel);
	}
	if (range) {
		snprintf(rel, sizeof(rel), "hub/%s/range", name);
		check_put_pattern(top, rel, range, 99);
		r = blob_at(&s, rel);
	}
	t0 = check_now_s();
	if (a)
		store_promote(&s, a, 0, 0);
	for (int i = 0; i < nwhole; i++)
		store_promote(&s, w[i], 0, 1);
	if (r)
		CHECK(&c, store_part_request(&s, r, &(struct brange){ 0, range }, 1, 0) ==
		      (int64_t)range, "%s: the range is queued", name);
	for (int i = 0; i < nwhole; i++)
		CHECK(&c, store_wait_settled(&s, w[i], 60000) == BLOB_LOCAL, "%s: w%d local", name, i);
	if (a)
		CHECK(&c, store_wait_settled(&s, a, 60000) == BLOB_LOCAL, "%s: auto local", name);
	if (r)
		wait_parts(&s, r);
	took = check_now_s() - t0;
	store_close(&s);
	policy_opts_free(&pol);
	return took;
}

/* @n ranges of @len bytes, @len apart, of one blob, asked for in one
 * request under CAP; returns the seconds until all were local. */
static double timed_ranges(const char *name, size_t len, int n)
{
	struct policy_opts pol;
	struct store_opts opt = { .workers = 2, .policy = &pol, .bw_limit = CAP };
	struct brange v[32];
	struct store s;
	struct blob *b;
	struct blob_info in;
	char local[PATH_MAX * 2], rel[PATH_MAX];
	double t0, took;

	policy_opts_init(&pol);
	pol.min_free_pct = 0;
	open_case_store(name, &s, &opt, local, sizeof(local));
	snprintf(rel, sizeof(rel), "hub/%s/ranges", name);
	check_put_pattern(top, rel, 2 * len * (size_t)n, 33);
	b = blob_at(&s, rel);
	for (int i = 0; i < n; i++)
		v[i] = (struct brange){ 2 * len * (uint64_t)i, len };
	t0 = check_now_s();
	CHECK(&c, store_part_request(&s, b, v, (size_t)n, 0) == (int64_t)(len * (size_t)n),
	      "%s: the ranges are queued", name);
	CHECK(&c, wait_parts(&s, b), "%s: the ranges copied", name);
	took = check_now_s() - t0;
	blob_info(&s, b, &in);
	CHECK(&c, in.part_bytes == len * (size_t)n, "%s: %llu bytes of ranges verified, not %zu",
	      name, (unsigned long long)in.part_bytes, len * (size_t)n);
	store_close(&s);
	policy_opts_free(&pol);
	return took;
}

/* The whole of @a and @b equal (at most 64 MiB). */
static int same_file(const char *a, const char *b)
{
	size_t n = 64 * MiB, na, nb;
	char *x = malloc(n), *y = malloc(n);
	FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
	int same = x && y && fa && fb && (na = fread(x, 1, n, fa)) == (nb = fread(y, 1, n, fb)) &&
		   !memcmp(x, y, na);

	if (fa)
		fclose(fa);
	if (fb)
		fclose(fb);
	free(x);
	free(y);
	return same;
}

/* An automatic copy of @size bytes at AUTO_RATE, asked for explicitly once
 * it has copied some: the rest goes at an explicit copy's share of
 * promote_mbps @cap (0: none).  Returns the seconds from the request until
 * it was local; the copy must have been made once, its bytes the NAS's. */
#define AUTO_RATE 256000u /* auto_mbps=0.256, one automatic copy at a time */
static double raised(const char *name, size_t size, uint64_t cap, size_t *left)
{
	struct policy_opts pol;
	struct store_opts opt = { .workers = 2, .policy = &pol, .bw_limit = cap };
	struct store s;
	struct blob *a;
	struct blob_info in;
	char local[PATH_MAX * 2], rel[PATH_MAX], nas[PATH_MAX * 2], copy[PATH_MAX * 3];
	double t0, took, end;

	policy_opts_init(&pol);
	pol.auto_bw = AUTO_RATE;
	pol.min_free_pct = 0;
	open_case_store(name, &s, &opt, local, sizeof(local));
	snprintf(rel, sizeof(rel), "hub/%s/auto", name);
	check_put_pattern(top, rel, size, 55);
	snprintf(nas, sizeof(nas), "%s/%s", top, rel);
	a = blob_at(&s, rel);
	store_promote(&s, a, 0, 0);
	/* its first chunk copied: the copy is under way at the automatic rate */
	end = check_now_s() + 60;
	do {
		usleep(2000);
		blob_info(&s, a, &in);
	} while ((in.state == BLOB_QUEUED || (in.state == BLOB_COPYING && !in.bytes_done)) &&
		 check_now_s() < end);
	CHECK(&c, in.state == BLOB_COPYING && in.bytes_done < size, "%s: the automatic copy is "
	      "in flight (state %d, %llu of %zu bytes)", name, (int)in.state,
	      (unsigned long long)in.bytes_done, size);
	*left = size - in.bytes_done;
	t0 = check_now_s();
	store_promote(&s, a, 0, 1);
	CHECK(&c, store_wait_settled(&s, a, 120000) == BLOB_LOCAL, "%s: local", name);
	took = check_now_s() - t0;
	blob_info(&s, a, &in);
	snprintf(copy, sizeof(copy), "%s/%.2s/%s", s.data_dir, in.xxh, in.xxh);
	CHECK(&c, same_file(nas, copy), "%s: the local copy %s holds the NAS bytes", name, copy);
	CHECK(&c, s.started == 1 && s.cancelled == 0 && s.promoted == 1 &&
	      atomic_load(&a->prog.bytes_done) == size, "%s: copied once (%llu started, %llu "
	      "cancelled, %llu bytes written of %zu)", name, (unsigned long long)s.started,
	      (unsigned long long)s.cancelled, (unsigned long long)atomic_load(&a->prog.bytes_done),
	      size);
	store_close(&s);
	policy_opts_free(&pol);
	return took;
}

/* The least time @bytes in @copies copies take under CAP: each copy may
 * start with a burst of one chunk (1 MiB, fetch_pipeline.c). */
static double least_s(double bytes, int copies)
{
	return (bytes - copies * (double)MiB) / CAP;
}

int main(void)
{
	double least, took;

	snprintf(top, sizeof(top), "/var/tmp/wfs-bw-XXXXXX");
	check_tmpdir(top);

	/* two whole copies of 4 MiB and a 4 MiB range */
	least = least_s(12.0 * MiB, 3);
	took = timed("range", 4 * MiB, 2, 0, 4 * MiB);
	fprintf(stderr, "range: %.2f s (the cap: at least %.2f s)\n", took, least);
	CHECK(&c, took >= 0.9 * least, "whole and range copies together read the NAS faster "
	      "than promote_mbps: 12 MiB in %.2f s", took);

	/* an automatic copy of 8 MiB and an explicit one of 4 MiB */
	least = least_s(12.0 * MiB, 2);
	took = timed("auto", 4 * MiB, 1, 8 * MiB, 0);
	fprintf(stderr, "auto: %.2f s (the cap: at least %.2f s)\n", took, least);
	CHECK(&c, took >= 0.9 * least, "automatic and explicit copies together read the NAS "
	      "faster than promote_mbps: 12 MiB in %.2f s", took);

	/* 8 MiB copied automatically (about 30 s at AUTO_RATE), asked for once
	 * under way: the rest at CAP's share for an explicit copy (one of
	 * copy_workers + 1), so no faster than that, and long before the
	 * automatic rate could have */
	{
		size_t left;
		double share = CAP / 3.0, slow;

		took = raised("raise", 8 * MiB, CAP, &left);
		least = ((double)left - MiB) / share;
		slow = ((double)left - MiB) / AUTO_RATE;
		fprintf(stderr, "raise: %.2f s for %zu bytes (the explicit share: at least %.2f s; "
			"the automatic rate: %.2f s)\n", took, left, least, slow);
		CHECK(&c, took >= 0.9 * least, "an automatic copy asked for explicitly reads the "
		      "NAS faster than an explicit copy's share of promote_mbps: %zu bytes in "
		      "%.2f s", left, took);
		CHECK(&c, took < slow / 2, "an automatic copy asked for explicitly goes on at the "
		      "automatic rate: %zu bytes in %.2f s (%.2f s at that rate)", left, took, slow);

		/* no promote_mbps: the rest uncapped */
		took = raised("raise-nocap", 8 * MiB, 0, &left);
		slow = ((double)left - MiB) / AUTO_RATE;
		fprintf(stderr, "raise-nocap: %.2f s for %zu bytes (the automatic rate: %.2f s)\n",
			took, left, slow);
		CHECK(&c, took < slow / 2, "an automatic copy asked for explicitly goes on at the "
		      "automatic rate: %zu bytes in %.2f s (%.2f s at that rate)", left, took, slow);
	}

	/* 24 copies of 256 KiB, each one read at once: the two workers' shares
	 * (CAP / 3 each) hold across their copies, a first burst each aside */
	{
		double bytes = 24.0 * 256 * 1024;

		least = (bytes - 2 * 256 * 1024) / (2 * CAP / 3.0);
		took = timed("small", 256 * 1024, 24, 0, 0);
		fprintf(stderr, "small: %.2f s (the workers' shares: at least %.2f s)\n", took,
			least);
		CHECK(&c, took >= 0.9 * least, "copies smaller than a chunk, one after another, "
		      "read the NAS faster than promote_mbps: %.0f bytes in %.2f s", bytes, took);

		/* and 12 ranges of 256 KiB: the range worker's share (CAP / 3) */
		bytes = 12.0 * 256 * 1024;
		least = (bytes - 256 * 1024) / (CAP / 3.0);
		took = timed_ranges("small-ranges", 256 * 1024, 12);
		fprintf(stderr, "small-ranges: %.2f s (the range worker's share: at least "
			"%.2f s)\n", took, least);
		CHECK(&c, took >= 0.9 * least, "ranges smaller than a chunk, one after another, "
		      "read the NAS faster than promote_mbps: %.0f bytes in %.2f s", bytes, took);
	}

	check_rmtree(top);
	printf("bandwidth: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
