#!/usr/bin/env python3
"""What another user learns through the control socket: no more than the
NAS shows that user.  A repo the NAS keeps to its owner (mode 0700) gives
uid 65534 EACCES through the mount; its status, a promote dry run and
doctor by that uid once walked it as root and told its revisions, file
names, sizes and blob ids.  They now walk as the asking user (peeras.h):
named, the repo answers EACCES; inside the whole mount, it is not listed.
Root (and the mount's owner) still see it all, on the same workers."""

import errno
import hashlib
import json
import os
import shutil
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from wfstest import ctl_check, ctl_json, run_wfsctl, NOBODY  # noqa: E402

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
        # what the store knows of it (a partial file, a ref pin) is not
        # told either: those lists are root's and the owner's
        e = next(e for e in FIX.of("file") if e["path"].startswith(HIDDEN + "/blobs/")
                 and e["size"] > 4096)
        ctl_check(self, ["promote", "--wait", "--range", "0:4096", FIX.m(e["path"])])
        self.addCleanup(run_wfsctl, ["evict", FIX.m(e["path"])])
        self.assertTrue(mentions(ctl_json(self, ["status", FIX.mnt])["partial"], HIDDEN))
        rc, rep = as_nobody(self, ["status"])
        for k in ("partial", "copies", "flagged", "held"):
            self.assertFalse(mentions(rep.get(k), HIDDEN), "%s: %s" % (k, rep.get(k)))
        # (a ref pin copies the revision whole: the partial file goes)
        ctl_check(self, ["pin", "--ref", "main", FIX.m(HIDDEN)])
        self.addCleanup(run_wfsctl, ["unpin", "--ref", "main", FIX.m(HIDDEN)])
        self.assertTrue(mentions(ctl_json(self, ["status", FIX.mnt])["ref_pins"], HIDDEN))
        rc, rep = as_nobody(self, ["status"])
        self.assertFalse(mentions(rep.get("ref_pins"), HIDDEN), rep.get("ref_pins"))
        # root, on the same workers afterwards, still sees it all
        for _ in range(6):
            rep = ctl_json(self, ["promote", "--dry-run", FIX.m(HIDDEN)])
            self.assertTrue(rep.get("blobs"), rep)
            st = ctl_json(self, ["status", FIX.mnt])
            self.assertIn(HIDDEN, [r.get("repo") for r in st.get("repos", [])])


class StoreAndRecord(unittest.TestCase):
    """What the store and the record know is not told to another user: the
    refs the record holds (they name repos and commits), the state of a
    blob by its key (progress); a flagged blob its own walk meets is."""

    def test_held_ref_of_a_hidden_repo(self):
        repo = "models--acme--secret"
        self.addCleanup(shutil.rmtree, os.path.join(FIX.hub, repo), True)
        old = wfstest.make_hf_repo(FIX.hub, repo, {"a.bin": b"a" * 5000})
        ctl_check(self, ["promote", "--wait", FIX.m("%s/snapshots/%s" % (repo, old))])
        self.assertTrue(wfstest.ctl_request(SOCK, {"op": "sync"}, timeout=60).get("ok"))
        wfstest.make_hf_repo(FIX.hub, repo, {"b.bin": b"b" * 5000})  # refs/main moves on
        self.assertTrue(wfstest.ctl_request(SOCK, {"op": "sync"}, timeout=60).get("ok"))
        held = ctl_json(self, ["status", FIX.mnt])["record"]["refs_held"]
        self.assertTrue(mentions(held, repo), held)
        os.chmod(os.path.join(FIX.hub, repo), 0o700)
        rc, rep = as_nobody(self, ["status"])
        self.assertEqual(rep["record"]["refs_held"], [], rep["record"])

    def test_progress_is_for_who_may_promote(self):
        e = next(e for e in FIX.of("file") if e["path"].startswith(HIDDEN + "/blobs/"))
        rep = wfstest.ctl_request(SOCK, {"op": "progress", "keys": [FIX.n(e["nas_real"])]})
        self.assertTrue(rep.get("ok"), rep)
        rc, out, err = wfstest.run_as_uid(
            [sys.executable, "-c", "import json, socket, sys; s = socket.socket(socket.AF_UNIX); "
             "s.connect(sys.argv[1]); s.sendall(sys.argv[2].encode() + b'\\n'); "
             "print(s.makefile().readline())", SOCK,
             json.dumps({"op": "progress", "keys": [FIX.n(e["nas_real"])]})], NOBODY, 30)
        rep = json.loads(out)
        self.assertEqual((rep.get("ok"), rep.get("errno")), (False, "EPERM"), rep)

    def test_doctor_names_a_flagged_blob_it_can_read(self):
        repo = "models--acme--flagq"
        self.addCleanup(shutil.rmtree, os.path.join(FIX.hub, repo), True)
        wrong = hashlib.sha256(b"what the name says").hexdigest()
        os.makedirs(os.path.join(FIX.hub, repo, "blobs"))
        with open(os.path.join(FIX.hub, repo, "blobs", wrong), "wb") as f:
            f.write(b"other bytes")
        rc, out, err = run_wfsctl(["promote", "--wait", FIX.m("%s/blobs/%s" % (repo, wrong))])
        self.assertEqual(rc, 1, out + err)  # a mismatch: flagged
        rc, rep = as_nobody(self, ["doctor"])
        self.assertTrue(mentions(rep.get("flagged"), wrong), rep)


