/* test_startkeep.c - what a restart must keep.
 *
 * A ref pin (wfsctl pin --ref) of a repo whose name is not UTF-8 (NAS
 * names are bytes): the index must still be written, and the pin and the
 * copies made meanwhile be there after a restart.  A pin whose name in a
 * damaged index is longer than a file name's is dropped, not cut short.
 *
 * A copy whose source lies in a further root (-o root=DIR) that is not
 * mounted at start-up (its empty mount point seen): the copy is kept,
 * never dropped as "source vanished"; a source deleted from a root that
 * is mounted still drops its copy.
 *
 * What start-up removes or changes stays inside LOCAL_STORE, and copies a
 * damaged index names survive until the operator has dealt with it.
 */
#include "check.h"
#include "nasgate.h"
#include "resolve.h"
#include "store.h"
#include "store_int.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

static char top[PATH_MAX];

/* The log lines of the store, one after another (what a user reads). */
static char logged[65536];

static void log_line(void *arg, int prio, const char *msg)
{
	size_t n = strlen(logged);

	(void)arg;
	(void)prio;
	snprintf(logged + n, sizeof(logged) - n, "%s\n", msg);
}

static const struct store_hooks hooks = { .log = log_line };

static void put(const char *rel, const char *content)
{
	char p[PATH_MAX * 2];

	snprintf(p, sizeof(p), "%s/%s", top, rel);
	check_write_file(p, content, strlen(content));
}

static struct blob *blob_of(struct store *s, const char *rel)
{
	char p[PATH_MAX * 2];
	struct stat st;

	snprintf(p, sizeof(p), "%s/%s", top, rel);
	if (stat(p, &st) < 0)
		return NULL;
	return store_blob(s, p, &st, strrchr(p, '/') + 1);
}

/* Open the store at @local (with @roots, or none), promote @rel if not
 * NULL and wait for it: its state then. */
static enum blob_state open_promote(struct store *s, const char *local,
				    const struct hub_roots *roots, const char *rel)
{
	struct store_opts opt = { .workers = 1, .roots = roots };
	struct blob *b;

	if (store_open(s, local, &opt, &hooks) != 0 || store_start(s) != 0)
		return BLOB_NAS;
	if (!rel || !(b = blob_of(s, rel)))
		return BLOB_NAS;
	store_promote(s, b, 0, 1);
	return store_wait_settled(s, b, 30000);
}

static enum blob_state state_of(struct store *s, const char *rel)
{
	struct blob *b = blob_of(s, rel);

	return b ? blob_state(b) : BLOB_NAS;
}

static void count_local(void *arg, const struct blob_info *b)
{
	*(size_t *)arg += b->state == BLOB_LOCAL;
}

/* The blobs local now (a blob is looked up by its key, which the files
 * of a root not mounted cannot be stat'ed for). */
static size_t store_count_local(struct store *s)
{
	size_t n = 0;

	store_each(s, count_local, &n);
	return n;
}

/* Add a ref pin of @repo to the index at @path by hand (a damaged one). */
static int index_add_ref(const char *path, const char *repo)
{
	json_t *root = json_load_file(path, 0, NULL);
	int r = -1;

	if (root && json_array_append_new(json_object_get(root, "refs"),
					  json_pack("{s:s, s:s, s:s, s:s}", "repo", repo, "ref",
						    "main", "commit", "", "pending", "")) == 0)
		r = json_dump_file(root, path, 0);
	json_decref(root);
	return r;
}

