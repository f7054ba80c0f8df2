/* test_store.c - the store and the control protocol without mounting:
 * promote, verify, restart from the index, demote on a changed source,
 * and requests that must be refused; with the NAS failing: only positive
 * evidence demotes a verified copy (a gate that is down, at a check and at
 * start-up), and a local copy that fails a read is demoted and removed;
 * a source whose sampled bytes changed while its size, mtime and ctime
 * stayed those recorded (stale NFS attributes) is found at start-up. */
#include "check.h"
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

static char top[PATH_MAX];

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
	return check_count_files(dir);
}

static void put_stamped(const char *rel, const char *content, size_t n, time_t mtime)
{
	char p[PATH_MAX * 2];
	struct timespec ts[2] = { { mtime, 0 }, { mtime, 0 } };

	put(rel, content, n);
	snprintf(p, sizeof(p), "%s/%s", top, rel);
	utimensat(AT_FDCWD, p, ts, 0);
}

static void mv(const char *from, const char *to)
{
	char a[PATH_MAX * 2], b[PATH_MAX * 2];

	snprintf(a, sizeof(a), "%s/%s", top, from);
	snprintf(b, sizeof(b), "%s/%s", top, to);
	if (rename(a, b) < 0) {
		perror(a);
		exit(2);
	}
}

static int checked(struct store *s, struct blob *b, int *check_err)
{
	int r;

	pthread_mutex_lock(&s->lock);
	r = b->checked;
	if (check_err)
		*check_err = b->check_err;
	pthread_mutex_unlock(&s->lock);
	return r;
}

static int wait_state(struct blob *b, enum blob_state want, int ms)
{
	int64_t end = store_now_ms() + ms;

	while (blob_state(b) != want && store_now_ms() < end)
		usleep(5000);
	return blob_state(b) == want;
}

static char *pattern(size_t n, unsigned seed)
{
	char *buf = malloc(n);

	if (!buf)
		exit(2);
	check_pattern_fill(buf, n, seed);
	return buf;
}

/* A NAS that cannot be reached never costs a verified copy: a check the
 * gate refuses keeps it serving (unchecked), the sweep checks it once the
 * gate is up again, and a start-up with the gate down does not look at
 * the sources at all; a source really gone (ENOENT) does demote. */
