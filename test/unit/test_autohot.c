/* test_autohot.c - when a blob turns hot again, and which names of it the
 * policy looks at, without mounting: a hub tree on disk, the store driven
 * through the calls the daemon makes (store_note_open/read/close).
 *
 *   partial   a blob staged in part turns hot (the policy does not copy
 *             it); once its ranges are evicted, reads from the NAS make it
 *             hot again and it is promoted (its hot flag stayed set, and it
 *             never was)
 *   mismatch  a flagged blob read from the NAS, then fixed on the NAS: its
 *             reads promote it (the same flag kept it on the NAS)
 *   names     a blob in an old revision and the one refs/main names, noted
 *             under the old one's name: the loaded revision's sibling shard
 *             is queued, not the old one's; a blob excluded by another of
 *             its snapshot names than the one noted stays on the NAS
 */
#include "check_store.h"
#include "auto.h"
#include "store.h"
#include "store_int.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KiB 1024u

static char top[PATH_MAX];
static struct check_count c;

/* Wait until the policy thread has dealt with @n hot blobs in all (10 s at
 * most): what it decided is visible then. */
static int wait_handled(struct auto_promoter *a, uint64_t n)
{
	int64_t end = store_now_ms() + 10000;

	while (atomic_load(&a->handled) < n && store_now_ms() < end)
		usleep(2000);
	return atomic_load(&a->handled) >= n;
}

/* A store with automatic promotion past @bytes of NAS reads. */
static void open_auto(struct store *s, struct auto_promoter *ap, struct policy_opts *pol,
		      const char *name, const struct hub_roots *roots, uint64_t bytes)
{
	struct store_opts opt = { .workers = 2, .policy = pol };
	char local[PATH_MAX * 2];

	pol->auto_bytes = bytes;
	pol->auto_opens = 0;
	pol->min_free_pct = 0;
	check_store_dir(top, name, local, sizeof(local));
	CHECK(&c, store_open(s, local, &opt, NULL) == 0 && store_start(s) == 0 &&
	      auto_start(ap, s, roots, pol, NULL) == 0, "%s: open", name);
}

static void close_auto(struct store *s, struct auto_promoter *ap, struct policy_opts *pol)
{
	auto_stop(ap);
	store_close(s);
	policy_opts_free(pol);
}

static void test_partial(void)
{
	struct policy_opts pol;
	struct auto_promoter ap;
	struct store s;
	struct brange r = { 0, 64 * KiB };
	struct blob *b;

	check_mkdirs(top, "hub-p");
	check_put_pattern(top, "hub-p/f.bin", 1024 * KiB, 7);
	policy_opts_init(&pol);
	open_auto(&s, &ap, &pol, "local-p", NULL, 100 * KiB);
	b = check_blob(&s, top, "hub-p/f.bin", NULL, 1);
	CHECK(&c, store_part_request(&s, b, &r, 1, 0) > 0 && wait_parts(&s, b),
	      "partial: a range staged");
	store_note_read(&s, b, 512 * KiB, 0);
	CHECK(&c, wait_handled(&ap, 1) && blob_state(b) == BLOB_NAS,
	      "partial: hot, and not copied whole by the policy (%s)",
	      blob_state_name(blob_state(b)));
	CHECK(&c, store_evict(&s, b, 0) == 1, "partial: its ranges evicted");
	store_note_read(&s, b, 1024 * KiB, 0);
	CHECK(&c, wait_handled(&ap, 2), "partial: hot again from its NAS reads once plain");
	CHECK(&c, store_wait_settled(&s, b, 30000) == BLOB_LOCAL, "partial: then promoted (%s)",
	      blob_state_name(blob_state(b)));
	close_auto(&s, &ap, &pol);
}

static void test_mismatch(void)
{
	struct policy_opts pol;
	struct auto_promoter ap;
	struct store s;
	char sha[65], p[PATH_MAX * 2], q[PATH_MAX * 2];
	struct stat st;
	struct blob *b;

	check_mkdirs(top, "hub-m");
	check_pattern_sha(256 * KiB, 9, sha);
	check_put_pattern(top, "hub-m/f.bin", 256 * KiB, 8); /* not the bytes its name says */
	policy_opts_init(&pol);
	open_auto(&s, &ap, &pol, "local-m", NULL, 100 * KiB);
	b = check_blob(&s, top, "hub-m/f.bin", sha, 1);
	store_note_read(&s, b, 256 * KiB, 0);
	CHECK(&c, wait_handled(&ap, 1) && store_wait_settled(&s, b, 30000) == BLOB_MISMATCH,
	      "mismatch: flagged (%s)", blob_state_name(blob_state(b)));
	store_note_read(&s, b, 256 * KiB, 0); /* the engine goes on reading it from the NAS */
	/* downloaded again, right this time: a new file in its place */
	check_put_pattern(top, "hub-m/f.bin.new", 256 * KiB, 9);
	check_path(p, sizeof(p), top, "hub-m/f.bin");
	check_path(q, sizeof(q), top, "hub-m/f.bin.new");
	CHECK(&c, rename(q, p) == 0 && stat(p, &st) == 0, "mismatch: fixed on the NAS");
	store_source_attrs(&s, b, &st);
	CHECK(&c, blob_state(b) == BLOB_NAS, "mismatch: flag dropped (%s)",
	      blob_state_name(blob_state(b)));
	store_note_read(&s, b, 256 * KiB, 0);
	CHECK(&c, wait_handled(&ap, 2), "mismatch: hot again from its NAS reads");
	CHECK(&c, store_wait_settled(&s, b, 30000) == BLOB_LOCAL, "mismatch: then promoted (%s)",
	      blob_state_name(blob_state(b)));
	close_auto(&s, &ap, &pol);
}

