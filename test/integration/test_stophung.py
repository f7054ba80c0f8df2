#!/usr/bin/env python3
"""SIGTERM while the NAS is frozen (faultfs `hang`) under work in flight:
the daemon must still stop within a bound, its store right.

  CopyInFlight     a promotion mid-copy (promote_mbps small: bytes_done > 0
                   in status, then a read of it blocked in the NAS); also
                   stopped by umount
  RebuildInFlight  the record's rebuild walking the NAS, blocked in a
                   listing (faultfs `faildir snapshots hang`), then the
                   whole NAS frozen
  WalkInFlight     a wfsctl request's walk (promote --dry-run of the repo)
                   blocked so, then the whole NAS frozen
  ReadInFlight     a reader's READ past its deadline, the daemon's read of
                   the NAS left blocked on the FUSE worker's own io_uring
                   (and, ReadInFlightHandedOff, on a NAS thread)
  SyncInFlight     the NAS healthy but slow, a sync request waiting for the
                   record's rebuild: the ordinary stop, not the frozen
                   NAS's (every part is told to stop before any is joined)

Each: SIGTERM, then within STOP_BOUND (nas_timeout for the FUSE loop's
requests, nas_timeout for the threads to stop, 10 s of room for the rest
and a busy machine, a sanitizer's exit included; 12 s with the 1 s
nas_timeout used here; it took 1.0-3.1 s) the
daemon has exited with status 0 and its mount is gone; LOCAL_STORE/data
holds only verified copies, each equal to its NAS bytes, and index.json
names exactly those.  The next start, the NAS still frozen, serves the
local revision from its record; tmp/ is empty; the NAS unfrozen, the blob
that was mid-copy reads right from the NAS and nothing half-written is
local.

Before the bounded stop, the daemon waited for the NAS: still there after
the bound, the test fails and unfreezes the NAS so that it can leave.
Waits are on the daemon's and faultfs's reported state, never sleeps.
"""

import errno
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultnas  # noqa: E402
import wfstest  # noqa: E402
from wfstest import ctl_check, ctl_json, state_of  # noqa: E402

MiB = 1 << 20
REPO = "models--acme--stophung"
SMALL = {"config.json": wfstest.det_bytes("stophung config", 4321),
         "tokenizer.json": wfstest.det_bytes("stophung tokenizer", 70000)}
BIG_NAME = "model.safetensors"
BIG = wfstest.det_bytes("stophung big", 24 * MiB)
NAS_TIMEOUT_MS = 1000
OPTIONS = ["auto_promote=off", "promote_mbps=2", "nas_timeout=%d" % NAS_TIMEOUT_MS]
# SIGTERM to exit: the FUSE loop's requests have nas_timeout (umount's own
# look at the mount is one), the threads nas_timeout more, then the index
# is written and the process ends: 2.05 s at most here, 3.1 s under
# ThreadSanitizer (which sleeps 1 s at exit).  The bound tells a stop that
# waits for the NAS (the code before: until it is unfrozen) from one that
# does not, not how fast: 10 s of room for a busy machine
STOP_BOUND = 2 * NAS_TIMEOUT_MS / 1000 + 10
HANG_WAIT = 30      # s: the daemon of the code before, once the NAS is unfrozen
STEP_WAIT = 20      # s: one step's event


def sha(b):
    return hashlib.sha256(b).hexdigest()


