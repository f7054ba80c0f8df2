/* test_bandwidth.c - promote_mbps caps the promotion reads from the NAS of
 * all copies together (README, "Mounting"), without mounting: a hub tree on
 * disk, the store's copies timed.  The caps are upper bounds, so each case
 * asserts a lower bound on the time the bytes took (a slow machine only
 * makes it longer), the one chunk each copy may read at once aside:
 *
 *   range    whole copies and a range copy (wfsctl promote --range) at once
 *   auto     an automatic copy and an explicit one at once
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

/* Copy @nwhole explicit whole blobs of @whole bytes, @auto_b automatically
 * (0: none), and a range of @range bytes (0: none) at once, under CAP;
 * returns the seconds until all were local. */
static double timed(const char *name, size_t whole, int nwhole, size_t auto_b, size_t range)
{
	struct policy_opts pol;
	struct store_opts opt = { .workers = 2, .policy = &pol, .bw_limit = CAP };
	struct store s;
	struct blob *w[4], *a = NULL, *r = NULL;
	char local[PATH_MAX * 2], rel[PATH_MAX];
	double t0, took;

	policy_opts_init(&pol);
	pol.auto_bw = 0; /* auto_mbps=0: only promote_mbps caps */
	pol.min_free_pct = 0;
	snprintf(rel, sizeof(rel), "hub/%s", name);
	check_mkdirs(top, rel);
	snprintf(local, sizeof(local), "%s/local-%s", top, name);
	check_mkdirs(top, local + strlen(top) + 1);
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open");
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

	check_rmtree(top);
	printf("bandwidth: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
