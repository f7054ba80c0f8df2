/* test_core.c - the namespace rules of core/, on a real directory tree,
 * without mounting anything. */
#include "check.h"
#include "collect.h"
#include "ns.h"
#include "path.h"
#include "resolve.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHA_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define SHA_B "4dbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
#define SHA1_C "cccccccccccccccccccccccccccccccccccccccc"
#define REV "0123456789abcdef0123456789abcdef01234567"

static char top[PATH_MAX];

static void mk(const char *rel, const char *content)
{
	char p[PATH_MAX * 2];

	snprintf(p, sizeof(p), "%s/%s", top, rel);
	check_write_file(p, content, strlen(content));
}

static void dir(const char *rel)
{
	char p[PATH_MAX * 2];

	snprintf(p, sizeof(p), "%s/%s", top, rel);
	if (mkdir(p, 0755) < 0 && errno != EEXIST) {
		perror(p);
		exit(2);
	}
}

static void ln(const char *target, const char *rel)
{
	char p[PATH_MAX * 2];

	snprintf(p, sizeof(p), "%s/%s", top, rel);
	if (symlink(target, p) < 0) {
		perror(p);
		exit(2);
	}
}

static void test_path(struct check_count *c)
{
	char out[PATH_MAX];

	CHECK(c, path_normalize("/a//b/./c/../d/", out, sizeof(out)) == 0 && !strcmp(out, "/a/b/d"),
	      "got %s", out);
	CHECK(c, path_normalize("/../x", out, sizeof(out)) == 0 && !strcmp(out, "/x"), "got %s", out);
	CHECK(c, path_normalize("a/../..", out, sizeof(out)) == -EXDEV, "relative climb");
	CHECK(c, path_normalize("./", out, sizeof(out)) == 0 && !strcmp(out, ""), "got %s", out);
	CHECK(c, path_dotdot_after_name("../../blobs/x") == -1, "leading .. only");
	CHECK(c, path_dotdot_after_name("./../a/./b") == -1, "no .. after a name");
	CHECK(c, path_dotdot_after_name("sub/../x") == 4, "after sub");
	CHECK(c, path_dotdot_after_name("../a//..") == 6, "after a, the last component");
	CHECK(c, path_dotdot_after_name("/r/a/..x/../y") == 9, "'..x' is a name");
	CHECK(c, path_under("/hub", "/hub/x/y") && !strcmp(path_under("/hub", "/hub/x/y"), "x/y"),
	      "under");
	CHECK(c, path_under("/hub", "/hubx") == NULL, "prefix is not a parent");
	CHECK(c, path_under("/hub", "/hub") && !*path_under("/hub", "/hub"), "root itself");
	path_relative("m/snapshots/r", "m/blobs/x", out, sizeof(out));
	CHECK(c, !strcmp(out, "../../blobs/x"), "got %s", out);
	path_relative("m/snapshots/r/original/deep", "m/blobs/x", out, sizeof(out));
	CHECK(c, !strcmp(out, "../../../../blobs/x"), "got %s", out);
	path_relative("", "a/b", out, sizeof(out));
	CHECK(c, !strcmp(out, "a/b"), "got %s", out);
	path_relative("a/b", "a/b", out, sizeof(out));
	CHECK(c, !strcmp(out, "."), "got %s", out);
	CHECK(c, hub_id_kind(SHA_A) == HUB_ID_SHA256, "sha256 name");
	CHECK(c, hub_id_kind(SHA1_C) == HUB_ID_SHA1, "sha1 name");
	CHECK(c, hub_id_kind("AAAAaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa") == HUB_ID_NONE, "upper case");
	CHECK(c, hub_id_kind(SHA_A ".incomplete") == HUB_ID_NONE, "incomplete");
	CHECK(c, hub_snapshot_blob_dir("models--o--n/snapshots/" REV "/x", out, sizeof(out)) &&
	      !strcmp(out, "models--o--n/blobs"), "got %s", out);
	CHECK(c, !hub_snapshot_blob_dir("models--o--n/snapshots/" REV, out, sizeof(out)),
	      "revision dir itself is not an entry");
	CHECK(c, !hub_snapshot_blob_dir("models--o--n/refs/main", out, sizeof(out)), "refs");
	CHECK(c, hub_repo_blob_name("m/blobs/" SHA_A) && !strcmp(hub_repo_blob_name("m/blobs/" SHA_A), SHA_A),
	      "blob name");
	CHECK(c, hub_repo_blob_name("m/blobs/4d/" SHA_B) == NULL, "nested is not a repo blob");
	/* what may be copied: blobs and snapshots of repos, nothing else */
	CHECK(c, hub_holds_weights(""), "the root");
	CHECK(c, hub_holds_weights("models--o--n"), "a repo");
	CHECK(c, hub_holds_weights("models--o--n/blobs/" SHA_A), "a blob");
	CHECK(c, hub_holds_weights("datasets--o--n/snapshots/" REV "/sub/x.bin"), "a snapshot file");
	CHECK(c, !hub_holds_weights("models--o--n/refs/main"), "a ref");
	CHECK(c, !hub_holds_weights("models--o--n/refs"), "refs/");
	CHECK(c, !hub_holds_weights("models--o--n/.no_exist/" REV "/x"), "a marker");
	CHECK(c, !hub_holds_weights("models--o--n/trees/" REV ".json"), "a file list");
	CHECK(c, !hub_holds_weights("models--o--n/blobsx/y"), "blobs is a whole name");
	CHECK(c, !hub_holds_weights(".locks/models--o--n/x.lock"), "a lock");
	CHECK(c, !hub_holds_weights("version.txt"), "a top-level file");
	CHECK(c, !hub_holds_weights("backup--old/blobs/" SHA_A), "a folder with -- that is no repo");
	CHECK(c, hub_holds_weights("spaces--o--n/snapshots/" REV "/app.py"), "a space");

	/* the one rule for a repo folder (HUB-LAYOUT.md) */
	CHECK(c, hub_is_repo_folder("models--o--n", 12), "models--");
	CHECK(c, hub_is_repo_folder("datasets--o--n", 14), "datasets--");
	CHECK(c, hub_is_repo_folder("spaces--n", 9), "spaces-- without an org");
	CHECK(c, hub_is_repo_folder("models--o--n/refs", 12), "the name's length is its end");
	CHECK(c, !hub_is_repo_folder("models--", 8), "the kind alone");
	CHECK(c, !hub_is_repo_folder("model--o--n", 11), "not a kind");
	CHECK(c, !hub_is_repo_folder("backup--x", 9), "-- alone");
	CHECK(c, !hub_is_repo_folder(".locks", 6), ".locks");
	CHECK(c, !hub_is_repo_folder("models--o/n", 11), "a slash inside");
	CHECK(c, hub_repo_len("models--o--n/blobs/x") == 12, "hub_repo_len: the first component");
	CHECK(c, hub_repo_len("models--o--n") == 12, "hub_repo_len: the whole of a name");
	CHECK(c, hub_repo_len("version.txt") == 0, "hub_repo_len: no repo");
	{
		char longname[NAME_MAX + 2];

		memset(longname, 'a', sizeof(longname) - 1);
		memcpy(longname, "models--", 8);
		longname[NAME_MAX + 1] = 0;
		CHECK(c, !hub_is_repo_folder(longname, NAME_MAX + 1), "longer than NAME_MAX");
		CHECK(c, hub_is_repo_folder(longname, NAME_MAX), "NAME_MAX bytes");
	}
}

