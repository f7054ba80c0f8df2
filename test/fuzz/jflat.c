/* jflat.c - fuzz the flat line reader (core/jflat.c) against jansson: a
 * text the fast reader takes must be one jansson reads, to the same
 * members and values, and jflat_parse's answer for any text must be
 * jansson's (read alike, or -EINVAL when jansson refuses it).
 */
#include "fuzz.h"

#include "jflat.h"

#include <jansson.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct jflat fast = { 0 }, slow = { 0 }, any = { 0 };
	const char *p = (const char *)data;
	json_t *o = json_loadb(p, size, JSON_REJECT_DUPLICATES, NULL);
	int rf = jflat_parse_fast(&fast, p, size), ra = jflat_parse(&any, p, size);

	FUZZ_ASSERT(rf == 0 || rf == -EAGAIN || rf == -ENOMEM, "jflat_parse_fast: %d", rf);
	if (o && jflat_from_json(&slow, o) < 0) {
		json_decref(o);
		o = NULL; /* (out of memory: nothing to compare with) */
	}
	if (rf == 0) {
		FUZZ_ASSERT(o, "the fast reader took a text jansson refuses");
		FUZZ_ASSERT(fast.object && jflat_same(&fast, &slow),
			    "the fast reader read otherwise than jansson");
	}
	if (o)
		FUZZ_ASSERT(ra == 0 && jflat_same(&any, &slow),
			    "jflat_parse read otherwise than jansson (%d)", ra);
	else if (ra != -ENOMEM)
		FUZZ_ASSERT(ra == -EINVAL, "jflat_parse took a text jansson refuses (%d)", ra);
	json_decref(o);
	jflat_free(&fast);
	jflat_free(&slow);
	jflat_free(&any);
	return 0;
}
