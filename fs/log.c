/* log.c - one line per event, to stderr or syslog as the operator chose.
 * Every line of the daemon and of the store (through its log hook) goes
 * through wfs_log, and the names in them come from the NAS: a newline in
 * one must not make two events of one, nor a control character reach a
 * terminal, nor invalid UTF-8 turn a journal entry into a blob.  So such
 * bytes are written \xNN (reply_escape). */
#include "wfs.h"
#include "reply.h"

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
	char raw[2048], line[4096];
	va_list ap;

	if (prio >= LOG_DEBUG && !w->opt.debug)
		return;
	va_start(ap, fmt);
	vsnprintf(raw, sizeof(raw), fmt, ap);
	va_end(ap);
	reply_escape(raw, line, sizeof(line), 1);
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
