/* test_status.c - the control requests of issue 10 without mounting:
 * "status" and "stats" report the NAS's state and the local record, and
 * while the NAS is down status answers from the record and the store
 * without touching the NAS (it is moved away to prove it); the requests
 * that walk the NAS are refused at once; "sync" refreshes the record, or
 * says why not. */
#include "check.h"
#include "control.h"
#include "nasgate.h"
#include "record.h"
#include "store.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* sha256("hello\n") */
#define H256 "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
#define OTHER "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define REV "0123456789abcdef0123456789abcdef01234567"
#define REPO "models--o--n"
#define SNAP REPO "/snapshots/" REV
#define REV2 "1111111111111111111111111111111111111111"
#define REV3 "2222222222222222222222222222222222222222"
#define REV4 "3333333333333333333333333333333333333333"
#define OWNER 0
#define STRANGER 4242

static char top[PATH_MAX], nas[PATH_MAX];

/* A repo with one local blob (H256, two names) and one on the NAS. */
static void hub(void)
{
	static const char *const dirs[] = { REPO, REPO "/blobs", REPO "/snapshots", SNAP,
					    REPO "/refs" };

	for (size_t i = 0; i < sizeof(dirs) / sizeof(*dirs); i++)
		check_mk(nas, dirs[i]);
	check_put(nas, REPO "/blobs/" H256, "hello\n");
	check_put(nas, REPO "/blobs/" OTHER, "other");
	check_ln(nas, "../../blobs/" H256, SNAP "/config.json");
	check_ln(nas, "../../blobs/" H256, SNAP "/again.json");
	check_ln(nas, "../../blobs/" OTHER, SNAP "/other.bin");
	check_put(nas, REPO "/refs/main", REV);
}

/* The reply to @req as a JSON object (NULL if it is not one). */
static json_t *ask(struct control *ctl, const char *req, uid_t uid)
{
	char *line = control_handle(ctl, req, strlen(req), uid);
	json_t *rep = line ? json_loads(line, 0, NULL) : NULL;

	free(line);
	return rep;
}

static json_int_t num(json_t *o, const char *path)
{
	char key[64];
	const char *dot;

	while ((dot = strchr(path, '.'))) {
		snprintf(key, sizeof(key), "%.*s", (int)(dot - path), path);
		o = json_object_get(o, key);
		path = dot + 1;
	}
	return json_integer_value(json_object_get(o, path));
}

static const char *str(json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key));

	return s ? s : "";
}

static void up(struct check_count *c, struct control *ctl)
{
	json_t *rep = ask(ctl, "{\"op\":\"status\"}", STRANGER), *repo, *nasj;

	nasj = json_object_get(rep, "nas");
	repo = json_array_get(json_object_get(rep, "repos"), 0);
	CHECK(c, json_is_true(json_object_get(rep, "ok")) && !strcmp(str(nasj, "state"), "up") &&
	      num(nasj, "outages") == 0 && num(nasj, "timeout_ms") == 200 &&
	      !strcmp(str(rep, "from"), "nas"), "status, NAS up: %s",
	      rep ? json_dumps(rep, JSON_COMPACT) : "?");
	CHECK(c, num(rep, "record.files") == 2 && num(rep, "record.built") > 0 &&
	      json_is_true(json_object_get(json_object_get(rep, "record"), "kept")),
	      "record: %lld files", (long long)num(rep, "record.files"));
	CHECK(c, !strcmp(str(repo, "repo"), REPO) && !strcmp(str(repo, "from"), "nas") &&
	      num(repo, "files") == 2 && num(repo, "local_files") == 1,
	      "repo on the NAS: %lld files, %lld local", (long long)num(repo, "files"),
	      (long long)num(repo, "local_files"));
	json_decref(rep);
}

