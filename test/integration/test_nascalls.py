#!/usr/bin/env python3
"""The daemon's NAS calls (issue 10) on test_nasfault.py's NAS that fails
on demand (faultnas.FaultNAS over test/faultfs, nf_base.py): a call that
fails inside a file (`eio`) or comes back short (`cut`), a NAS that
freezes under a copy or under a walk, or is slow (`latency`), and the
calls the daemon spares the NAS.

  EioMidCopy          EIO in a blob's middle: promote fails naming EIO, reads
                      of that range fail EIO and others are right; the range
                      healed, promote succeeds
  FrozenMidCopy       promote --wait while the NAS freezes under one copy,
                      another queued: a line says the NAS is down and why,
                      one that it is back; both end local, exit 0
  ShortNasRead        a NAS read short inside the file (`cut`): the rest is
                      asked for, the file reads whole, or the rest's EIO;
                      a file cut shorter under an open reads to its new end
                      (on the worker's ring, and on the NAS threads)
  FreshAttrs          a GETATTR within attr_timeout of the attributes' NAS
                      stat (after a listing) asks the NAS nothing
  WalkCalls           status of a repo of 300 links: a walk's few calls a
                      link; a NAS listing no entry types lists the same
  SlowNAS             20 ms a NAS call: right bytes, no errors, nas stays up
  SlowWalk            30 ms a NAS call, nas_timeout 100 ms: status stops
                      walking after 3 s (30 times nas_timeout) and answers
                      the rest from the record, saying so; another user's
                      is refused (ETIMEDOUT); at full speed it walks all
  OthersMidWalk       another user's status whose walk meets the NAS going
                      down halfway: refused (EHOSTDOWN), never answered
                      from the store's list of repos (which told that user
                      which repos have local copies)

Every call that could hang runs in a thread with a bounded join (a hang
fails the test instead of hanging it); waits are on events (status, the
faultfs state), never sleeps; tearDown puts the NAS back to health first.
"""

import errno
import os
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nf_base  # noqa: E402
import wfstest  # noqa: E402
from nf_base import (FIX, MANY_BLOBS, REPO, OTHER_REPO, FAIL_WAIT, DOWN_WAIT,  # noqa: E402
                     UP_WAIT, NAS_TIMEOUT_MS, NO_CACHE, WfsOnFaultNAS, bounded,
                     revision_entries, sha_size_uncached)
from wfstest import ctl_check, ctl_json, errname, run_wfsctl, state_of  # noqa: E402

NAS = None  # nf_base.NAS and REV, once setUpModule has set them
REV = None


def setUpModule():
    global NAS, REV
    nf_base.setup_module()
    NAS, REV = nf_base.NAS, nf_base.REV


def tearDownModule():
    nf_base.teardown_module()


