"""nf_base.py - what the classes of test_nasfault.py and test_nascalls.py
share: their hub (FIX), the faultfs NAS over it (NAS), the revision they
promote (REPO@REV), the waits of the fault guarantees, and WfsOnFaultNAS,
a wfs mount over that NAS with the checks the classes make (the local
revision reads right within LOCAL_WAIT, non-local content fails EIO
within FAIL_WAIT).

A test module calls setup_module() and teardown_module() from its own
setUpModule and tearDownModule; NAS and REV are set by setup_module().
"""
import errno
import os
import re
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultnas  # noqa: E402
import wfstest  # noqa: E402
from wfstest import ctl_check, ctl_json, errname, state_of  # noqa: E402

# many: datasets--acme--many/blobs, 300 names, for a listing that takes many replies
FIX = wfstest.HubFixture(options=(), scale_mib=8, many=300, mount=False)
MANY_BLOBS = "datasets--acme--many/blobs"
NAS = None          # the FaultNAS over FIX.hub the daemons use
REPO = "models--acme--standard"
OTHER_REPO = "models--acme--packs"    # never promoted: in no record
REV = None          # REPO's refs/main

LOCAL_WAIT = 10     # s: every local file reads right within this, whatever the NAS does
FAIL_WAIT = 5       # s: non-local content fails EIO within this
DOWN_WAIT = 5       # s: status says nas down (nas_timeout + slack)
UP_WAIT = 15        # s: the prober backs off to 2 s between looks (+ its deadline + slack)
NAS_TIMEOUT_MS = 500

# Every lookup, getattr and readdir reaches the daemon (no kernel cache hides a fault).
NO_CACHE = ("entry_timeout=0", "attr_timeout=0", "negative_timeout=0", "blob_timeout=0")
BLOB_RE = re.compile(r"^(models|datasets)--[^/]+/blobs/[^/]+$")


def setup_module():
    global NAS, REV
    NAS = faultnas.module_nas(FIX)
    try:
        with open(FIX.n(REPO + "/refs/main")) as f:
            REV = f.read().strip()
    except BaseException:
        faultnas.stop_nas(NAS, FIX)
        raise


def teardown_module():
    faultnas.stop_nas(NAS, FIX)


# ------------------------------------------------------------------ helpers

bounded, bounded_all, heal_stragglers = faultnas.bounded, faultnas.bounded_all, faultnas.heal_stragglers


def sha_size(path):
    return wfstest.sha256_file(path)


def sha_size_uncached(path):
    """Content of a file in the wfs mount, its cached pages dropped first
    (each read reaches the daemon or the local copy)."""
    wfstest.drop_pages(path)
    return wfstest.sha256_file(path)


SYS_GETDENTS64, getdents = faultnas.SYS_GETDENTS64, faultnas.getdents


def revision_entries():
    """(snapshot entries of REPO@REV that read as files, the blob entries
    they resolve to)."""
    pre = "%s/snapshots/%s/" % (REPO, REV)
    snap = [e for e in FIX.readable() if e["path"].startswith(pre)]
    blobs = [FIX.by_path[p] for p in sorted({e["nas_real"] for e in snap})]
    return snap, blobs


def non_local_blobs():
    """Real blob files (no link on the way) not in REPO@REV: REPO's other
    revision first (names in a recorded directory), then other repos."""
    local = {e["nas_real"] for e in revision_entries()[1]}
    out = [e for e in FIX.entries if e["type"] == "file" and e["nas_real"] == e["path"]
           and BLOB_RE.match(e["path"]) and e["path"] not in local and e["size"] > 0]
    return sorted(out, key=lambda e: (not e["path"].startswith(REPO + "/"), e["path"]))