static void down(struct check_count *c, struct control *ctl)
{
	json_t *rep = ask(ctl, "{\"op\":\"status\"}", STRANGER), *repo, *rev, *nasj;
	char *s = rep ? json_dumps(rep, JSON_COMPACT) : NULL;

	nasj = json_object_get(rep, "nas");
	repo = json_array_get(json_object_get(rep, "repos"), 0);
	rev = json_array_get(json_object_get(repo, "revisions"), 0);
	CHECK(c, json_is_true(json_object_get(rep, "ok")) && !strcmp(str(nasj, "state"), "down") &&
	      !strcmp(str(nasj, "reason"), "unplugged by a test") && num(nasj, "outages") == 1 &&
	      num(nasj, "since") > time(NULL) - 600 && !strcmp(str(rep, "from"), "record"),
	      "status, NAS down: %s", s);
	CHECK(c, json_array_size(json_object_get(rep, "repos")) == 1 &&
	      !strcmp(str(repo, "repo"), REPO) && !strcmp(str(repo, "from"), "record") &&
	      num(repo, "files") == 1 && num(repo, "local_files") == 1 &&
	      num(repo, "local_bytes") == 6, "the repo from the record: %s", s);
	CHECK(c, !strcmp(str(rev, "rev"), REV) && num(rev, "files") == 1 &&
	      num(rev, "local_files") == 1, "its revision from the record (two names, one "
	      "blob): %s", s);
	free(s);
	json_decref(rep);

	rep = ask(ctl, "{\"op\":\"status\",\"path\":\"" SNAP "\"}", STRANGER);
	CHECK(c, json_is_true(json_object_get(rep, "ok")) &&
	      num(json_array_get(json_object_get(rep, "repos"), 0), "local_files") == 1,
	      "status of a recorded path while down");
	json_decref(rep);
	rep = ask(ctl, "{\"op\":\"status\",\"path\":\"models--no--such\"}", STRANGER);
	CHECK(c, json_is_false(json_object_get(rep, "ok")) && !strcmp(str(rep, "errno"), "EHOSTDOWN"),
	      "a path the record does not know: %s", str(rep, "error"));
	json_decref(rep);

	rep = ask(ctl, "{\"op\":\"promote\",\"paths\":[\"" REPO "\"]}", OWNER);
	CHECK(c, !strcmp(str(rep, "errno"), "EHOSTDOWN") &&
	      strstr(str(rep, "error"), "the NAS is down (since ") &&
	      strstr(str(rep, "error"), "unplugged by a test"), "promote refused at once: %s",
	      str(rep, "error"));
	json_decref(rep);
	rep = ask(ctl, "{\"op\":\"progress\",\"keys\":[]}", STRANGER);
	CHECK(c, json_is_true(json_object_get(rep, "ok")), "progress still answers");
	json_decref(rep);

	rep = ask(ctl, "{\"op\":\"stats\",\"prometheus\":true}", STRANGER);
	CHECK(c, !strcmp(str(json_object_get(json_object_get(rep, "metrics"), "nas"), "state"),
			 "down") && num(rep, "metrics.record.files") == 2 &&
	      strstr(str(rep, "prometheus"), "\nwfs_nas_up 0\n") &&
	      strstr(str(rep, "prometheus"), "\nwfs_nas_outages_total 1\n") &&
	      strstr(str(rep, "prometheus"), "\nwfs_record_files 2\n") &&
	      strstr(str(rep, "prometheus"), "\nwfs_nas_stuck_calls 0\n"), "stats while down");
	json_decref(rep);

	rep = ask(ctl, "{\"op\":\"sync\"}", STRANGER);
	CHECK(c, !strcmp(str(rep, "errno"), "EPERM"), "sync: the owner's only");
	json_decref(rep);
	rep = ask(ctl, "{\"op\":\"sync\"}", OWNER);
	CHECK(c, json_is_false(json_object_get(rep, "ok")) && !strcmp(str(rep, "errno"), "EHOSTDOWN") &&
	      strstr(str(rep, "error"), "could not be refreshed") && num(rep, "record_files") == 2,
	      "sync while down: %s", str(rep, "error"));
	json_decref(rep);
}

/* The revision @rev of the repo in @rep's first repo, or NULL. */
static json_t *rev_of(json_t *rep, const char *rev)
{
	json_t *revs = json_object_get(json_array_get(json_object_get(rep, "repos"), 0), "revisions");
	json_t *o;
	size_t i;

	json_array_foreach(revs, i, o)
		if (!strcmp(str(o, "rev"), rev))
			return o;
	return NULL;
}

/* Each revision's figures come from the one walk of its repo: a blob
 * shared by revisions counts in each, once per revision however many
 * names it has there; a nested name counts; a revision with no file shows
 * zeros; a snapshot file that is no link counts as its own file. */
