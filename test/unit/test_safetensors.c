/* test_safetensors.c - the byte ranges of part K of N of a safetensors file
 * (core/safetensors.c): the exact ranges of a small case worked out by
 * hand, the split's invariants byte by byte over every K of several N, the
 * descriptor path on real files, and every refusal. */
#include "check.h"
#include "safetensors.h"

#include <limits.h>

#define HDR(body) "{\"__metadata__\":{\"format\":\"pt\"}," body "}"
#define T(name, dtype, shape, b, e)                                                   \
	"\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b \
	"," #e "]}"
#define EXPECT(c, k, n, ...)                                                         \
	expect_part(c, k, n, (struct brange[]){ __VA_ARGS__ },                       \
		    sizeof((struct brange[]){ __VA_ARGS__ }) / sizeof(struct brange))

static char top[PATH_MAX];

/* The small case: a 2-D F32, a BF16 vector, an F64 scalar (listed out of
 * data order), an empty F16 sharing its offset with a packed F4 of whole
 * rows (a dtype not in the table). */
static const char small[] = HDR(T("a", "F32", "[3,2]", 0, 24) "," T("s", "F64", "[]", 34, 42) ","
				T("b", "BF16", "[5]", 24, 34) "," T("z", "F16", "[0,4]", 42, 42) ","
				T("u", "F4", "[2,3]", 42, 48));

/* Is @v the set @want?  Says what it got when not. */
static int same(const struct brange *v, size_t n, const struct brange *want, size_t nwant)
{
	int eq = n == nwant;

	for (size_t i = 0; eq && i < n; i++)
		eq = v[i].off == want[i].off && v[i].len == want[i].len;
	for (size_t i = 0; !eq && i < n; i++)
		fprintf(stderr, "  got [%llu,+%llu)\n", (unsigned long long)v[i].off,
			(unsigned long long)v[i].len);
	return eq;
}

static void expect_part(struct check_count *c, unsigned k, unsigned n, const struct brange *want,
			size_t nwant)
{
	uint64_t ds = 8 + strlen(small);
	struct brange *v;
	size_t nv;
	char why[256] = "x";
	int r = safetensors_part_mem(small, strlen(small), ds, ds + 48, k, n, &v, &nv, why,
				     sizeof(why));

	CHECK(c, r == 0 && !why[0], "part %u/%u: %d %s", k, n, r, why);
	CHECK(c, r || same(v, nv, want, nwant), "part %u/%u: the ranges", k, n);
	if (!r)
		free(v);
}

static void test_small(struct check_count *c)
{
	uint64_t ds = 8 + strlen(small);

	EXPECT(c, 1, 1, { 0, ds + 48 });
	/* a: rows [0,1) of 8 bytes; b: [0,2) of 2; s whole; u: [0,1) of 3 */
	EXPECT(c, 1, 2, { 0, ds + 8 }, { ds + 24, 4 }, { ds + 34, 11 });
	/* a: [1,3); b: [2,5); s whole, then u: [1,2) after a 3-byte gap */
	EXPECT(c, 2, 2, { 0, ds }, { ds + 8, 16 }, { ds + 28, 14 }, { ds + 45, 3 });
	/* a: [1,2); b: [1,3); u: [0,1), right after s */
	EXPECT(c, 2, 3, { 0, ds }, { ds + 8, 8 }, { ds + 26, 4 }, { ds + 34, 11 });
	/* 7 parts of 3, 5 and 2 rows: part 1 has no row of any, only s */
	EXPECT(c, 1, 7, { 0, ds }, { ds + 34, 8 });
	/* part 7: the last row of each */
	EXPECT(c, 7, 7, { 0, ds }, { ds + 16, 8 }, { ds + 32, 10 }, { ds + 45, 3 });
}

/* The bigger case: a hole before "w" and one at the end, rows that no n
 * divides, a 3-D tensor, a scalar, empty tensors, a dtype not in the table. */