def raw_request(sock, req):
    """One request on the control socket (sync has no wfsctl command of
    its own: promote --wait sends it); the reply line, or b"" if the
    daemon closed the connection without one."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.connect(sock)
        c.sendall(json.dumps(req).encode() + b"\n")
        return c.makefile("rb").readline()


class StopOnFrozenNas:
    """The fixture each case shares: a hub with REPO, faultfs over it, a
    daemon in the foreground."""

    extra_options = []

    def setUp(self):
        faultnas.require_faultfs()
        wfstest.require_wfsctl()
        self.base = wfstest.make_base("wfs-it-stophung-")
        self.addCleanup(shutil.rmtree, self.base, True)
        self.hub = os.path.join(self.base, "hub")
        files = dict(SMALL)
        files[BIG_NAME] = BIG
        self.rev = wfstest.make_hf_repo(self.hub, REPO, files)
        self.nas = faultnas.FaultNAS(self.hub, os.path.join(self.base, "nas"),
                                     os.path.join(self.base, "ff.sock")).start()
        self.addCleanup(self.stop_nas)
        self.addCleanup(faultnas.heal_stragglers)
        self.local = os.path.join(self.base, "local")
        self.mnt = os.path.join(self.base, "mnt")
        os.mkdir(self.mnt)
        self.m = None
        self.addCleanup(self.stop_wfs)
        self.start_wfs()

    def start_wfs(self):
        self.m = wfstest.ForegroundMount(self.nas.mnt, self.local, self.mnt,
                                         OPTIONS + self.extra_options).start()
        self.sock = os.path.join(os.path.realpath(self.local), "wfs.sock")
        self.assertTrue(wfstest.wait_until(lambda: os.path.exists(self.sock), 10),
                        "no control socket; log:\n%s" % self.m.log()[-2000:])

    def stop_nas(self):
        problems = self.nas.stop()
        if problems:
            raise AssertionError("faultfs: " + "; ".join(problems))

    def stop_wfs(self):
        if not self.m:
            return
        if self.nas.alive():
            self.nas.reset()  # a daemon stuck in the NAS can leave now
        problems = self.m.stop()
        self.m.cleanup()
        self.m = None
        if problems:
            raise AssertionError("wfs: " + "; ".join(problems))

    def p(self, name):
        return os.path.join(self.mnt, REPO, "snapshots", self.rev, name)

    def promote_small(self):
        ctl_check(self, ["--socket", self.sock, "promote", "--wait"]
                  + [self.p(n) for n in SMALL])
        for n in SMALL:
            self.assertEqual(state_of(self.p(n)), "local", n)

    def sigterm_and_exit(self, how="SIGTERM"):
        """SIGTERM (or umount); the daemon must be gone within STOP_BOUND,
        status 0, its mount gone.  Returns the seconds it took."""
        proc = self.m.proc
        t0 = time.monotonic()
        if how == "umount":
            subprocess.run(["umount", self.mnt], check=True, timeout=30)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            rc = proc.wait(timeout=STOP_BOUND)
        except subprocess.TimeoutExpired:
            hung = self.nas.state().get("hung")
            self.nas.reset()  # let it go (the code before waits for the NAS)
            try:
                proc.wait(timeout=HANG_WAIT)
                after = "it exited once the NAS was unfrozen"
            except subprocess.TimeoutExpired:
                after = "it is still there %d s after the NAS was unfrozen" % HANG_WAIT
            self.fail("the daemon still runs %.1f s after %s with the NAS frozen (%s "
                      "calls hung); %s; its log ends:\n%s"
                      % (STOP_BOUND, how, hung, after, self.m.log()[-3000:]))
        took = time.monotonic() - t0
        self.assertEqual(rc, 0, "the daemon's exit status after %s; log:\n%s"
                         % (how, self.m.log()[-3000:]))
        self.assertTrue(faultnas.wait_mounts(lambda: not wfstest.is_mounted(self.mnt), 5),
                        "%s still mounted after the daemon exited" % self.mnt)
        return took

    def check_store(self, local_names):
        """LOCAL_STORE/data holds one verified copy of each of local_names'
        bytes and nothing else; index.json names exactly those."""
        want = {}
        for n in local_names:
            data = (SMALL.get(n) or BIG)
            want[hashlib.sha256(data).hexdigest()] = len(data)
        got = {}
        for rel, st in wfstest.store_files(self.local).items():
            with open(os.path.join(self.local, "data", rel), "rb") as f:
                got[sha(f.read())] = st.st_size
        self.assertEqual(got, want, "LOCAL_STORE/data after the stop (sha256: size) should "
                         "hold %s only" % sorted(local_names))
        with open(os.path.join(self.local, "index.json")) as f:
            idx = json.load(f)
        text = json.dumps(idx)
        self.assertNotIn("copying", text, "index.json names a copy in flight")
        named = {rel.split("/")[-1] for rel in wfstest.store_files(self.local)}
        for name in named:
            self.assertIn(name, text, "index.json does not name the copy %s" % name)

    def restart_frozen(self, served, local_names):
        """The next start, the NAS still frozen: the files `served` (the
        record's) read right, tmp/ empty.  Then the NAS unfrozen: nothing
        copying, local_names local, BIG read right from the NAS."""
        problems = self.m.stop()
        self.m.cleanup()
        self.m = None
        self.assertEqual(problems, [], "the daemon that exited")
        self.nas.check("hang")
        self.start_wfs()
        self.assertEqual(wfstest.tmp_entries(self.local), [],
                         "LOCAL_STORE/tmp not empty after the next start")
        for n in served:
            r = faultnas.bounded(faultnas.pread_file, self.p(n), 0, len(SMALL[n]) + 1,
                                 timeout=10)
            self.assertTrue(r["done"] and r["errno"] is None,
                            "%s on the frozen NAS after the restart: %s" % (n, r))
            self.assertEqual(sha(r["value"]), sha(SMALL[n]), n)
        self.nas.reset()
        faultnas.wait_nas_state(self, self.sock, "up", 10)
        st = ctl_json(self, ["--socket", self.sock, "status"])
        self.assertEqual(st["copies"], [], "copies after the restart without a request")
        self.assertEqual(state_of(self.p(BIG_NAME)), "nas", BIG_NAME)
        self.assertEqual(wfstest.sha256_file(self.p(BIG_NAME)), (sha(BIG), len(BIG)))
        for n in local_names:
            self.assertEqual(state_of(self.p(n)), "local", n)
        self.check_store(local_names)


class CopyInFlight(StopOnFrozenNas, unittest.TestCase):
    def test_sigterm_mid_copy(self):
        self.stop_mid_copy("SIGTERM")

    def test_umount_mid_copy(self):
        self.stop_mid_copy("umount")

    def stop_mid_copy(self, how):
        self.promote_small()
        ctl_check(self, ["--socket", self.sock, "promote", self.p(BIG_NAME)])

        def copy():
            st = ctl_json(self, ["--socket", self.sock, "status"])
            return next((c for c in st["copies"] if c.get("id") == sha(BIG)), None)
        c = wfstest.wait_until(lambda: (copy() or {}).get("bytes_done", 0) > 0, STEP_WAIT, 0.05)
        self.assertTrue(c, "the copy of %s never started: %s" % (BIG_NAME, copy()))
        self.nas.check("hang")
        # the copy's read blocked, not only some other call (between two
        # paced reads, the copy would see the stop and cancel itself)
        self.nas.wait_hung(1, timeout=STEP_WAIT, what="hung_reads")
        took = self.sigterm_and_exit(how)
        print("\n  exited %.2f s after %s, the copy in flight" % (took, how), file=sys.stderr)
        # (a name's state would ask the frozen NAS: the daemon's log says
        # the copy was still in flight when it stopped)
        self.assertIn("the copy of %s is left unfinished" % os.path.join(
            os.path.realpath(self.base), "nas", REPO, "blobs", sha(BIG)), self.m.log(),
            "the copy was not in flight at the stop")
        self.check_store(list(SMALL))
        self.restart_frozen(list(SMALL), list(SMALL))


class RebuildInFlight(StopOnFrozenNas, unittest.TestCase):
    def test_sigterm_mid_rebuild(self):
        first, second = sorted(SMALL)
        ctl_check(self, ["--socket", self.sock, "promote", "--wait", self.p(first)])
        # the rebuild after the next local copy walks REPO: its listing of
        # snapshots/ blocks (promote --wait would wait for that rebuild)
        self.nas.check("faildir %s hang" % os.path.join(REPO, "snapshots"))
        blob = os.path.join(self.mnt, REPO, "blobs", sha(SMALL[second]))
        ctl_check(self, ["--socket", self.sock, "promote", blob])
        self.assertTrue(wfstest.wait_until(lambda: state_of(blob) == "local", STEP_WAIT, 0.05),
                        "%s never local: %s" % (second, state_of(blob)))
        self.nas.wait_hung(1, timeout=STEP_WAIT)
        self.nas.check("hang")
        took = self.sigterm_and_exit()
        print("\n  exited %.2f s after SIGTERM, the rebuild in flight" % took, file=sys.stderr)
        self.check_store(list(SMALL))
        self.nas.check("clear")
        # the record keeps its last build: the first file only
        self.restart_frozen([first], list(SMALL))


class WalkInFlight(StopOnFrozenNas, unittest.TestCase):
    def test_sigterm_mid_walk(self):
        first = sorted(SMALL)[0]
        ctl_check(self, ["--socket", self.sock, "promote", "--wait", self.p(first)])
        # a wfsctl request's walk of REPO, its listing of snapshots/ blocked
        self.nas.check("faildir %s hang" % os.path.join(REPO, "snapshots"))
        walk = faultnas.bounded_all([(wfstest.run_wfsctl, (["--socket", self.sock, "promote",
                                                            "--dry-run", os.path.join(
                                                                self.mnt, REPO)], None, 60))],
                                    timeout=0)[0]
        self.nas.wait_hung(1, timeout=STEP_WAIT)
        self.nas.check("hang")
        took = self.sigterm_and_exit()
        print("\n  exited %.2f s after SIGTERM, a wfsctl walk in flight" % took, file=sys.stderr)
        self.check_store([first])
        self.nas.check("clear")
        walk["thread"].join(STEP_WAIT)
        self.assertFalse(walk["thread"].is_alive(), "wfsctl still waits for the daemon that "
                         "exited")
        self.restart_frozen([first], [first])


class ReadInFlight(StopOnFrozenNas, unittest.TestCase):
    def test_sigterm_with_a_read_left_in_the_nas(self):
        """A reader of a file still on the NAS, the NAS frozen: the READ
        passes its deadline and the reader gets EIO, while the daemon's read
        stays blocked in the NAS -- on its FUSE worker's own io_uring
        (nas_read_ring), or on a NAS thread.  SIGTERM then: the worker ends
        with that read still blocked, and the daemon must stop within the
        bound all the same."""
        self.promote_small()
        fd = os.open(self.p(BIG_NAME), os.O_RDONLY)
        try:
            self.nas.check("hang")
            r = faultnas.bounded(os.pread, fd, 4096, 8 * MiB, timeout=STEP_WAIT)
            self.assertTrue(r["done"], "a read of %s on the frozen NAS still blocks after %d s"
                            % (BIG_NAME, STEP_WAIT))
            self.assertEqual(r["errno"], errno.EIO, "a read on the frozen NAS: %s" % r)
            self.nas.wait_hung(1, timeout=STEP_WAIT, what="hung_reads")
            took = self.sigterm_and_exit()
        finally:
            os.close(fd)
        print("\n  exited %.2f s after SIGTERM, a read left in the NAS" % took, file=sys.stderr)
        self.check_store(list(SMALL))
        self.restart_frozen(list(SMALL), list(SMALL))


class ReadInFlightHandedOff(ReadInFlight):
    """The same with the read handed to a NAS thread (-o nas_read_ring=off,
    the way where io_uring is disabled)."""

    extra_options = ["nas_read_ring=off"]


class SyncInFlight(StopOnFrozenNas, unittest.TestCase):
    def test_sigterm_mid_sync_healthy_nas(self):
        """A healthy NAS, only slow: a `wfsctl sync` waits for the record's
        rebuild, which only the record's stop ends.  Told one part at a
        time, the control worker used the whole deadline waiting for it,
        the record and the store were then left behind with none, and a
        stop that had nothing stuck took the path for a frozen NAS (index
        written with the store held, "exiting without the threads").  Every
        part is told first now: the stop is the ordinary one."""
        self.promote_small()
        self.nas.check("latency 200")
        before = self.nas.state()["calls"]
        sync = faultnas.bounded_all([(raw_request, (self.sock, {"op": "sync"}))], timeout=0)[0]
        # the rebuild is walking the NAS: calls made since the sync began
        self.assertTrue(wfstest.wait_until(lambda: self.nas.state()["calls"] >= before + 3,
                                           STEP_WAIT, step=0.01), "the sync made no NAS call")
        self.assertFalse(sync["done"], "the sync ended before the stop: %s" % sync)
        self.sigterm_and_exit()
        log = self.m.log()
        self.assertNotIn("exiting without the threads", log,
                         "a stop with nothing stuck took the frozen NAS's path; log:\n%s"
                         % log[-3000:])
        self.check_store(list(SMALL))
        sync["thread"].join(STEP_WAIT)
        self.assertFalse(sync["thread"].is_alive(), "the sync request still waits")


if __name__ == "__main__":
    wfstest.main()