static void test_ref_names(struct check_count *c)
{
	/* "models--o--" then Latin-1 bytes: a name made on a non-UTF-8 host */
	static const char repo[] = "models--o--m\xe9t\xe9o";
	char local[PATH_MAX * 2], longname[320];
	struct store_ref_rec pin = { 0 }, *got;
	struct store s;
	size_t n = 0;

	snprintf(local, sizeof(local), "%s/local-refs", top);
	mkdir(local, 0755);
	put("hub/a", "copied before the pin");
	put("hub/b", "copied after the pin");
	CHECK(c, open_promote(&s, local, NULL, "hub/a") == BLOB_LOCAL, "a local");
	snprintf(pin.repo, sizeof(pin.repo), "%s", repo);
	snprintf(pin.ref, sizeof(pin.ref), "main");
	snprintf(pin.commit, sizeof(pin.commit), "%040d", 7);
	CHECK(c, store_set_refs(&s, &pin, 1) == 0, "pin set");
	CHECK(c, store_sync(&s) == 0, "the index is written with the pin of a repo whose name "
	      "is not UTF-8");
	store_promote(&s, blob_of(&s, "hub/b"), 0, 1);
	CHECK(c, store_wait_settled(&s, blob_of(&s, "hub/b"), 30000) == BLOB_LOCAL, "b local");
	CHECK(c, store_sync(&s) == 0, "and again, with b");
	store_close(&s);

	CHECK(c, open_promote(&s, local, NULL, NULL) == BLOB_NAS, "reopen");
	got = store_get_refs(&s, &n);
	CHECK(c, got && n == 1 && !strcmp(got[0].repo, repo) && !strcmp(got[0].ref, "main") &&
	      !strcmp(got[0].commit, pin.commit), "the pin is back, its name byte for byte: %zu "
	      "pins", n);
	free(got);
	CHECK(c, state_of(&s, "hub/a") == BLOB_LOCAL && state_of(&s, "hub/b") == BLOB_LOCAL,
	      "both copies kept");
	store_close(&s);

	/* 150 two-byte characters: 300 bytes, longer than any pin is made */
	longname[0] = '\0';
	for (int i = 0; i < 150; i++)
		strcat(longname, "\xc3\xa9");
	CHECK(c, index_add_ref(s.index_path, longname) == 0, "index edited");
	logged[0] = '\0';
	CHECK(c, open_promote(&s, local, NULL, NULL) == BLOB_NAS, "reopen");
	got = store_get_refs(&s, &n);
	CHECK(c, got && n == 1 && !strcmp(got[0].repo, repo), "the too long pin dropped, the "
	      "other kept: %zu pins", n);
	free(got);
	CHECK(c, strstr(logged, "dropped the pin of ref main") != NULL, "said: %s", logged);
	CHECK(c, store_write_index(&s) == 0, "the index can be written");
	CHECK(c, state_of(&s, "hub/a") == BLOB_LOCAL && state_of(&s, "hub/b") == BLOB_LOCAL,
	      "both copies kept");
	store_close(&s);
}

static void test_root_not_mounted(struct check_count *c)
{
	static struct hub_roots roots;
	char local[PATH_MAX * 2], hub[PATH_MAX * 2], extra[PATH_MAX * 2], away[PATH_MAX * 2];
	char reason[512];
	struct store s;
	struct blob *f;

	snprintf(local, sizeof(local), "%s/local-roots", top);
	snprintf(hub, sizeof(hub), "%s/hub", top);
	snprintf(extra, sizeof(extra), "%s/extra", top);
	snprintf(away, sizeof(away), "%s/extra.mounted", top);
	mkdir(local, 0755);
	mkdir(extra, 0755);
	put("extra/f", "a file of the further root");
	put("extra/g", "another file of the further root");
	if (hub_roots_add(&roots, hub) < 0 || hub_roots_add(&roots, extra) < 0) {
		perror("roots");
		exit(2);
	}
	CHECK(c, open_promote(&s, local, &roots, "extra/f") == BLOB_LOCAL, "f local");
	store_promote(&s, blob_of(&s, "extra/g"), 0, 1);
	CHECK(c, store_wait_settled(&s, blob_of(&s, "extra/g"), 30000) == BLOB_LOCAL, "g local");
	f = blob_of(&s, "extra/f");

	/* the further root's filesystem not mounted: its mount point, empty */
	if (rename(extra, away) < 0 || mkdir(extra, 0755) < 0) {
		perror(extra);
		exit(2);
	}
	/* a check while it runs (wfsctl verify; the sweep's and an open's) */
	CHECK(c, store_verify(&s, f, 0, reason, sizeof(reason)) == -ENOLINK &&
	      blob_state(f) == BLOB_LOCAL && strstr(reason, NAS_ROOT_GONE_WHY),
	      "a check keeps the copy and says why: %s: %s", blob_state_name(blob_state(f)), reason);
	store_close(&s);
	logged[0] = '\0';
	open_promote(&s, local, &roots, NULL);
	CHECK(c, store_count_local(&s) == 2, "both copies kept at a start with the root not "
	      "mounted: %zu local; log: %s", store_count_local(&s), logged);
	CHECK(c, strstr(logged, NAS_ROOT_GONE_WHY) != NULL, "said why: %s", logged);
	CHECK(c, !strstr(logged, "vanished"), "nothing said vanished: %s", logged);
	store_close(&s);

	/* mounted again, g deleted from it: g's copy goes, f's stays */
	if (rmdir(extra) < 0 || rename(away, extra) < 0) {
		perror(extra);
		exit(2);
	}
	snprintf(away, sizeof(away), "%s/g", extra);
	unlink(away);
	logged[0] = '\0';
	open_promote(&s, local, &roots, NULL);
	CHECK(c, state_of(&s, "extra/f") == BLOB_LOCAL, "f kept");
	CHECK(c, store_count_local(&s) == 1 && strstr(logged, "source vanished"),
	      "g's copy dropped: %zu local; log: %s", store_count_local(&s), logged);
	store_close(&s);
}

