/* check_record.h - what the unit tests of the record (test_record,
 * test_recfaults) share: the hub they build under @top (hub(), its
 * local revision's file list in @tree_text), their store's copies
 * (promote()), the record's answers read back (list(), look() into
 * @ent, bytes_are()) and the log lines it wrote.  Include once, in the
 * test's one .c. */
#ifndef WFS_CHECK_RECORD_H
#define WFS_CHECK_RECORD_H

#include "check.h"
#include "collect.h"
#include "record.h"
#include "store.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* sha256("hello\n") and git's blob SHA-1 of it: both content addresses hold */
#define H256 "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
#define H1 "ce013625030ba8dba906f756967f9e9ca394464a"
#define OTHER "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define REV "0123456789abcdef0123456789abcdef01234567"
#define REPO "models--o--n"
#define SNAP REPO "/snapshots/" REV
#define GONE "fedcba9876543210fedcba9876543210fedcba98" /* a revision not in snapshots/ */
#define ODD "odd\xff\x01name"

static char top[PATH_MAX], nas[PATH_MAX];
/* REV's file list: more than a refs file's RECORD_MAX_DATA, so its own bound counts */
static char tree_text[6000];

struct logs {
	pthread_mutex_t lock;
	int n;
	char all[16384];
};

static inline void log_line(void *arg, int prio, const char *msg)
{
	struct logs *l = arg;

	(void)prio;
	pthread_mutex_lock(&l->lock);
	l->n++;
	if (strlen(l->all) + strlen(msg) + 2 < sizeof(l->all)) {
		strcat(l->all, msg);
		strcat(l->all, "\n");
	}
	pthread_mutex_unlock(&l->lock);
}

static inline int logged(struct logs *l, const char *what)
{
	int yes;

	pthread_mutex_lock(&l->lock);
	yes = strstr(l->all, what) != NULL;
	pthread_mutex_unlock(&l->lock);
	return yes;
}

static inline void hub(void)
{
	static const char *const dirs[] = { REPO, REPO "/blobs", REPO "/snapshots", SNAP,
		SNAP "/sub", SNAP "/sub/dir", REPO "/refs", REPO "/.no_exist",
		REPO "/.no_exist/" REV, REPO "/.no_exist/" REV "/sub", REPO "/.no_exist/" GONE,
		"models--x--y", "models--x--y/blobs",
		"models--x--y/snapshots", "models--x--y/snapshots/" REV, "models--x--y/refs",
		"hubstore", "models--h--s", "models--h--s/blobs", "models--h--s/snapshots",
		"models--h--s/snapshots/" REV, REPO "/trees", "models--h--s/trees",
		"models--h--t", "models--h--t/blobs", "models--h--t/snapshots",
		"models--h--t/snapshots/" REV };
	size_t len = 0;

	for (size_t i = 0; i < sizeof(dirs) / sizeof(*dirs); i++)
		check_mk(nas, dirs[i]);
	check_put(nas, REPO "/blobs/" H256, "hello\n");
	check_put(nas, REPO "/blobs/" H1, "hello\n");
	check_put(nas, REPO "/blobs/" OTHER, "other");
	check_ln(nas, "../../blobs/" H256, SNAP "/config.json");
	check_ln(nas, "../../../../blobs/" H1, SNAP "/sub/dir/file");
	check_ln(nas, "../../blobs/" OTHER, SNAP "/other.bin");
	check_ln(nas, "../../blobs/" H256, SNAP "/" ODD);
	/* links to directories: one in the revision (kept, its files are),
	 * one out of it (never) */
	check_ln(nas, "sub", SNAP "/latest");
	check_ln(nas, "../../blobs", SNAP "/blobs-dir");
	check_put(nas, REPO "/refs/main", REV);
	check_put(nas, REPO "/.no_exist/" REV "/missing.txt", "");
	check_put(nas, REPO "/.no_exist/" REV "/sub/missing.json", "");
	check_put(nas, REPO "/.no_exist/" GONE "/other.txt", "");
	/* the file lists of recent clients: the local revision's (kept with
	 * its bytes), another revision's and a file that is no list (not) */
	len += (size_t)snprintf(tree_text, sizeof(tree_text), "{\"files\": {");
	for (int i = 0; len + 80 < sizeof(tree_text); i++)
		len += (size_t)snprintf(tree_text + len, sizeof(tree_text) - len,
					"\"shard-%05d.safetensors\": {\"size\": %d}, ", i, i * 7919);
	snprintf(tree_text + len, sizeof(tree_text) - len, "\"x\": {}}}");
	check_put(nas, REPO "/trees/" REV ".json", tree_text);
	check_put(nas, REPO "/trees/" GONE ".json", "{\"files\": {}}");
	check_put(nas, REPO "/trees/notes.txt", "not a list");
	/* over RECORD_MAX_TREE: left out, said once */
	check_put_pattern(nas, "models--h--s/trees/" REV ".json", RECORD_MAX_TREE + 1, 3);
	check_put(nas, "models--x--y/blobs/" OTHER, "other too");
	check_ln(nas, "../../blobs/" OTHER, "models--x--y/snapshots/" REV "/w");
	check_put(nas, "models--x--y/refs/main", REV);
	/* a repo whose blob lives in a hub-level store outside the repos */
	check_put(nas, "hubstore/blob1", "hub level\n");
	check_ln(nas, "../../hubstore/blob1", "models--h--s/blobs/hid");
	check_ln(nas, "../../blobs/hid", "models--h--s/snapshots/" REV "/f");
	/* another, promoted by its revision and never opened */
	check_put(nas, "hubstore/blob2", "hub level too\n");
	check_ln(nas, "../../hubstore/blob2", "models--h--t/blobs/tid");
	check_ln(nas, "../../blobs/tid", "models--h--t/snapshots/" REV "/g");
}