static void build_tree(void)
{
	char p[PATH_MAX * 2];

	dir("hub");
	dir("outside");
	mk("outside/secret", "secret");
	/* A standard repo. */
	dir("hub/models--o--std");
	dir("hub/models--o--std/blobs");
	dir("hub/models--o--std/snapshots");
	dir("hub/models--o--std/snapshots/" REV);
	dir("hub/models--o--std/snapshots/" REV "/original");
	dir("hub/models--o--std/refs");
	mk("hub/models--o--std/refs/main", REV);
	mk("hub/models--o--std/blobs/" SHA_A, "weights A");
	mk("hub/models--o--std/blobs/" SHA1_C, "{}");
	ln("../../blobs/" SHA_A, "hub/models--o--std/snapshots/" REV "/model.safetensors");
	ln("../../../blobs/" SHA1_C, "hub/models--o--std/snapshots/" REV "/original/params.json");
	/* A hub-level store and a repo whose blobs link into it. */
	dir("hub/blobs");
	dir("hub/blobs/4d");
	mk("hub/blobs/4d/" SHA_B, "weights B");
	dir("hub/models--o--store");
	dir("hub/models--o--store/blobs");
	dir("hub/models--o--store/snapshots");
	dir("hub/models--o--store/snapshots/" REV);
	ln("../../blobs/4d/" SHA_B, "hub/models--o--store/blobs/" SHA_B);
	snprintf(p, sizeof(p), "%s/hub/blobs/4d/" SHA_B, top);
	ln(p, "hub/models--o--store/blobs/" SHA_A); /* absolute, still inside */
	ln(SHA_A, "hub/models--o--store/blobs/hop"); /* two hops */
	ln("../../blobs/" SHA_B, "hub/models--o--store/snapshots/" REV "/a.safetensors");
	ln("../../blobs/hop", "hub/models--o--store/snapshots/" REV "/b.safetensors");
	ln("../../../blobs/4d/" SHA_B, "hub/models--o--store/snapshots/" REV "/direct.bin");
	/* Real files and broken links in a snapshot. */
	dir("hub/models--o--store/snapshots/" REV "/packs");
	mk("hub/models--o--store/snapshots/" REV "/packs/p1.bin", "1111");
	ln("../../blobs/" SHA1_C, "hub/models--o--store/snapshots/" REV "/dangling.json");
	ln("self", "hub/models--o--store/snapshots/" REV "/self");
	snprintf(p, sizeof(p), "%s/outside/secret", top);
	ln(p, "hub/models--o--store/snapshots/" REV "/escape-abs");
	ln("../../../../outside/secret", "hub/models--o--store/snapshots/" REV "/escape-rel");
	ln("packs", "hub/models--o--store/snapshots/" REV "/packdir");
	ln("../../..", "hub/models--o--store/snapshots/" REV "/up");
	ln("../../../..", "hub/models--o--store/snapshots/" REV "/above");
	/* Near the shape ns_classify_in() takes a short cut for. */
	ln("../../blobs/./" SHA_A, "hub/models--o--std/snapshots/" REV "/dotted.safetensors");
	ln("../../../models--o--std/blobs/" SHA_A, "hub/models--o--store/snapshots/" REV "/other-repo");
	dir("hub/models--o--std/blobs/dirblob");
	ln("../../blobs/dirblob", "hub/models--o--std/snapshots/" REV "/to-dir");
	snprintf(p, sizeof(p), "%s/hub/models--o--std/blobs/fifo", top);
	if (mkfifo(p, 0644) < 0)
		perror(p);
	ln("../../blobs/fifo", "hub/models--o--std/snapshots/" REV "/to-fifo");
	ln("../../blobs/nope/x", "hub/models--o--std/snapshots/" REV "/under-missing");
	ln("../../blobs/", "hub/models--o--std/snapshots/" REV "/to-blobs");
	/* ".." after a link in a link's text: the link target's parent (the
	 * kernel's rule), not the text's */
	ln("../../blobs/4d", "hub/models--o--store/blobs/sub");
	mk("hub/blobs/dotdot.bin", "physical");
	mk("hub/models--o--store/blobs/dotdot.bin", "lexical");
	ln("sub/../dotdot.bin", "hub/models--o--store/blobs/weird");
	ln("../../../models--o--std/blobs/dirblob", "hub/models--o--std/snapshots/" REV "/x");
	ln("x/../../../blobs/" SHA_A, "hub/models--o--std/snapshots/" REV "/through-x.json");
	ln("x/../../blobs/" SHA_A, "hub/models--o--std/snapshots/" REV "/through-x-up2");
}

