/* test_jtext.c - index.json's text as index_write lays it out (a blob a
 * line, read back a line at a time) and as anything else may: what is read
 * back is what was written, whatever the layout; a cut text is refused
 * whole, with nothing called back. */
#include "check.h"
#include "index.h"
#include "jtext.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char top[PATH_MAX];

/* What the reader called back, as one line a record. */
struct seen {
	char text[8192];
	int blobs, refs;
};

static int see_blob(void *arg, const struct index_rec *r)
{
	struct seen *s = arg;
	size_t n = strlen(s->text);

	snprintf(s->text + n, sizeof(s->text) - n, "blob %s|%s|%s|%s|%s|%llu|%d|%d|%llu|%zu",
		 r->key, r->id, r->state, r->xxh, r->reason, (unsigned long long)r->size,
		 r->pinned, r->ref_pinned, (unsigned long long)r->copy_ino, r->nranges);
	for (size_t i = 0; i < r->nranges; i++) {
		n = strlen(s->text);
		snprintf(s->text + n, sizeof(s->text) - n, "|%llu+%llu:%s",
			 (unsigned long long)r->ranges[i].off,
			 (unsigned long long)r->ranges[i].len, r->ranges[i].xxh);
	}
	n = strlen(s->text);
	snprintf(s->text + n, sizeof(s->text) - n, "\n");
	if (*r->name) { /* a line of its own: the blob lines above stay as they were */
		n = strlen(s->text);
		snprintf(s->text + n, sizeof(s->text) - n, "name %s\n", r->name);
	}
	s->blobs++;
	return 0;
}

static int see_ref(void *arg, const struct index_ref *r)
{
	struct seen *s = arg;
	size_t n = strlen(s->text);

	snprintf(s->text + n, sizeof(s->text) - n, "ref %s|%s|%s|%s\n", r->repo, r->ref,
		 r->commit, r->pending);
	s->refs++;
	return 0;
}

static int read_index(const char *path, struct seen *s)
{
	struct index_cb cb = { .arg = s, .blob = see_blob, .ref = see_ref };

	memset(s, 0, sizeof(*s));
	return index_read(path, &cb);
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "r");
	char *buf = calloc(1, 1 << 20);

	*len = f ? fread(buf, 1, (1 << 20) - 1, f) : 0;
	if (f)
		fclose(f);
	return buf;
}

static void put(const char *path, const char *text, size_t len)
{
	check_write_file(path, text, len);
}

/* Three blobs -- a local copy, a partial one with two ranges, a pinned one
 * whose key is not UTF-8 -- and a ref pin. */
static int write_sample(const char *path)
{
	static const struct part_range ranges[] = {
		{ 0, 4096, "0123456789abcdef0123456789abcdef" },
		{ 8192, 100, "fedcba9876543210fedcba9876543210" },
	};
	const struct index_rec recs[] = {
		{ .key = "/nas/models--a--b/blobs/aa", .id = "aa", .state = "local",
		  .xxh = "11111111111111111111111111111111", .sample = "s1", .reason = "",
		  .size = 12345, .use_ns = 7, .copy_ino = 42,
		  .name = "models--a--b/snapshots/c0ffee/model.safetensors" },
		{ .key = "/nas/models--a--b/blobs/bb", .id = "bb", .state = "partial",
		  .xxh = "", .sample = "s2", .reason = "a \"quoted\" reason\nand a line",
		  .size = 1 << 20, .ranges = ranges, .nranges = 2, .part_ino = 9 },
		{ .key = "/nas/models--a--b/blobs/\xff\xfe", .id = "\xff\xfe", .state = "nas",
		  .xxh = "", .sample = "", .reason = "", .pinned = 1, .ref_pinned = 1,
		  .name = "models--a--b/snapshots/c0ffee/\xff\xfe" },
	};
	const struct index_ref ref = { "models--a--b", "main", "c0ffee", "" };

	return index_write(path, recs, 3, &ref, 1);
}

