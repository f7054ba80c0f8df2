/* jline.c - fuzz the tree-less line writer (core/jline.c) against jansson:
 * the members an input spells out, put into a jline and set in a jansson
 * object, must come out as the same bytes as json_dumps(JSON_COMPACT |
 * JSON_SORT_KEYS) writes -- or the line be refused with -EINVAL exactly
 * when jansson cannot hold it (a string or key not UTF-8, a key twice).
 *
 * The input, member after member: a kind byte (its low two bits: string,
 * integer, boolean, tree), a key (a length byte, at most 7, then its
 * bytes; a NUL ends the key early), then the value: a string's length
 * byte and bytes, an integer's 8 bytes, a boolean's byte, or a tree's
 * length byte and JSON text (a member skipped when that is not an array or
 * object).
 */
#include "fuzz.h"

#include "jline.h"

#include <jansson.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	return 0;
}

/* The next @n bytes of the input, or NULL when it has fewer. */
static const uint8_t *take(const uint8_t **p, const uint8_t *end, size_t n)
{
	const uint8_t *s = *p;

	if ((size_t)(end - s) < n)
		return NULL;
	*p += n;
	return s;
}

/* One member from the input into @l and @o: 1, or 0 at the input's end.
 * *@refuse set when jansson cannot hold it. */
static int member(const uint8_t **p, const uint8_t *end, struct jline *l, json_t *o, int *refuse)
{
	const uint8_t *kind = take(p, end, 1), *kl = take(p, end, 1), *k, *n, *v;
	char key[8] = { 0 };
	json_t *val = NULL;
	int64_t x;

	if (!kind || !kl || !(k = take(p, end, *kl % 8)))
		return 0;
	memcpy(key, k, *kl % 8);
	switch (*kind % 4) {
	case 0:
		if (!(n = take(p, end, 1)) || !(v = take(p, end, *n)))
			return 0;
		jline_strn(l, key, (const char *)v, *n);
		val = json_stringn((const char *)v, *n);
		break;
	case 1:
		if (!(v = take(p, end, 8)))
			return 0;
		memcpy(&x, v, 8);
		jline_int(l, key, x);
		val = json_integer((json_int_t)x);
		break;
	case 2:
		if (!(v = take(p, end, 1)))
			return 0;
		jline_bool(l, key, *v & 1);
		val = json_boolean(*v & 1);
		break;
	default:
		if (!(n = take(p, end, 1)) || !(v = take(p, end, *n)))
			return 0;
		val = json_loadb((const char *)v, *n, 0, NULL);
		if (!json_is_array(val) && !json_is_object(val)) {
			json_decref(val);
			return 1;
		}
		jline_tree(l, key, val);
	}
	if (!val || json_object_get(o, key)) {
		json_decref(val);
		*refuse = 1;
	} else if (json_object_set_new(o, key, val) < 0) {
		*refuse = 1;
	}
	return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *p = data, *end = data + size;
	struct jline l = { 0 };
	struct jtext t = { 0 };
	json_t *o = json_object();
	int refuse = 0, r;
	char *want, *got;
	size_t len;

	while (member(&p, end, &l, o, &refuse))
		;
	r = jline_write(&l, &t);
	got = jtext_take(&t, &len);
	want = refuse ? NULL : json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
	if (r != -ENOMEM && (refuse || want)) {
		FUZZ_ASSERT(refuse ? r == -EINVAL && !got : r == 0 && got,
			    "jline_write %d where jansson %s", r, refuse ? "refuses" : "writes");
		FUZZ_ASSERT(refuse || (len == strlen(want) && !memcmp(got, want, len)),
			    "jline wrote %s, jansson %s", got, want);
	}
	free(want);
	free(got);
	json_decref(o);
	jline_free(&l);
	return 0;
}
