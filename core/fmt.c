/* fmt.c - see fmt.h. */
#include "fmt.h"

#include <stdio.h>

const char *fmt_bytes(uint64_t n, char *buf, size_t sz)
{
	static const char *const unit[] = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double v = (double)n;
	size_t u = 0;

	if (n < 1024) {
		snprintf(buf, sz, "%llu B", (unsigned long long)n);
		return buf;
	}
	v /= 1024.0;
	/* 1023.96 would print as "1024.0": move up a unit before that */
	while (v >= 1023.95 && u + 1 < sizeof(unit) / sizeof(unit[0])) {
		v /= 1024.0;
		u++;
	}
	snprintf(buf, sz, "%.1f %s", v, unit[u]);
	return buf;
}