class EioMidCopy(WfsOnFaultNAS):
    """A NAS read error inside a blob: the copy fails and says why; healed,
    it succeeds."""

    # readahead_kb=0: the kernel's default (128 KiB), so a read far from the
    # bad range never reaches into it
    OPTIONS = NO_CACHE + ("auto_promote=off", "readahead_kb=0")
    PROMOTE = False

    def test_eio_then_recovery(self):
        snap, _ = revision_entries()
        e = max(snap, key=lambda x: x["size"])
        size = e["size"]
        self.assertGreaterEqual(size, 3 << 20, "the biggest shard is too small to keep reads apart")
        off, ln = (size // 2) & ~4095, 4096
        NAS.check("eio %s %d %d" % (e["nas_real"], off, ln))
        path = self.m(e["path"])
        rc, out, err = run_wfsctl(["promote", "--wait", path], timeout=60)
        self.assertEqual(rc, 1, "promote --wait with an EIO range: exit %s\nstdout: %s\nstderr: %s"
                         % (rc, out, err))
        self.assertTrue("EIO" in out + err or "Input/output error" in out + err,
                        "promote's message does not name EIO:\nstdout: %s\nstderr: %s" % (out, err))
        self.assertNotEqual(state_of(path), "local")
        with open(FIX.n(e["nas_real"]), "rb") as f:
            want = f.read()
        fd = os.open(path, os.O_RDONLY)
        try:
            for o, n in ((0, 65536), (size - 65536, 65536)):
                r = bounded(os.pread, fd, n, o, timeout=FAIL_WAIT)
                self.assertTrue(r["done"], "read [%d, %d) blocked" % (o, o + n))
                self.assertIsNone(r["errno"], "read [%d, %d): %s" % (o, o + n, errname(r["errno"])))
                self.assertEqual(r["value"], want[o:o + n], "read [%d, %d)" % (o, o + n))
            r = bounded(os.pread, fd, ln, off, timeout=FAIL_WAIT)
            self.assertTrue(r["done"], "read of the bad range blocked")
            self.assertEqual(r["errno"], errno.EIO, "read of the bad range: %s" % errname(r["errno"]))
        finally:
            os.close(fd)
        NAS.check("clear")
        ctl_check(self, ["promote", "--wait", path], timeout=60)
        self.assertEqual(state_of(path), "local")
        self.assertEqual(sha_size_uncached(path), (e["sha256"], size))
        self.assertEqual(self.nas()["state"], "up")


class ShortNasRead(WfsOnFaultNAS):
    """A NAS read that comes back short inside the file (faultfs `cut`: an
    NFS read whose later RPC failed, a client that splits reads): the daemon
    asks for the rest, so a reader gets every byte, or the rest's error --
    never a file that ends early with no error."""

    OPTIONS = NO_CACHE + ("auto_promote=off",)
    PROMOTE = False

    def test_short_read_inside_the_file(self):
        snap, _ = revision_entries()
        e = max(snap, key=lambda x: x["size"])
        off = e["size"] // 2 + 1000
        NAS.check("cut %s %d" % (e["nas_real"], off))
        path = self.m(e["path"])
        self.assertEqual(sha_size_uncached(path), (e["sha256"], e["size"]),
                         "read through a NAS read cut short at %d" % off)
        # the read of the rest fails: so does the reader's (it got a
        # file that ended there, with no error)
        NAS.check("eio %s %d %d" % (e["nas_real"], off, 4096))
        wfstest.drop_pages(path)
        self.assert_eio(e["path"])
        NAS.check("clear")
        self.assertEqual(sha_size_uncached(path), (e["sha256"], e["size"]))
        self.assertNotEqual(state_of(path), "local")

    def test_file_shrunk_under_an_open(self):
        """A file cut shorter on the NAS under an open: a read across its
        new end gives the bytes up to there (the rest asked for, none
        came: the file does end there now).  Its 100 bytes were taken for
        ENETDOWN, a descriptor that died: the rest was asked of -ESTALE,
        and the reader got EBADF."""
        snap, _ = revision_entries()
        rel = os.path.dirname(snap[0]["path"]) + "/shrinks.bin"
        data = wfstest.det_bytes("shrinks", 3 << 20)
        with open(FIX.n(rel), "wb") as f:
            f.write(data)
        try:
            fd = os.open(self.m(rel), os.O_RDONLY)
            try:
                self.assertEqual(os.pread(fd, 4096, 0), data[:4096])
                os.truncate(FIX.n(rel), (1 << 20) + 100)
                got = os.pread(fd, 1 << 20, 1 << 20)
                self.assertEqual(got, data[1 << 20:(1 << 20) + 100],
                                 "a read across the new end: %d bytes" % len(got))
            finally:
                os.close(fd)
        finally:
            os.unlink(FIX.n(rel))


class ShortNasReadOffRing(ShortNasRead):
    """The same, the NAS reads handed to the NAS threads."""

    OPTIONS = NO_CACHE + ("auto_promote=off", "nas_read_ring=off")


class FrozenMidCopy(WfsOnFaultNAS):
    """promote --wait of two shards while the NAS freezes under the first
    one's copy, the second queued: it says the NAS is down (and why), the
    copy and the queue wait, and once the NAS answers again it says so,
    both copies end local and the wait exits 0."""

    # copy_workers=1: the second shard waits in the queue; promote_mbps=2:
    # half of 2 MB/s for the copy, so the two are still copying seconds
    # after the NAS is back, when the prober (at most 2 s between looks)
    # has seen it
    OPTIONS = NO_CACHE + ("auto_promote=off", "promote_mbps=2", "copy_workers=1",
                          "nas_timeout=%d" % NAS_TIMEOUT_MS)
    PROMOTE = False

    def test_promote_wait_through_an_outage(self):
        snap, _ = revision_entries()
        e, e2 = sorted(snap, key=lambda x: -x["size"])[:2]
        self.assertGreaterEqual(e["size"], 3 << 20, "the biggest shard is too small to copy slowly")
        other = self.take_nonlocal(False)
        path, path2 = self.m(e["path"]), self.m(e2["path"])
        p = subprocess.Popen([wfstest.wfsctl_bin(), "promote", "--wait", path, path2],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/")
        self.addCleanup(lambda: p.poll() is None and p.kill())
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(
            l.decode(errors="replace") for l in p.stderr), daemon=True)
        reader.start()
        # one copy worker: one copies (the order is the daemon's), the other waits
        states = lambda: sorted((state_of(path), state_of(path2)))  # noqa: E731
        self.assertTrue(wfstest.wait_until(lambda: states() == ["copying", "queued"], 30, 0.01),
                        "never one copying and one queued: %s" % states())
        NAS.check("hang")
        # a reader meets the frozen NAS: the daemon marks it down
        r = bounded(os.lstat, self.m(other["path"]), timeout=FAIL_WAIT)
        self.assertTrue(r["done"] and r["errno"] == errno.EIO, "lstat on a frozen NAS: %s" % r)
        said = wfstest.wait_until(lambda: any("the NAS is DOWN since" in l for l in lines), 30, 0.02)
        NAS.check("ok")
        self.assertTrue(said, "promote --wait did not say the NAS is down: %s" % lines)
        p.wait(timeout=120)   # (stderr is the reader's alone)
        reader.join(10)
        err = "".join(lines)
        self.assertEqual(p.returncode, 0, "promote --wait through an outage: exit %s\n%s"
                         % (p.returncode, err))
        down = [l for l in lines if "the NAS is DOWN since" in l]
        back = [l for l in lines if "the NAS answers again" in l]
        self.assertTrue(len(down) == 1 and len(back) == 1 and lines.index(down[0]) <
                        lines.index(back[0]), "one line down, then one back:\n" + err)
        self.assertIn("the copies wait for it", down[0])
        for pth, ent in ((path, e), (path2, e2)):
            self.assertEqual(state_of(pth), "local")
            self.assertEqual(sha_size_uncached(pth), (ent["sha256"], ent["size"]))


class FreshAttrs(WfsOnFaultNAS):
    """Attributes the daemon read from the NAS less than attr_timeout ago
    answer a GETATTR without a second NAS stat (issue 12).  The kernel asks
    for a directory's attributes again after each listing it read from the
    daemon (the listing marks its atime stale), within their timeout."""

    OPTIONS = ("auto_promote=off", "attr_timeout=60", "entry_timeout=60",
               "nas_timeout=%d" % NAS_TIMEOUT_MS)
    PROMOTE = False

    def listings_ahead(self):
        """(listed ahead, taken) from `wfsctl stats --json`."""
        m = ctl_json(self, ["--socket", self.sock, "stats"]).get("metrics") or {}
        ls = m.get("listings") or {}
        self.assertIsInstance(ls.get("ahead"), int, "stats has no metrics.listings: %s" % sorted(m))
        return ls["ahead"], ls["ahead_taken"]

    def test_getattr_after_listing_asks_nas_nothing(self):
        # original/ is the only directory of the revision, and has none: a
        # walk of the two has no next directory, so the daemon lists
        # nothing ahead -- a listing ahead (of a sibling) could meet the
        # frozen NAS below on a loaded machine, mark it down and fail this.
        # The start-up scan for links leaving NAS_HUB walks the NAS on a
        # thread of its own: it ends (one log line) before the NAS freezes.
        self.assertTrue(wfstest.wait_until(lambda: "under the repos' blobs/" in self.mount.log(),
                                           30, 0.02), "the start-up link scan did not end")
        p = "%s/snapshots/%s" % (REPO, REV)
        d = p + "/original"
        ahead0 = self.listings_ahead()[0]
        os.listdir(self.m(p))      # READDIRPLUS: the attributes of original/
        # held open: its dentry and its parents' stay in the kernel through
        # a drop_caches (another test's), which would send a LOOKUP
        held = os.open(self.m(d), os.O_RDONLY | os.O_DIRECTORY)
        self.addCleanup(os.close, held)
        os.listdir(self.m(d))      # read from the daemon: its atime is stale
        self.assertEqual(self.listings_ahead()[0], ahead0, "a directory was listed ahead")
        before = self.nas()
        # frozen: a NAS stat now would hang in faultfs, past nas_timeout
        NAS.check("hang")
        r = bounded(os.lstat, self.m(d), timeout=FAIL_WAIT)
        hung = NAS.state()["hung"]
        NAS.check("ok")
        self.assertTrue(r["done"], "lstat %s: still blocked after %d s" % (d, FAIL_WAIT))
        self.assertIsNone(r["errno"], "lstat %s: %s; the daemon's log ends:\n%s"
                          % (d, errname(r["errno"]), self.debug_state()))
        self.assertEqual(hung, 0, "lstat %s reached the NAS (a call hung in faultfs); the daemon's "
                         "log ends:\n%s" % (d, self.debug_state()))
        nas = os.lstat(FIX.n(d))
        st = r["value"]
        self.assertEqual((st.st_ino, st.st_mtime_ns, st.st_nlink),
                         (nas.st_ino, nas.st_mtime_ns, nas.st_nlink), "lstat %s" % d)
        after = self.nas()
        self.assertEqual((after["state"], after["timeouts"]), ("up", before["timeouts"]), after)


class WalkCalls(WfsOnFaultNAS):
    """A walk of the NAS (status, promote, the record) classifies each
    entry by descriptor in its open directory: a snapshot link is an
    fstatat, a readlinkat and an fstatat in the open blobs/, and the walk's
    consumer takes the blob's attributes from it.  Each path-based call it
    made instead was a lookup of every component on a NAS that caches
    nothing (faultfs; an NFS client past its lookup cache)."""

    PROMOTE = False

    def test_status_of_300_links(self):
        self.assertTrue(wfstest.wait_until(lambda: "under the repos' blobs/" in self.mount.log(),
                                           30, 0.02), "the start-up link scan did not end")
        repo = MANY_BLOBS.split("/")[0]
        self.wait_nas("up", UP_WAIT)
        c0 = NAS.state()["calls"]
        st = ctl_json(self, ["status", self.m(repo)])
        calls = NAS.state()["calls"] - c0
        self.assertEqual([(r["repo"], r["files"]) for r in st["repos"]], [(repo, 300)])
        # one walk of the repo gives its figures and its revisions': ~12.5
        # faultfs requests a link (each call above a LOOKUP, with a GETATTR
        # or a READLINK); ~22 when each revision was walked again, ~97 when
        # every call looked its path up afresh
        self.assertLessEqual(calls, 15 * 300, "status of %s: %d NAS calls" % (repo, calls))

    def test_status_without_entry_types(self):
        """A NAS whose listings give no entry types (DT_UNKNOWN: NFS
        without READDIRPLUS) lists the same repos and revisions in status:
        they were all dropped, taken for files."""
        self.wait_nas("up", UP_WAIT)
        repo = MANY_BLOBS.split("/")[0]

        def seen():
            st = ctl_json(self, ["status", self.mnt])
            one = ctl_json(self, ["status", self.m(repo)])
            return (sorted((r["repo"], r["files"]) for r in st["repos"]),
                    sorted(v["rev"] for v in one["repos"][0]["revisions"]))
        want = seen()
        self.assertTrue(want[0] and want[1], want)
        NAS.check("notype 1")
        self.addCleanup(NAS.check, "notype 0")
        self.assertEqual(seen(), want, "status with a NAS listing no entry types")


class SlowNAS(WfsOnFaultNAS):
    """20 ms a NAS call (each FUSE request costs several) is slow, not down
    (default nas_timeout)."""

    OPTIONS = NO_CACHE + ("auto_promote=off",)
    PROMOTE = False

    def test_latency(self):
        before = self.nas()
        NAS.check("latency 20")
        files = [self.take_nonlocal(True), self.take_nonlocal(False)]
        files.append(min(revision_entries()[1], key=lambda e: e["size"]))
        for e in files:
            self.assert_reads_right(e)
        self.assertEqual(NAS.state()["latency_ms"], 20)
        # status walks the NAS while it is up: asked at full speed, its
        # counters say whether the NAS ever went down meanwhile
        NAS.check("latency 0")
        st = self.nas()
        self.assertEqual(st["state"], "up", st)
        self.assertEqual((st["outages"], st["timeouts"]), (before["outages"], before["timeouts"]), st)


class SlowWalk(WfsOnFaultNAS):
    """A NAS slow but within its deadline: at 30 ms a call, a status of
    this hub (thousands of NAS calls uncached) took minutes, past
    wfsctl's own timeout."""

    OPTIONS = NO_CACHE + ("allow_other", "auto_promote=off", "nas_timeout=100")

    def test_status_walk_stops(self):
        NAS.check("latency 30")
        rc, out, err = run_wfsctl(["--json", "--socket", self.sock, "status"], timeout=60)
        self.assertEqual(rc, 0, out + err)
        st = wfstest.parse_json_out(out)
        self.assertEqual(st["walk_cut_s"], 3, st)
        self.assertEqual(st["from"], "record", st)
        self.assertEqual(st["nas"]["state"], "up", st["nas"])
        froms = {r["repo"]: r["from"] for r in st["repos"]}
        self.assertEqual(froms.get(REPO), "record", froms)
        local = next(r for r in st["repos"] if r["repo"] == REPO)
        self.assertGreater(local["local_files"], 0, "the record's figures of %s: %s"
                           % (REPO, local))
        rc, out, err = run_wfsctl(["--socket", self.sock, "status"], timeout=60)
        self.assertEqual(rc, 0, out + err)
        self.assertIn("the NAS answers slowly: its walk stopped after 3 s", out)
        self.assertIn("%s (record)" % REPO, out)
        rc, out, err = run_wfsctl(["--json", "--socket", self.sock, "status"],
                                  uid=wfstest.NOBODY, timeout=60)
        self.assertEqual(rc, 1, out + err)
        self.assertIn("ETIMEDOUT", out)
        self.assertIn("the NAS answers too slowly", out)
        NAS.check("latency 0")
        st = ctl_json(self, ["--socket", self.sock, "status"], timeout=60)
        self.assertEqual((st["walk_cut_s"], st["from"]), (0, "nas"))


class OthersMidWalk(WfsOnFaultNAS):
    def test_status_of_another_user_nas_down_mid_walk(self):
        NAS.check("faildir %s/snapshots hang" % OTHER_REPO)
        res = {}

        def status():
            res["r"] = run_wfsctl(["--json", "--socket", self.sock, "status"],
                                  uid=wfstest.NOBODY, timeout=60)
        t = threading.Thread(target=status)
        t.start()
        try:
            self.assertTrue(wfstest.wait_until(lambda: NAS.state()["hung"] >= 1, 10),
                            "the walk never reached %s/snapshots" % OTHER_REPO)
            # the NAS gone, and the daemon told so by a call of the mount's
            NAS.check("fail ENOTCONN")
            wfstest.errno_of(os.stat, self.m(OTHER_REPO + "/refs/main"))
            self.wait_nas("down", DOWN_WAIT)
            # then the walk's frozen listing fails as every call does now
            NAS.check("faildir %s/snapshots ENOTCONN" % OTHER_REPO)
        finally:
            t.join(70)
        self.assertFalse(t.is_alive(), "wfsctl status did not end")
        rc, out, err = res["r"]
        self.assertEqual(rc, 1, "status of another user, the NAS gone mid-walk: %s %s; log: %s"
                         % (out, err, self.mount.log()[-3000:]))
        self.assertIn("the NAS does not answer, and another user's status", out + err)
        self.assertNotIn(REPO, out, "the store's list of repos told another user")


if __name__ == "__main__":
    wfstest.main()
