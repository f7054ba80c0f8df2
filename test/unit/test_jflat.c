/* test_jflat.c - the flat line reader against jansson.
 *
 * What the fast reader takes, jansson must read to the same members and
 * values; whatever it does not take, jflat_parse hands to jansson, so that
 * jflat_parse's answer is jansson's for every text.  Checked on the lines
 * the writers make (all of which the fast reader must take: that is its
 * point), on texts at the edges of its shape, and on 100,000 random
 * mutations of the writers' lines.
 */
#include "check.h"
#include "index.h"
#include "jflat.h"

#include <jansson.h>
#include <limits.h>

static char top[PATH_MAX];

/* Lines of record.json as record_text writes them (a link, a refs file
 * kept with its data, a directory). */
static const char *const record_lines[] = {
	"{\"atime_ns\":428427694,\"atime_s\":1796365599,\"backing\":\"/n/hub/datasets--a--m/"
	"blobs/e20a83692f293d0703a0463d33897f45b89cdb0c\",\"blksize\":4096,\"blob_id\":"
	"\"e20a83692f293d0703a0463d33897f45b89cdb0c\",\"blocks\":0,\"ctime_ns\":592483873,"
	"\"ctime_s\":1796365594,\"dev\":65024,\"gid\":0,\"ino\":11167122,\"kind\":\"link\","
	"\"link_state\":\"resolved\",\"mode\":41471,\"mtime_ns\":592483873,\"mtime_s\":"
	"1796365594,\"nlink\":1,\"path\":\"datasets--a--m/snapshots/41b7f4c5310bf2f51b4cac17b6"
	"816db46762146c/part-000/file-000000.json\",\"size\":55,\"target\":\"../../../blobs/"
	"e20a83692f293d0703a0463d33897f45b89cdb0c\",\"uid\":0}",
	"{\"atime_ns\":312427694,\"atime_s\":1796365602,\"backing\":\"/n/hub/datasets--a--m/"
	"refs/main\",\"blksize\":4096,\"blocks\":8,\"ctime_ns\":829195025,\"ctime_s\":"
	"1796365597,\"data\":\"41b7f4c5310bf2f51b4cac17b6816db46762146c\",\"dev\":65024,"
	"\"gid\":0,\"ino\":11247906,\"kind\":\"file\",\"mode\":33060,\"mtime_ns\":829195025,"
	"\"mtime_s\":1796365597,\"nlink\":1,\"path\":\"datasets--a--m/refs/main\",\"size\":40,"
	"\"uid\":0}",
	"{\"atime_ns\":0,\"atime_s\":-1,\"backing\":\"/n/hub\",\"blksize\":4096,\"blocks\":8,"
	"\"ctime_ns\":999999999,\"ctime_s\":-9223372036854775808,\"dev\":0,\"gid\":4294967295,"
	"\"ino\":9223372036854775807,\"kind\":\"dir\",\"mode\":16749,\"mtime_ns\":1,"
	"\"mtime_s\":0,\"nlink\":10,\"path\":\"\",\"size\":4096,\"uid\":0}",
};

/* 1 when the fast reader (if it took the text), jflat_parse and jansson
 * read @p, @n alike; *@took: the fast reader took it. */
static int agree(const char *p, size_t n, int *took)
{
	struct jflat fast = { 0 }, slow = { 0 }, any = { 0 };
	json_t *o = json_loadb(p, n, JSON_REJECT_DUPLICATES, NULL);
	int rf = jflat_parse_fast(&fast, p, n), ra = jflat_parse(&any, p, n), ok;

	ok = (rf == 0 || rf == -EAGAIN) && (o ? jflat_from_json(&slow, o) == 0 : 1);
	if (ok && rf == 0)
		ok = o && jflat_same(&fast, &slow) && fast.object;
	if (ok)
		ok = o ? ra == 0 && jflat_same(&any, &slow) : ra == -EINVAL;
	*took = rf == 0;
	json_decref(o);
	jflat_free(&fast);
	jflat_free(&slow);
	jflat_free(&any);
	return ok;
}

