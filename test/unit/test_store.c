/* test_store.c - the store and the control protocol without mounting:
 * promote, verify, restart from the index, demote on a changed source,
 * and requests that must be refused. */
#include "check.h"
#include "control.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char top[PATH_MAX];

static void put(const char *rel, const char *content, size_t n)
{
	char p[PATH_MAX * 2];

	snprintf(p, sizeof(p), "%s/%s", top, rel);
	check_write_file(p, content, n);
}

static enum blob_state wait_settled(struct store *s, struct blob *b)
{
	return store_wait_settled(s, b, 30000);
}

/* What the store says of @b now (a copy: valid until the next call). */
static const struct blob_info *info(struct store *s, struct blob *b)
{
	static struct blob_info in;

	blob_info(s, b, &in);
	return &in;
}

static struct blob *blob_of(struct store *s, const char *rel, const char *id)
{
	char p[PATH_MAX * 2];
	struct stat st;

	snprintf(p, sizeof(p), "%s/%s", top, rel);
	if (stat(p, &st) < 0)
		return NULL;
	return store_blob(s, p, &st, id);
}

static int count_files(const char *dir)
{
	char cmd[PATH_MAX * 2];
	FILE *f;
	int n = -1;

	snprintf(cmd, sizeof(cmd), "find %s -type f | wc -l", dir);
	f = popen(cmd, "r");
	if (f && fscanf(f, "%d", &n) != 1)
		n = -1;
	if (f)
		pclose(f);
	return n;
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
	snprintf(dir, sizeof(dir), "rm -rf %s", top);
	if (system(dir) != 0)
		fprintf(stderr, "could not remove %s\n", top);
	printf("store: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