/* The first copy file found under @local/data (its path into @out), or 0. */
static int first_copy(const char *local, char *out, size_t sz)
{
	char cmd[PATH_MAX * 3];
	FILE *f;
	int ok;

	snprintf(cmd, sizeof(cmd), "find %s/data -type f | head -1", local);
	if (!(f = popen(cmd, "r")))
		return 0;
	ok = fgets(out, (int)sz, f) != NULL;
	pclose(f);
	if (ok)
		out[strcspn(out, "\n")] = '\0';
	return ok && *out;
}

/* What start-up removes or changes stays inside LOCAL_STORE: a data/<xx>
 * or a tmp/ that is a link elsewhere has nothing removed through it, and
 * an index.json that is a link does not have its target's mode changed.
 * A damaged index set aside keeps the copies it names in data/ until the
 * operator puts it back (at the next start they were removed as
 * leftovers, for good).  A FIFO as the index does not hang the start. */
static void test_store_stays_inside(struct check_count *c)
{
	char local[PATH_MAX * 2], p[PATH_MAX * 2], q[PATH_MAX * 2], copy[PATH_MAX * 2];
	struct stat st;
	struct store s;

	snprintf(local, sizeof(local), "%s/local-inside", top);
	mkdir(local, 0700);
	put("hub/inside", "a blob kept across a damaged index");
	check_mkdirs(top, "victim");
	check_mkdirs(top, "victim2");
	put("victim/precious", "not the store's");
	put("victim2/precious", "not the store's either");
	CHECK(c, open_promote(&s, local, NULL, "hub/inside") == BLOB_LOCAL, "local");
	store_close(&s);
	CHECK(c, first_copy(local, copy, sizeof(copy)), "its copy: %s", copy);
	snprintf(p, sizeof(p), "%s/victim", top);
	snprintf(q, sizeof(q), "%s/data/zz", local);
	CHECK(c, symlink(p, q) == 0, "data/zz a link to a directory outside");
	snprintf(p, sizeof(p), "%s/tmp", local);
	snprintf(q, sizeof(q), "%s/victim2", top);
	CHECK(c, rmdir(p) == 0 && symlink(q, p) == 0, "tmp/ a link to a directory outside");
	logged[0] = '\0';
	open_promote(&s, local, NULL, NULL);
	store_close(&s);
	snprintf(p, sizeof(p), "%s/victim/precious", top);
	snprintf(q, sizeof(q), "%s/victim2/precious", top);
	CHECK(c, access(p, F_OK) == 0 && access(q, F_OK) == 0 && access(copy, F_OK) == 0,
	      "nothing removed through the links; log: %s", logged);

	/* the index damaged: set aside; its copy stays through two starts */
	snprintf(p, sizeof(p), "%s/index.json", local);
	check_write_file(p, "{\"version\": 4, \"blobs\": [", 26);
	open_promote(&s, local, NULL, NULL);
	CHECK(c, state_of(&s, "hub/inside") != BLOB_LOCAL, "damaged index: not local");
	store_close(&s);
	logged[0] = '\0';
	open_promote(&s, local, NULL, NULL);
	store_close(&s);
	CHECK(c, access(copy, F_OK) == 0 && strstr(logged, "index.json.damaged is there"),
	      "a start after: the copy kept beside the damaged index; log: %s", logged);
	snprintf(q, sizeof(q), "%s/index.json.damaged", local);
	CHECK(c, rename(q, p) == 0, "the damaged index put back (here: an older good one)");

	/* index.json a link to a file outside: its mode left alone */
	put("outside.txt", "mode 0644");
	snprintf(q, sizeof(q), "%s/outside.txt", top);
	chmod(q, 0644);
	unlink(p);
	CHECK(c, symlink(q, p) == 0, "index.json a link");
	open_promote(&s, local, NULL, NULL);
	store_close(&s);
	CHECK(c, stat(q, &st) == 0 && (st.st_mode & 07777) == 0644, "its target's mode kept: %04o",
	      (unsigned)(st.st_mode & 07777));

	/* a FIFO in the index's place */
	unlink(p);
	snprintf(q, sizeof(q), "%s/index.json.damaged", local);
	unlink(q);
	CHECK(c, mkfifo(p, 0600) == 0, "index.json a FIFO");
	alarm(20); /* (a start that hangs ends the test here) */
	open_promote(&s, local, NULL, NULL);
	store_close(&s);
	alarm(0);
	CHECK(c, lstat(p, &st) < 0 || !S_ISFIFO(st.st_mode), "a FIFO as the index: the start "
	      "went on, it set aside");
}