/* models--t--r/snapshots/@rev/@name -> ../../(../)blobs/@blob */
static void snap_link(const char *rev, const char *name, const char *blob)
{
	char rel[PATH_MAX], target[PATH_MAX], dir[PATH_MAX];
	const char *up = strchr(name, '/') ? "../../../" : "../../";

	snprintf(rel, sizeof(rel), "hub-n/models--t--r/snapshots/%s/%s", rev, name);
	snprintf(dir, sizeof(dir), "%.*s", (int)(strrchr(rel, '/') - rel), rel);
	check_mkdirs(top, dir);
	snprintf(target, sizeof(target), "%sblobs/%s", up, blob);
	check_ln(top, target, rel);
}

static void test_names(void)
{
	struct policy_opts pol;
	struct hub_roots roots = { 0 };
	struct auto_promoter ap;
	struct store s;
	struct blob *s1, *s2old, *s2new, *tok;
	char hub[PATH_MAX * 2], err[128];
	struct blob_info in;
	const char *blobs[] = { "s1", "s2old", "s2new", "tok" };

	check_mkdirs(top, "hub-n/models--t--r/blobs");
	check_mkdirs(top, "hub-n/models--t--r/refs");
	for (unsigned i = 0; i < 4; i++) {
		char rel[128];

		snprintf(rel, sizeof(rel), "hub-n/models--t--r/blobs/%s", blobs[i]);
		check_put_pattern(top, rel, 64 * KiB, 40 + i);
	}
	snap_link("OLD", "model-00001-of-00002.safetensors", "s1");
	snap_link("OLD", "model-00002-of-00002.safetensors", "s2old");
	snap_link("NEW", "model-00001-of-00002.safetensors", "s1");
	snap_link("NEW", "model-00002-of-00002.safetensors", "s2new");
	snap_link("NEW", "tokenizer.model", "tok");
	snap_link("NEW", "original/tokenizer.model", "tok");
	check_put(top, "hub-n/models--t--r/refs/main", "NEW");
	check_path(hub, sizeof(hub), top, "hub-n");
	hub_roots_add(&roots, hub);
	policy_opts_init(&pol);
	policy_parse_opt(&pol, "exclude", "*/original/*", err, sizeof(err));
	open_auto(&s, &ap, &pol, "local-n", &roots, 32 * KiB);
	s1 = check_blob(&s, top, "hub-n/models--t--r/blobs/s1", NULL, 1);
	s2old = check_blob(&s, top, "hub-n/models--t--r/blobs/s2old", NULL, 1);
	s2new = check_blob(&s, top, "hub-n/models--t--r/blobs/s2new", NULL, 1);
	tok = check_blob(&s, top, "hub-n/models--t--r/blobs/tok", NULL, 1);

	/* a wfsctl walk of OLD noted this name; the engine loads NEW, whose
	 * link the kernel follows to blobs/s1 */
	store_note_name(&s, s1, "models--t--r/snapshots/OLD/model-00001-of-00002.safetensors");
	store_note_open(&s, s1, "models--t--r/blobs/s1");
	store_note_read(&s, s1, 64 * KiB, 0);
	store_note_close(&s, s1);
	CHECK(&c, wait_handled(&ap, 1), "names: s1 hot");
	CHECK(&c, blob_state(s2new) != BLOB_NAS && blob_state(s2old) == BLOB_NAS,
	      "names: the sibling of refs/main's revision queued (%s), not the old one's (%s)",
	      blob_state_name(blob_state(s2new)), blob_state_name(blob_state(s2old)));

	store_note_name(&s, tok, "models--t--r/snapshots/NEW/tokenizer.model");
	store_note_open(&s, tok, "models--t--r/blobs/tok");
	store_note_read(&s, tok, 64 * KiB, 0);
	store_note_close(&s, tok);
	CHECK(&c, wait_handled(&ap, 2), "names: tok hot");
	blob_info(&s, tok, &in);
	CHECK(&c, in.state == BLOB_NAS && in.hold == HOLD_EXCLUDED && strstr(in.reason, "original"),
	      "names: excluded by its other name (%s, \"%s\")", blob_state_name(in.state),
	      in.reason);
	store_wait_settled(&s, s1, 30000);
	store_wait_settled(&s, s2new, 30000);
	close_auto(&s, &ap, &pol);
}

int main(void)
{
	snprintf(top, sizeof(top), "/var/tmp/wfs-autohot-XXXXXX");
	check_tmpdir(top);
	test_partial();
	test_mismatch();
	test_names();
	check_rmtree(top);
	printf("autohot: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