static void expect_link(struct check_count *c, struct hub_roots *roots, const char *rel,
			const char *target, enum ns_link_state state)
{
	struct ns_entry e;
	int r = ns_classify(roots, rel, &e);

	CHECK(c, r == 0 && e.kind == NS_LINK, "%s: r=%d kind=%d", rel, r, e.kind);
	CHECK(c, r == 0 && !strcmp(e.target, target), "%s: target %s, want %s", rel, e.target, target);
	CHECK(c, r == 0 && e.link_state == state, "%s: state %s", rel, ns_link_state_name(e.link_state));
	CHECK(c, r == 0 && S_ISLNK(e.st.st_mode) && e.st.st_size == (off_t)strlen(target), "%s: attrs", rel);
}

static void expect_file(struct check_count *c, struct hub_roots *roots, const char *rel,
			const char *backing_rel, const char *blob_id)
{
	char want[PATH_MAX * 2], norm[PATH_MAX * 2];
	struct ns_entry e;
	int r = ns_classify(roots, rel, &e);

	snprintf(want, sizeof(want), "%s/%s", roots->path[0], backing_rel);
	path_normalize(want, norm, sizeof(norm));
	strcpy(want, norm);
	CHECK(c, r == 0 && e.kind == NS_FILE, "%s: r=%d kind=%d", rel, r, e.kind);
	CHECK(c, r == 0 && !strcmp(e.backing, want), "%s: backing %s", rel, e.backing);
	CHECK(c, r == 0 && !strcmp(e.blob_id, blob_id), "%s: blob id '%s'", rel, e.blob_id);
	CHECK(c, r == 0 && S_ISREG(e.st.st_mode) && !(e.st.st_mode & 0222), "%s: mode %o", rel,
	      e.st.st_mode);
}

