/* ctl_conn.c - one request/reply exchange with the wfs control socket; see
 * ctl_conn.h. */
#include "ctl_conn.h"
#include "ctl_fmt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

void ctl_reply_free(struct ctl_reply *rep)
{
	json_decref(rep->obj);
	free(rep->raw);
	rep->obj = NULL;
	rep->raw = NULL;
}

void ctl_print_raw(const struct ctl_reply *rep)
{
	fputs(rep->raw, stdout);
	fputc('\n', stdout);
}

/* connect(2) to a unix socket path of any length: sun_path holds 107 bytes,
 * and LOCAL_STORE may live deeper than that, so a long path is reached
 * through /proc/self/fd/<dirfd>/<name>. */
static int connect_path(int fd, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	const char *slash;
	char *dir;
	int dfd, r = 0;

	if (strlen(path) < sizeof(sa.sun_path)) {
		memcpy(sa.sun_path, path, strlen(path) + 1);
		return connect(fd, (struct sockaddr *)&sa, sizeof(sa)) ? -errno : 0;
	}
	slash = strrchr(path, '/');
	if (!slash)
		return -ENAMETOOLONG;
	dir = strndup(path, (size_t)(slash - path) + (slash == path));
	if (!dir)
		return -ENOMEM;
	dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	free(dir);
	if (dfd < 0)
		return -errno;
	if ((size_t)snprintf(sa.sun_path, sizeof(sa.sun_path), "/proc/self/fd/%d/%s",
			     dfd, slash + 1) >= sizeof(sa.sun_path))
		r = -ENAMETOOLONG;
	else if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
		r = -errno;
	close(dfd);
	return r;
}

static int send_all(int fd, const char *buf, size_t len)
{
	while (len) {
		/* MSG_NOSIGNAL: a daemon that went away is an error to report,
		 * not a reason to die of SIGPIPE. */
		ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		buf += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Read up to the first newline (or EOF) into a NUL-terminated malloc'd
 * string. */
static int recv_line(int fd, char **out)
{
	size_t len = 0, cap = 4096;
	char *buf = malloc(cap);

	if (!buf)
		return -ENOMEM;
	for (;;) {
		char *nl;
		ssize_t n;

		if (cap - len < 2) {
			char *nb;

			if (cap >= CTL_REPLY_MAX + 2) {
				free(buf);
				return -EMSGSIZE;
			}
			cap = cap * 2 > CTL_REPLY_MAX + 2 ? CTL_REPLY_MAX + 2 : cap * 2;
			nb = realloc(buf, cap);
			if (!nb) {
				free(buf);
				return -ENOMEM;
			}
			buf = nb;
		}
		n = read(fd, buf + len, cap - len - 1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			free(buf);
			return -errno;
		}
		if (n == 0)
			break;
		nl = memchr(buf + len, '\n', (size_t)n);
		len += (size_t)n;
		if (nl) {
			len = (size_t)(nl - buf);
			break;
		}
	}
	if (len > CTL_REPLY_MAX) {
		free(buf);
		return -EMSGSIZE;
	}
	if (len == 0) {
		free(buf);
		return -ECONNRESET;
	}
	buf[len] = '\0';
	*out = buf;
	return 0;
}

int ctl_exchange(const char *sock, const json_t *req, struct ctl_reply *rep)
{
	char *line = json_dumps(req, JSON_COMPACT);
	size_t len;
	int fd, r;

	rep->obj = NULL;
	rep->raw = NULL;
	if (!line)
		return -ENOMEM;
	len = strlen(line);
	if (len + 1 > CTL_REQUEST_MAX) {
		free(line);
		return -E2BIG;
	}
	line[len] = '\n'; /* json_dumps left room: it was the NUL */
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		free(line);
		return -errno;
	}
	r = connect_path(fd, sock);
	if (!r)
		r = send_all(fd, line, len + 1);
	free(line);
	if (!r)
		r = recv_line(fd, &rep->raw);
	close(fd);
	if (r)
		return r;
	rep->obj = json_loads(rep->raw, JSON_REJECT_DUPLICATES, NULL);
	if (!json_is_object(rep->obj) || !json_is_boolean(json_object_get(rep->obj, "ok"))) {
		ctl_reply_free(rep);
		return -EBADMSG;
	}
	return 0;
}

/* The number for an errno name such as "EPERM"; the daemon sends names
 * because numbers differ between architectures. */
static int errno_from_name(const char *name)
{
	int e;

	for (e = 1; e < 4096; e++) {
		const char *n = strerrorname_np(e);

		if (n && !strcmp(n, name))
			return e;
	}
	return EREMOTEIO;
}

int ctl_call(const char *sock, const char *cmd, const json_t *req,
	     bool json_out, struct ctl_reply *rep)
{
	return ctl_call_ex(sock, cmd, req, json_out, "", rep);
}

int ctl_call_ex(const char *sock, const char *cmd, const json_t *req,
		bool json_out, const char *err_prefix, struct ctl_reply *rep)
{
	const char *err, *ename;
	char text[FMT_TEXT];
	int r = ctl_exchange(sock, req, rep);

	if (r || !json_is_true(json_object_get(rep->obj, "ok")))
		fputs(err_prefix, stderr);

	switch (r) {
	case 0:
		break;
	case -E2BIG:
		fprintf(stderr, "wfsctl: %s: the request is over the daemon's %u KiB "
			"limit; name a directory instead of its files\n",
			cmd, CTL_REQUEST_MAX >> 10);
		return r;
	case -EMSGSIZE:
		fprintf(stderr, "wfsctl: %s: the reply from %s is over %u MiB; "
			"is that a wfs daemon?\n", cmd, sock, CTL_REPLY_MAX >> 20);
		return r;
	case -EBADMSG:
		fprintf(stderr, "wfsctl: %s: the reply from %s is not a wfs reply "
			"(a JSON object with \"ok\")\n", cmd, sock);
		return r;
	case -ECONNRESET:
	case -EPIPE:
		fprintf(stderr, "wfsctl: %s: the wfs daemon at %s closed the "
			"connection without replying\n", cmd, sock);
		return r;
	default:
		fprintf(stderr, "wfsctl: cannot reach the wfs daemon at %s: %s\n",
			sock, strerror(-r));
		return r;
	}
	if (json_is_true(json_object_get(rep->obj, "ok")))
		return 0;
	err = json_string_value(json_object_get(rep->obj, "error"));
	ename = json_string_value(json_object_get(rep->obj, "errno"));
	if (json_out)
		ctl_print_raw(rep);
	if (!err || !*err)
		err = "the daemon refused the request";
	/* it often names a NAS path, which may hold control characters */
	err = fmt_text(err, text, sizeof(text));
	/* the daemon may name the op itself: "promote: only root ..." */
	if (!strncmp(err, cmd, strlen(cmd)) && err[strlen(cmd)] == ':')
		fprintf(stderr, "wfsctl: %s", err);
	else
		fprintf(stderr, "wfsctl: %s: %s", cmd, err);
	if (ename && *ename)
		fprintf(stderr, " [%s]", ename);
	fputc('\n', stderr);
	r = ename && *ename ? errno_from_name(ename) : EREMOTEIO;
	if (r == EPERM)
		fprintf(stderr, "wfsctl: %s changes state, so it needs root or the "
			"user that mounted wfs\n", cmd);
	ctl_reply_free(rep);
	return -r;
}