/* index_write's lines for records with every shape of value it writes. */
static int index_lines(char ***lines)
{
	struct part_range r[2] = { { 0, 4096, "0123456789abcdef0123456789abcdef" },
				   { 8192, 100, "fedcba9876543210fedcba9876543210" } };
	struct index_rec v[] = {
		{ .key = "/n/hub/models--o--m/blobs/aa", .id = "aa", .state = "local",
		  .xxh = "0123456789abcdef0123456789abcdef", .sample = "s", .reason = "",
		  .size = 1ULL << 40, .mtime = { 1796365597, 99611806 }, .last_used = 7,
		  .use_ns = UINT64_C(1796370536892427694), .pinned = 1, .copy_ino = 11021306 },
		{ .key = "/n/hub/a \"quoted\"\\name\ttab", .id = "bb", .state = "mismatch",
		  .xxh = "", .sample = "", .reason = "NAS file changed\nsize 3 -> 4 /" },
		{ .key = "/n/hub/\xff\xfe not utf-8", .id = "cc", .state = "nas", .xxh = "",
		  .sample = "", .reason = "caf\xc3\xa9 r\xc3\xa9sum\xc3\xa9", .ref_pinned = 1 },
		{ .key = "/n/hub/p", .id = "dd", .state = "partial", .xxh = "", .sample = "",
		  .reason = "", .ranges = r, .nranges = 2, .part_ino = 5 },
	};
	char path[PATH_MAX + 16], *text, *p, *nl;
	FILE *f;
	long len;
	int n = 0;

	snprintf(path, sizeof(path), "%s/index.json", top);
	if (index_write(path, v, sizeof(v) / sizeof(v[0]), NULL, 0) < 0 || !(f = fopen(path, "r")))
		return -1;
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	rewind(f);
	text = calloc(1, (size_t)len + 1);
	if (fread(text, 1, (size_t)len, f) != (size_t)len)
		len = 0;
	fclose(f);
	*lines = calloc(8, sizeof(**lines));
	/* the lines between the head and "]}" */
	for (p = strchr(text, '\n'); p && (nl = strchr(p + 1, '\n')) && n < 8; p = nl) {
		size_t k = (size_t)(nl - p - 1);

		if (k && p[k] == ',')
			k--;
		if (k == 2 && !memcmp(p + 1, "]}", 2))
			break;
		(*lines)[n++] = strndup(p + 1, k);
	}
	free(text);
	return n;
}

/* The fast reader's shape, for the writers' lines: no array value, no \u
 * escape. */
static int plain(const char *s)
{
	return !strstr(s, "\"ranges\"") && !strstr(s, "\\u");
}

static void test_writers(struct check_count *c, char **ix, int nix)
{
	int took, all = 1, nfast = 0;

	CHECK(c, nix == 4, "index_write wrote 4 blob lines (%d)", nix);
	for (int i = 0; i < nix; i++) {
		int ok = agree(ix[i], strlen(ix[i]), &took);

		/* a partial record's ranges are an array: jansson reads them */
		CHECK(c, ok && took == plain(ix[i]),
		      "index line %d read alike (fast: %d): %s", i, took, ix[i]);
		nfast += took;
	}
	CHECK(c, nfast == 3, "three of the index lines in the fast reader's shape (%d)", nfast);
	for (size_t i = 0; i < sizeof(record_lines) / sizeof(record_lines[0]); i++) {
		all &= agree(record_lines[i], strlen(record_lines[i]), &took) && took;
	}
	CHECK(c, all, "record lines: taken by the fast reader, read as jansson reads them");
}

