/* control.c - fuzz the control server's request handling: control_handle()
 * on a real store (with ref pins and a policy) over a small NAS hub.
 *
 * Input: request lines, one per '\n' (at most 8), handled in turn as if
 * each came on its own connection: from root, the mount's owner and
 * another user in rotation.  The NAS tree and LOCAL_STORE are made once;
 * the store is reopened for every input from the same index.json and
 * local copies, so an input's outcome depends on it alone and every crash
 * file replays.
 *
 * WFS_FUZZ_VERBOSE=1 prints each request and its reply (replaying a crash).
 *
 * Checked on every reply: it is one JSON object with a boolean "ok", and a
 * refusal carries an "error" string and an "errno" name ("EINVAL"); a
 * request that would change state from a user other than root and the
 * owner is refused with EPERM.
 */
#include "fuzz.h"

#include "control.h"
#include "hash.h"
#include "pins.h"
#include "policy.h"
#include "store.h"

#include <jansson.h>

#define HELLO_SHA "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
#define CFG_SHA1 "0123456789abcdef0123456789abcdef01234567"
#define REV1 "1111111111111111111111111111111111111111"
#define REV2 "2222222222222222222222222222222222222222"
#define XXH_B "bb00000000000000000000000000000b"
#define OWNER 1000

static char nas[PATH_MAX], extra[PATH_MAX], local[PATH_MAX];
static struct hub_roots roots;
static int verbose; /* WFS_FUZZ_VERBOSE=1: print each request and reply */
static struct policy_opts pol;

static void put(const char *dir, const char *rel, const char *content)
{
	char p[PATH_MAX * 2], d[PATH_MAX * 2];

	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	snprintf(d, sizeof(d), "%s", p);
	*strrchr(d, '/') = '\0';
	fuzz_mkdirs(d);
	fuzz_write(p, content, strlen(content));
}

static void link_at(const char *dir, const char *rel, const char *target)
{
	char p[PATH_MAX * 2], d[PATH_MAX * 2];

	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	snprintf(d, sizeof(d), "%s", p);
	*strrchr(d, '/') = '\0';
	fuzz_mkdirs(d);
	FUZZ_SETUP(symlink(target, p) == 0, "symlink");
}

/* A hub with every shape the namespace knows, small. */
static void make_nas(void)
{
	char t[PATH_MAX * 2];

	put(nas, "models--org--name/blobs/" HELLO_SHA, "hello\n");
	put(nas, "models--org--name/blobs/" CFG_SHA1, "{\"a\": 1}\n");
	put(nas, "models--org--name/blobs/shard1", "shard one\n");
	put(nas, "models--org--name/blobs/shard2", "shard two\n");
	put(nas, "models--org--name/blobs/wmap",
	    "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", "
	    "\"b\": \"model-00002-of-00002.safetensors\"}}\n");
	link_at(nas, "models--org--name/snapshots/" REV1 "/model.safetensors",
		"../../blobs/" HELLO_SHA);
	link_at(nas, "models--org--name/snapshots/" REV1 "/config.json", "../../blobs/" CFG_SHA1);
	link_at(nas, "models--org--name/snapshots/" REV1 "/model-00001-of-00002.safetensors",
		"../../blobs/shard1");
	link_at(nas, "models--org--name/snapshots/" REV1 "/model-00002-of-00002.safetensors",
		"../../blobs/shard2");
	link_at(nas, "models--org--name/snapshots/" REV1 "/model.safetensors.index.json",
		"../../blobs/wmap");
	link_at(nas, "models--org--name/snapshots/" REV1 "/sub/dir/q4.gguf",
		"../../../../blobs/" HELLO_SHA);
	put(nas, "models--org--name/snapshots/" REV2 "/model.safetensors", "rev two\n");
	put(nas, "models--org--name/refs/main", REV1);
	put(nas, "models--org--name/refs/pr/1", REV2 "\n");
	put(nas, "models--org--name/.no_exist/" REV1 "/missing.json", "");
	/* a repo whose blobs live in a hub-level store, relative and absolute */
	put(nas, "store/ab/cdef", "in the store\n");
	link_at(nas, "models--org--other/blobs/rel", "../../store/ab/cdef");
	snprintf(t, sizeof(t), "%s/store/ab/cdef", nas);
	link_at(nas, "models--org--other/blobs/abs", t);
	snprintf(t, sizeof(t), "%s/file", extra);
	link_at(nas, "models--org--other/blobs/extra", t);
	link_at(nas, "models--org--other/snapshots/r/a.bin", "../../blobs/rel");
	link_at(nas, "models--org--other/snapshots/r/b.bin", "../../blobs/abs");
	link_at(nas, "models--org--other/snapshots/r/c.bin", "../../blobs/extra");
	link_at(nas, "models--org--other/snapshots/r/dangling", "../../blobs/nope");
	link_at(nas, "models--org--other/snapshots/r/loop", "loop");
	link_at(nas, "models--org--other/snapshots/r/escape", "/etc/hostname");
	link_at(nas, "models--org--other/snapshots/r/up", "../../../../../../../../etc");
	link_at(nas, "models--org--other/snapshots/r/dir", "../../../store");
	put(nas, "models--org--other/refs/main", "r");
	put(nas, "models--org--other/refs/dangling", "nonexistent");
	put(nas, "datasets--u--d/snapshots/r/data.csv", "a,b\n1,2\n");
	put(nas, "datasets--u--d/refs/main", "r");
	fuzz_mkdirs(nas);
	snprintf(t, sizeof(t), "%s/.locks/models--org--name", nas);
	fuzz_mkdirs(t);
	put(nas, "version.txt", "1");
	put(extra, "file", "extra root\n");
}

