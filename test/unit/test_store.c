/* test_store.c - the store and the control protocol without mounting:
 * promote, verify, restart from the index, demote on a changed source,
 * and requests that must be refused; the index when its write fails or
 * a record is malformed, a mismatch in it once found, the fsyncs of a
 * publish, and a copy shared with a blob still to be re-hashed kept (an
 * eviction, a stop that leaves a thread behind).  With the NAS failing, a
 * local copy failing a read, stale NFS attributes: test_demote.c. */
#include "check_top.h"
#include "control.h"
#include "fsyncs.h"
#include "index.h"
#include "nasgate.h"
#include "store.h"
#include "store_int.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int count_rec(void *arg, const struct index_rec *r)
{
	(void)r;
	(*(int *)arg)++;
	return 0;
}

/* The records in the index on disk (-1: unreadable). */
static int index_records(struct store *s)
{
	int n = 0;
	struct index_cb cb = { .arg = &n, .blob = count_rec };

	return index_read(s->index_path, &cb) > 0 ? n : -1;
}

/* The record of @key in the index on disk: its "pinned" (1/0), or -1. */
struct pin_query {
	const char *key;
	int pinned;
};

static int pin_rec(void *arg, const struct index_rec *r)
{
	struct pin_query *q = arg;

	if (!strcmp(r->key, q->key))
		q->pinned = r->pinned;
	return 0;
}

static int index_pinned(struct store *s, const char *key)
{
	struct pin_query q = { key, -1 };
	struct index_cb cb = { .arg = &q, .blob = pin_rec };
	return index_read(s->index_path, &cb) > 0 ? q.pinned : -1;
}

/* The index when its write fails, when a record is malformed, and what a
 * crash between a write and its rename leaves. */
