/* test_jline.c - the tree-less line writer against jansson.
 *
 * Every line jline writes must be, byte for byte, what jansson's
 * json_dumps(JSON_COMPACT | JSON_SORT_KEYS) writes for the same members:
 * that is what index.json and record.json were before, what an older wfs
 * reads, and what the fast reader (jflat) is shaped for.  Checked on the
 * lines index_write and record_text make (each must be its own parse
 * dumped again), on every byte and the UTF-8 edges as a string, on
 * integers at their edges, on key order and keys put twice, and on
 * 100,000 random lines built both ways.
 */
#include "check.h"
#include "index.h"
#include "jline.h"
#include "record_int.h"

#include <jansson.h>
#include <limits.h>

static char top[PATH_MAX];

static const size_t dump_flags = JSON_COMPACT | JSON_SORT_KEYS;

/* @l written alone: its text (malloc'ed) and jline_write's answer. */
static char *line_text(struct jline *l, int *r)
{
	struct jtext t = { 0 };
	size_t n;
	char *s;

	*r = jline_write(l, &t);
	s = jtext_take(&t, &n);
	return s;
}

/* 1 when every line between the head and "]}" of the text @s is the
 * compact, sorted dump of its own parse; *@n the lines seen. */
static int canonical_lines(const char *s, int *n)
{
	const char *p = strchr(s, '\n'), *nl;
	int ok = 1;

	*n = 0;
	for (; p && (nl = strchr(p + 1, '\n')); p = nl) {
		size_t k = (size_t)(nl - p - 1);
		json_t *o;
		char *d;

		if (k && p[k] == ',')
			k--;
		if (k == 2 && !memcmp(p + 1, "]}", 2))
			break;
		o = json_loadb(p + 1, k, JSON_REJECT_DUPLICATES, NULL);
		d = o ? json_dumps(o, dump_flags) : NULL;
		if (!d || strlen(d) != k || memcmp(d, p + 1, k)) {
			fprintf(stderr, "not canonical: %.*s\n   jansson: %s\n", (int)k, p + 1,
				d ? d : "(no parse)");
			ok = 0;
		}
		(*n)++;
		free(d);
		json_decref(o);
	}
	return ok;
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *s = NULL;
	long len;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	rewind(f);
	if (len >= 0 && (s = calloc(1, (size_t)len + 1)) &&
	    fread(s, 1, (size_t)len, f) != (size_t)len) {
		free(s);
		s = NULL;
	}
	fclose(f);
	return s;
}

static void test_index(struct check_count *c)
{
	struct part_range r[2] = { { 0, 4096, "0123456789abcdef0123456789abcdef" },
				   { 8192, 100, "fedcba9876543210fedcba9876543210" } };
	struct index_rec v[] = {
		{ .key = "/n/hub/models--o--m/blobs/aa", .id = "aa", .state = "local",
		  .xxh = "0123456789abcdef0123456789abcdef", .sample = "s", .reason = "",
		  .size = 1ULL << 40, .mtime = { 1796365597, 99611806 }, .last_used = -7,
		  .use_ns = UINT64_C(1796370536892427694), .pinned = 1, .copy_ino = 11021306,
		  .copy_mtime = { INT64_MAX, 999999999 }, .copy_ctime = { INT64_MIN, 0 },
		  .name = "models--o--m/snapshots/r/model \"a\".safetensors" },
		{ .key = "/n/hub/a \"quoted\"\\name\ttab\x01\x1f\x7f/", .id = "bb",
		  .state = "mismatch", .xxh = "", .sample = "",
		  .reason = "NAS file changed\nsize 3 -> 4 / \b\f\r\x02" },
		{ .key = "/n/hub/\xff\xfe not utf-8", .id = "\xc0\xaf", .state = "nas", .xxh = "",
		  .sample = "", .reason = "caf\xc3\xa9 \xff r\xc3\xa9sum\xc3\xa9 \xed\xa0\x80",
		  .ref_pinned = 1, .name = "models--o--m/snapshots/r/\xff" },
		{ .key = "/n/hub/p\xf4\x8f\xbf\xbf", .id = "dd", .state = "partial", .xxh = "",
		  .sample = "", .reason = "", .ranges = r, .nranges = 2, .part_ino = 5 },
	};
	struct index_ref refs[] = { { "models--o--m", "main", "abc", "" } };
	char path[PATH_MAX + 16], *s;
	int n = 0, ok;

	snprintf(path, sizeof(path), "%s/index.json", top);
	CHECK(c, index_write(path, v, sizeof(v) / sizeof(v[0]), refs, 1) == 0, "index_write");
	s = slurp(path);
	ok = s && canonical_lines(s, &n);
	CHECK(c, ok && n == 4, "index_write's 4 lines are jansson's dumps of themselves (%d)", n);
	CHECK(c, s && strstr(s, "\"key_hex\":\"2f6e2f6875622ffffe206e6f74207574662d38\"") &&
		 strstr(s, "\"id_hex\":\"c0af\"") &&
		 strstr(s, "\"name_hex\":\"6d6f64656c732d2d6f2d2d6d2f736e617073686f74732f722fff\"") &&
		 strstr(s, "\"name\":\"models--o--m/snapshots/r/model \\\"a\\\".safetensors\"") &&
		 strstr(s, "\"reason\":\"caf?? ? r??sum?? ???\""),
	      "names not UTF-8 as _hex; a reason not UTF-8 with '?' for each byte >= 0x80");
	free(s);
}