static const struct tensor {
	const char *name;
	uint64_t begin, end, rows; /* rows 0: a scalar */
} big[] = {
	{ "w", 50, 170, 5 },     { "emb", 0, 42, 7 },   { "bias", 170, 222, 13 },
	{ "scale", 222, 226, 0 }, { "flag", 226, 227, 1 }, { "e", 227, 227, 4 },
	{ "q", 227, 249, 11 },   { "pk", 249, 285, 9 },  { "d", 285, 317, 2 },
	{ "n", 317, 417, 100 },  { "one", 417, 423, 3 }, { "none", 423, 423, 0 },
};
static const char big_json[] = HDR(
	T("w", "BF16", "[5,4,3]", 50, 170) "," T("emb", "F16", "[7,3]", 0, 42) ","
	T("bias", "F32", "[13]", 170, 222) "," T("scale", "F32", "[]", 222, 226) ","
	T("flag", "BOOL", "[1]", 226, 227) "," T("e", "I64", "[4,0]", 227, 227) ","
	T("q", "U8", "[11,2]", 227, 249) "," T("pk", "F4", "[9,8]", 249, 285) ","
	T("d", "F64", "[2,2]", 285, 317) "," T("n", "I8", "[100]", 317, 417) ","
	T("one", "I16", "[3]", 417, 423) "," T("none", "F4", "[]", 423, 423));
#define BIG_DATA 430

/* Is byte @b (of the file, the data at @ds) in part @k of @n, by the rule? */
static int in_part(uint64_t b, uint64_t ds, unsigned k, unsigned n)
{
	if (b < ds)
		return 1;
	for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
		const struct tensor *t = &big[i];
		uint64_t row;

		if (b - ds < t->begin || b - ds >= t->end)
			continue;
		if (!t->rows)
			return 1;
		row = (b - ds - t->begin) / ((t->end - t->begin) / t->rows);
		return row >= (k - 1) * t->rows / n && row < k * t->rows / n;
	}
	return 0; /* a hole */
}

/* Every byte of the file against the rule, for every part of @n; the union
 * of the parts is the header and every tensor's bytes. */
static void split_n(struct check_count *c, const char *json, size_t len, uint64_t ds, unsigned n)
{
	uint64_t size = ds + BIG_DATA, wrong = 0, uncovered = 0;
	unsigned *hits = calloc(size, sizeof(*hits));

	for (unsigned k = 1; hits && k <= n; k++) {
		struct brange *v;
		size_t nv;
		char why[256];
		int r = safetensors_part_mem(json, len, ds, size, k, n, &v, &nv, why, sizeof(why));

		CHECK(c, r == 0, "part %u/%u: %d %s", k, n, r, why);
		if (r)
			continue;
		CHECK(c, nv && v[0].off == 0 && v[0].len >= ds, "part %u/%u: the header", k, n);
		for (size_t i = 1; i < nv; i++)
			CHECK(c, v[i].off > v[i - 1].off + v[i - 1].len && v[i].len,
			      "part %u/%u: range %zu not after the one before", k, n, i);
		CHECK(c, v[nv - 1].off + v[nv - 1].len <= size, "part %u/%u: past the end", k, n);
		for (uint64_t b = 0; b < size; b++) {
			int got = brange_covers(v, nv, b, 1);

			hits[b] += (unsigned)got;
			wrong += got != in_part(b, ds, k, n);
		}
		free(v);
	}
	CHECK(c, hits && !wrong, "n=%u: %llu bytes in the wrong parts", n,
	      (unsigned long long)wrong);
	for (uint64_t b = 0; hits && b < size; b++)
		uncovered += (hits[b] != 0) != in_part(b, ds, 1, 1);
	CHECK(c, hits && !uncovered, "n=%u: the union is %llu bytes off header + tensors", n,
	      (unsigned long long)uncovered);
	free(hits);
}

static void check_split(struct check_count *c, const char *json, size_t len, uint64_t ds)
{
	static const unsigned ns[] = { 1, 2, 3, 4, 7 };

	for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++)
		split_n(c, json, len, ds, ns[i]);
}

/* Rows near 2^63 and a file of 2^64-1 bytes: the row arithmetic must not
 * overflow (UBSan watches), and the parts still tile the tensor. */