static void test_ns(struct check_count *c)
{
	struct hub_roots roots = {0};
	struct hub_res res;
	struct ns_entry e;
	char p[PATH_MAX * 2];

	snprintf(p, sizeof(p), "%s/hub", top);
	CHECK(c, hub_roots_add(&roots, p) == 0, "root");

	CHECK(c, ns_classify(&roots, "", &e) == 0 && e.kind == NS_DIR, "root is a dir");
	CHECK(c, ns_classify(&roots, "models--o--std/refs/main", &e) == 0 && e.kind == NS_FILE &&
	      e.st.st_size == 40, "ref is a 40-byte file");
	CHECK(c, ns_classify(&roots, "nope", &e) == -ENOENT, "missing name");
	CHECK(c, ns_classify(&roots, "models--o--std/refs/main/x", &e) == -ENOENT, "under a file");

	expect_link(c, &roots, "models--o--std/snapshots/" REV "/model.safetensors",
		    "../../blobs/" SHA_A, NS_LINK_RESOLVED);
	expect_link(c, &roots, "models--o--std/snapshots/" REV "/original/params.json",
		    "../../../blobs/" SHA1_C, NS_LINK_RESOLVED);
	expect_file(c, &roots, "models--o--std/blobs/" SHA_A, "models--o--std/blobs/" SHA_A, SHA_A);
	/* Repo blobs that link into the hub-level store are files there. */
	expect_file(c, &roots, "models--o--store/blobs/" SHA_B, "blobs/4d/" SHA_B, SHA_B);
	expect_file(c, &roots, "models--o--store/blobs/" SHA_A, "blobs/4d/" SHA_B, SHA_A);
	expect_file(c, &roots, "models--o--store/blobs/hop", "blobs/4d/" SHA_B, "hop");
	expect_link(c, &roots, "models--o--store/snapshots/" REV "/a.safetensors",
		    "../../blobs/" SHA_B, NS_LINK_RESOLVED);
	expect_link(c, &roots, "models--o--store/snapshots/" REV "/b.safetensors",
		    "../../blobs/hop", NS_LINK_RESOLVED);
	/* Straight into the hub store, bypassing the repo's blobs: a file. */
	expect_file(c, &roots, "models--o--store/snapshots/" REV "/direct.bin", "blobs/4d/" SHA_B, "");
	expect_file(c, &roots, "models--o--store/blobs/weird", "blobs/dotdot.bin", "weird");
	/* dangling on the NAS (x/.. is models--o--std/blobs, not snapshots/REV) */
	expect_link(c, &roots, "models--o--std/snapshots/" REV "/through-x.json",
		    "x/../../../blobs/" SHA_A, NS_LINK_DANGLING);
	expect_link(c, &roots, "models--o--std/snapshots/" REV "/through-x-up2",
		    "../../blobs/" SHA_A, NS_LINK_RESOLVED);
	expect_file(c, &roots, "models--o--store/snapshots/" REV "/packs/p1.bin",
		    "models--o--store/snapshots/" REV "/packs/p1.bin", "");
	expect_link(c, &roots, "models--o--store/snapshots/" REV "/dangling.json",
		    "../../blobs/" SHA1_C, NS_LINK_DANGLING);
	expect_link(c, &roots, "models--o--store/snapshots/" REV "/self", "self", NS_LINK_LOOP);
	snprintf(p, sizeof(p), "%s/outside/secret", top);
	expect_link(c, &roots, "models--o--store/snapshots/" REV "/escape-abs", p, NS_LINK_ESCAPE);
	expect_link(c, &roots, "models--o--store/snapshots/" REV "/escape-rel",
		    "../../../../outside/secret", NS_LINK_ESCAPE);
	expect_link(c, &roots, "models--o--store/snapshots/" REV "/packdir", "packs",
		    NS_LINK_RESOLVED);
	expect_link(c, &roots, "models--o--store/snapshots/" REV "/up", "../../..",
		    NS_LINK_RESOLVED);
	expect_link(c, &roots, "models--o--store/snapshots/" REV "/above", "../../../..",
		    NS_LINK_ESCAPE);

	/* The escape is decided from the link text: the secret is never touched. */
	CHECK(c, hub_resolve(&roots, "models--o--store/snapshots/" REV "/escape-abs", NULL, NULL, &res) == 0 &&
	      res.kind == HUB_RES_ESCAPE && res.hops == 1, "escape after one hop");
	/* An extra root lets the same link resolve. */
	snprintf(p, sizeof(p), "%s/outside", top);
	CHECK(c, hub_roots_add(&roots, p) == 0, "extra root");
	CHECK(c, hub_resolve(&roots, "models--o--store/snapshots/" REV "/escape-abs", NULL, NULL, &res) == 0 &&
	      res.kind == HUB_RES_FILE && res.root == 1, "escape allowed by extra root");
	expect_file(c, &roots, "models--o--store/snapshots/" REV "/escape-rel", "../outside/secret", "");
}