static struct rnode *node(const char *path, enum ns_kind kind, mode_t mode)
{
	struct rnode *n = calloc(1, sizeof(*n));

	n->path = strdup(path);
	n->name = strrchr(n->path, '/') ? strrchr(n->path, '/') + 1 : n->path;
	n->kind = kind;
	n->st.st_mode = mode;
	n->st.st_nlink = 1;
	n->st.st_size = 4096;
	n->st.st_ino = UINT64_MAX;
	n->st.st_dev = 65024;
	n->st.st_uid = UINT32_MAX;
	n->st.st_atim = (struct timespec){ -1, 999999999 };
	return n;
}

static void test_record(struct check_count *c)
{
	struct rnodes l = { 0 };
	struct record_table *t;
	struct rnode *n;
	size_t dropped = 0, len = 0;
	char *s;
	int nl = 0, ok;

	rnodes_push(&l, node("", NS_DIR, S_IFDIR | 0755));
	rnodes_push(&l, node("m\xff", NS_DIR, S_IFDIR | 0755));
	n = node("m\xff/link \"q\"", NS_LINK, S_IFLNK | 0777);
	n->target = strdup("../blobs/\x01\xc3\xa9");
	n->blob_id = strdup("e20a83692f293d0703a0463d33897f45b89cdb0c");
	n->backing = strdup("/n/hub/m\xff/link \"q\"");
	n->link_state = NS_LINK_RESOLVED;
	rnodes_push(&l, n);
	n = node("m\xff/main", NS_FILE, S_IFREG | 0444);
	n->data = malloc(4);
	memcpy(n->data, "a\0b\n", 4);
	n->data_len = 4;
	n->has_data = 1;
	n->nas_data = strdup("41b7f4c5\n");
	n->nas_data_len = 9;
	rnodes_push(&l, n);
	n = node("m\xff/text", NS_FILE, S_IFREG | 0444);
	n->data = strdup("{\"a\": \"\\u00e9\"}\t\xe2\x82\xac");
	n->data_len = strlen(n->data);
	n->has_data = 1;
	rnodes_push(&l, n);
	t = record_table_make(&l, &dropped);
	CHECK(c, t && !dropped, "a table of 5 nodes");
	s = t ? record_text(t, "/n/hub\xfe", 1796365597, &len) : NULL;
	ok = s && canonical_lines(s, &nl);
	CHECK(c, ok && nl == 5, "record_text's 5 lines are jansson's dumps of themselves (%d)", nl);
	CHECK(c, s && strstr(s, "\"data_hex\":\"6100620a\"") &&
		 strstr(s, "\"nas_data\":\"41b7f4c5\\n\"") && strstr(s, "\"path_hex\":\"6dff\"") &&
		 strstr(s, "\"target\":\"../blobs/\\u0001\xc3\xa9\"") &&
		 strstr(s, "\"link_state\":\"resolved\"") && strstr(s, "\"nas_hex\":"),
	      "the record's bytes as they were written before");
	free(s);
	record_table_free(t);
}

/* @n bytes at @s as a string: jline's text against json_stringn's dump,
 * or both refusing it.  1 when they agree. */
static int same_string(const char *s, size_t n)
{
	struct jline l = { 0 };
	json_t *o = json_object(), *v = json_stringn(s, n);
	char *want = NULL, *got;
	int r, ok;

	jline_strn(&l, "k", s, n);
	got = line_text(&l, &r);
	if (v && !json_object_set_new(o, "k", v))
		want = json_dumps(o, dump_flags);
	ok = want ? r == 0 && got && !strcmp(got, want) : r == -EINVAL && !got;
	if (!ok)
		fprintf(stderr, "string %zu bytes: jline %d '%s', jansson '%s'\n", n, r,
			got ? got : "", want ? want : "(refused)");
	free(want);
	free(got);
	json_decref(o);
	jline_free(&l);
	return ok;
}