static void test_huge(struct check_count *c)
{
	static const char j[] = HDR(T("h", "U8", "[9223372036854775807]", 0, 9223372036854775807));
	uint64_t ds = 8 + strlen(j), next = ds;

	for (unsigned k = 1; k <= 7; k++) {
		struct brange *v;
		size_t nv;
		char why[256];
		int r = safetensors_part_mem(j, strlen(j), ds, UINT64_MAX, k, 7, &v, &nv, why, 256);

		/* each part starts where the one before ended (part 1 at the header) */
		CHECK(c, r == 0 && v[nv - 1].off == (k == 1 ? 0 : next), "huge %u/7: %d %s", k, r,
		      why);
		next = r ? 0 : v[nv - 1].off + v[nv - 1].len;
		free(v);
	}
	CHECK(c, next == ds + INT64_MAX, "huge: the parts end at %llu", (unsigned long long)next);
}

/* A file: the 8-byte length (@hlen_field, or 0: the true one), the JSON
 * padded with spaces to a multiple of 8 as the real writers do, @data bytes
 * of data (zeros).  Returns the true header length. */
static uint64_t write_st(const char *path, const char *json, uint64_t hlen_field, size_t data)
{
	size_t len = strlen(json), pad = (8 - len % 8) % 8, total = 8 + len + pad + data;
	unsigned char *buf = calloc(1, total);
	uint64_t hlen = hlen_field ? hlen_field : len + pad;

	if (!buf)
		exit(2);
	for (int i = 0; i < 8; i++)
		buf[i] = (unsigned char)(hlen >> (8 * i));
	memcpy(buf + 8, json, len);
	memset(buf + 8 + len, ' ', pad);
	check_write_file(path, buf, total);
	free(buf);
	return len + pad;
}

static int part_of_file(const char *path, uint64_t size_delta, unsigned k, unsigned n,
			struct brange **v, size_t *nv, char *why, size_t wsz)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), r;
	struct stat st;

	if (fd < 0 || fstat(fd, &st) < 0)
		exit(2);
	r = safetensors_part(fd, (uint64_t)st.st_size + size_delta, k, n, v, nv, why, wsz);
	if (lseek(fd, 0, SEEK_CUR) != 0)
		r = -EBADE; /* the offset moved: the contract says pread only */
	close(fd);
	return r;
}

static void test_file(struct check_count *c)
{
	char path[PATH_MAX + 16], padded[sizeof(big_json) + 8], why[256];
	uint64_t hlen;

	snprintf(path, sizeof(path), "%s/model.safetensors", top);
	hlen = write_st(path, big_json, 0, BIG_DATA);
	snprintf(padded, sizeof(padded), "%-*s", (int)hlen, big_json); /* what the file holds */
	for (unsigned n = 1; n <= 4; n++) {
		for (unsigned k = 1; k <= n; k++) {
			struct brange *v = NULL, *w = NULL;
			size_t nv = 0, nw = 0;
			int r = part_of_file(path, 0, k, n, &v, &nv, why, sizeof(why)), rm;

			CHECK(c, r == 0 && !why[0], "file %u/%u: %d %s", k, n, r, why);
			rm = safetensors_part_mem(padded, hlen, 8 + hlen, 8 + hlen + BIG_DATA, k, n,
						  &w, &nw, why, sizeof(why));
			CHECK(c, r || rm || same(v, nv, w, nw), "file %u/%u: not as memory", k, n);
			free(v);
			free(w);
		}
	}
}

/* A file of @json (no data; @hlen the length it says, 0: its own; NULL: 5
 * bytes), taken as @size_delta bytes longer: refused with @rc, @why naming @word. */
static void refuse_file(struct check_count *c, const char *what, const char *json, uint64_t hlen,
			uint64_t size_delta, int rc, const char *word)
{
	char path[PATH_MAX + 16], why[256] = "";
	struct brange *v = (struct brange *)1;
	size_t nv = 1;
	int r;

	snprintf(path, sizeof(path), "%s/bad.safetensors", top);
	if (json)
		write_st(path, json, hlen, 0);
	else
		check_write_file(path, "\x02\0\0\0\0", 5);
	r = part_of_file(path, size_delta, 1, 1, &v, &nv, why, sizeof(why));
	CHECK(c, r == rc && strstr(why, word) && !v && !nv, "%s: %d (%s), want %d naming \"%s\"",
	      what, r, why, rc, word);
}