/* The local copies write_index() names: the first with its real hashes
 * (verify and verify --full find it sound), the second with made-up ones
 * (verify demotes it).  Made again only when a request removed one (evict),
 * so that their identity (inode, times) mostly stays. */
static struct {
	const char *rel, *content;
	char xxh[33], sample[33];
} copies[] = {
	{ "models--org--name/blobs/" HELLO_SHA, "hello\n", "", "" },
	{ "models--org--name/blobs/shard1", "shard one\n", XXH_B,
	  "00000000000000000000000000000000" },
};

static void copy_hashes(void)
{
	char key[PATH_MAX * 2];
	int fd;

	xxh128_hex_of(copies[0].content, strlen(copies[0].content), copies[0].xxh);
	snprintf(key, sizeof(key), "%s/%s", nas, copies[0].rel);
	fd = open(key, O_RDONLY | O_CLOEXEC);
	FUZZ_SETUP(fd >= 0 && source_sample(fd, strlen(copies[0].content), copies[0].sample) == 0,
		   "source_sample");
	close(fd);
}

static void copy_stat(int i, struct stat *st)
{
	char p[PATH_MAX * 2];

	snprintf(p, sizeof(p), "%s/data/%.2s/%s", local, copies[i].xxh, copies[i].xxh);
	if (stat(p, st) == 0 && (size_t)st->st_size == strlen(copies[i].content))
		return;
	*strrchr(p, '/') = '\0';
	fuzz_mkdirs(p);
	snprintf(p, sizeof(p), "%s/data/%.2s/%s", local, copies[i].xxh, copies[i].xxh);
	fuzz_write(p, copies[i].content, strlen(copies[i].content));
	FUZZ_SETUP(stat(p, st) == 0, "stat");
}

/* Two verified copies (with the proof a version 2 index keeps of them), a
 * flagged blob and a ref pin, as the daemon would have left them: the
 * index every input starts from. */
static void write_index(void)
{
	json_t *root = json_object(), *blobs = json_array(), *refs = json_array();
	static const struct {
		const char *rel, *id, *state;
		int copy, pinned;
	} recs[] = {
		{ "models--org--name/blobs/" HELLO_SHA, HELLO_SHA, "local", 0, 0 },
		{ "models--org--name/blobs/shard1", "shard1", "local", 1, 1 },
		{ "models--org--name/blobs/shard2", "shard2", "mismatch", -1, 0 },
	};
	char p[PATH_MAX * 2], *text;

	for (size_t i = 0; i < sizeof(recs) / sizeof(recs[0]); i++) {
		char key[PATH_MAX * 2];
		struct stat st, cst;
		json_t *o;

		snprintf(key, sizeof(key), "%s/%s", nas, recs[i].rel);
		FUZZ_SETUP(stat(key, &st) == 0, "stat");
		o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b}",
			"key", key, "id", recs[i].id, "state", recs[i].state,
			"xxh", recs[i].copy >= 0 ? copies[recs[i].copy].xxh : "",
			"sample", recs[i].copy >= 0 ? copies[recs[i].copy].sample : "",
			"reason", recs[i].copy >= 0 ? "" : "sha256 of the content does not match its name",
			"size", (json_int_t)st.st_size, "mtime_s", (json_int_t)st.st_mtim.tv_sec,
			"mtime_ns", (json_int_t)st.st_mtim.tv_nsec,
			"ctime_s", (json_int_t)st.st_ctim.tv_sec,
			"ctime_ns", (json_int_t)st.st_ctim.tv_nsec, "last_used", (json_int_t)1700000000,
			"last_used_ns", (json_int_t)1700000000000000000LL, "pinned", recs[i].pinned);
		if (recs[i].copy >= 0) {
			copy_stat(recs[i].copy, &cst);
			json_object_update_new(o, json_pack("{s:I, s:I, s:I, s:I, s:I}",
				"copy_ino", (json_int_t)cst.st_ino,
				"copy_mtime_s", (json_int_t)cst.st_mtim.tv_sec,
				"copy_mtime_ns", (json_int_t)cst.st_mtim.tv_nsec,
				"copy_ctime_s", (json_int_t)cst.st_ctim.tv_sec,
				"copy_ctime_ns", (json_int_t)cst.st_ctim.tv_nsec));
		}
		json_array_append_new(blobs, o);
	}
	json_array_append_new(refs, json_pack("{s:s, s:s, s:s, s:s}", "repo", "models--org--name",
					      "ref", "main", "commit", REV1, "pending", ""));
	json_object_set_new(root, "version", json_integer(2));
	json_object_set_new(root, "blobs", blobs);
	json_object_set_new(root, "refs", refs);
	text = json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS);
	FUZZ_SETUP(text, "json_dumps");
	json_decref(root);
	snprintf(p, sizeof(p), "%s/index.json", local);
	fuzz_write(p, text, strlen(text));
	free(text);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *base = fuzz_make_base("control");

	(void)argc;
	(void)argv;
	snprintf(nas, sizeof(nas), "%s/nas", base);
	snprintf(extra, sizeof(extra), "%s/extra", base);
	snprintf(local, sizeof(local), "%s/local", base);
	fuzz_mkdirs(nas);
	fuzz_mkdirs(extra);
	fuzz_mkdirs(local);
	make_nas();
	copy_hashes();
	FUZZ_SETUP(hub_roots_add(&roots, nas) == 0, "root");
	FUZZ_SETUP(hub_roots_add(&roots, extra) == 0, "extra root");
	policy_opts_init(&pol);
	FUZZ_SETUP(policy_add_exclude(&pol, "*.gguf") == 0, "exclude");
	FUZZ_SETUP(policy_add_exclude(&pol, "models--org--other/*") == 0, "exclude");
	pol.store_max = 1 << 20;
	verbose = getenv("WFS_FUZZ_VERBOSE") != NULL;
	return 0;
}