static void test_strings(struct check_count *c)
{
	static const char *const utf8[] = {
		"caf\xc3\xa9", "\xe2\x82\xac \xf0\x9f\x98\x80", "\xf4\x8f\xbf\xbf", "\xc2\x80",
		"\xdf\xbf", "\xe0\xa0\x80", "\xef\xbf\xbf", "\xf0\x90\x80\x80", "\xed\x9f\xbf",
		"\xee\x80\x80", "\xf4\x90\x80\x80", "\xed\xa0\x80", "\xed\xbf\xbf", "\xe0\x80\xaf",
		"\xf0\x80\x80\xaf", "\xc0\xaf", "\xc1\xbf", "\xc3", "\xc3\xa9\xa9", "\xf5\x80\x80\x80",
		"\xe2\x82", "\xc3\xc3\xa9", "\xe2\x82\xf0", "\xf8\x88\x80\x80\x80", "\xff", "\x80",
		"a\\b\"c/d", "\x7f", "", "x\ty\n\r\b\f\x0b\x1f\x01",
	};
	int all = 1;
	char b[3];

	for (int i = 0; i < 256; i++) {
		b[0] = 'a';
		b[1] = (char)i;
		b[2] = 'z';
		all &= same_string(b, 3) && same_string(b + 1, 1);
	}
	CHECK(c, all, "every byte alone and between two letters, as jansson writes it");
	all = 1;
	for (size_t i = 0; i < sizeof(utf8) / sizeof(utf8[0]); i++)
		all &= same_string(utf8[i], strlen(utf8[i]));
	CHECK(c, all, "UTF-8 at its edges written or refused as jansson does");
}

static void test_ints(struct check_count *c)
{
	static const int64_t v[] = { 0, 1, -1, 9, 10, -10, 99, 100, 999999999, 1000000000,
				     INT32_MAX, INT32_MIN, (int64_t)UINT32_MAX, INT64_MAX,
				     INT64_MIN, INT64_MIN + 1, INT64_MAX - 1 };
	int all = 1;

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		struct jline l = { 0 };
		json_t *o = json_pack("{s:I, s:b, s:b}", "n", (json_int_t)v[i], "t", 1, "f", 0);
		char *want = json_dumps(o, dump_flags), *got;
		int r;

		jline_bool(&l, "t", 1);
		jline_int(&l, "n", v[i]);
		jline_bool(&l, "f", 0);
		got = line_text(&l, &r);
		all &= r == 0 && got && want && !strcmp(got, want);
		free(got);
		free(want);
		json_decref(o);
		jline_free(&l);
	}
	CHECK(c, all, "integers at their edges and booleans as jansson writes them");
}

static void test_keys(struct check_count *c)
{
	static const char *const keys[] = { "b", "a_hex", "", "a", "ab", "\xc3\xa9", "A", "a\x7f",
					    "a\x01", "a\"", "z", "a b" };
	const size_t nk = sizeof(keys) / sizeof(keys[0]);
	struct jline l = { 0 };
	struct jtext t = { 0 };
	json_t *o = json_object();
	char *want, *got;
	size_t len;
	int r, r2;

	for (size_t i = 0; i < nk; i++) {
		jline_int(&l, keys[i], (int64_t)i);
		json_object_set_new(o, keys[i], json_integer((json_int_t)i));
	}
	got = line_text(&l, &r);
	want = json_dumps(o, dump_flags);
	CHECK(c, r == 0 && got && want && !strcmp(got, want),
	      "keys put in any order written in jansson's order: %s", got ? got : "");
	free(got);
	free(want);
	json_decref(o);

	/* a key twice, a key not UTF-8, a missing tree: the line fails,
	 * nothing of it is written, and the next line is whole */
	jtext_str(&t, "[");
	jline_int(&l, "a", 1);
	jline_str(&l, "a", "x");
	r = jline_write(&l, &t);
	CHECK(c, r == -EINVAL && t.err && t.n == 1, "a key put twice: -EINVAL, nothing written");
	t.err = 0;
	jline_int(&l, "\xff", 1);
	r = jline_write(&l, &t);
	jline_tree(&l, "a", NULL);
	jline_int(&l, "b", 1);
	r2 = jline_write(&l, &t);
	CHECK(c, r == -EINVAL && r2 == -ENOMEM && t.n == 1,
	      "a key not UTF-8: -EINVAL; a tree not made: -ENOMEM (%d %d)", r, r2);
	t.err = 0;
	jline_str(&l, "s", "v");
	r = jline_write(&l, &t);
	got = jtext_take(&t, &len);
	CHECK(c, r == 0 && got && !strcmp(got, "[{\"s\":\"v\"}"), "the next line whole: %s",
	      got ? got : "");
	free(got);
	jline_free(&l);
}

