/* jflat.h - one JSON object of index.json or record.json, read without a tree.
 *
 * Each line of those files is a compact object of strings, integers and
 * booleans, 20 members or so: 120,000 of them at 40,000 local files.
 * jansson built a tree of each (a hash table, a malloc'ed value a member)
 * and that was most of the daemon's start-up (2.3 s of ~4).  Here a line of
 * the shape the writers produce is read into a reused array of members,
 * its strings copied into one reused buffer: no allocation a line.
 *
 * The shape read here, and nothing else:
 *   - '{' members '}' filling the text exactly: no white space anywhere;
 *   - keys in strictly increasing strcmp order (the writers sort them; it
 *     also rules out a duplicate, which jansson is told to refuse);
 *   - values: a string of UTF-8 (checked as jansson checks it: no overlong
 *     form, no surrogate, nothing past U+10FFFF) without control bytes,
 *     with the escapes \" \\ \/ \b \f \n \r \t; an integer
 *     -?(0|[1-9][0-9]*) within int64_t; true, false, null.
 * Any other text -- an array or object value, a fraction or exponent, a
 * \u escape, bytes that are not UTF-8, a control byte, leading zeros,
 * white space, keys out of order -- is handed to jansson
 * (JSON_REJECT_DUPLICATES), which reads it or says it is not JSON.  So a
 * text read here is a text jansson reads, to the same members and values
 * (test_jflat and the jflat fuzz target compare the two); the second
 * reader only makes the common case cheap.
 */
#ifndef WFS_JFLAT_H
#define WFS_JFLAT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

enum jflat_type { JFLAT_STR, JFLAT_INT, JFLAT_TRUE, JFLAT_FALSE, JFLAT_NULL, JFLAT_TREE };

struct jflat_member {
	const char *key;
	enum jflat_type type;
	const char *s;  /* JFLAT_STR: NUL-terminated (no NUL inside) */
	size_t len;     /* its length */
	int64_t i;      /* JFLAT_INT */
	json_t *tree;   /* JFLAT_TREE: a real, array or object (borrowed) */
};

/* Zeroed before first use; reused line after line; jflat_free at the end. */
struct jflat {
	struct jflat_member *m; /* sorted by key (strcmp) */
	size_t n, cap;
	int object;             /* 0: the text was JSON but not an object (no members) */
	char *buf;              /* the strings of a text read here */
	size_t bcap;
	json_t *tree;           /* jansson's value, when it read the text */
};

/* Read the JSON text @p, @n into @f (what it held before is let go).
 * 0; -EINVAL: not JSON, as jansson's json_loadb says; -ENOMEM. */
int jflat_parse(struct jflat *f, const char *p, size_t n);

/* Only the shape above: 0, or -EAGAIN for any other text (@f then holds
 * nothing usable), -ENOMEM.  For the tests, which compare it with jansson. */
int jflat_parse_fast(struct jflat *f, const char *p, size_t n);

/* 1 when @a and @b hold the same members and values.  For the tests. */
int jflat_same(const struct jflat *a, const struct jflat *b);

/* The value @o (a reference is taken) into @f: 0 or -ENOMEM. */
int jflat_from_json(struct jflat *f, json_t *o);

void jflat_free(struct jflat *f);

/* The member @key, or NULL. */
const struct jflat_member *jflat_get(const struct jflat *f, const char *key);
/* Its string, or NULL when absent or not a string. */
const char *jflat_str(const struct jflat *f, const char *key);
/* Its integer, or 0 when absent or not an integer (as json_integer_value). */
int64_t jflat_int(const struct jflat *f, const char *key);
/* 1 when it is true. */
int jflat_true(const struct jflat *f, const char *key);
/* Its array or object (borrowed), or NULL. */
json_t *jflat_tree(const struct jflat *f, const char *key);

/* The length of the UTF-8 sequence at @s (its first byte >= 0x80), or 0
 * when it is not one jansson takes: a lead byte of 2-4 bytes, that many
 * continuation bytes, no overlong form, no surrogate, nothing past
 * U+10FFFF (RFC 3629).  (jline.c checks what it writes with it.) */
size_t jflat_utf8_len(const unsigned char *s, const unsigned char *end);

#endif
