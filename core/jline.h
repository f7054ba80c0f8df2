/* jline.h - one JSON object of index.json or record.json, written without a tree.
 *
 * The write side of jflat.h.  Each line of those files was a jansson tree
 * (a hash table, a malloc'ed value a member) dumped with JSON_COMPACT |
 * JSON_SORT_KEYS: most of the 0.3 s an index of 40,000 records took to
 * write, at every flush and at the stop.  Here a line's members are put
 * one at a time, each value's text made at once in one reused buffer, and
 * the line is written as jansson writes that tree, byte for byte:
 *   - '{' members '}', no white space, keys in strcmp order;
 *   - a string's bytes as they are, except '"' and '\' escaped with a
 *     backslash, 0x08 0x09 0x0a 0x0c 0x0d as \b \t \n \f \r, any other
 *     byte below 0x20 as \u00XX (upper-case hex);
 *   - integers in decimal; true, false;
 *   - an array or object as json_dumpb writes it with the same flags.
 * A string jansson would not take (bytes that are not UTF-8 by its rules:
 * jflat.h) fails the line with -EINVAL, as json_string's NULL failed the
 * tree.  test_jline and the jline fuzz target hold the output to
 * jansson's.
 */
#ifndef WFS_JLINE_H
#define WFS_JLINE_H

#include "jtext.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct jline_member {
	size_t key;       /* offset in @text of the key, NUL-terminated */
	size_t val, vlen; /* offset and length of the value's text */
};

/* Zeroed before first use; reused line after line; jline_free at the end. */
struct jline {
	struct jtext text;         /* keys and values, one after another */
	struct jline_member *m;
	size_t n, cap;
	int err;                   /* the first failed put's -errno: the line
				    * is not written */
};

/* Put the member @key (a string, written as a string value is) with a
 * value.  A put after a failed one does nothing. */
void jline_str(struct jline *l, const char *key, const char *s);
void jline_strn(struct jline *l, const char *key, const char *s, size_t n);
void jline_int(struct jline *l, const char *key, int64_t v);
void jline_bool(struct jline *l, const char *key, int v);
/* jline_strn, but a string jansson would not take (not UTF-8) is not put
 * and does not fail the line: -EINVAL, for the caller to put something
 * else; else 0, or the line's error.  (One pass over @s: the check is the
 * escaping's.) */
int jline_try_strn(struct jline *l, const char *key, const char *s, size_t n);
/* @v an array or object (borrowed); NULL fails the line with -ENOMEM (a
 * json_pack that ran out of memory). */
void jline_tree(struct jline *l, const char *key, json_t *v);

/* Fail the line with @e (a value that could not be made: -ENOMEM). */
void jline_fail(struct jline *l, int e);

/* The members put since the last call, as one object, onto the end of
 * @t; @l is emptied for the next line either way.  0; the first put's
 * error; -EINVAL: a key put twice; -ENOMEM.  On an error nothing is
 * appended and @t->err is set (jtext.h: every later put does nothing). */
int jline_write(struct jline *l, struct jtext *t);

void jline_free(struct jline *l);

#endif
