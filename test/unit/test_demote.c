/* test_demote.c - when the store demotes a verified copy, without
 * mounting: with the NAS failing, only positive evidence demotes it (a
 * gate that is down, at a check and at start-up), and a local copy that
 * fails a read is demoted and removed; a source whose sampled bytes
 * changed while its size, mtime and ctime stayed those recorded (stale
 * NFS attributes) is found at start-up. */
#include "check_top.h"
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
#include <unistd.h>

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

int main(void)
{
	struct check_count c = {0};
	char dir[PATH_MAX * 2];

	snprintf(top, sizeof(top), "/var/tmp/wfs-demote-XXXXXX");
	check_tmpdir(top);
	snprintf(dir, sizeof(dir), "%s/nas", top);
	mkdir(dir, 0755);
	test_gate(&c);
	test_local_error(&c);
	test_stale_attrs(&c);
	check_rmtree(top);
	printf("demote: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