class WfsOnFaultNAS(unittest.TestCase):
    """A wfs mount over the faultfs NAS, its own LOCAL_STORE and mount point
    per class."""

    OPTIONS = NO_CACHE + ("allow_other", "auto_promote=off", "nas_timeout=%d" % NAS_TIMEOUT_MS)
    PROMOTE = True
    maxDiff = None

    @classmethod
    def setUpClass(cls):
        name = cls.__name__.lower()
        cls.local = os.path.join(FIX.gen, "local-" + name)
        cls.mnt = os.path.join(FIX.gen, "mnt-" + name)
        os.mkdir(cls.mnt)
        cls.mount = None
        cls.start_wfs()
        cls.unused = non_local_blobs()

    @classmethod
    def start_wfs(cls):
        cls.mount = wfstest.ForegroundMount(NAS.mnt, cls.local, cls.mnt, cls.OPTIONS).start()
        cls.sock = os.path.join(os.path.realpath(cls.local), "wfs.sock")

    @classmethod
    def tearDownClass(cls):
        problems = []
        if NAS and not NAS.alive():
            NAS.restore()
        if NAS:
            NAS.reset()
        heal_stragglers()
        if cls.mount is not None:
            problems = cls.mount.stop()
            cls.mount.cleanup()
            cls.mount = None
        if problems:
            raise AssertionError("teardown: " + "; ".join(problems))

    def setUp(self):
        if not NAS.alive():
            NAS.restore()
        NAS.reset()
        if self.PROMOTE:
            # A test before this one may have failed with the NAS down:
            # the daemon sees it back first, or the promotion is refused.
            self.wait_nas("up", UP_WAIT)
            self.promote_revision()

    def tearDown(self):
        # The NAS healthy first: a reader blocked by a failed test goes on.
        if not NAS.alive():
            NAS.restore()
        NAS.reset()
        heal_stragglers()

    # ---- the daemon

    def m(self, rel):
        return os.path.join(self.mnt, rel)

    def nas(self):
        """The "nas" object of `wfsctl status` (asked through the socket
        alone: never touches the mount)."""
        st = ctl_json(self, ["--socket", self.sock, "status"], timeout=30)
        nas = st.get("nas")
        self.assertIsInstance(nas, dict, "wfsctl --json status has no \"nas\" object: %s"
                              % sorted(st))
        for k in ("state", "since", "outages", "timeouts", "failed_down", "busy", "from_record",
                  "reason"):
            self.assertIn(k, nas, "status nas has no %r: %s" % (k, nas))
        return nas

    def wait_nas(self, want, timeout):
        return faultnas.wait_nas_state(self, self.sock, want, timeout)

    def debug_state(self):
        """The daemon's log lines about the NAS and the record, and the
        record's status: what a failed check needs to be understood."""
        lines = [l for l in self.mount.log().splitlines()
                 if "NAS" in l or "record" in l or "error" in l.lower()]
        try:
            st = ctl_json(self, ["--socket", self.sock, "status"], timeout=10)
            rec = {"nas": st.get("nas"), "record": st.get("record")}
        except Exception as e:  # the status itself failing says something too
            rec = "status failed: %s" % e
        return "\n".join(lines[-40:]) + "\nstatus: %s" % rec

    def promote_revision(self):
        snap, blobs = revision_entries()
        ctl_check(self, ["promote", "--wait", self.m("%s/snapshots/%s" % (REPO, REV))])
        self.assertTrue(os.path.isfile(os.path.join(self.local, "record.json")),
                        "promote --wait returned, but LOCAL_STORE/record.json does not exist")
        states = {e["path"]: state_of(self.m(e["path"])) for e in snap + blobs}
        self.assertEqual({p: s for p, s in states.items() if s != "local"}, {},
                         "after promote --wait of %s@%s" % (REPO, REV))

    def take_nonlocal(self, same_repo):
        """A non-local blob this mount has not read yet (its pages are in no cache)."""
        for e in self.unused:
            if e["path"].startswith(REPO + "/") == same_repo:
                self.unused.remove(e)
                return e
        self.fail("no unused non-local blob left (same repo: %s)" % same_repo)

    # ---- checks

    def check_local_revision(self, what):
        """Every name of REPO@REV reads right within LOCAL_WAIT; listings,
        links, refs/main, its .no_exist markers and its file list
        trees/<rev>.json too."""
        snap, blobs = revision_entries()
        pre = "%s/snapshots/%s" % (REPO, REV)
        calls = [(sha_size_uncached, (self.m(e["path"]),)) for e in snap + blobs]
        calls.append((wfstest.read_file, (self.m(REPO + "/refs/main"),)))
        calls.append((os.listdir, (self.m(pre),)))
        calls.append((os.listdir, (self.m(pre + "/original"),)))
        links = [e for e in snap if e["type"] == "link"]
        calls += [(os.readlink, (self.m(e["path"]),)) for e in links]
        # offline loading asks .no_exist/<rev>/<path> before the snapshot
        markers = [e for e in FIX.entries if e["type"] == "file"
                   and e["path"].startswith("%s/.no_exist/%s/" % (REPO, REV))]
        self.assertTrue(markers, "the fixture has no .no_exist marker for %s" % REV)
        calls += [(wfstest.read_file, (self.m(e["path"]),)) for e in markers]
        # recent clients read trees/<rev>.json offline to tell a complete
        # snapshot from an incomplete one
        tree = FIX.by_path.get("%s/trees/%s.json" % (REPO, REV))
        self.assertTrue(tree, "the fixture has no trees/%s.json" % REV)
        trees = len(calls)
        calls += [(sha_size_uncached, (self.m(tree["path"]),)), (os.stat, (self.m(tree["path"]),)),
                  (os.listdir, (self.m(REPO + "/trees"),)), (os.listdir, (self.m(REPO),))]
        calls.append((wfstest.as_uid, (sha_size, self.m(snap[0]["path"]))))
        t0 = time.monotonic()
        res = bounded_all(calls, LOCAL_WAIT)
        hung = [c[1][0] if c[0] is not wfstest.as_uid else "as nobody: " + c[1][1]
                for c, r in zip(calls, res) if not r["done"]]
        self.assertEqual(hung, [], "%s: still blocked %.1f s after asking" % (what, time.monotonic() - t0))
        bad = {}
        for (fn, args), r in zip(calls, res):
            if r["errno"] is not None or "exc" in r:
                bad[str(args[-1])] = errname(r["errno"]) if r["errno"] is not None else r["exc"]
        self.assertEqual(bad, {}, "%s: errors on the local revision; the daemon's log ends:\n%s"
                         % (what, self.debug_state()))
        i = 0
        for e in snap + blobs:
            self.assertEqual(res[i]["value"], (e["sha256"], e["size"]), "%s: %s bytes" % (what, e["path"]))
            i += 1
        self.assertEqual(res[i]["value"].decode(), REV, "%s: refs/main" % what)
        kids = FIX.children()
        self.assertEqual(sorted(res[i + 1]["value"]), kids[pre], "%s: ls %s" % (what, pre))
        self.assertEqual(sorted(res[i + 2]["value"]), kids[pre + "/original"], "%s: ls original/" % what)
        for j, e in enumerate(links):
            self.assertEqual(res[i + 3 + j]["value"], e["target"], "%s: readlink %s" % (what, e["path"]))
        for j, e in enumerate(markers):
            self.assertEqual(res[i + 3 + len(links) + j]["value"], b"", "%s: %s" % (what, e["path"]))
        self.assertEqual(res[trees]["value"], (tree["sha256"], tree["size"]), "%s: %s bytes" % (what, tree["path"]))
        self.assertEqual(res[trees + 1]["value"].st_size, tree["size"], "%s: stat %s" % (what, tree["path"]))
        self.assertIn(REV + ".json", res[trees + 2]["value"], "%s: ls %s/trees" % (what, REPO))
        self.assertIn("trees", res[trees + 3]["value"], "%s: ls %s" % (what, REPO))
        value, err = res[-1]["value"]
        self.assertIsNone(err, "%s: read as nobody: %s" % (what, errname(err)))
        self.assertEqual(value, (snap[0]["sha256"], snap[0]["size"]), "%s: read as nobody" % what)

    def assert_eio(self, rel, fn=None):
        """fn(path) (default: read the file) fails EIO within FAIL_WAIT."""
        r = bounded(fn or wfstest.read_file, self.m(rel), timeout=FAIL_WAIT)
        self.assertTrue(r["done"], "%s: still blocked after %d s (must fail EIO)" % (rel, FAIL_WAIT))
        self.assertEqual(r["errno"], errno.EIO, "%s: %s after %.2f s, expected EIO"
                         % (rel, errname(r["errno"]) if "exc" not in r else r["exc"], r["took"]))

    def assert_reads_right(self, e, timeout=30):
        r = bounded(sha_size, self.m(e["path"]), timeout=timeout)
        self.assertTrue(r["done"], "%s: still blocked after %d s" % (e["path"], timeout))
        self.assertIsNone(r["errno"], "%s: %s" % (e["path"], errname(r["errno"])))
        self.assertEqual(r.get("value"), (e["sha256"], e["size"]), "%s: bytes (%s)"
                         % (e["path"], r.get("exc")))