/* data/ out of reach at a start (a disk not mounted yet: an empty mount
 * point): the index is left as it is, so once data/ is back its copies
 * serve again.  (The index written at that start named none of them, and
 * the start after removed them all as leftovers.) */
static void test_data_out_of_reach(struct check_count *c)
{
	char local[PATH_MAX * 2], data[PATH_MAX * 2], away[PATH_MAX * 2];
	struct store s;

	snprintf(local, sizeof(local), "%s/local-reach", top);
	snprintf(data, sizeof(data), "%s/data", local);
	snprintf(away, sizeof(away), "%s/data.disk", local);
	mkdir(local, 0700);
	put("hub/reach1", "the first blob of a store whose data/ goes away");
	put("hub/reach2", "the second blob of a store whose data/ goes away");
	CHECK(c, open_promote(&s, local, NULL, "hub/reach1") == BLOB_LOCAL, "reach1 local");
	store_promote(&s, blob_of(&s, "hub/reach2"), 0, 1);
	CHECK(c, store_wait_settled(&s, blob_of(&s, "hub/reach2"), 30000) == BLOB_LOCAL,
	      "reach2 local");
	store_close(&s);
	CHECK(c, rename(data, away) == 0 && mkdir(data, 0700) == 0, "data/ an empty mount point");
	logged[0] = '\0';
	open_promote(&s, local, NULL, NULL);
	CHECK(c, state_of(&s, "hub/reach1") != BLOB_LOCAL && strstr(logged, "not one of the 2 "
	      "local copies"), "the copies not there: not served, said; log: %s", logged);
	store_close(&s);
	CHECK(c, rmdir(data) == 0 && rename(away, data) == 0, "data/ back");
	open_promote(&s, local, NULL, NULL);
	CHECK(c, state_of(&s, "hub/reach1") == BLOB_LOCAL && state_of(&s, "hub/reach2") ==
	      BLOB_LOCAL, "data/ back: both copies serve again");
	store_close(&s);
}

int main(void)
{
	struct check_count c = { 0 };

	snprintf(top, sizeof(top), "/var/tmp/wfs-startkeep-XXXXXX");
	check_tmpdir(top);
	check_mkdirs(top, "hub");
	test_ref_names(&c);
	test_root_not_mounted(&c);
	test_store_stays_inside(&c);
	test_data_out_of_reach(&c);
	check_rmtree(top);
	printf("startkeep: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