static inline struct blob *promote(struct store *s, const char *rel, const char *id)
{
	char p[PATH_MAX * 2];
	struct stat st;
	struct blob *b;

	check_path(p, sizeof(p), nas, rel);
	if (stat(p, &st) < 0 || !(b = store_blob(s, p, &st, id)))
		return NULL;
	store_promote(s, b, 0, 1);
	return store_wait_settled(s, b, 30000) == BLOB_LOCAL ? b : NULL;
}

/* The children of @rel, joined by '|'; "ENOENT" if not a recorded dir. */
static inline const char *list(struct record *r, const char *rel)
{
	static char out[4096];
	char **names;
	size_t n;

	out[0] = '\0';
	if (record_list(r, rel, &names, &n) < 0)
		return "ENOENT";
	for (size_t i = 0; i < n; i++) {
		if (i)
			strcat(out, "|");
		strncat(out, names[i], sizeof(out) - strlen(out) - 2);
		free(names[i]);
	}
	free(names);
	return out;
}

static struct record_entry ent;

static inline int look(struct record *r, const char *rel)
{
	return record_lookup(r, rel, &ent);
}

/* Are the bytes kept for @rel @want (and its entry's size their length)? */
static inline int bytes_are(struct record *r, const char *rel, const char *want)
{
	char *data;
	int same;

	if (record_lookup_data(r, rel, &ent, &data) < 0 || !data)
		return 0;
	same = ent.has_data && ent.data_len == strlen(want) &&
	       ent.e.st.st_size == (off_t)ent.data_len && !memcmp(data, want, ent.data_len);
	free(data);
	return same;
}

/* How many log lines hold @what. */
static inline int times_logged(struct logs *l, const char *what)
{
	int n = 0;

	pthread_mutex_lock(&l->lock);
	for (const char *p = l->all; (p = strstr(p, what)); p += strlen(what))
		n++;
	pthread_mutex_unlock(&l->lock);
	return n;
}

static inline char *slurp(const char *dir)
{
	char p[PATH_MAX * 2], *buf = calloc(1, 1 << 20);
	FILE *f;

	snprintf(p, sizeof(p), "%s/" RECORD_FILE, dir);
	f = fopen(p, "r");
	if (f) {
		if (fread(buf, 1, (1 << 20) - 1, f) == 0)
			buf[0] = '\0';
		fclose(f);
	}
	return buf;
}

/* The test's directory @top (/var/tmp/wfs-@name-XXXXXX), the hub() under
 * top/nas added to @roots, and an empty LOCAL_STORE top/local, its path
 * in @local.  0, or -1: the test cannot run. */
static inline int record_fixture(const char *name, struct hub_roots *roots, char *local,
				 size_t sz)
{
	char p[PATH_MAX * 2];

	snprintf(top, sizeof(top), "/var/tmp/wfs-%s-XXXXXX", name);
	if (!mkdtemp(top) || !realpath(top, p))
		return -1;
	snprintf(top, sizeof(top), "%s", p); /* roots are canonical: so are blob keys */
	snprintf(nas, sizeof(nas), "%s/nas", top);
	mkdir(nas, 0755);
	hub();
	hub_roots_add(roots, nas);
	snprintf(local, sz, "%s/local", top);
	mkdir(local, 0700);
	return 0;
}

#endif