/* A random string: letters, escapes, UTF-8 and bytes that are not. */
static size_t random_string(char *s, size_t cap, unsigned *seed)
{
	static const char *const bits[] = { "a", "Z", "0", "/", " ", "\"", "\\", "\n", "\t", "\x01",
					    "\x1f", "\x7f", "\xc3\xa9", "\xe2\x82\xac",
					    "\xf0\x9f\x98\x80", "\xed\xa0\x80", "\xc0\xaf", "\xff",
					    "\xc3", "\x80", "\0" };
	size_t n = 0, want = (size_t)rand_r(seed) % 24;

	while (want--) {
		const char *b = bits[rand_r(seed) % (sizeof(bits) / sizeof(bits[0]))];
		size_t k = *b ? strlen(b) : 1;

		/* mostly text jansson takes: a bad byte in one string of ~8 */
		if ((unsigned char)*b >= 0x80 && k < 3 && strcmp(b, "\xc3\xa9") &&
		    rand_r(seed) % 8)
			continue;
		if (n + k > cap)
			break;
		memcpy(s + n, b, k);
		n += k;
	}
	return n;
}

/* One random line both ways: 1 when they agree. */
static int random_line(unsigned *seed, int *written)
{
	static const char *const keys[] = { "a", "ab", "a_hex", "b", "id", "id_hex", "key",
					    "key_hex", "size", "", "\xc3\xa9", "z\x01" };
	struct jline l = { 0 };
	json_t *o = json_object();
	int members = rand_r(seed) % 24, valid = 1, dup = 0, r, ok;
	char *want, *got, s[128];

	for (int i = 0; i < members; i++) {
		const char *k = keys[rand_r(seed) % (sizeof(keys) / sizeof(keys[0]))];
		json_t *v;
		size_t n;

		dup |= json_object_get(o, k) != NULL;
		switch (rand_r(seed) % 4) {
		case 0:
			n = random_string(s, sizeof(s), seed);
			jline_strn(&l, k, s, n);
			v = json_stringn(s, n);
			break;
		case 1: {
			int64_t x = (int64_t)((uint64_t)rand_r(seed) << 40 ^
					      (uint64_t)rand_r(seed) << 20 ^ (uint64_t)rand_r(seed));

			x = rand_r(seed) % 3 ? x % 100000 : x;
			jline_int(&l, k, x);
			v = json_integer((json_int_t)x);
			break;
		}
		case 2:
			jline_bool(&l, k, i & 1);
			v = json_boolean(i & 1);
			break;
		default:
			v = json_pack("[I, {s:s, s:i}]", (json_int_t)i, "z", "\xc3\xa9\n", "a", i);
			jline_tree(&l, k, v);
		}
		valid &= v != NULL;
		json_object_set_new(o, k, v);
	}
	got = line_text(&l, &r);
	want = valid && !dup ? json_dumps(o, dump_flags) : NULL;
	ok = want ? r == 0 && got && !strcmp(got, want) : r == -EINVAL && !got;
	if (!ok)
		fprintf(stderr, "line: jline %d '%s', jansson '%s'\n", r, got ? got : "",
			want ? want : "(refused)");
	*written = r == 0;
	free(want);
	free(got);
	json_decref(o);
	jline_free(&l);
	return ok;
}

static void test_random(struct check_count *c)
{
	const int rounds = 100000;
	unsigned seed = 20261204;
	int bad = 0, written = 0, w;

	for (int i = 0; i < rounds; i++) {
		bad += !random_line(&seed, &w);
		written += w;
	}
	CHECK(c, !bad, "%d of %d random lines written otherwise than jansson writes them", bad,
	      rounds);
	/* refused for a key twice or a string not UTF-8: the rest written */
	CHECK(c, written > rounds / 10 && written < rounds - rounds / 10,
	      "%d of them written, the rest refused", written);
}

int main(void)
{
	struct check_count c = { 0 };

	snprintf(top, sizeof(top), "/tmp/wfs-jline-XXXXXX");
	check_tmpdir(top);
	test_index(&c);
	test_record(&c);
	test_strings(&c);
	test_ints(&c);
	test_keys(&c);
	test_random(&c);
	check_rmtree(top);
	printf("jline: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