/* NAS_HUB named through a link (/home -> /data/home, say): an absolute
 * link written with that spelling leads into the hub as one with the
 * canonical spelling does, so its read stays in the mount. */
static void test_ns_given_spelling(struct check_count *c)
{
	struct hub_roots roots = {0};
	char p[PATH_MAX * 2], alias[PATH_MAX * 2];

	snprintf(alias, sizeof(alias), "%s/alias", top);
	snprintf(p, sizeof(p), "%s", top);
	if (symlink(p, alias) < 0)
		perror(alias);
	check_mkdirs(top, "hub/models--o--alias/blobs");
	check_mkdirs(top, "hub/models--o--alias/snapshots/" REV);
	snprintf(p, sizeof(p), "%s/alias/hub", top);
	CHECK(c, hub_roots_add(&roots, p) == 0, "root named through a link");
	snprintf(p, sizeof(p), "%s/alias/hub/blobs/4d/" SHA_B, top);
	ln(p, "hub/models--o--alias/blobs/" SHA_B);
	ln("../../blobs/" SHA_B, "hub/models--o--alias/snapshots/" REV "/a.safetensors");
	snprintf(p, sizeof(p), "%s/alias/outside/secret", top);
	ln(p, "hub/models--o--alias/snapshots/" REV "/escape");
	expect_file(c, &roots, "models--o--alias/blobs/" SHA_B, "blobs/4d/" SHA_B, SHA_B);
	expect_link(c, &roots, "models--o--alias/snapshots/" REV "/a.safetensors",
		    "../../blobs/" SHA_B, NS_LINK_RESOLVED);
	expect_link(c, &roots, "models--o--alias/snapshots/" REV "/escape", p, NS_LINK_ESCAPE);
}