/* The same JSON in another layout (jansson's @flags). */
static int relayout(const char *path, size_t flags)
{
	json_t *o = json_load_file(path, 0, NULL);
	int e = o ? json_dump_file(o, path, flags) : -1;

	json_decref(o);
	return e;
}

static void test_layouts(struct check_count *c, const char *path)
{
	struct seen first, again;
	char *text;
	size_t len, lines = 0;

	CHECK(c, write_sample(path) == 0, "index written");
	text = slurp(path, &len);
	for (size_t i = 0; i < len; i++)
		lines += text[i] == '\n';
	CHECK(c, lines == 3 + 2 && !strncmp(text, "{\"refs\":[", 9), "a blob a line: %s", text);
	free(text);
	CHECK(c, read_index(path, &first) == INDEX_VERSION && first.blobs == 3 && first.refs == 1,
	      "read back: %d blobs, %d refs", first.blobs, first.refs);
	CHECK(c, strstr(first.text, "blob /nas/models--a--b/blobs/bb|bb|partial||a \"quoted\" "
			"reason\nand a line|1048576|0|0|0|2|0+4096:0123456789abcdef0123456789abcdef|"
			"8192+100:fedcba9876543210fedcba9876543210\n") &&
	      strstr(first.text, "blob /nas/models--a--b/blobs/\xff\xfe|\xff\xfe|nas|||0|1|1|0|0\n") &&
	      strstr(first.text, "|local|11111111111111111111111111111111||12345|0|0|42|0\n") &&
	      strstr(first.text, "ref models--a--b|main|c0ffee|\n"), "the records: %s", first.text);
	CHECK(c, strstr(first.text, "|0|0|42|0\nname models--a--b/snapshots/c0ffee/"
			"model.safetensors\n") &&
	      strstr(first.text, "|nas|||0|1|1|0|0\nname models--a--b/snapshots/c0ffee/\xff\xfe\n"),
	      "the names the blobs were opened by, one not UTF-8: %s", first.text);

	CHECK(c, relayout(path, JSON_INDENT(1) | JSON_SORT_KEYS) == 0, "indented");
	CHECK(c, read_index(path, &again) == INDEX_VERSION && !strcmp(again.text, first.text),
	      "indented (as earlier builds wrote it): the same records: %s", again.text);
	CHECK(c, relayout(path, JSON_COMPACT) == 0, "on one line");
	CHECK(c, read_index(path, &again) == INDEX_VERSION && !strcmp(again.text, first.text),
	      "on one line: the same records: %s", again.text);
}

/* Every cut of the text -- at each line's end and within lines -- is
 * refused (-EINVAL) before anything is called back. */
static void test_cuts(struct check_count *c, const char *path)
{
	struct seen s;
	char *text;
	size_t len;
	int bad = 0, cuts = 0;

	CHECK(c, write_sample(path) == 0, "index written again");
	text = slurp(path, &len);
	for (size_t cut = 1; cut + 1 < len; cut++) {
		int r;

		if (text[cut - 1] != '\n' && cut % 7)
			continue;
		put(path, text, cut);
		r = read_index(path, &s);
		cuts++;
		if (r != -EINVAL || s.blobs || s.refs) {
			if (!bad++)
				fprintf(stderr, "cut at %zu: %d, %d blobs called back\n", cut, r,
					s.blobs);
		}
	}
	CHECK(c, cuts > 10 && !bad, "%d cuts refused with nothing called back (%d not)", cuts,
	      bad);
	/* a line after the close, a blob line without its comma */
	memcpy(text + len, "{}\n", 4);
	put(path, text, len + 3);
	CHECK(c, read_index(path, &s) == -EINVAL && !s.blobs, "text after the close: refused");
	text[len] = '\0';
	strstr(text, "},\n")[1] = ' ';
	put(path, text, len);
	CHECK(c, read_index(path, &s) == -EINVAL && !s.blobs, "a missing comma: refused");
	free(text);
}

