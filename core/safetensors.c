/* safetensors.c - the byte ranges of part K of N of a safetensors file;
 * see safetensors.h. */
#include "safetensors.h"
#include "durable.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* How a tensor is named in a reason: a name may be megabytes long. */
#define TENSOR "tensor \"%.64s\": "
/* The usual failure: -EINVAL, said in the caller's @why. */
#define BAD(...) fail(why, wsz, -EINVAL, __VA_ARGS__)
#define ULL(x) ((unsigned long long)(x))

/* One tensor of the header, checked. */
struct st_tensor {
	const char *name;    /* a key of the parsed header: lives as long as it */
	uint64_t begin, end; /* relative to the data start */
	uint64_t rows;       /* the first dimension (0 for a scalar) */
	int scalar;          /* shape []: no first dimension, whole in every part */
};

/* A shape, as far as the byte count and the split need it. */
struct st_shape {
	uint64_t rows, elems; /* d0; the product of all dimensions */
	int scalar;           /* shape [] (elems 1) */
	int huge;             /* the product does not fit in 64 bits */
};

/* Bytes per element of the dtypes we know; any other is taken by whole
 * rows (safetensors.h). */
static const struct {
	const char *name;
	unsigned size;
} dtypes[] = {
	{ "BOOL", 1 }, { "U8", 1 },  { "I8", 1 },  { "F8_E4M3", 1 }, { "F8_E5M2", 1 },
	{ "I16", 2 },  { "U16", 2 }, { "F16", 2 }, { "BF16", 2 },
	{ "I32", 4 },  { "U32", 4 }, { "F32", 4 },
	{ "I64", 8 },  { "U64", 8 }, { "F64", 8 },
};

/* Bytes per element of @name, 0 when not a dtype of the table. */
static unsigned dtype_size(const char *name)
{
	for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
		if (!strcmp(dtypes[i].name, name))
			return dtypes[i].size;
	return 0;
}

/* Say why in @why (when there is room) and return @err.  Everything but
 * printable ASCII becomes '?': names come from a file anyone may write,
 * and the reason ends up in logs, on terminals and in JSON replies (which
 * must be UTF-8, so a name cut mid-character must not get through). */