/* A batch gives back what ns_classify gave, entry for entry: files, links
 * of every state, hidden and missing names; more entries than its first
 * allocation holds. */
static void test_ns_batch(struct check_count *c)
{
	static const char *const rels[] = {
		"", "nope", "models--o--std/refs/main", "models--o--std/refs/main/x",
		"models--o--std/snapshots/" REV "/model.safetensors",
		"models--o--std/blobs/" SHA_A, "models--o--store/blobs/hop",
		"models--o--store/snapshots/" REV "/direct.bin",
		"models--o--store/snapshots/" REV "/dangling.json",
		"models--o--store/snapshots/" REV "/self",
		"models--o--store/snapshots/" REV "/escape-rel",
		"models--o--store/snapshots/" REV "/packdir",
	};
	const size_t nrel = sizeof(rels) / sizeof(rels[0]), rounds = 5;
	struct hub_roots roots = {0};
	struct ns_batch b = {0};
	struct ns_entry *want = malloc(sizeof(*want)), *got = malloc(sizeof(*got));
	char p[PATH_MAX * 2];
	int ok = 1;

	snprintf(p, sizeof(p), "%s/hub", top);
	CHECK(c, want && got && hub_roots_add(&roots, p) == 0, "setup");
	if (!want || !got)
		goto out;
	for (size_t i = 0; i < nrel * rounds; i++) {
		int r = ns_classify(&roots, rels[i % nrel], want);

		ok &= ns_batch_add(&b, r, want) == 0;
	}
	CHECK(c, ok && b.n == nrel * rounds, "%zu entries added", b.n);
	for (size_t i = 0; i < b.n; i++) {
		const char *rel = rels[i % nrel];
		int r = ns_classify(&roots, rel, want), g;

		memset(got, 0x5a, sizeof(*got));
		g = ns_batch_get(&b, i, got);
		CHECK(c, g == r, "%s: res %d, want %d", rel, g, r);
		if (g != 0 || r != 0)
			continue;
		/* (not the atime: a readlink may have moved it since) */
		CHECK(c, got->kind == want->kind && got->link_state == want->link_state &&
		      got->st.st_ino == want->st.st_ino && got->st.st_mode == want->st.st_mode &&
		      got->st.st_size == want->st.st_size &&
		      got->st.st_mtim.tv_nsec == want->st.st_mtim.tv_nsec &&
		      got->st.st_mtim.tv_sec == want->st.st_mtim.tv_sec, "%s: kind, state, attrs", rel);
		CHECK(c, !strcmp(got->backing, want->backing) && !strcmp(got->target, want->target) &&
		      !strcmp(got->blob_id, want->blob_id), "%s: backing '%s' target '%s' id '%s'",
		      rel, got->backing, got->target, got->blob_id);
	}
	ns_batch_free(&b);
	CHECK(c, b.n == 0 && !b.items && !b.strs, "freed batch is empty");
out:
	free(want);
	free(got);
}

/* Every entry of the tree, directory by directory: ns_classify_in() gives
 * what ns_classify() gives (the short cut for hub-shaped links included). */
static int same_in_dir(struct check_count *c, struct hub_roots *roots, const char *rel,
		       struct ns_entry *a, struct ns_entry *b)
{
	char path[PATH_MAX * 2], child[PATH_MAX];
	struct ns_dir *nd = malloc(sizeof(*nd));
	struct dirent *de;
	DIR *dh;
	int n = 0, ra, rb;