/* The reader alone, on a text the writer made. */
static void test_lines(struct check_count *c)
{
	struct jtext t = { 0 };
	struct jtext_reader rd;
	struct jflat o = { 0 };
	char *text, why[160];
	size_t len;
	int r = -1, n = 0, ok = 1;

	jtext_open_new(&t, json_pack("{s:i}", "version", 7));
	jtext_str(&t, "\"items\":[\n");
	for (int i = 0; i < 3; i++) {
		jtext_json_new(&t, json_pack("{s:i, s:s}", "n", i, "s", "x,\n]}"));
		jtext_str(&t, i < 2 ? ",\n" : "\n");
	}
	jtext_str(&t, "]}\n");
	text = jtext_take(&t, &len);
	CHECK(c, text != NULL, "text made");
	r = jtext_read_open(&rd, text, len, "items", why, sizeof(why));
	CHECK(c, r == 0 && rd.lines && rd.list && jflat_int(&rd.head, "version") == 7 &&
	      rd.head.n == 1, "the head, read by lines");
	while (rd.lines && (r = jtext_read_next(&rd, &o)) > 0)
		ok &= jflat_int(&o, "n") == n++ && !strcmp(jflat_str(&o, "s"), "x,\n]}");
	CHECK(c, r == 0 && n == 3 && ok, "three items, then the end (%d)", n);
	CHECK(c, jtext_read_next(&rd, &o) == 0, "still the end");
	jtext_read_close(&rd);
	r = jtext_read_open(&rd, text, len, "item", why, sizeof(why));
	CHECK(c, r == 0 && !rd.lines && !rd.list && jflat_get(&rd.head, "items"),
	      "another key: parsed whole, no elements of that key");
	jtext_read_close(&rd);
	r = jtext_read_open(&rd, text, len - 3, "items", why, sizeof(why));
	CHECK(c, r == -EINVAL && why[0], "cut short: not JSON (%s)", why);
	jflat_free(&o);
	free(text);
}

/* Entries dumped into the text as json_dumps writes them, whatever their
 * size against the room left (a small one, one past the 4096 bytes tried
 * first, one past the buffer's 64 KiB, and small ones after them). */
static void test_dump(struct check_count *c)
{
	static const size_t sizes[] = { 10, 5000, 3, 200000, 4090, 1, 70000 };
	struct jtext t = { 0 };
	char *want = calloc(1, 1), *text;
	size_t wlen = 0, len;

	for (size_t i = 0; want && i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		char *s = malloc(sizes[i] + 1), *d, *w;
		json_t *o;

		for (size_t k = 0; s && k < sizes[i]; k++)
			s[k] = "ab\"\\\n/"[k % 6];
		if (!s)
			break;
		s[sizes[i]] = '\0';
		o = json_pack("{s:s, s:i}", "s", s, "n", (int)i);
		d = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
		json_decref(o);
		w = d ? realloc(want, wlen + strlen(d) + 1) : NULL;
		if (w) {
			memcpy(w + wlen, d, strlen(d) + 1);
			wlen += strlen(d);
		}
		want = w;
		jtext_json_new(&t, json_pack("{s:s, s:i}", "s", s, "n", (int)i));
		free(d);
		free(s);
	}
	text = jtext_take(&t, &len);
	CHECK(c, want && text && len == wlen && !memcmp(text, want, wlen) && !text[len],
	      "the dumps, one after another, as json_dumps writes them (%zu bytes, want %zu)",
	      len, wlen);
	free(text);
	free(want);
}

/* The same text made in memory and sent to a file as it is made
 * (jtext_stream): a head of 1.5 MiB (a buffer goes out inside it, and its
 * closing brace must still become a comma), an empty head, and 3 MiB of
 * lines; then a file that takes nothing (/dev/full). */
static void put_stream_text(struct jtext *t, const char *big)
{
	jtext_open_new(t, json_pack("{s:s, s:i}", "big", big, "v", 1));
	jtext_str(t, "\"list\":[\n");
	for (int i = 0; i < 30000; i++)
		jtext_json_new(t, json_pack("{s:i, s:s}", "i", i, "pad",
					    "0123456789012345678901234567890123456789012345678901234567890123456789"));
	jtext_str(t, "]}\n");
	jtext_open_new(t, json_object());
	jtext_str(t, "\"x\":1}\n");
}