static void test_gate(struct check_count *c)
{
	struct nas_gate g, down;
	struct store_opts opt = { .workers = 1, .gate = &g };
	struct store s;
	struct blob *b1, *b2, *b3;
	char nas[PATH_MAX * 2], local[PATH_MAX * 2], key2[PATH_MAX * 2], data[PATH_MAX * 2];
	char reason[512], *buf = pattern(256 * 1024, 7);
	struct stat st;
	uint64_t gen;
	int err = 0;

	snprintf(nas, sizeof(nas), "%s/gnas", top);
	mkdir(nas, 0755);
	snprintf(local, sizeof(local), "%s/glocal", top);
	mkdir(local, 0755);
	snprintf(data, sizeof(data), "%s/data", local);
	put_stamped("gnas/g1", buf, 256 * 1024, 1000000);
	put("gnas/g2", "g2 bytes", 8);
	put("gnas/g3", "g3 bytes", 8);
	CHECK(c, nas_gate_init(&g, nas, 200, NULL, NULL) == 0, "gate");
	CHECK(c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open with a gate");
	b1 = blob_of(&s, "gnas/g1", "g1");
	b2 = blob_of(&s, "gnas/g2", "g2");
	b3 = blob_of(&s, "gnas/g3", "g3");
	store_promote(&s, b1, 0, 1);
	store_promote(&s, b2, 0, 1);
	store_promote(&s, b3, 0, 1);
	CHECK(c, wait_settled(&s, b1) == BLOB_LOCAL && wait_settled(&s, b2) == BLOB_LOCAL &&
	      wait_settled(&s, b3) == BLOB_LOCAL, "three local through a gate that is up");

	/* Down: the source of g1 changes (same size, new head, new mtime);
	 * the check cannot be made, the verified copy keeps serving. */
	gen = atomic_load(&g.generation);
	nas_gate_set_down(&g, "test: down");
	buf[0] ^= 1;
	put_stamped("gnas/g1", buf, 256 * 1024, 2000000);
	snprintf(nas, sizeof(nas), "%s/gnas/g1", top);
	stat(nas, &st);
	store_source_attrs(&s, b1, &st);
	CHECK(c, store_check_source(&s, b1) == 1 && blob_state(b1) == BLOB_LOCAL,
	      "the gate down: served from the verified copy (%s)", blob_state_name(blob_state(b1)));
	CHECK(c, !checked(&s, b1, &err) && err == -EHOSTDOWN,
	      "left unchecked (%d), the error remembered (%d)", checked(&s, b1, NULL), err);
	CHECK(c, store_check_source(&s, b1) == 1, "again: still served");
	CHECK(c, store_verify(&s, b1, 0, reason, sizeof(reason)) == -EHOSTDOWN &&
	      blob_state(b1) == BLOB_LOCAL && strstr(reason, "not checked"),
	      "wfsctl verify while down: not demoted, said so: %s", reason);

	/* Up again (the prober): the sweep checks it and the changed source
	 * -- positive evidence -- demotes it. */
	CHECK(c, nas_gate_start(&g) == 0, "prober");
	gen = nas_gate_wait_change(&g, gen + 1, 5000);
	CHECK(c, nas_gate_up(&g), "the prober found the NAS up (generation %llu)",
	      (unsigned long long)gen);
	CHECK(c, wait_state(b1, BLOB_NAS, 10000), "the sweep checked it once the NAS was up: %s",
	      blob_state_name(blob_state(b1)));
	CHECK(c, strstr(info(&s, b1)->reason, "sampled hash differs") != NULL, "reason: %s",
	      info(&s, b1)->reason);

	/* A source really gone: ENOENT is evidence (wfsctl verify). */
	mv("gnas/g3", "gnas/g3.away");
	CHECK(c, store_verify(&s, b3, 0, reason, sizeof(reason)) == 1 && blob_state(b3) == BLOB_NAS &&
	      strstr(reason, "vanished"), "a vanished source demotes: %s", reason);
	mv("gnas/g3.away", "gnas/g3");

	/* Start-up with the gate down: g2's source renamed away is not
	 * looked at; its copy is kept and serves. */
	snprintf(key2, sizeof(key2), "%s/gnas/g2", top);
	store_close(&s);
	mv("gnas/g2", "gnas/g2.away");
	CHECK(c, nas_gate_init(&down, top, 200, NULL, NULL) == 0, "a second gate");
	nas_gate_set_down(&down, "test: down at start-up");
	opt.gate = &down;
	CHECK(c, store_open(&s, local, &opt, NULL) == 0, "open with the gate down");
	b2 = store_find(&s, key2);
	CHECK(c, b2 && blob_state(b2) == BLOB_LOCAL && !checked(&s, b2, NULL),
	      "source not looked at: the copy kept, unchecked (%s)",
	      b2 ? blob_state_name(blob_state(b2)) : "no blob");
	CHECK(c, b2 && store_check_source(&s, b2) == 1, "and served");
	CHECK(c, count_files(data) == 1, "its copy still there: %d files", count_files(data));
	store_close(&s);

	/* With the gate up the vanished source is seen (ENOENT): dropped,
	 * its copy removed at load. */
	opt.gate = &g;
	CHECK(c, store_open(&s, local, &opt, NULL) == 0, "open with the gate up");
	b2 = store_find(&s, key2);
	CHECK(c, b2 && blob_state(b2) == BLOB_NAS, "the vanished source dropped the record: %s",
	      b2 ? blob_state_name(blob_state(b2)) : "no blob");
	CHECK(c, count_files(data) == 0, "its copy removed: %d files", count_files(data));
	store_close(&s);
	nas_gate_destroy(&g);
	nas_gate_destroy(&down);
	free(buf);
}

static atomic_int changed_calls;

static void on_changed(void *arg, uint64_t ino)
{
	(void)arg;
	if (ino == 42)
		atomic_fetch_add(&changed_calls, 1);
}

/* A local copy that fails a read: demoted with every blob it serves, the
 * file removed, counted, flagged, and its re-promotion in the backoff. */
static void test_local_error(struct check_count *c)
{
	struct store_opts opt = { .workers = 1 };
	struct store_hooks hooks = { .changed = on_changed };
	struct store s;
	struct blob *x, *y, *z;
	char local[PATH_MAX * 2], data[PATH_MAX * 2];
	const struct blob_info *in;
	int64_t t0;
	unsigned gen;

	snprintf(local, sizeof(local), "%s/llocal", top);
	mkdir(local, 0755);
	snprintf(data, sizeof(data), "%s/data", local);
	put("nas/lx", "shared bytes", 12);
	put("nas/ly", "shared bytes", 12);
	put("nas/lz", "other bytes!", 12);
	CHECK(c, store_open(&s, local, &opt, &hooks) == 0 && store_start(&s) == 0, "open");
	x = blob_of(&s, "nas/lx", "lx");
	y = blob_of(&s, "nas/ly", "ly");
	z = blob_of(&s, "nas/lz", "lz");
	store_promote(&s, x, 0, 1);
	store_promote(&s, y, 0, 1);
	store_promote(&s, z, 0, 1);
	CHECK(c, wait_settled(&s, x) == BLOB_LOCAL && wait_settled(&s, y) == BLOB_LOCAL &&
	      wait_settled(&s, z) == BLOB_LOCAL, "three local");
	CHECK(c, !strcmp(info(&s, x)->xxh, info(&s, y)->xxh) && count_files(data) == 2,
	      "x and y share one copy: %d files", count_files(data));
	blob_set_fs_ino(x, 42);
	blob_set_fs_ino(y, 42);
	store_sync(&s);
	t0 = store_now_ms();
	gen = blob_copy_gen(x);
	CHECK(c, store_local_read_error(&s, x, gen + 1, EIO) == 0 && blob_state(x) == BLOB_LOCAL,
	      "an error of another copy than x's own: nothing to do");
	CHECK(c, store_local_read_error(&s, x, gen, EIO) == 2, "both blobs of the bad file demoted");
	CHECK(c, blob_state(x) == BLOB_NAS && blob_state(y) == BLOB_NAS &&
	      blob_state(z) == BLOB_LOCAL, "x, y on the NAS; z untouched");
	CHECK(c, count_files(data) == 1, "the bad copy removed: %d files", count_files(data));
	in = info(&s, x);
	CHECK(c, in->local_error && in->fail_count == 1 &&
	      in->retry_at_ms >= t0 + STORE_RETRY_FIRST_MS &&
	      in->retry_at_ms <= store_now_ms() + STORE_RETRY_FIRST_MS,
	      "flagged, in its backoff: local_error %d, fail_count %u", in->local_error,
	      in->fail_count);
	CHECK(c, !strcmp(in->reason, "local copy unreadable: Input/output error (demoted; NAS "
			 "bytes from now on)"), "reason: %s", in->reason);
	CHECK(c, atomic_load(&s.local_read_errors) == 1 && atomic_load(&s.demoted) == 2,
	      "counted: %llu local read errors, %llu demoted",
	      (unsigned long long)atomic_load(&s.local_read_errors),
	      (unsigned long long)atomic_load(&s.demoted));
	CHECK(c, atomic_load(&changed_calls) == 2, "the kernel's pages dropped for both: %d",
	      atomic_load(&changed_calls));
	pthread_mutex_lock(&s.lock);
	CHECK(c, s.index_dirty, "the index is behind");
	pthread_mutex_unlock(&s.lock);
	CHECK(c, store_local_read_error(&s, x, gen, -EIO) == 0, "a second report: nothing to do");
	/* an automatic re-promotion waits for the backoff; a user's does not */
	store_promote(&s, x, 0, 0);
	CHECK(c, blob_state(x) == BLOB_NAS, "automatic request held back: %s",
	      blob_state_name(blob_state(x)));
	store_promote(&s, x, 0, 1);
	CHECK(c, wait_settled(&s, x) == BLOB_LOCAL, "a user's request copies at once");
	CHECK(c, blob_copy_gen(x) == gen + 1, "one copy_gen since: %u, was %u", blob_copy_gen(x), gen);
	CHECK(c, store_local_read_error(&s, x, gen, EIO) == 0 && blob_state(x) == BLOB_LOCAL,
	      "a late error of the demoted copy does not demote the new one");
	in = info(&s, x);
	CHECK(c, !in->local_error && !in->fail_count && !in->retry_at_ms && !in->reason[0],
	      "a verified copy clears it all: %d %u", in->local_error, in->fail_count);
	store_close(&s);
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

/* Set @field of @key's record in the index at @path to @v (taken). */
static int index_set(const char *path, const char *key, const char *field, json_t *v)
{
	json_t *root = json_load_file(path, 0, NULL), *o;
	size_t i;
	int found = 0;

	if (!root) {
		json_decref(v);
		return -1;
	}
	json_array_foreach(json_object_get(root, "blobs"), i, o)
		if (!strcmp(json_string_value(json_object_get(o, "key")), key))
			found = !json_object_set(o, field, v);
	json_decref(v);
	found = found && json_dump_file(root, path, 0) == 0;
	json_decref(root);
	return found ? 0 : -1;
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

/* The log lines of a store, one after another (what a user reads). */
static char logged[16384];

static void log_line(void *arg, int prio, const char *msg)
{
	size_t n = strlen(logged);

	(void)arg;
	(void)prio;
	snprintf(logged + n, sizeof(logged) - n, "%s\n", msg);
}

/* The stale-NFS case (DESIGN): while wfs is stopped, a promoted file's
 * bytes change inside a sampled range (the middle 64 KiB) with its size,
 * and the attributes the NAS shows (mtime, ctime) those the index records
 * -- an NFS client with stale attributes.  Here the bytes are changed in
 * place, then the record's mtime and ctime set to the file's new ones (a
 * ctime cannot be set back): at the next start the store sees exactly the
 * attributes it recorded.  The start-up check of the source (the sweep,
 * with no open asking) finds the sampled hash changed: the copy does not
 * serve, the blob is back on the NAS, the reason and the log say why. */
static void test_stale_attrs(struct check_count *c)
{
	enum { N = 1 << 20 };
	struct nas_gate g, g2;
	struct store_opts opt = { .workers = 1, .gate = &g };
	struct store_hooks hooks = { .log = log_line };
	struct store s;
	struct blob *b;
	char nas[PATH_MAX * 2], local[PATH_MAX * 2], key[PATH_MAX * 2], *buf = pattern(N, 11);
	struct stat st;
	off_t at = (N - 64 * 1024) / 2 + 1000; /* in the middle sampled range */
	int fd, same = 0, unchecked = 0;

	snprintf(nas, sizeof(nas), "%s/stalenas", top);
	mkdir(nas, 0755);
	snprintf(local, sizeof(local), "%s/stalelocal", top);
	mkdir(local, 0755);
	snprintf(key, sizeof(key), "%s/stalenas/f", top);
	put("stalenas/f", buf, N);
	CHECK(c, nas_gate_init(&g, nas, 200, NULL, NULL) == 0, "gate");
	CHECK(c, store_open(&s, local, &opt, &hooks) == 0 && store_start(&s) == 0, "open");
	b = blob_of(&s, "stalenas/f", "f");
	store_promote(&s, b, 0, 1);
	CHECK(c, wait_settled(&s, b) == BLOB_LOCAL, "local: %s", blob_state_name(blob_state(b)));
	CHECK(c, store_sync(&s) == 0, "the index on disk");
	store_close(&s);
	nas_gate_destroy(&g);

	/* wfs stopped: 4 KiB of the source change, its size does not */
	for (int i = 0; i < 4096; i++)
		buf[at + i] ^= 0x5a;
	fd = open(key, O_WRONLY);
	CHECK(c, fd >= 0 && pwrite(fd, buf + at, 4096, at) == 4096 && close(fd) == 0,
	      "the source changed in place");
	CHECK(c, stat(key, &st) == 0 && st.st_size == N, "its size kept");
	CHECK(c, index_set(s.index_path, key, "mtime_s", json_integer(st.st_mtim.tv_sec)) == 0 &&
	      index_set(s.index_path, key, "mtime_ns", json_integer(st.st_mtim.tv_nsec)) == 0 &&
	      index_set(s.index_path, key, "ctime_s", json_integer(st.st_ctim.tv_sec)) == 0 &&
	      index_set(s.index_path, key, "ctime_ns", json_integer(st.st_ctim.tv_nsec)) == 0,
	      "the record's source attributes are the file's now");

	/* The next start, the NAS up: what it loads is what the NAS shows. */
	logged[0] = '\0';
	CHECK(c, nas_gate_init(&g2, nas, 200, NULL, NULL) == 0 && nas_gate_up(&g2), "gate up");
	opt.gate = &g2;
	CHECK(c, store_open(&s, local, &opt, &hooks) == 0, "reopen");
	b = store_find(&s, key);
	if (b) {
		pthread_mutex_lock(&s.lock);
		same = b->size == (uint64_t)st.st_size && same_ts(&b->nas_mtime, &st.st_mtim) &&
		       same_ts(&b->nas_ctime, &st.st_ctim);
		unchecked = b->state == BLOB_LOCAL && !b->checked;
		pthread_mutex_unlock(&s.lock);
	}
	CHECK(c, b && same, "loaded: the source's attributes as the NAS shows them now");
	CHECK(c, unchecked, "the copy loaded, its source not trusted unchecked: %s",
	      b ? blob_state_name(blob_state(b)) : "no blob");
	CHECK(c, store_start(&s) == 0, "start");
	CHECK(c, b && wait_state(b, BLOB_NAS, 10000),
	      "the start-up check found the changed bytes: back on the NAS (%s)",
	      b ? blob_state_name(blob_state(b)) : "no blob");
	CHECK(c, b && strstr(info(&s, b)->reason, "sampled hash differs"), "reason: %s",
	      b ? info(&s, b)->reason : "");
	CHECK(c, strstr(logged, "demoted") && strstr(logged, "sampled hash differs"),
	      "said in the log: %s", logged);
	CHECK(c, b && store_check_source(&s, b) == 0, "an open is not served from the copy");
	store_close(&s);
	nas_gate_destroy(&g2);
	free(buf);
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
	test_gate(&c);
	test_local_error(&c);
	test_index_faults(&c);
	test_mismatch_recorded(&c);
	test_publish_syncs(&c);
	test_evict_shared_unproven(&c);
	test_leave_keeps_unproven(&c);
	test_stale_attrs(&c);
	snprintf(dir, sizeof(dir), "rm -rf %s", top);
	if (system(dir) != 0)
		fprintf(stderr, "could not remove %s\n", top);
	printf("store: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
