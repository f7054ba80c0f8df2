/* check.h - the smallest test harness: CHECK() counts, main() reports. */
#ifndef WFS_CHECK_H
#define WFS_CHECK_H

#include <stdio.h>

struct check_count {
	int passed, failed;
};

#define CHECK(cnt, cond, ...)                                                  \
	do {                                                                   \
		if (cond) {                                                    \
			(cnt)->passed++;                                       \
		} else {                                                       \
			(cnt)->failed++;                                       \
			fprintf(stderr, "%s:%d: FAIL %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                          \
			fputc('\n', stderr);                                   \
		}                                                              \
	} while (0)

#endif