static void revisions(struct check_count *c, struct control *ctl)
{
	json_t *rep, *r1, *r2, *r3, *r4, *repo;
	char *s;

	check_mk(nas, REPO "/snapshots/" REV2);
	check_mk(nas, REPO "/snapshots/" REV2 "/sub");
	check_ln(nas, "../../blobs/" OTHER, REPO "/snapshots/" REV2 "/x.bin");
	check_ln(nas, "../../../blobs/" H256, REPO "/snapshots/" REV2 "/sub/deep.bin");
	check_mk(nas, REPO "/snapshots/" REV3);
	check_mk(nas, REPO "/snapshots/" REV4);
	check_put(nas, REPO "/snapshots/" REV4 "/plain.txt", "plain\n");
	for (int k = 0; k < 2; k++) {
		rep = ask(ctl, k ? "{\"op\":\"status\",\"path\":\"" REPO "/snapshots/" REV2 "\"}" :
			  "{\"op\":\"status\"}", STRANGER);
		s = rep ? json_dumps(rep, JSON_COMPACT) : NULL;
		repo = json_array_get(json_object_get(rep, "repos"), 0);
		r1 = rev_of(rep, REV);
		r2 = rev_of(rep, REV2);
		r3 = rev_of(rep, REV3);
		r4 = rev_of(rep, REV4);
		CHECK(c, num(repo, "files") == 3 && num(repo, "local_files") == 1 &&
		      num(repo, "bytes") == 6 + 5 + 6 && !strcmp(str(repo, "from"), "nas"),
		      "the repo, %s: %s", k ? "asked by a revision" : "the whole mount", s);
		CHECK(c, json_array_size(json_object_get(repo, "revisions")) == 4, "4 revisions: %s", s);
		CHECK(c, r1 && num(r1, "files") == 2 && num(r1, "local_files") == 1 &&
		      num(r1, "bytes") == 11, "a blob under two names counts once: %s", s);
		CHECK(c, r2 && num(r2, "files") == 2 && num(r2, "local_files") == 1 &&
		      num(r2, "states.local") == 1 && num(r2, "states.nas") == 1,
		      "a nested name, blobs shared with another revision: %s", s);
		CHECK(c, r3 && num(r3, "files") == 0 && num(r3, "bytes") == 0,
		      "an empty revision: %s", s);
		CHECK(c, r4 && num(r4, "files") == 1 && num(r4, "local_files") == 0 &&
		      num(r4, "bytes") == 6, "a plain file in a snapshot: %s", s);
		free(s);
		json_decref(rep);
	}
}

int main(void)
{
	struct check_count c = {0};
	struct store_opts opt = { .workers = 1 };
	struct hub_roots roots = {0};
	char local[PATH_MAX * 2], p[PATH_MAX * 2], gone[PATH_MAX * 2];
	struct control ctl;
	struct nas_gate g;
	struct record r;
	struct store s;
	struct stat st;
	struct blob *b;
	json_t *rep;

	snprintf(top, sizeof(top), "/var/tmp/wfs-status-XXXXXX");
	if (!mkdtemp(top) || !realpath(top, p))
		return 2;
	snprintf(top, sizeof(top), "%s", p); /* roots are canonical: so are blob keys */
	snprintf(nas, sizeof(nas), "%s/nas", top);
	mkdir(nas, 0755);
	hub();
	hub_roots_add(&roots, nas);
	snprintf(local, sizeof(local), "%s/local", top);
	mkdir(local, 0700);
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "store");
	check_path(p, sizeof(p), nas, REPO "/blobs/" H256);
	b = stat(p, &st) == 0 ? store_blob(&s, p, &st, H256) : NULL;
	if (b)
		store_promote(&s, b, 0, 1);
	CHECK(&c, b && store_wait_settled(&s, b, 30000) == BLOB_LOCAL, "a blob local");
	CHECK(&c, record_open(&r, local, 0, NULL, NULL) == 0 &&
	      record_start(&r, &roots, &s, NULL) == 0, "record");
	CHECK(&c, nas_gate_init(&g, nas, 200, NULL, NULL) == 0, "gate");

	memset(&ctl, 0, sizeof(ctl));
	ctl.roots = &roots;
	ctl.store = &s;
	ctl.gate = &g;
	ctl.record = &r;
	ctl.mount = "/mnt";
	ctl.local = local;
	ctl.owner = OWNER;

	rep = ask(&ctl, "{\"op\":\"sync\"}", OWNER);
	CHECK(&c, json_is_true(json_object_get(rep, "ok")) && num(rep, "record_files") == 2 &&
	      num(rep, "record.entries") > 1, "sync: %s", str(rep, "error"));
	json_decref(rep);
	up(&c, &ctl);

	/* Down, and the NAS moved away: nothing may need it now. */
	nas_gate_set_down(&g, "unplugged by a test");
	snprintf(gone, sizeof(gone), "%s.gone", nas);
	CHECK(&c, rename(nas, gone) == 0, "NAS moved away");
	down(&c, &ctl);
	CHECK(&c, rename(gone, nas) == 0, "NAS back");

	/* Without a gate or a record (tests, tools): up, none kept. */
	ctl.gate = NULL;
	ctl.record = NULL;
	rep = ask(&ctl, "{\"op\":\"status\"}", STRANGER);
	CHECK(&c, !strcmp(str(json_object_get(rep, "nas"), "state"), "up") &&
	      num(rep, "nas.since") == 0 &&
	      json_is_false(json_object_get(json_object_get(rep, "record"), "kept")),
	      "no gate, no record");
	json_decref(rep);
	rep = ask(&ctl, "{\"op\":\"sync\"}", OWNER);
	CHECK(&c, json_is_true(json_object_get(rep, "ok")) && num(rep, "record_files") == 0,
	      "sync without a record: the index only");
	json_decref(rep);
	revisions(&c, &ctl);

	record_close(&r);
	store_close(&s);
	nas_gate_destroy(&g);
	snprintf(p, sizeof(p), "rm -rf %s", top);
	if (system(p) != 0)
		fprintf(stderr, "could not remove %s\n", top);
	printf("status: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