static void test_refuse_file(struct check_count *c)
{
	struct brange *v;
	size_t nv;
	char why[256];
	int r, fd;

	refuse_file(c, "5 bytes", NULL, 0, 0, -EINVAL, "too short");
	refuse_file(c, "length past the file", "{}", 1000, 0, -EINVAL, "past the end");
	refuse_file(c, "> 100 MB", "{}", SAFETENSORS_MAX_HEADER + 1, 0, -EFBIG, "over the format");
	refuse_file(c, "100 MB", "{}", SAFETENSORS_MAX_HEADER, 0, -EINVAL, "past the end");
	/* the size says 100 more bytes than the file has: the header is cut */
	refuse_file(c, "shrunk file", "{}", 64, 100, -EINVAL, "truncated header");
	refuse_file(c, "JSON cut", big_json, strlen(big_json) - 1, 0, -EINVAL, "not JSON");
	r = safetensors_part(-1, 100, 1, 1, &v, &nv, why, sizeof(why));
	CHECK(c, r == -EBADF && strstr(why, "reading"), "bad fd: %d %s", r, why);
	fd = open(top, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	r = safetensors_part(fd, 4096, 1, 1, &v, &nv, why, sizeof(why));
	CHECK(c, r == -EISDIR && !v && !nv, "a directory: %d %s", r, why);
	close(fd);
}

/* Part @k of @n of @json (its data 48 bytes long): refused with @rc, @why
 * naming @word; or, @rc 0, accepted with the header in the first range. */
static void expect(struct check_count *c, const char *what, const char *json, unsigned k,
		   unsigned n, int rc, const char *word)
{
	uint64_t ds = 8 + strlen(json);
	struct brange *v = (struct brange *)1;
	size_t nv = 1;
	char why[256] = "x";
	int r = safetensors_part_mem(json, strlen(json), ds, ds + 48, k, n, &v, &nv, why,
				     sizeof(why));

	if (!rc)
		CHECK(c, r == 0 && !why[0] && nv && !v[0].off && v[0].len >= ds, "%s: %d %s", what,
		      r, why);
	else
		CHECK(c, r == rc && strstr(why, word) && !v && !nv,
		      "%s: %d (%s), want %d naming \"%s\"", what, r, why, rc, word);
	if (!r)
		free(v);
}

/* A header of one tensor, @e; of two; one whose entry is @body by hand. */
#define ONE(e) "{" e "}"
#define TWO(e, f) "{" e "," f "}"
#define RAW(name, body) "{\"" name "\":{" body "}}"
#define U8_AT(name, offs) RAW(name, "\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":" offs)
static const struct {
	const char *what, *json, *word;
} bad[] = {
	{ "not JSON", "{\"a\":", "not JSON" },
	{ "not an object", "[]", "not a JSON object" },
	{ "NUL in a name", "{\"a\\u0000b\":{}}", "not JSON" },
	{ "duplicate keys", TWO(T("a", "U8", "[1]", 0, 1), T("a", "U8", "[1]", 1, 2)), "dup" },
	{ "negative offset", ONE(T("neg", "U8", "[4]", -1, 3)), "\"neg\": data_off" },
	{ "real offset", ONE(T("real", "U8", "[4]", 0, 4.0)), "\"real\": data_off" },
	{ "string offset", U8_AT("str", "[\"0\",4]"), "\"str\": data_off" },
	{ "three offsets", U8_AT("o3", "[0,4,8]"), "\"o3\": data_off" },
	{ "one offset", U8_AT("o1", "[4]"), "\"o1\": data_off" },
	{ "end past the file", ONE(T("far", "U8", "[49]", 0, 49)), "\"far\"" },
	{ "begin > end", ONE(T("rev", "U8", "[0]", 8, 4)), "\"rev\"" },
	{ "size mismatch", ONE(T("mis", "F32", "[3,2]", 0, 20)), "\"mis\"" },
	{ "2^64 elements", ONE(T("ovf", "F32", "[65536,65536,65536,65536]", 0, 8)), "2^64" },
	{ "2^63 rows of 3", ONE(T("ov2", "U8", "[9223372036854775807,3]", 0, 8)), "\"ov2\"" },
	{ "negative shape", ONE(T("ns", "U8", "[-4]", 0, 4)), "\"ns\": shape" },
	{ "real shape", ONE(T("rs", "U8", "[4.0]", 0, 4)), "\"rs\": shape" },
	{ "shape not an array", ONE(T("sa", "U8", "4", 0, 4)), "\"sa\": shape" },
	{ "no dtype", RAW("nd", "\"shape\":[4],\"data_offsets\":[0,4]"), "\"nd\"" },
	{ "dtype 4", RAW("ds", "\"dtype\":4,\"shape\":[4],\"data_offsets\":[0,4]"), "\"ds\"" },
	{ "entry not an object", "{\"five\":5}", "\"five\"" },
	{ "unknown dtype, part rows", ONE(T("pk", "F4", "[3,1]", 0, 4)), "\"pk\"" },
	{ "unknown dtype, empty shape", ONE(T("pe", "F4", "[2,0]", 0, 4)), "\"pe\"" },
	{ "overlap", TWO(T("x", "U8", "[24]", 0, 24), T("y", "U8", "[10]", 20, 30)),
	  "\"y\": [20, 30) overlaps tensor \"x\" [0, 24)" },
	{ "overlap inside", TWO(T("in", "U8", "[4]", 4, 8), T("out", "U8", "[24]", 0, 24)),
	  "\"in\": [4, 8) overlaps tensor \"out\"" },
	{ "metadata not an object", "{\"__metadata__\":[]}", "__metadata__" },
	{ "metadata not strings", "{\"__metadata__\":{\"n\":1}}", "__metadata__ \"n\"" },
	{ "a control byte shown", ONE(T("c\\u0001", "U8", "[1]", 0, 99)), "\"c?\"" },
};

static void test_refuse(struct check_count *c)
{
	uint64_t ds = 8 + strlen(small);
	struct brange *v;
	size_t nv;
	char why[256];
	int r;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		expect(c, bad[i].what, bad[i].json, 1, 1, -EINVAL, bad[i].word);
	expect(c, "k = 0", small, 0, 2, -EINVAL, "part 0 of 2");
	expect(c, "k > n", small, 3, 2, -EINVAL, "part 3 of 2");
	expect(c, "n = 0", small, 1, 0, -EINVAL, "part 1 of 0");
	expect(c, "n = 0, k = 0", small, 0, 0, -EINVAL, "part 0 of 0");
	/* the data past the size; no reason overflows its buffer */
	r = safetensors_part_mem(small, strlen(small), ds, ds - 1, 1, 1, &v, &nv, why, 8);
	CHECK(c, r == -EINVAL && !strcmp(why, "the dat"), "data past the size: %d \"%s\"", r, why);
	r = safetensors_part_mem(small, strlen(small), ds, ds - 1, 1, 1, &v, &nv, NULL, 0);
	CHECK(c, r == -EINVAL, "no @why: %d", r);
}

/* What is accepted: an empty header, zero-byte tensors anywhere, holes, a
 * scalar of a dtype not in the table. */
static void test_accept(struct check_count *c)
{
	static const char *const ok[] = {
		"{}",
		"{\"__metadata__\":{}}",
		TWO(T("z1", "F32", "[0]", 48, 48), T("z2", "U8", "[2,0]", 0, 0)),
		TWO(T("e", "U8", "[4]", 0, 4), T("in", "F4", "[0]", 2, 2)),
		ONE(T("whole", "F4", "[]", 0, 48)),
		U8_AT("extra", "[44,48],\"x\":[1]"), /* keys of its own are ignored */
	};

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		expect(c, ok[i], ok[i], 2, 2, 0, "");
}

int main(void)
{
	struct check_count c = {0};

	snprintf(top, sizeof(top), "/tmp/wfs-unit-XXXXXX");
	check_tmpdir(top);
	test_small(&c);
	check_split(&c, big_json, strlen(big_json), 8 + strlen(big_json));
	test_huge(&c);
	test_file(&c);
	test_refuse_file(&c);
	test_refuse(&c);
	test_accept(&c);
	check_rmtree(top);
	printf("safetensors: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