static int __attribute__((format(printf, 4, 5)))
fail(char *why, size_t wsz, int err, const char *fmt, ...)
{
	va_list ap;

	if (!why || !wsz)
		return err;
	va_start(ap, fmt);
	vsnprintf(why, wsz, fmt, ap);
	va_end(ap);
	for (char *p = why; *p; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
			*p = '?';
	return err;
}

/* A JSON integer >= 0 in *@out; -1 for anything else (jansson's integers
 * are signed, and a real such as 1.0 is no integer). */
static int get_uint(const json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -1;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

/* Read @shape, an array of integers >= 0, into @s; -1 when it is not one. */
static int parse_shape(const json_t *shape, struct st_shape *s)
{
	int zero = 0;
	json_t *d;
	size_t i;

	if (!json_is_array(shape))
		return -1;
	*s = (struct st_shape){ .elems = 1, .scalar = json_array_size(shape) == 0 };
	json_array_foreach(shape, i, d) {
		uint64_t v;

		if (get_uint(d, &v) < 0)
			return -1;
		if (i == 0)
			s->rows = v;
		if (!v)
			zero = 1;
		else if (__builtin_mul_overflow(s->elems, v, &s->elems))
			s->huge = 1;
	}
	/* A 0 anywhere empties the tensor, however big the other dimensions. */
	if (zero)
		*s = (struct st_shape){ .rows = s->rows, .elems = 0 };
	return 0;
}

/* Are @bytes what @dtype and @s call for?  Returns 0 or -EINVAL (@why). */
static int check_bytes(const char *name, const char *dtype, const struct st_shape *s,
		       uint64_t bytes, char *why, size_t wsz)
{
	unsigned esize = dtype_size(dtype);
	uint64_t want;

	if (esize) {
		if (s->huge || __builtin_mul_overflow(s->elems, esize, &want))
			return BAD(TENSOR "its %s shape has more than 2^64 bytes", name, dtype);
		if (want != bytes)
			return BAD(TENSOR "%llu %s elements are %llu bytes, data_offsets span %llu",
				   name, ULL(s->elems), dtype, ULL(want), ULL(bytes));
		return 0;
	}
	/* A dtype we do not know: the split needs whole rows, no more. */
	if (s->scalar)
		return 0;
	if (!s->huge && s->elems == 0 && bytes)
		return BAD(TENSOR "an empty shape spans %llu bytes", name, ULL(bytes));
	if (s->rows && bytes % s->rows)
		return BAD(TENSOR "%llu bytes of dtype \"%.16s\" are not %llu whole rows", name,
			   ULL(bytes), dtype, ULL(s->rows));
	return 0;
}

/* Check the tensor @name, @v, whose data must lie within the first @room
 * bytes of the data, into @t.  Returns 0 or -EINVAL (@why). */
static int parse_tensor(const char *name, const json_t *v, uint64_t room, struct st_tensor *t,
			char *why, size_t wsz)
{
	const json_t *dtype = json_object_get(v, "dtype");
	const json_t *offs = json_object_get(v, "data_offsets");
	struct st_shape s;

	if (!json_is_object(v))
		return BAD(TENSOR "not an object", name);
	if (!json_is_string(dtype))
		return BAD(TENSOR "no dtype string", name);
	if (parse_shape(json_object_get(v, "shape"), &s) < 0)
		return BAD(TENSOR "shape is not an array of integers >= 0", name);
	if (!json_is_array(offs) || json_array_size(offs) != 2 ||
	    get_uint(json_array_get(offs, 0), &t->begin) < 0 ||
	    get_uint(json_array_get(offs, 1), &t->end) < 0)
		return BAD(TENSOR "data_offsets is not [begin, end], integers >= 0", name);
	if (t->begin > t->end)
		return BAD(TENSOR "data_offsets begin %llu is past its end %llu", name,
			   ULL(t->begin), ULL(t->end));
	if (t->end > room)
		return BAD(TENSOR "data ends at %llu, past the end of the file (%llu of data)",
			   name, ULL(t->end), ULL(room));
	t->name = name;
	t->rows = s.rows;
	t->scalar = s.scalar;
	return check_bytes(name, json_string_value(dtype), &s, t->end - t->begin, why, wsz);
}

/* "__metadata__" is ignored, but only when it is what the format says. */
static int check_metadata(json_t *m, char *why, size_t wsz)
{
	const char *key;
	json_t *v;

	if (!json_is_object(m))
		return BAD("__metadata__ is not an object");
	json_object_foreach(m, key, v)
		if (!json_is_string(v))
			return BAD("__metadata__ \"%.64s\" is not a string", key);
	return 0;
}

/* Every tensor of the header @root into *@tv (malloc'ed, *@nt of them;
 * names borrowed from @root).  Returns 0, -EINVAL or -ENOMEM (@why). */
static int parse_header(json_t *root, uint64_t room, struct st_tensor **tv, size_t *nt,
			char *why, size_t wsz)
{
	struct st_tensor *t;
	const char *key;
	size_t n = 0;
	json_t *v;

	if (!json_is_object(root))
		return BAD("the header is not a JSON object");
	if (!(t = calloc(json_object_size(root) + 1, sizeof(*t))))
		return fail(why, wsz, -ENOMEM, "out of memory");
	json_object_foreach(root, key, v) {
		int r = strcmp(key, "__metadata__") ? parse_tensor(key, v, room, &t[n++], why, wsz)
						    : check_metadata(v, why, wsz);

		if (r < 0) {
			free(t);
			return r;
		}
	}
	*tv = t;
	*nt = n;
	return 0;
}

static int by_begin(const void *a, const void *b)
{
	const struct st_tensor *x = a, *y = b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return strcmp(x->name, y->name); /* the same reason for the same file */
}

/* No byte may belong to two tensors: the parts of one rank would then
 * hold bytes of another.  Sorts @t.  Returns 0 or -EINVAL (@why). */
static int check_overlap(struct st_tensor *t, size_t n, char *why, size_t wsz)
{
	const struct st_tensor *last = NULL; /* the tensor with bytes that ends last */

	qsort(t, n, sizeof(*t), by_begin);
	for (size_t i = 0; i < n; i++) {
		if (t[i].begin == t[i].end)
			continue; /* no bytes to share */
		if (last && t[i].begin < last->end)
			return BAD(TENSOR "[%llu, %llu) overlaps tensor \"%.64s\" [%llu, %llu)",
				   t[i].name, ULL(t[i].begin), ULL(t[i].end), last->name,
				   ULL(last->begin), ULL(last->end));
		last = &t[i];
	}
	return 0;
}

/* The bytes of @t in part @k of @n: rows [floor((k-1)R/n), floor(kR/n)).
 * Checked before: the bytes are whole rows and end within the file, so
 * nothing here overflows (the products of the row index go to 128 bits). */
static struct brange part_of(const struct st_tensor *t, uint64_t data_start, unsigned k,
			     unsigned n)
{
	uint64_t bytes = t->end - t->begin, row, r0, r1;

	if (t->scalar)
		return (struct brange){ data_start + t->begin, bytes };
	if (!t->rows || !bytes)
		return (struct brange){ 0, 0 };
	row = bytes / t->rows;
	r0 = (uint64_t)((unsigned __int128)t->rows * (k - 1) / n);
	r1 = (uint64_t)((unsigned __int128)t->rows * k / n);
	return (struct brange){ data_start + t->begin + r0 * row, (r1 - r0) * row };
}

/* The header and the part of every tensor, normalized, into *@out. */
static int collect(const struct st_tensor *t, size_t nt, uint64_t data_start, unsigned k,
		   unsigned n, struct brange **out, size_t *nout, char *why, size_t wsz)
{
	struct brange *v = malloc((nt + 1) * sizeof(*v));

	if (!v)
		return fail(why, wsz, -ENOMEM, "out of memory");
	v[0] = (struct brange){ 0, data_start };
	for (size_t i = 0; i < nt; i++)
		v[i + 1] = part_of(&t[i], data_start, k, n);
	*nout = brange_normalize(v, nt + 1);
	*out = v;
	return 0;
}

/* Reset the results, so that they say "nothing" on every failure; check
 * @k of @n.  Returns 0 or -EINVAL (@why). */
static int start(unsigned k, unsigned n, struct brange **out, size_t *nout, char *why, size_t wsz)
{
	*out = NULL;
	*nout = 0;
	if (why && wsz)
		why[0] = '\0';
	if (!n || !k || k > n)
		return BAD("part %u of %u: parts are numbered 1 to N, N >= 1", k, n);
	return 0;
}

int safetensors_part_mem(const char *json, size_t json_len, uint64_t data_start, uint64_t size,
			 unsigned k, unsigned n, struct brange **out, size_t *nout,
			 char *why, size_t wsz)
{
	struct st_tensor *t = NULL;
	json_error_t jerr;
	size_t nt = 0;
	json_t *root;
	int r;

	if ((r = start(k, n, out, nout, why, wsz)) < 0)
		return r;
	if (json_len > SAFETENSORS_MAX_HEADER)
		return fail(why, wsz, -EFBIG, "a header of %zu bytes, over the format's %llu",
			    json_len, SAFETENSORS_MAX_HEADER);
	if (data_start > size)
		return BAD("the data starts at %llu, past the end of the file (%llu)",
			   ULL(data_start), ULL(size));
	if (!(root = json_loadb(json, json_len, JSON_REJECT_DUPLICATES, &jerr))) {
		if (json_error_code(&jerr) == json_error_out_of_memory)
			return fail(why, wsz, -ENOMEM, "out of memory parsing the header");
		return BAD("the header is not JSON: %s (at byte %d of it)", jerr.text,
			   jerr.position);
	}
	r = parse_header(root, size - data_start, &t, &nt, why, wsz);
	if (!r)
		r = check_overlap(t, nt, why, wsz);
	if (!r)
		r = collect(t, nt, data_start, k, n, out, nout, why, wsz);
	free(t);
	json_decref(root);
	return r;
}

/* Read the header length, the first 8 bytes (little-endian), and check it
 * against the limit and the file.  Returns 0 or -errno (@why). */
static int header_len(int fd, uint64_t size, uint64_t *hlen, char *why, size_t wsz)
{
	unsigned char le[8];
	ssize_t r;

	if (size < 8)
		return BAD("too short: %llu bytes, a safetensors file has 8 or more", ULL(size));
	if ((r = durable_pread_fd(fd, le, 8, 0)) < 0)
		return fail(why, wsz, (int)r, "reading the header length: %s", strerror((int)-r));
	if (r < 8)
		return BAD("truncated header");
	*hlen = 0;
	for (int i = 7; i >= 0; i--)
		*hlen = *hlen << 8 | le[i];
	if (*hlen > SAFETENSORS_MAX_HEADER)
		return fail(why, wsz, -EFBIG, "a header of %llu bytes, over the format's %llu",
			    ULL(*hlen), SAFETENSORS_MAX_HEADER);
	if (*hlen > size - 8)
		return BAD("a header of %llu bytes, past the end of the file (%llu bytes)",
			   ULL(*hlen), ULL(size));
	return 0;
}

int safetensors_part(int fd, uint64_t size, unsigned k, unsigned n,
		     struct brange **out, size_t *nout, char *why, size_t wsz)
{
	uint64_t hlen = 0;
	ssize_t got;
	char *json;
	int r;

	if ((r = start(k, n, out, nout, why, wsz)) < 0 ||
	    (r = header_len(fd, size, &hlen, why, wsz)) < 0)
		return r;
	if (!(json = malloc(hlen ? hlen : 1)))
		return fail(why, wsz, -ENOMEM, "out of memory for a %llu-byte header", ULL(hlen));
	got = durable_pread_fd(fd, json, hlen, 8);
	if (got < 0)
		r = fail(why, wsz, (int)got, "reading the header: %s", strerror((int)-got));
	else if ((uint64_t)got < hlen)
		r = BAD("truncated header");
	else
		r = safetensors_part_mem(json, hlen, 8 + hlen, size, k, n, out, nout, why, wsz);
	free(json);
	return r;
}
