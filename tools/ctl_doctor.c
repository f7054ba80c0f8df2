/* ctl_doctor.c - wfsctl doctor: links the mount shows as they are (they
 * dangle, loop or leave NAS_HUB, so wfs never follows them) and blobs that
 * verification flagged.  Exit 1 when anything is wrong. */
#include "ctl_cmds.h"
#include "ctl_conn.h"
#include "ctl_fmt.h"

#include <stdio.h>
#include <string.h>

static const char *problem_text(const char *p)
{
	if (!strcmp(p, "dangling"))
		return "DANGLING";
	if (!strcmp(p, "loop"))
		return "LOOP";
	if (!strcmp(p, "escapes"))
		return "ESCAPES";
	return "FOREIGN";
}

int cmd_doctor(const struct ctl_opts *o)
{
	struct ctl_target t;
	struct ctl_reply rep;
	json_t *req, *links, *flags, *e;
	uint64_t problems, nflagged;
	size_t i;
	int r;

	if (ctl_target_resolve(o->conn, &t, o->socket, o->paths, o->npaths))
		return 1;
	if (t.nrel > 1) {
		/* as status: a glob of several would check its first alone */
		fprintf(stderr, "wfsctl: doctor: one PATH at a time (%s matched %zu)\n",
			o->paths[0], t.nrel);
		ctl_target_free(&t);
		return 1;
	}
	req = json_pack("{s:s}", "op", "doctor");
	r = req && !ctl_req_path(req, t.nrel ? t.rel[0] : "") ?
	    ctl_call(o->conn, t.socket, "doctor", req, o->json, &rep) : -1;
	json_decref(req);
	ctl_target_free(&t);
	if (r)
		return 1;
	links = json_object_get(rep.obj, "links");
	flags = json_object_get(rep.obj, "flagged");
	problems = jget_u64(rep.obj, "link_problems");
	nflagged = jget_total(rep.obj, "flagged");
	if (o->json) {
		ctl_print_raw(&rep);
	} else {
		printf("checked %llu entries: %llu link%s shown as link%s and never followed, "
		       "%llu flagged blob%s\n", (unsigned long long)jget_u64(rep.obj, "entries"),
		       (unsigned long long)problems, problems == 1 ? "" : "s",
		       problems == 1 ? "" : "s",
		       (unsigned long long)nflagged, nflagged == 1 ? "" : "s");
		json_array_foreach(links, i, e) {
			char path[FMT_TEXT], target[FMT_TEXT];

			printf("  %-8s %s -> %s\n", problem_text(jget_str(e, "problem")),
			       fmt_text(jget_str(e, "path"), path, sizeof(path)),
			       fmt_text(jget_str(e, "target"), target, sizeof(target)));
		}
		if (problems > json_array_size(links))
			printf("  ... and %llu more\n",
			       (unsigned long long)(problems - json_array_size(links)));
		json_array_foreach(flags, i, e) {
			char key[FMT_TEXT], id[FMT_TEXT], why[FMT_TEXT];

			printf("  %-8s %s (id %s): %s\n",
			       !strcmp(jget_str(e, "state"), "mismatch") ? "MISMATCH" : "FAILED",
			       fmt_text(jget_str(e, "key"), key, sizeof(key)),
			       fmt_text(jget_str(e, "id"), id, sizeof(id)),
			       fmt_text(jget_str(e, "reason"), why, sizeof(why)));
		}
		if (nflagged > json_array_size(flags))
			printf("  ... and %llu more\n",
			       (unsigned long long)(nflagged - json_array_size(flags)));
	}
	r = problems || nflagged;
	ctl_reply_free(&rep);
	return r ? 1 : 0;
}
