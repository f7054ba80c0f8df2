/* trim.h - give freed heap memory back to the system (glibc keeps it),
 * after work that allocated much and freed it (a walk, an index text).
 *
 * Skipped under a sanitizer.  ASan and TSan replace malloc, so there is
 * nothing of glibc's to trim, and glibc's malloc_trim called from a thread
 * that never used glibc's own malloc reads an arena that thread never set
 * up: a SEGV (google/sanitizers issue 1721), seen here about once in 60
 * runs of test_status under ASan.
 */
#ifndef WFS_TRIM_H
#define WFS_TRIM_H

#include <malloc.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define WFS_SANITIZED_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define WFS_SANITIZED_MALLOC 1
#endif
#endif

static inline void heap_give_back(void)
{
#ifndef WFS_SANITIZED_MALLOC
	malloc_trim(0);
#endif
}

#endif
