/* jtext.h - a JSON file's text built an entry at a time.
 *
 * index.json and record.json hold one entry per blob or name: 40,000
 * files make ~30-50 MB of text.  A jansson tree of every entry, dumped at
 * once, held the tree and the text together (twice the memory) and took
 * longer to make than the text alone.  Here each entry's small tree is
 * dumped and freed in turn, onto the end of one growing buffer.
 */
#ifndef WFS_JTEXT_H
#define WFS_JTEXT_H

#include <jansson.h>
#include <stddef.h>

struct jtext {
	char *p;       /* NUL-terminated; NULL until something is put */
	size_t n, cap; /* n: bytes before the NUL */
	int err;       /* set by the first put that ran out of memory: every
			* later put does nothing */
};

/* Append the @n bytes at @s / the string @s. */
void jtext_put(struct jtext *t, const char *s, size_t n);
void jtext_str(struct jtext *t, const char *s);
/* Append @o compact, its keys sorted, and decref it (a NULL @o sets the
 * error, as a failed json_pack would have). */
void jtext_json_new(struct jtext *t, json_t *o);
/* Append the members of the object @o as "{...," -- its closing brace left
 * off, for an array to follow -- and decref it. */
void jtext_open_new(struct jtext *t, json_t *o);
/* The text (the caller frees it) and its length, or NULL (-ENOMEM) when a
 * put failed: @t is emptied either way. */
char *jtext_take(struct jtext *t, size_t *len);

/* Reading back a text laid out as the writers above lay it out --
 *   {<head members>,"<key>":[\n
 *   <element>,\n ... <element>\n
 *   ]}\n
 * -- a line at a time: each line parsed alone took half the time of one
 * parse of the whole text (jansson, 40,000 entries), and an element can be
 * freed before the next is parsed.  A text laid out any other way (an
 * earlier build's, a hand edit) is not refused here: jtext_lines_open or
 * jtext_lines_next says so, and the caller parses it whole, which says
 * what, if anything, is wrong with it.  Elements and head are parsed with
 * JSON_REJECT_DUPLICATES. */
struct jtext_lines {
	const char *p, *end;   /* the next line, the text's end */
	size_t i;              /* elements read */
};

/* The head (an object without @key; a new reference) with @l set on the
 * first element, or NULL: not that layout (or no memory). */
json_t *jtext_lines_open(struct jtext_lines *l, const char *text, size_t len, const char *key);
/* The next element (a new reference): 1, 0 after the last; -EAGAIN: not
 * that layout. */
int jtext_lines_next(struct jtext_lines *l, json_t **o);

#endif