	snprintf(path, sizeof(path), "%s/%s", roots->path[0], rel);
	dh = opendir(path);
	CHECK(c, nd && dh && ns_dir_open(nd, roots, rel) == 0, "open %s", rel);
	if (!nd || !dh) {
		free(nd);
		if (dh)
			closedir(dh);
		return 0;
	}
	while ((de = readdir(dh))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		path_join(rel, de->d_name, child, sizeof(child));
		ra = ns_classify_in(nd, de->d_name, a);
		rb = ns_classify(roots, child, b);
		n++;
		CHECK(c, ra == rb, "%s: ns_classify_in %d, ns_classify %d", child, ra, rb);
		if (ra != 0 || rb != 0)
			continue;
		CHECK(c, a->kind == b->kind && a->link_state == b->link_state &&
		      a->st.st_ino == b->st.st_ino && a->st.st_mode == b->st.st_mode &&
		      a->st.st_size == b->st.st_size, "%s: kind %d/%d state %d/%d", child, a->kind,
		      b->kind, a->link_state, b->link_state);
		CHECK(c, !strcmp(a->backing, b->backing) && !strcmp(a->target, b->target) &&
		      !strcmp(a->blob_id, b->blob_id), "%s: backing %s/%s target %s/%s id %s/%s",
		      child, a->backing, b->backing, a->target, b->target, a->blob_id, b->blob_id);
		/* the backing file's attributes, read on the way (a walk's
		 * consumer stats it no more) */
		CHECK(c, a->has_backing_st == b->has_backing_st &&
		      a->has_backing_st == (a->kind == NS_FILE || (a->kind == NS_LINK &&
		      a->link_state == NS_LINK_RESOLVED && a->backing[0])) &&
		      (!a->has_backing_st || (S_ISREG(a->backing_st.st_mode) &&
		      a->backing_st.st_ino == b->backing_st.st_ino &&
		      a->backing_st.st_size == b->backing_st.st_size)),
		      "%s: backing attributes %d/%d", child, a->has_backing_st, b->has_backing_st);
		if (de->d_type == DT_DIR)
			n += same_in_dir(c, roots, child, a, b);
	}
	closedir(dh);
	ns_dir_close(nd);
	free(nd);
	return n;
}

static void test_ns_in(struct check_count *c)
{
	struct hub_roots roots = {0};
	struct ns_entry *a = malloc(sizeof(*a)), *b = malloc(sizeof(*b));
	struct ns_dir *nd = malloc(sizeof(*nd));
	char p[PATH_MAX * 2];
	int n;

	snprintf(p, sizeof(p), "%s/hub", top);
	CHECK(c, a && b && nd && hub_roots_add(&roots, p) == 0, "setup");
	if (!a || !b || !nd)
		goto out;
	n = same_in_dir(c, &roots, "", a, b);
	CHECK(c, n > 30, "%d entries compared", n);
	/* A link to a blob in its own blobs/ takes the short cut's answer. */
	CHECK(c, ns_dir_open(nd, &roots, "models--o--std/snapshots/" REV) == 0 &&
	      ns_classify_in(nd, "model.safetensors", a) == 0 && a->kind == NS_LINK &&
	      !strcmp(a->target, "../../blobs/" SHA_A) && !strcmp(a->blob_id, SHA_A) &&
	      nd->blobs_fd >= 0, "short cut: target %s", a->target);
	ns_dir_close(nd);
	/* ... and a ".." after a name of the text's own does not */
	CHECK(c, ns_dir_open(nd, &roots, "models--o--std/snapshots/" REV) == 0 &&
	      ns_classify_in(nd, "through-x.json", a) == 0 && a->kind == NS_LINK &&
	      a->link_state == NS_LINK_DANGLING, "through x: kind %d state %d", a->kind,
	      a->link_state);
	ns_dir_close(nd);
	CHECK(c, ns_dir_open(nd, &roots, "nope") == -ENOENT, "open of a missing directory");
	ns_dir_close(nd);
	CHECK(c, ns_dir_open(nd, &roots, "models--o--store/snapshots/" REV "/packdir") == -ENOTDIR,
	      "open through a link");
	ns_dir_close(nd);
out:
	free(a);
	free(b);
	free(nd);
}