/* Does @req (a request line) ask for a change of state? */
static int changes_state(const char *req, size_t len)
{
	static const char *const ops[] = { "evict", "verify", "pin", "unpin" };
	json_t *j = json_loadb(req, len, JSON_REJECT_DUPLICATES, NULL);
	const char *op = json_is_object(j) ? json_string_value(json_object_get(j, "op")) : NULL;
	int r = 0;

	if (op && !strcmp(op, "promote"))
		r = !json_is_true(json_object_get(j, "dry_run"));
	for (size_t i = 0; op && i < sizeof(ops) / sizeof(ops[0]); i++)
		r |= !strcmp(op, ops[i]);
	json_decref(j);
	return r;
}

/* A reply is one JSON object: {"ok":true,...} or {"ok":false,"error":"...","errno":"E..."};
 * a user other than root and the owner changes nothing. */
static void check_reply(const char *req, size_t len, uid_t peer, const char *rep)
{
	json_error_t err;
	json_t *j, *ok;

	FUZZ_ASSERT(rep, "no reply to %.*s", (int)len, req);
	FUZZ_ASSERT(!strchr(rep, '\n'), "a reply spans lines: %s", rep);
	j = json_loads(rep, JSON_REJECT_DUPLICATES, &err);
	FUZZ_ASSERT(j && json_is_object(j), "reply is not a JSON object (%s): %s",
		    j ? "not an object" : err.text, rep);
	ok = json_object_get(j, "ok");
	FUZZ_ASSERT(json_is_boolean(ok), "reply without a boolean \"ok\": %s", rep);
	if (json_is_false(ok)) {
		FUZZ_ASSERT(json_is_string(json_object_get(j, "error")), "refusal without error: %s",
			    rep);
		FUZZ_ASSERT(json_string_value(json_object_get(j, "errno")) &&
			    json_string_value(json_object_get(j, "errno"))[0] == 'E',
			    "refusal without an errno name: %s", rep);
	}
	if (peer != 0 && peer != OWNER && changes_state(req, len))
		FUZZ_ASSERT(json_is_false(ok) && !strcmp(json_string_value(json_object_get(j, "errno")),
							 "EPERM"),
			    "uid %u may not change state: %.*s -> %s", (unsigned)peer, (int)len, req,
			    rep);
	json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uid_t peers[] = { 0, OWNER, 4242 };
	struct store_opts opt = { .workers = 2, .policy = &pol };
	struct store s;
	struct pins pins;
	struct control ctl;
	const char *p = (const char *)data, *end = p + size;

	if (size > CONTROL_MAX_REQUEST)
		return -1;
	write_index();
	FUZZ_SETUP(store_open(&s, local, &opt, NULL) == 0, "store_open");
	FUZZ_SETUP(pins_open(&pins, &s, &roots, &pol) == 0, "pins_open");
	memset(&ctl, 0, sizeof(ctl));
	ctl.roots = &roots;
	ctl.store = &s;
	ctl.pins = &pins;
	ctl.mount = "/mnt/hub";
	ctl.local = local;
	ctl.owner = OWNER;
	for (int line = 0; line < 8 && p < end; line++) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
		char *rep = control_handle(&ctl, p, len, peers[line % 3]);

		if (verbose)
			fprintf(stderr, "> %.*s\n< %s\n", (int)len, p, rep ? rep : "(null)");
		check_reply(p, len, peers[line % 3], rep);
		free(rep);
		p += len + (nl != NULL);
	}
	pins_close(&pins);
	store_close(&s);
	return 0;
}
