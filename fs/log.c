/* log.c - one line per event, to stderr or syslog as the operator chose. */
#include "wfs.h"

#include <stdio.h>
#include <syslog.h>
#include <time.h>

void wfs_log_open(struct wfs *w)
{
	if (w->opt.log == WFS_LOG_SYSLOG)
		openlog("wfs", LOG_PID | LOG_NDELAY, LOG_DAEMON);
}

void wfs_log(const struct wfs *w, int prio, const char *fmt, ...)
{
	static const char *const names[] = {
		"emerg", "alert", "crit", "error", "warning", "notice", "info", "debug",
	};
	char line[2048];
	va_list ap;

	if (prio >= LOG_DEBUG && !w->opt.debug)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (w->opt.log == WFS_LOG_SYSLOG) {
		syslog(prio, "%s", line);
	} else {
		struct timespec ts;
		struct tm tm;
		char when[32];

		clock_gettime(CLOCK_REALTIME, &ts);
		localtime_r(&ts.tv_sec, &tm);
		strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
		fprintf(stderr, "%s wfs[%s]: %s\n", when, names[prio & 7], line);
	}
}
