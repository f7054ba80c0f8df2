/* test_metrics.c - what stats reports of the daemon's routes and of the
 * mount's read-ahead, from a real store: the states and errors as noted,
 * and the read-ahead in effect read from its file at each collect. */
#include "check.h"
#include "metrics.h"
#include "store.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The routes as stats reports them: starting until noted; a refusal
 * with its error; a refused route stays refused when a later note (the
 * start-up's, racing a request that met the refusal) says otherwise. */
static void test_routes(struct check_count *c, const char *top)
{
	struct store_opts opt = { .workers = 1 };
	struct metrics_src src = { 0 };
	char local[PATH_MAX * 2];
	struct metrics m;
	struct store s;
	json_t *j, *r;

	snprintf(local, sizeof(local), "%s/rlocal", top);
	mkdir(local, 0755);
	CHECK(c, store_open(&s, local, &opt, NULL) == 0, "open");
	src.store = &s;
	store_note_route(&s, STORE_ROUTE_IO_URING, STORE_ROUTE_ON, 0);
	store_note_route(&s, STORE_ROUTE_PASSTHROUGH, STORE_ROUTE_REFUSED, -EPERM);
	store_note_route(&s, STORE_ROUTE_PASSTHROUGH, STORE_ROUTE_ON, 0);
	metrics_collect(&src, &m);
	j = metrics_json(&m);
	r = json_object_get(j, "routes");
	CHECK(c, !strcmp(json_string_value(json_object_get(json_object_get(r, "fuse_uring"),
							       "state")) ?: "", "starting"),
	      "a route not noted: starting");
	CHECK(c, json_integer_value(json_object_get(json_object_get(r, "io_uring"), "on")) == 1 &&
	      json_is_null(json_object_get(json_object_get(r, "io_uring"), "error")),
	      "io_uring on, no error");
	CHECK(c, !strcmp(json_string_value(json_object_get(json_object_get(r, "passthrough"),
							       "state")) ?: "", "refused") &&
	      !strcmp(json_string_value(json_object_get(json_object_get(r, "passthrough"),
							"error")) ?: "", strerror(EPERM)) &&
	      json_integer_value(json_object_get(json_object_get(r, "passthrough"), "on")) == 0,
	      "passthrough refused with EPERM, and stays so after a later note of on");
	json_decref(j);
	store_close(&s);
}

/* The read-ahead as stats reports it: what the daemon asked and why its
 * write failed, as noted; the value in effect read from the file at each
 * collect (an operator may write it later); null where it cannot be read. */
static void test_readahead(struct check_count *c, const char *top)
{
	struct store_opts opt = { .workers = 1 };
	struct store_readahead ra = { .want_kb = 4096, .err = -EROFS };
	struct metrics_src src = { 0 };
	char local[PATH_MAX * 2], *prom;
	struct metrics m;
	struct store s;
	json_t *j, *r;
	FILE *f;
	int fd;

	snprintf(ra.path, sizeof(ra.path), "/tmp/wfs-ra-XXXXXX");
	fd = mkstemp(ra.path);
	CHECK(c, fd >= 0 && write(fd, "128\n", 4) == 4 && close(fd) == 0, "the kb file");
	snprintf(local, sizeof(local), "%s/ralocal", top);
	mkdir(local, 0755);
	CHECK(c, store_open(&s, local, &opt, NULL) == 0, "open");
	src.store = &s;
	metrics_collect(&src, &m);
	j = metrics_json(&m);
	r = json_object_get(j, "readahead");
	CHECK(c, json_integer_value(json_object_get(r, "kb")) == 0 &&
	      json_is_null(json_object_get(r, "wanted")) && json_is_null(json_object_get(r, "path")),
	      "nothing noted: kb 0, nothing wanted, no path");
	json_decref(j);

	store_note_readahead(&s, &ra);
	metrics_collect(&src, &m);
	j = metrics_json(&m);
	r = json_object_get(j, "readahead");
	CHECK(c, json_integer_value(json_object_get(r, "kb")) == 128 &&
	      json_integer_value(json_object_get(r, "wanted")) == 4096 &&
	      !strcmp(json_string_value(json_object_get(r, "error")) ?: "", strerror(EROFS)) &&
	      !strcmp(json_string_value(json_object_get(r, "path")) ?: "", ra.path),
	      "refused: kb 128 read from the file, 4096 wanted, the error, the path");
	json_decref(j);

	f = fopen(ra.path, "w");
	CHECK(c, f && fputs("4096\n", f) >= 0 && fclose(f) == 0, "the file rewritten");
	metrics_collect(&src, &m);
	prom = metrics_prometheus(&m);
	CHECK(c, prom && strstr(prom, "\nwfs_readahead_bytes 4194304\n"),
	      "the value written later, as Prometheus has it");
	free(prom);

	unlink(ra.path);
	metrics_collect(&src, &m);
	j = metrics_json(&m);
	CHECK(c, json_is_null(json_object_get(json_object_get(j, "readahead"), "kb")),
	      "kb null where the file cannot be read");
	json_decref(j);
	store_close(&s);
}

int main(void)
{
	struct check_count c = { 0 };
	char top[PATH_MAX];

	snprintf(top, sizeof(top), "/var/tmp/wfs-metrics-XXXXXX");
	check_tmpdir(top);
	test_routes(&c, top);
	test_readahead(&c, top);
	check_rmtree(top);
	printf("metrics: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