class ManyGroups(unittest.TestCase):
    def test_a_peer_in_more_groups_than_kept(self):
        """A peer in more supplementary groups than the daemon keeps (64):
        SO_PEERGROUPS copies none of them, and the buffer -- what an
        earlier connection left on the stack, root's group 0 among it --
        was taken for its groups.  It gets its uid and gid alone: a repo
        of mode 0750, group root, stays closed to it."""
        repo = os.path.join(FIX.hub, HIDDEN)
        st = os.stat(repo)
        os.chown(repo, 0, 0)
        os.chmod(repo, 0o750)
        self.addCleanup(os.chown, repo, st.st_uid, st.st_gid)
        self.addCleanup(os.chmod, repo, st.st_mode & 0o7777)
        for _ in range(3):  # root asks first: its groups are what was left
            ctl_json(self, ["status", FIX.mnt])
            rc, out, err = wfstest.run_captured(
                [wfstest.reachable(wfstest.wfsctl_bin()), "--json", "--socket", SOCK, "promote",
                 "--dry-run", HIDDEN], 60, cwd="/", user=NOBODY, group=NOBODY,
                extra_groups=list(range(3000, 3070)),
                env=wfstest.without_leak_check(os.environ))
            rep = json.loads(out) if out.strip() else {}
            self.assertEqual((rc, rep.get("errno")), (1, "EACCES"), out + err)


class NasThreads(unittest.TestCase):
    def test_a_thread_started_for_another_user_is_the_daemons(self):
        """The NAS gate starts its threads on demand, from the caller's
        thread: the first status of a fresh daemon, asked by uid 65534,
        started one running as that uid for good -- every NAS call after
        it (the mount's lookups, root's) got that uid's EACCES."""
        base = os.path.join(FIX.base, "nasthreads")
        os.mkdir(base)
        mnt = os.path.join(base, "mnt")
        os.mkdir(mnt)
        local = os.path.join(base, "local")
        m = wfstest.ForegroundMount(FIX.hub, local, mnt, ["allow_other", "auto_promote=off"]).start()
        self.addCleanup(m.cleanup)
        self.addCleanup(m.stop)
        sock = os.path.join(local, "wfs.sock")
        self.assertTrue(wfstest.wait_until(lambda: os.path.exists(sock), 10))
        repo = os.path.join(FIX.hub, HIDDEN)
        mode = os.stat(repo).st_mode & 0o7777
        os.chmod(repo, 0o700)
        self.addCleanup(os.chmod, repo, mode)
        rc, out, err = run_wfsctl(["--json", "--socket", sock, "status"], uid=NOBODY, timeout=60)
        self.assertEqual(rc, 0, out + err)
        ids = {}
        for tid in os.listdir("/proc/%d/task" % m.proc.pid):
            try:
                with open("/proc/%d/task/%s/status" % (m.proc.pid, tid)) as f:
                    st = dict(l.split(":", 1) for l in f if ":" in l)
            except OSError:
                continue  # ended meanwhile
            ids[st["Name"].strip() + "/" + tid] = (st["Uid"].split()[3], st["Gid"].split()[3])
        self.assertEqual({k: v for k, v in ids.items() if v != ("0", "0")}, {},
                         "threads whose file identity is not root's")
        self.assertTrue(os.listdir(os.path.join(mnt, HIDDEN)), "root's listing of " + HIDDEN)


if __name__ == "__main__":
    wfstest.main()