/* --wrap=readdir64 (readdir's symbol with 64-bit offsets, as the build
 * has them): a listing of the directory (break_dev, break_ino) breaks off
 * with EIO after break_after entries, as a NAS failing mid-way breaks one. */
struct dirent *__real_readdir64(DIR *d);
struct dirent *__wrap_readdir64(DIR *d);
static dev_t break_dev;
static ino_t break_ino;
static int break_after = -1;

struct dirent *__wrap_readdir64(DIR *d)
{
	struct stat st;

	if (break_after >= 0 && fstat(dirfd(d), &st) == 0 && st.st_dev == break_dev &&
	    st.st_ino == break_ino && break_after-- == 0) {
		break_after = 0; /* every later call fails too */
		errno = EIO;
		return NULL;
	}
	return __real_readdir64(d);
}

static int count_entry(void *arg, const char *rel, const struct ns_entry *e)
{
	(void)rel, (void)e;
	++*(int *)arg;
	return 0;
}

/* A walk whose listing of a directory below its start breaks off part way
 * stops with that error, in either mode: a promote must not take the
 * entries before the break for the whole tree.  A directory that cannot
 * be opened at all is skipped (not strict) as before. */
static void test_walk_listing_breaks(struct check_count *c)
{
	const char *sub = "models--o--std/snapshots/" REV;
	struct hub_roots roots = {0};
	char p[PATH_MAX * 2];
	struct stat st;
	int whole = 0, n, r;

	snprintf(p, sizeof(p), "%s/hub", top);
	CHECK(c, hub_roots_add(&roots, p) == 0, "root");
	snprintf(p, sizeof(p), "%s/hub/%s", top, sub);
	CHECK(c, stat(p, &st) == 0, "%s", p);
	break_dev = st.st_dev;
	break_ino = st.st_ino;
	CHECK(c, ns_walk(&roots, "models--o--std", NS_WALK_WEIGHTS, count_entry, &whole) == 0 &&
	      whole > 4, "the whole walk: %d entries", whole);
	for (int strict = 0; strict < 2; strict++) {
		n = 0;
		break_after = 1;
		r = ns_walk(&roots, "models--o--std", NS_WALK_WEIGHTS | (strict ? NS_WALK_STRICT : 0),
			    count_entry, &n);
		break_after = -1;
		CHECK(c, r == -EIO && n < whole, "%s walk: the listing of %s breaking off stops it "
		      "(%d, %d of %d entries)", strict ? "a strict" : "a", sub, r, n, whole);
	}
}

/* A repo's snapshot names, the names the exclusion globs speak of: all of
 * them or none (a map cut at its cap would let an excluded blob be copied,
 * its name past the cap). */
static void test_snapshot_names_cap(struct check_count *c)
{
	struct hub_roots roots = {0};
	char p[PATH_MAX * 2];
	json_t *map = json_object();
	int n;

	snprintf(p, sizeof(p), "%s/hub", top);
	CHECK(c, map && hub_roots_add(&roots, p) == 0, "root");
	n = collect_snapshot_names(&roots, "models--o--std", map, 1000);
	CHECK(c, n >= 2, "the repo's snapshot names: %d", n);
	json_object_clear(map);
	CHECK(c, collect_snapshot_names(&roots, "models--o--std", map, (size_t)n) == n,
	      "as many as the cap: all of them");
	json_object_clear(map);
	CHECK(c, collect_snapshot_names(&roots, "models--o--std", map, (size_t)n - 1) == -E2BIG,
	      "one more than the cap: E2BIG, not a map cut short");
	json_decref(map);
}

int main(void)
{
	struct check_count c = {0};

	snprintf(top, sizeof(top), "/tmp/wfs-unit-XXXXXX");
	check_tmpdir(top);
	build_tree();
	test_path(&c);
	test_ns(&c);
	test_ns_given_spelling(&c);
	test_ns_batch(&c);
	test_ns_in(&c);
	test_walk_listing_breaks(&c);
	test_snapshot_names_cap(&c);
	check_rmtree(top);
	printf("core: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
