/* index.c - fuzz the state index loader: index_read() on the input as a
 * file, then store_open() over a LOCAL_STORE whose index.json is the input
 * (and store_close(), which writes it back).  For the store, every "@/" in
 * the input stands for this process's directory + "/", so a seed can name
 * the one NAS file, "@/nas/f" ("hello\n"), and the one local copy the
 * store may find, data/aa/aa00000000000000000000000000000a (its twin).
 *
 * Checked: every record handed to the callbacks has its strings (a key, a
 * state...); after store_open, every blob it calls LOCAL has a 32-hex
 * content hash and its copy inside data/, of the recorded size; a blob
 * whose local ranges may serve (a "partial" record, version 3; the one
 * partial file a seed can name is parts/<xxh3 of "@/nas/f">) has ranges
 * sorted, disjoint, inside its size, adding up to its local bytes.
 */
#include "fuzz.h"

#include "hash.h"
#include "index.h"
#include "store.h"

#define XXH_A "aa00000000000000000000000000000a"

static char in_path[PATH_MAX + 16], local[PATH_MAX + 16], local_index[PATH_MAX + 32];
static char nas_file[PATH_MAX + 16], part_file[PATH_MAX + 64];

static size_t touch(const char *s)
{
	FUZZ_ASSERT(s, "a record field is NULL");
	return strlen(s);
}

static int on_blob(void *arg, const struct index_rec *r)
{
	size_t *n = arg;

	*n += touch(r->key) + touch(r->id) + touch(r->state) + touch(r->xxh) +
	      touch(r->sample) + touch(r->reason);
	return 0;
}

static int on_ref(void *arg, const struct index_ref *r)
{
	size_t *n = arg;

	*n += touch(r->repo) + touch(r->ref) + touch(r->commit) + touch(r->pending);
	return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *base = fuzz_make_base("index");
	char p[PATH_MAX * 2];

	(void)argc;
	(void)argv;
	snprintf(in_path, sizeof(in_path), "%s/in.json", base);
	snprintf(local, sizeof(local), "%s/local", base);
	snprintf(local_index, sizeof(local_index), "%s/index.json", local);
	snprintf(nas_file, sizeof(nas_file), "%s/nas/f", base);
	snprintf(p, sizeof(p), "%s/nas", base);
	fuzz_mkdirs(p);
	fuzz_write(nas_file, "hello\n", 6);
	snprintf(p, sizeof(p), "%s/data/aa", local);
	fuzz_mkdirs(p);
	snprintf(p, sizeof(p), "%s/parts", local);
	fuzz_mkdirs(p);
	{
		char h[33];

		xxh128_hex_of(nas_file, strlen(nas_file), h);
		snprintf(part_file, sizeof(part_file), "%s/%s", p, h);
	}
	return 0;
}

static int hex32(const char *s)
{
	size_t n = 0;

	for (; s[n]; n++)
		if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f')))
			return 0;
	return n == 32;
}

static void check_blob(void *arg, const struct blob_info *b)
{
	struct store *s = arg;
	char p[PATH_MAX * 2];
	struct stat st;

	(void)s;
	FUZZ_ASSERT(!b->part_bytes || (b->part_n && b->part_bytes <= b->size),
		    "blob %s: %llu bytes in %zu local ranges, size %llu", b->key,
		    (unsigned long long)b->part_bytes, b->part_n, (unsigned long long)b->size);
	if (b->state != BLOB_LOCAL)
		return;
	FUZZ_ASSERT(hex32(b->xxh), "LOCAL blob %s has copy name \"%s\", not a content hash",
		    b->key, b->xxh);
	snprintf(p, sizeof(p), "%s/%.2s/%s", s->data_dir, b->xxh, b->xxh);
	FUZZ_ASSERT(stat(p, &st) == 0 && (uint64_t)st.st_size == b->size,
		    "LOCAL blob %s: copy %s missing or not %llu bytes", b->key, p,
		    (unsigned long long)b->size);
}

static void check_ranges(struct store *s, struct blob *b)
{
	struct brange *v;
	uint64_t end = 0, sum = 0;
	size_t n;

	FUZZ_ASSERT(store_part_ranges(s, b, &v, &n) == 0, "store_part_ranges");
	for (size_t i = 0; i < n; i++) {
		FUZZ_ASSERT(v[i].len && v[i].off >= end && v[i].off + v[i].len <= b->size,
			    "range %zu (%llu+%llu) of %s: empty, out of order or past %llu", i,
			    (unsigned long long)v[i].off, (unsigned long long)v[i].len, b->key,
			    (unsigned long long)b->size);
		end = v[i].off + v[i].len;
		sum += v[i].len;
	}
	FUZZ_ASSERT(!n || sum == b->part_bytes || !b->part_bytes,
		    "ranges of %s add up to %llu, %llu served", b->key,
		    (unsigned long long)sum, (unsigned long long)b->part_bytes);
	free(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct index_cb cb;
	struct store_opts opt = { .workers = 1 };
	struct store s;
	size_t n = 0;
	char p[PATH_MAX * 2];
	int r;

	if (size > 65536)
		return -1;
	fuzz_write(in_path, data, size);
	cb = (struct index_cb){ .arg = &n, .blob = on_blob, .ref = on_ref };
	r = index_read(in_path, &cb);
	/* (a version past INDEX_VERSION: a later wfs's index, nothing read) */
	FUZZ_ASSERT(r <= INDEX_VERSION || n == 0, "index_read returned %d", r);
	cb.ref = NULL; /* optional */
	r = index_read(in_path, &cb);
	FUZZ_ASSERT(r <= INDEX_VERSION || n == 0, "index_read returned %d", r);

	/* The same bytes as a store's index, next to a copy it may name. */
	{
		size_t blen = strlen(fuzz_base), k = 0;
		char *text = malloc(size * (blen + 1) + 1);

		FUZZ_SETUP(text, "malloc");
		for (size_t i = 0; i < size; i++) {
			if (data[i] == '@' && i + 1 < size && data[i + 1] == '/') {
				memcpy(text + k, fuzz_base, blen);
				k += blen;
			} else {
				text[k++] = (char)data[i];
			}
		}
		fuzz_write(local_index, text, k);
		free(text);
	}
	snprintf(p, sizeof(p), "%s/data/aa/" XXH_A, local);
	fuzz_write(p, "hello\n", 6);
	fuzz_write(part_file, "hello\n", 6);
	r = store_open(&s, local, &opt, NULL);
	if (r >= 0) {
		struct blob *b = store_find(&s, nas_file);

		store_each(&s, check_blob, &s);
		if (b)
			check_ranges(&s, b);
	}
	store_close(&s);
	return 0;
}