static void test_index_faults(struct check_count *c)
{
	struct store_opts opt = { .workers = 1 };
	struct store s;
	struct blob *x, *y;
	char local[PATH_MAX * 2], p[PATH_MAX * 3], keyx[PATH_MAX * 2];
	/* valid JSON, but 33 bytes: cut to 32 in memory, it is not UTF-8 */
	const char *bad = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\xc3\xa9";

	snprintf(local, sizeof(local), "%s/ilocal", top);
	mkdir(local, 0755);
	put("nas/ix", "index fault x", 13);
	put("nas/iy", "index fault y", 13);
	snprintf(keyx, sizeof(keyx), "%s/nas/ix", top);
	CHECK(c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open");
	x = blob_of(&s, "nas/ix", "ix");
	y = blob_of(&s, "nas/iy", "iy");
	store_promote(&s, x, 0, 1);
	store_promote(&s, y, 0, 1);
	CHECK(c, wait_settled(&s, x) == BLOB_LOCAL && wait_settled(&s, y) == BLOB_LOCAL,
	      "two local");
	CHECK(c, store_sync(&s) == 0 && index_pinned(&s, keyx) == 0, "on disk, unpinned: %d",
	      index_pinned(&s, keyx));

	/* A write that fails (a directory where its temporary file goes) is
	 * tried again: the change is not lost once the disk takes writes. */
	snprintf(p, sizeof(p), "%s/index.json.%d.tmp", local, (int)getpid());
	for (int i = 0; i < 100 && mkdir(p, 0755) < 0 && errno == EEXIST; i++)
		store_sync(&s); /* a worker's write has its temporary file there: let it end */
	CHECK(c, access(p, F_OK) == 0, "the obstacle is in place");
	store_pin(&s, x, 1);
	CHECK(c, store_sync(&s) < 0, "the write fails");
	rmdir(p);
	CHECK(c, store_sync(&s) == 0 && index_pinned(&s, keyx) == 1,
	      "written once it can be: pinned on disk %d", index_pinned(&s, keyx));
	store_close(&s);

	/* A record whose sampled hash is no XXH3 (hand-edited, damaged): the
	 * copy cannot be vouched for, so it goes, said in the log -- and the
	 * index can still be written (it failed every write before). */
	CHECK(c, index_set(s.index_path, keyx, "sample", json_string(bad)) == 0, "index edited");
	/* what a crash between durable_replace's write and rename leaves */
	snprintf(p, sizeof(p), "%s/index.json.99999.tmp", local);
	check_write_file(p, "{", 1);
	snprintf(p, sizeof(p), "%s/record.json.123.tmp", local);
	check_write_file(p, "{", 1);
	snprintf(p, sizeof(p), "%s/index.json.tmp.mine", local);
	check_write_file(p, "{", 1);
	CHECK(c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "reopen");
	x = blob_of(&s, "nas/ix", "");
	y = blob_of(&s, "nas/iy", "");
	CHECK(c, blob_state(x) == BLOB_NAS && blob_state(y) == BLOB_LOCAL,
	      "the malformed record dropped, the other kept: %s %s",
	      blob_state_name(blob_state(x)), blob_state_name(blob_state(y)));
	CHECK(c, store_write_index(&s) == 0, "the index can be written");
	snprintf(p, sizeof(p), "%s/index.json.99999.tmp", local);
	CHECK(c, access(p, F_OK) < 0, "a stale index temporary removed");
	snprintf(p, sizeof(p), "%s/record.json.123.tmp", local);
	CHECK(c, access(p, F_OK) < 0, "a stale record temporary removed");
	snprintf(p, sizeof(p), "%s/index.json.tmp.mine", local);
	CHECK(c, access(p, F_OK) == 0, "a file of another name kept");
	store_close(&s);
}

/* Two blobs of @local share a copy (its xxh into @xxh); in the index, a's
 * record proves it and b's does not (copy_ino changed): at the next open,
 * a is local and b to be re-hashed (COPYING, reverify) until the sweep. */
static void shared_one_unproven(struct check_count *c, const char *local, char *xxh)
{
	struct store_opts opt = { .workers = 1 };
	char key[PATH_MAX * 2];
	struct store s;
	struct blob *a, *b;

	mkdir(local, 0755);
	put("nas/sa", "shared bytes", 12);
	put("nas/sb", "shared bytes", 12);
	CHECK(c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open");
	a = blob_of(&s, "nas/sa", "sa");
	b = blob_of(&s, "nas/sb", "sb");
	store_promote(&s, a, 0, 1);
	CHECK(c, wait_settled(&s, a) == BLOB_LOCAL, "a local");
	store_promote(&s, b, 0, 1);
	CHECK(c, wait_settled(&s, b) == BLOB_LOCAL, "b local");
	snprintf(xxh, 33, "%s", info(&s, a)->xxh);
	CHECK(c, !strcmp(xxh, info(&s, b)->xxh), "one copy for both");
	store_close(&s);
	snprintf(key, sizeof(key), "%s/nas/sb", top);
	CHECK(c, index_set(s.index_path, key, "copy_ino", json_integer(1)) == 0, "index edited");
}

/* Evicting the proven one must leave the file to the other: its re-hash
 * makes it local again. */
static void test_evict_shared_unproven(struct check_count *c)
{
	struct store_opts opt = { .workers = 1 };
	char local[PATH_MAX * 2], copy[PATH_MAX * 3], xxh[33];
	struct store s;
	struct blob *a, *b;

	snprintf(local, sizeof(local), "%s/slocal", top);
	shared_one_unproven(c, local, xxh);
	/* not started: b's re-hash waits for the sweep */
	CHECK(c, store_open(&s, local, &opt, NULL) == 0, "reopen");
	a = blob_of(&s, "nas/sa", "");
	b = blob_of(&s, "nas/sb", "");
	CHECK(c, blob_state(a) == BLOB_LOCAL && blob_state(b) == BLOB_COPYING,
	      "a proven, b to be re-hashed: %s %s", blob_state_name(blob_state(a)),
	      blob_state_name(blob_state(b)));
	CHECK(c, store_evict(&s, a, 0) == 1, "a evicted");
	snprintf(copy, sizeof(copy), "%s/%.2s/%s", s.data_dir, xxh, xxh);
	CHECK(c, access(copy, F_OK) == 0, "the copy b is re-hashed from is kept");
	CHECK(c, store_start(&s) == 0 && wait_settled(&s, b) == BLOB_LOCAL,
	      "b re-hashed, local: %s (%s)", blob_state_name(blob_state(b)), info(&s, b)->reason);
	store_close(&s);
}

/* A stop that leaves a thread behind (store_leave) while b still waits for
 * its re-hash: b's "copy in flight" is the copy itself, shared with a, and
 * must be kept -- it was unlinked as if a temporary file, and both lost. */
static void test_leave_keeps_unproven(struct check_count *c)
{
	struct store_opts opt = { .workers = 1 };
	char local[PATH_MAX * 2], copy[PATH_MAX * 3], xxh[33];
	struct store s;
	struct blob *a, *b;
	pid_t pid;
	int st = -1;

	snprintf(local, sizeof(local), "%s/llocal", top);
	shared_one_unproven(c, local, xxh);
	pid = fork();
	if (pid == 0) { /* the daemon's last steps: store_leave holds the locks, then exit */
		int ok = store_open(&s, local, &opt, NULL) == 0 &&
			 blob_state(blob_of(&s, "nas/sb", "")) == BLOB_COPYING;

		store_leave(&s);
		_exit(ok ? 0 : 1);
	}
	CHECK(c, pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && !WEXITSTATUS(st),
	      "store_leave with b to be re-hashed (child status %d)", st);
	CHECK(c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "reopen");
	snprintf(copy, sizeof(copy), "%s/%.2s/%s", s.data_dir, xxh, xxh);
	CHECK(c, access(copy, F_OK) == 0, "the shared copy %s kept by store_leave", copy);
	a = blob_of(&s, "nas/sa", "");
	b = blob_of(&s, "nas/sb", "");
	CHECK(c, wait_settled(&s, a) == BLOB_LOCAL && wait_settled(&s, b) == BLOB_LOCAL,
	      "both local after the stop: %s (%s), %s (%s)", blob_state_name(blob_state(a)),
	      info(&s, a)->reason, blob_state_name(blob_state(b)), info(&s, b)->reason);
	store_close(&s);
}

/* A publish that makes data/<xx> makes both it and its entry in data/
 * durable before the index may name the copy: fsyncing data/<xx> alone
 * leaves the directory itself to a power loss (POSIX). */
static void test_publish_syncs(struct check_count *c)
{
	struct store_opts opt = { .workers = 1 };
	const char *xxh = "ab0123456789abcdef0123456789abcd";
	char local[PATH_MAX * 2], tmp[PATH_MAX * 3], sub[PATH_MAX * 3];
	struct store s;

	snprintf(local, sizeof(local), "%s/plocal", top);
	mkdir(local, 0755);
	CHECK(c, store_open(&s, local, &opt, NULL) == 0, "open");
	snprintf(tmp, sizeof(tmp), "%s/copy.part", s.tmp_dir);
	check_write_file(tmp, "x", 1);
	snprintf(sub, sizeof(sub), "%s/ab", s.data_dir);
	fsyncs_watch(1);
	CHECK(c, store_publish(&s, tmp, xxh) == 0, "published");
	fsyncs_watch(0);
	CHECK(c, fsynced(sub), "the new directory %s fsynced", sub);
	CHECK(c, fsynced(s.data_dir), "%s fsynced once %s is made in it", s.data_dir, sub);
	store_close(&s);
}

/* A mismatch is in the index once found: its request's store_sync ran
 * while the copy was still going, and killed before any other change, a
 * restart would forget it (and copy the blob again). */
static void test_mismatch_recorded(struct check_count *c)
{
	enum { N = 2 << 20 };
	struct store_opts opt = { .workers = 1 };
	char local[PATH_MAX * 2], *buf = pattern(N, 9);
	struct store s;
	struct blob *b;

	snprintf(local, sizeof(local), "%s/mlocal", top);
	mkdir(local, 0755);
	put("nas/mbad", buf, N);
	free(buf);
	CHECK(c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open");
	store_set_bw_limit(&s, 2 * N); /* a half each (worker, range worker): ~1 s a copy */
	b = blob_of(&s, "nas/mbad",
		    "1111111111111111111111111111111111111111111111111111111111111111");
	store_promote(&s, b, 0, 1);
	CHECK(c, store_sync(&s) == 0, "the request's sync");
	CHECK(c, wait_settled(&s, b) == BLOB_MISMATCH, "mismatch: %s",
	      blob_state_name(blob_state(b)));
	CHECK(c, store_sync(&s) == 0 && index_records(&s) == 1,
	      "the mismatch in the index on disk: %d records", index_records(&s));
	store_close(&s);
}

/* sha256("hello\n") */
#define HELLO_SHA "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"

int main(void)
{
	struct check_count c = {0};
	struct store_opts opt = { .workers = 2 };
	struct store s;
	struct blob *a, *bad, *big, *same1, *same2, *odd;
	char local[PATH_MAX * 2], reason[512], dir[PATH_MAX * 2], *bigbuf;
	struct hub_roots roots = {0};
	struct control ctl;
	const char *req;
	char *rep;

	snprintf(top, sizeof(top), "/var/tmp/wfs-store-XXXXXX");
	if (!mkdtemp(top))
		return 2;
	snprintf(dir, sizeof(dir), "%s/nas", top);
	mkdir(dir, 0755);
	put("nas/" HELLO_SHA, "hello\n", 6);
	put("nas/bad", "hello\n", 6);
	put("nas/same1", "AAAA", 4);
	put("nas/same2", "BBBB", 4);
	bigbuf = malloc(5 << 20);
	for (int i = 0; i < (5 << 20); i++)
		bigbuf[i] = (char)(i * 7 + i / 4096);
	put("nas/big", bigbuf, 5 << 20);
	snprintf(local, sizeof(local), "%s/local", top);
	mkdir(local, 0755);

	CHECK(&c, store_open(&s, local, &opt, NULL) == 0, "open");
	CHECK(&c, store_start(&s) == 0, "start");
	a = blob_of(&s, "nas/" HELLO_SHA, HELLO_SHA);
	bad = blob_of(&s, "nas/bad", "0000000000000000000000000000000000000000000000000000000000000000");
	big = blob_of(&s, "nas/big", "big");
	same1 = blob_of(&s, "nas/same1", "");
	same2 = blob_of(&s, "nas/same2", "");
	CHECK(&c, a && bad && big && same1 && same2, "blobs");
	CHECK(&c, blob_of(&s, "nas/" HELLO_SHA, "") == a, "one blob per NAS file");
	store_promote(&s, a, 0, 1);
	store_promote(&s, bad, 0, 1);
	store_promote(&s, big, 1, 1);
	store_promote(&s, same1, 0, 0);
	store_promote(&s, same2, 0, 0);
	CHECK(&c, wait_settled(&s, a) == BLOB_LOCAL, "verified: %s", info(&s, a)->reason);
	CHECK(&c, wait_settled(&s, bad) == BLOB_MISMATCH, "mismatch: %s",
	      blob_state_name(info(&s, bad)->state));
	CHECK(&c, strstr(info(&s, bad)->reason, "sha256") != NULL ||
	      strstr(info(&s, bad)->reason, "name") != NULL,
	      "reason names the check: %s", info(&s, bad)->reason);
	CHECK(&c, wait_settled(&s, big) == BLOB_LOCAL, "big: %s", info(&s, big)->reason);
	CHECK(&c, wait_settled(&s, same1) == BLOB_LOCAL && wait_settled(&s, same2) == BLOB_LOCAL,
	      "equal size");
	{
		char x1[33];

		snprintf(x1, sizeof(x1), "%s", info(&s, same1)->xxh);
		CHECK(&c, strcmp(x1, info(&s, same2)->xxh) != 0, "equal size, different copies");
	}
	snprintf(dir, sizeof(dir), "%s/data", local);
	CHECK(&c, count_files(dir) == 4, "four copies, got %d", count_files(dir));
	snprintf(dir, sizeof(dir), "%s/tmp", local);
	CHECK(&c, count_files(dir) == 0, "tmp empty");

	/* A NAS name that is not UTF-8 (JSON strings are): its record too. */
	put("nas/odd\xff\x01name", "odd", 3);
	odd = blob_of(&s, "nas/odd\xff\x01name", "odd\xff");
	store_promote(&s, odd, 0, 1);
	CHECK(&c, wait_settled(&s, odd) == BLOB_LOCAL, "odd name local: %s", info(&s, odd)->reason);

	/* Restart: the index brings every verified copy back without copying. */
	store_close(&s);
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0, "reopen");
	odd = blob_of(&s, "nas/odd\xff\x01name", "");
	CHECK(&c, odd && blob_state(odd) == BLOB_LOCAL && !strcmp(info(&s, odd)->id, "odd\xff"),
	      "a name that is not UTF-8 survives the index: %s",
	      odd ? blob_state_name(blob_state(odd)) : "no blob");
	a = blob_of(&s, "nas/" HELLO_SHA, HELLO_SHA);
	big = blob_of(&s, "nas/big", "big");
	bad = blob_of(&s, "nas/bad", "");
	CHECK(&c, blob_state(a) == BLOB_LOCAL && blob_state(big) == BLOB_LOCAL,
	      "local after restart");
	CHECK(&c, info(&s, big)->pinned, "pin survives restart");
	CHECK(&c, blob_state(bad) == BLOB_MISMATCH, "mismatch flag survives restart");
	CHECK(&c, store_check_source(&s, a) == 1, "source unchanged");

	store_close(&s);
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0, "reopen again");
	a = blob_of(&s, "nas/" HELLO_SHA, HELLO_SHA);
	big = blob_of(&s, "nas/big", "big");
	bad = blob_of(&s, "nas/bad", "");
	same1 = blob_of(&s, "nas/same1", "");
	same2 = blob_of(&s, "nas/same2", "");
	odd = blob_of(&s, "nas/odd\xff\x01name", "");
	CHECK(&c, a && big && bad && same1 && same2 && odd, "blobs after reopen");
	CHECK(&c, blob_state(a) == BLOB_LOCAL && blob_state(big) == BLOB_LOCAL &&
	      blob_state(same1) == BLOB_LOCAL && blob_state(same2) == BLOB_LOCAL &&
	      blob_state(odd) == BLOB_LOCAL && blob_state(bad) == BLOB_MISMATCH,
	      "every record kept: %s %s %s %s %s %s", blob_state_name(blob_state(a)),
	      blob_state_name(blob_state(big)), blob_state_name(blob_state(same1)),
	      blob_state_name(blob_state(same2)), blob_state_name(blob_state(odd)),
	      blob_state_name(blob_state(bad)));
	snprintf(dir, sizeof(dir), "%s/data", local);
	CHECK(&c, count_files(dir) == 5, "five copies kept, got %d", count_files(dir));

	/* Same size, same mtime, different bytes in the sampled head. */
	{
		struct stat st;

		snprintf(dir, sizeof(dir), "%s/nas/big", top);
		stat(dir, &st);
		bigbuf[10] ^= 1;
		put("nas/big", bigbuf, 5 << 20);
		{
			struct timespec ts[2] = { st.st_atim, st.st_mtim };

			utimensat(AT_FDCWD, dir, ts, 0);
		}
	}
	CHECK(&c, store_verify(&s, big, 0, reason, sizeof(reason)) == 1, "verify demotes");
	CHECK(&c, blob_state(big) == BLOB_NAS, "back on the NAS");
	CHECK(&c, store_evict(&s, a, 0) == 1 && blob_state(a) == BLOB_NAS, "evict");

	/* The control protocol refuses what it must. */
	snprintf(dir, sizeof(dir), "%s/nas", top);
	hub_roots_add(&roots, dir);
	memset(&ctl, 0, sizeof(ctl));
	ctl.roots = &roots;
	ctl.store = &s;
	ctl.mount = "/mnt";
	ctl.local = local;
	ctl.owner = 0;
	{
		static const char *const bad_reqs[] = {
			"{", "[]", "{\"op\":42}", "{\"op\":\"nope\"}", "{\"op\":\"promote\",\"paths\":[\"../x\"]}",
			"{\"op\":\"promote\",\"paths\":[\"/etc\"]}", "{\"op\":\"promote\",\"paths\":7}",
			"{\"op\":\"progress\"}", "{\"op\":\"status\",\"path\":\"missing\"}", "",
		};

		for (size_t i = 0; i < sizeof(bad_reqs) / sizeof(*bad_reqs); i++) {
			rep = control_handle(&ctl, bad_reqs[i], strlen(bad_reqs[i]), 0);
			CHECK(&c, rep && strstr(rep, "\"ok\":false"), "%s -> %s", bad_reqs[i], rep);
			free(rep);
		}
	}
	req = "{\"op\":\"evict\",\"paths\":[\"\"]}";
	rep = control_handle(&ctl, req, strlen(req), 1234);
	CHECK(&c, rep && strstr(rep, "EPERM"), "non-owner refused: %s", rep);
	free(rep);
	req = "{\"op\":\"promote\",\"paths\":[\"\"],\"dry_run\":true}";
	rep = control_handle(&ctl, req, strlen(req), 1234);
	CHECK(&c, rep && strstr(rep, "\"ok\":true") && strstr(rep, "bytes_to_copy"), "dry run: %s", rep);
	free(rep);
	req = "{\"op\":\"status\"}";
	rep = control_handle(&ctl, req, strlen(req), 1234);
	CHECK(&c, rep && strstr(rep, "\"ok\":true"), "status: %s", rep);
	free(rep);

	/* One index write per request, however many blobs it touches: pinning
	 * and unpinning a repo of MANY blobs writes the index once each. */
	{
		enum { MANY = 300 };
		uint64_t before;
		char expect[64];

		for (int i = 0; i < MANY; i++) {
			char rel[128], body[32];

			snprintf(rel, sizeof(rel), "nas/models--t--many/blobs/f%03d", i);
			if (i == 0) {
				snprintf(dir, sizeof(dir), "%s/nas/models--t--many", top);
				mkdir(dir, 0755);
				snprintf(dir, sizeof(dir), "%s/nas/models--t--many/blobs", top);
				mkdir(dir, 0755);
			}
			snprintf(body, sizeof(body), "blob %d", i);
			put(rel, body, strlen(body));
		}
		snprintf(expect, sizeof(expect), "\"count\":%d", MANY);
		store_sync(&s); /* what came before is on disk */
		for (int k = 0; k < 2; k++) {
			before = atomic_load(&s.index_writes);
			req = k ? "{\"op\":\"unpin\",\"paths\":[\"models--t--many\"]}"
				: "{\"op\":\"pin\",\"paths\":[\"models--t--many\"]}";
			rep = control_handle(&ctl, req, strlen(req), 0);
			CHECK(&c, rep && strstr(rep, expect), "%s -> %s", req, rep);
			CHECK(&c, atomic_load(&s.index_writes) == before + 1,
			      "%s: one index write, not %llu", req,
			      (unsigned long long)(atomic_load(&s.index_writes) - before));
			free(rep);
		}
	}

	store_close(&s);
	free(bigbuf);
	test_index_faults(&c);
	test_mismatch_recorded(&c);
	test_publish_syncs(&c);
	test_evict_shared_unproven(&c);
	test_leave_keeps_unproven(&c);
	snprintf(dir, sizeof(dir), "rm -rf %s", top);
	if (system(dir) != 0)
		fprintf(stderr, "could not remove %s\n", top);
	printf("store: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