/* Texts at the edges: @fast says whether the fast reader must take it. */
static void test_edges(struct check_count *c)
{
	static const struct { const char *text; int fast; } t[] = {
		{ "{}", 1 }, { "{\"a\":-0}", 1 }, { "{\"a\":0}", 1 },
		{ "{\"a\":9223372036854775807}", 1 }, { "{\"a\":-9223372036854775808}", 1 },
		{ "{\"a\":9223372036854775808}", 0 }, { "{\"a\":-9223372036854775809}", 0 },
		{ "{\"a\":12345678901234567890}", 0 }, { "{\"a\":01}", 0 }, { "{\"a\":-}", 0 },
		{ "{\"a\":1.0}", 0 }, { "{\"a\":1e3}", 0 }, { "{\"a\":1E3}", 0 }, { "{\"a\":-01}", 0 },
		{ "{\"a\":true,\"b\":false,\"c\":null}", 1 }, { "{\"a\":tru}", 0 },
		{ "{\"a\":truex}", 0 }, { "{\"a\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"}", 1 },
		{ "{\"a\":\"\\u00e9\"}", 0 }, { "{\"a\":\"\\u0000\"}", 0 },
		{ "{\"a\":\"\\u0001\"}", 0 }, { "{\"a\":\"\\x\"}", 0 },
		{ "{\"a\":\"caf\xc3\xa9\"}", 1 }, { "{\"a\":\"\xff\"}", 0 }, { "{\"a\":\"\xc0\xaf\"}", 0 },
		{ "{\"a\":\"\xe2\x82\xac \xf0\x9f\x98\x80\"}", 1 }, { "{\"\xc3\xa9\":1}", 1 },
		{ "{\"a\":\"\xf4\x8f\xbf\xbf\"}", 1 }, { "{\"a\":\"\xf4\x90\x80\x80\"}", 0 },
		{ "{\"a\":\"\xed\xa0\x80\"}", 0 }, { "{\"a\":\"\xe0\x80\xaf\"}", 0 },
		{ "{\"a\":\"\xf0\x80\x80\xaf\"}", 0 }, { "{\"a\":\"\xc3\"}", 0 },
		{ "{\"a\":\"\xc3\xa9\xa9\"}", 0 }, { "{\"a\":\"\xf5\x80\x80\x80\"}", 0 },
		{ "{\"a\":\"\xe2\x82\"}", 0 }, { "{\"a\":\"\xc3", 0 },
		{ "{\"a\":\"\xc3\xc3\xa9\"}", 0 }, { "{\"a\":\"\xe2\x82\xf0\"}", 0 },
		{ "{\"a\":\"x\ty\"}", 0 }, { "{\"a\":\"\x7f\"}", 1 }, { "{\"\":1}", 1 },
		{ "{\"b\":1,\"a\":2}", 0 }, { "{\"a\":1,\"a\":2}", 0 }, { "{\"a\":1,\"a\":1}", 0 },
		{ " {\"a\":1}", 0 }, { "{\"a\":1} ", 0 }, { "{\"a\" :1}", 0 }, { "{\"a\":1}x", 0 },
		{ "{\"a\":1,}", 0 }, { "{\"a\"1}", 0 }, { "{\"a\":}", 0 }, { "{", 0 }, { "", 0 },
		{ "}", 0 }, { "[]", 0 }, { "[1]", 0 }, { "{\"a\":[1,{\"b\":2}]}", 0 },
		{ "{\"a\":{}}", 0 }, { "{\"a\":\"unterminated}", 0 }, { "{\"a\\\"b\":1}", 1 },
		{ "{\"a\":1,\"b\"}", 0 }, { "\"s\"", 0 }, { "5", 0 }, { "{\"a\":\"x\"\"y\"}", 0 },
	};
	int took;

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		int ok = agree(t[i].text, strlen(t[i].text), &took);

		CHECK(c, ok && took == t[i].fast, "%s: read alike %d, fast %d (want %d)",
		      t[i].text, ok, took, t[i].fast);
	}
	/* a NUL inside the text */
	CHECK(c, agree("{\"a\":\"x\0\"}", 10, &took) && !took, "a NUL byte: jansson's verdict");
}

/* A random edit of @src into @dst (its length). */
static size_t mutate(const char *src, size_t n, char *dst, unsigned *seed)
{
	static const char alphabet[] = "{}[]\":,\\-0123456789.eEtrufalsn /bu\t\x7f\x80\xc3\xa9\xff";
	size_t at = n ? (size_t)rand_r(seed) % n : 0;
	char b = rand_r(seed) % 4 ? alphabet[rand_r(seed) % (sizeof(alphabet) - 1)] :
				    (char)rand_r(seed);

	memcpy(dst, src, n);
	switch (rand_r(seed) % 4) {
	case 0: /* replace */
		if (n)
			dst[at] = b;
		return n;
	case 1: /* insert */
		memmove(dst + at + 1, dst + at, n - at);
		dst[at] = b;
		return n + 1;
	case 2: /* delete */
		if (n)
			memmove(dst + at, dst + at + 1, n - at - 1);
		return n ? n - 1 : 0;
	default: /* cut */
		return at;
	}
}

static void test_mutations(struct check_count *c, char **ix, int nix)
{
	const int rounds = 100000;
	char buf[4096], twice[4096];
	unsigned seed = 20261204;
	int bad = 0, took, fast = 0;

	for (int i = 0; i < rounds; i++) {
		const char *src = i % 2 ? record_lines[i / 2 % 3] : ix[i / 2 % nix];
		size_t n = mutate(src, strlen(src), buf, &seed);

		if (i % 3 == 0) /* two edits */
			n = mutate(memcpy(twice, buf, n), n, buf, &seed);
		if (!agree(buf, n, &took) && bad++ < 5)
			fprintf(stderr, "differs: %.*s\n", (int)n, buf);
		fast += took;
	}
	CHECK(c, !bad, "%d of %d edited lines read otherwise than jansson reads them", bad, rounds);
	/* an edit of a digit or a letter inside a string keeps the shape */
	CHECK(c, fast > rounds / 10, "the fast reader took %d of them", fast);
}

int main(void)
{
	struct check_count c = { 0 };
	char **ix = NULL;
	int nix;

	snprintf(top, sizeof(top), "/tmp/wfs-jflat-XXXXXX");
	check_tmpdir(top);
	nix = index_lines(&ix);
	test_writers(&c, ix, nix);
	test_edges(&c);
	if (nix > 0)
		test_mutations(&c, ix, nix);
	for (int i = 0; ix && i < nix; i++)
		free(ix[i]);
	free(ix);
	check_rmtree(top);
	printf("jflat: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
