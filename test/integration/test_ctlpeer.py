#!/usr/bin/env python3
"""What another user learns through the control socket: no more than the
NAS shows that user.  A repo the NAS keeps to its owner (mode 0700) gives
uid 65534 EACCES through the mount; its status, a promote dry run and
doctor by that uid once walked it as root and told its revisions, file
names, sizes and blob ids.  They now walk as the asking user (peeras.h):
named, the repo answers EACCES; inside the whole mount, it is not listed.
Root (and the mount's owner) still see it all, on the same workers."""

import errno
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from wfstest import ctl_json, run_wfsctl, NOBODY  # noqa: E402

FIX = wfstest.HubFixture(options=("allow_other", "auto_promote=off"), scale_mib=4, many=0, mount=False)
SOCK = None
HIDDEN = "models--acme--packs"


def setUpModule():
    global SOCK
    SOCK = wfstest.setup_with_ctl(FIX)


def tearDownModule():
    FIX.teardown()


def as_nobody(tc, args):
    """wfsctl --json --socket SOCK ARGS as uid 65534: (rc, reply object)."""
    rc, out, err = run_wfsctl(["--json", "--socket", SOCK] + args, uid=NOBODY, timeout=60)
    tc.assertIsNotNone(rc, "wfsctl %s as uid %d did not finish" % (args, NOBODY))
    try:
        return rc, json.loads(out)
    except ValueError:
        tc.fail("wfsctl %s as uid %d: not JSON: %r %r" % (args, NOBODY, out, err))


def mentions(rep, name):
    return name in json.dumps(rep)


class OtherUsers(unittest.TestCase):
    def setUp(self):
        self.repo = os.path.join(FIX.hub, HIDDEN)
        self.mode = os.stat(self.repo).st_mode & 0o7777
        os.chmod(self.repo, 0o700)
        self.addCleanup(os.chmod, self.repo, self.mode)

    def test_a_repo_the_nas_hides(self):
        # the mount refuses it to this user (the kernel checks the NAS modes)
        rc, out, err = wfstest.run_as_uid(["/bin/ls", FIX.m(HIDDEN)], NOBODY, 30)
        self.assertNotEqual(rc, 0, "ls of a 0700 repo as uid %d: %s" % (NOBODY, out))
        rc, rep = as_nobody(self, ["promote", "--dry-run", HIDDEN])
        self.assertEqual((rc, rep.get("errno")), (1, "EACCES"), rep)
        self.assertFalse(rep.get("blobs"), rep)
        # status of it: nothing it holds (it lists what it can read)
        rc, rep = as_nobody(self, ["status", HIDDEN])
        self.assertEqual([(r["repo"], r["files"], r["revisions"]) for r in rep.get("repos", [])],
                         [(HIDDEN, 0, [])] if rc == 0 else [], rep)
        for args in (["promote", "--dry-run", "."], ["doctor"]):
            rc, rep = as_nobody(self, args)
            self.assertFalse(mentions(rep, HIDDEN), "%s as uid %d names %s: %s"
                             % (args, NOBODY, HIDDEN, json.dumps(rep)[:2000]))
        # the whole mount's status: its name (NAS_HUB lists it to anyone, as
        # ls of the mount does), nothing it holds
        rc, rep = as_nobody(self, ["status"])
        self.assertEqual(rc, 0, rep)
        hidden = [(r["files"], r["revisions"]) for r in rep["repos"] if r["repo"] == HIDDEN]
        self.assertIn(hidden, ([], [(0, [])]), rep)
        self.assertGreater(sum(r["files"] for r in rep["repos"]), 0, rep)
        # and the rest of the mount is still listed to it
        rc, rep = as_nobody(self, ["promote", "--dry-run", "."])
        self.assertTrue(mentions(rep, "models--acme--standard"), rep)
        # root, on the same workers afterwards, still sees it all
        for _ in range(6):
            rep = ctl_json(self, ["promote", "--dry-run", FIX.m(HIDDEN)])
            self.assertTrue(rep.get("blobs"), rep)
            st = ctl_json(self, ["status", FIX.mnt])
            self.assertIn(HIDDEN, [r.get("repo") for r in st.get("repos", [])])


if __name__ == "__main__":
    wfstest.main()
