/* jtext.h - a JSON file's text built an entry at a time.
 *
 * index.json and record.json hold one entry per blob or name: 40,000
 * files make ~30-50 MB of text.  A jansson tree of every entry, dumped at
 * once, held the tree and the text together (twice the memory) and took
 * longer to make than the text alone.  Here the entries are written in
 * turn onto the end of one growing buffer: each a line made by jline.h
 * (no tree), the head a small jansson tree dumped and freed.
 */
#ifndef WFS_JTEXT_H
#define WFS_JTEXT_H

#include "jflat.h"

#include <jansson.h>
#include <stddef.h>

struct jtext {
	char *p;       /* NUL-terminated; NULL until something is put */
	size_t n, cap; /* n: bytes before the NUL */
	int err;       /* set by the first put that ran out of memory (or
			* could not be written out): every later put does
			* nothing */
	/* jtext_stream: the text goes to @fd as it is made, a buffer of
	 * about JTEXT_FLUSH bytes at a time; @p holds what is not out yet */
	int streaming, fd;
	int werr;      /* -errno of the write that failed */
	size_t out;    /* bytes written out */
};

#define JTEXT_FLUSH ((size_t)1 << 20)

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

/* Send @t's text to @fd (a file of its own, written from its start) as it
 * is made: a 40,000-line index is written from a 1 MiB buffer, not from a
 * text of 20 MB built first.  jtext_end writes the rest out and empties
 * @t: 0 with *@len the bytes written, -errno of a failed write, -ENOMEM. */
void jtext_stream(struct jtext *t, int fd);
int jtext_end(struct jtext *t, size_t *len);

/* Reading back a text laid out as the writers above lay it out --
 *   {<head members>,"<key>":[\n
 *   <element>,\n ... <element>\n
 *   ]}\n
 * -- a line at a time, each line read by jflat (jflat.h: no tree for the
 * common line), and an element let go before the next is read.  A text
 * laid out any other way (an earlier build's, a hand edit) is not refused:
 * it is parsed whole by jansson, which says what, if anything, is wrong
 * with it.  Every line is read once when the text is opened, so that a
 * damaged line is found before any element is handed out (the index's
 * callbacks never see half a file).  Head and elements are read with
 * JSON_REJECT_DUPLICATES. */
struct jtext_reader {
	struct jflat head;       /* the head's members (a whole parse: the
				  * whole object's, @key among them) */
	int list;                /* there are elements: @key is an array */
	int lines;               /* read by lines (else from @arr) */
	json_t *arr;             /* a whole parse's @key (borrowed from @head) */
	const char *first, *p, *end; /* by lines: the first element's line,
				  * the next line, the text's end */
	size_t i;                /* elements read */
};

/* Open @text, @len, whose elements are the array @key: 0 with @r->head
 * (no members and object 0 when the text is JSON but not an object) and
 * @r->list; -EINVAL: not JSON (jansson's reason in @why, @wsz); -ENOMEM.
 * @text must outlive @r. */
int jtext_read_open(struct jtext_reader *r, const char *text, size_t len, const char *key,
		    char *why, size_t wsz);
/* The next element into @f: 1; 0 after the last; -ENOMEM. */
int jtext_read_next(struct jtext_reader *r, struct jflat *f);
void jtext_read_close(struct jtext_reader *r);

/* The "version" of the file @path, laid out as above with the array @key,
 * read from its head alone (up to the array's key, at most JTEXT_HEAD_MAX
 * bytes: the head holds the index's refs, which have no cap): for a file
 * over the reader's size cap, which a later wfs with a larger cap may have
 * written -- set aside as damage, such a file was lost to that wfs.  The
 * version (>= 0; 0 when the head names none), or -errno: -EINVAL for a
 * head that is not laid out so. */
#define JTEXT_HEAD_MAX ((size_t)16 << 20)
long long jtext_head_version(const char *path, const char *key);

#endif