static void test_stream(struct check_count *c)
{
	struct jtext mem = { 0 }, out = { 0 }, full = { 0 };
	size_t big_n = (3 << 20) / 2, len, flen = 0, mlen = 0;
	char *big = malloc(big_n + 1), *want, *got = NULL, path[PATH_MAX + 16];
	int fd, r, rf = 0;

	memset(big, 'b', big_n);
	big[big_n] = '\0';
	put_stream_text(&mem, big);
	want = jtext_take(&mem, &mlen);
	snprintf(path, sizeof(path), "%s/stream", top);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	jtext_stream(&out, fd);
	put_stream_text(&out, big);
	r = jtext_end(&out, &len);
	if (fd >= 0 && (got = malloc(len + 1)))
		flen = (size_t)pread(fd, got, len + 1, 0);
	CHECK(c, want && mlen > (4u << 20) && r == 0 && len == mlen && flen == mlen && got &&
		 !memcmp(got, want, mlen) && strstr(want, "{\"x\":1}\n"),
	      "a text sent out as it is made is the text made in memory (%zu bytes, %zu)", len,
	      mlen);
	if (fd >= 0)
		close(fd);
	fd = open("/dev/full", O_WRONLY);
	if (fd >= 0) {
		jtext_stream(&full, fd);
		put_stream_text(&full, big);
		rf = jtext_end(&full, &len);
		close(fd);
	}
	CHECK(c, fd < 0 || rf == -ENOSPC, "a file that takes nothing: -ENOSPC (%d)", rf);
	free(big);
	free(want);
	free(got);
}

/* A head of @pad bytes of refs before the array's key, the key cut at
 * no read's edge in particular: the version is read from any head up to
 * JTEXT_HEAD_MAX (the index's refs have no cap), none past it. */
static long long head_version_of(const char *path, size_t pad)
{
	static const char pre[] = "{\"refs\":\"", post[] = "\",\"version\":7,\"blobs\":[\n]}";
	size_t len = sizeof(pre) - 1 + pad + sizeof(post) - 1;
	char *text = malloc(len + 1);
	long long v;

	if (!text)
		return -ENOMEM;
	memcpy(text, pre, sizeof(pre) - 1);
	memset(text + sizeof(pre) - 1, 'x', pad);
	memcpy(text + sizeof(pre) - 1 + pad, post, sizeof(post));
	put(path, text, len);
	free(text);
	v = jtext_head_version(path, "blobs");
	unlink(path);
	return v;
}

static void test_head_version(struct check_count *c, const char *path)
{
	/* the key straddles the first read's end (64 KiB) at the third */
	static const size_t pads[] = { 10, (64 << 10) - 12, (64 << 10) - 9, 200 << 10,
				       (5 << 20) + 3 };
	long long v;

	for (size_t i = 0; i < sizeof(pads) / sizeof(pads[0]); i++) {
		v = head_version_of(path, pads[i]);
		CHECK(c, v == 7, "a head of %zu bytes: version 7 (%lld)", pads[i], v);
	}
	v = head_version_of(path, JTEXT_HEAD_MAX + 10);
	CHECK(c, v == -EINVAL, "a head past JTEXT_HEAD_MAX: -EINVAL (%lld)", v);
	CHECK(c, jtext_head_version(path, "blobs") == -ENOENT, "no file: -ENOENT");
}

int main(void)
{
	struct check_count c = { 0 };
	char path[PATH_MAX + 32];

	snprintf(top, sizeof(top), "/tmp/wfs-jtext-XXXXXX");
	check_tmpdir(top);
	snprintf(path, sizeof(path), "%s/index.json", top);
	test_lines(&c);
	test_dump(&c);
	test_stream(&c);
	test_layouts(&c, path);
	test_cuts(&c, path);
	test_head_version(&c, path);
	check_rmtree(top);
	printf("jtext: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
