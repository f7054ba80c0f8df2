#!/usr/bin/env python3
"""The daemon on a NAS that is slow but up (test/faultfs `latency`, under
nas_timeout), with more requests at once than it has workers or NAS
threads.

  SyncsLeaveAWorker  four `sync` requests at once (each waits for the local
                     record's rebuild, which walks the slow NAS for seconds)
                     take at most the slow requests' share of the workers:
                     a `stats` sent while they wait is answered before any
                     of them (README "Control protocol": one worker is
                     always left for the quick requests, so the progress
                     polls of `promote --wait` do not wait behind them)
  StatusBehindHungWalks  the NAS frozen under three walks that hold the
                     slow workers: a `status` queued behind them before
                     the NAS was known down is answered once it is (as
                     the quick status, from the record), not when the
                     NAS lets the walks go
  BurstOnSlowNas     twice as many reads at once as the daemon's 16 NAS
                     threads, each answered by the NAS in 0.7 nas_timeout:
                     the second half waits ~0.7 nas_timeout for a thread
                     and is then answered; every read returns the file's
                     bytes and the NAS is not taken for down (README
                     "Deadlines": the deadline runs from when a NAS thread
                     takes the call)

Waits are on what the daemon and faultfs report, never sleeps.
"""

import json
import mmap
import os
import select
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultnas  # noqa: E402
import wfstest  # noqa: E402
from wfstest import ctl_check, ctl_json  # noqa: E402

FIX = wfstest.HubFixture(options=(), scale_mib=4, many=0, mount=False)
NAS = None
REPO = "models--acme--standard"
LATENCY_MS = 150        # a NAS call: slow, well under nas_timeout
SYNCS = 4               # the daemon's control workers (core/control.h)


def setUpModule():
    global NAS
    NAS = faultnas.module_nas(FIX)


def tearDownModule():
    faultnas.stop_nas(NAS, FIX)


def send(sock_path, line):
    s = wfstest.connect_unix(sock_path, 60)
    s.sendall(line)
    return s


class SyncsLeaveAWorker(unittest.TestCase):
    def setUp(self):
        local = os.path.join(FIX.gen, "local-busy")
        mnt = os.path.join(FIX.gen, "mnt-busy")
        os.mkdir(mnt)
        self.m = wfstest.ForegroundMount(NAS.mnt, local, mnt,
                                         ["auto_promote=off", "nas_timeout=2000"]).start()
        self.addCleanup(self.m.cleanup)
        self.addCleanup(self.m.stop)
        self.addCleanup(NAS.reset)
        self.mnt, self.sock = mnt, os.path.join(os.path.realpath(local), "wfs.sock")
        with open(FIX.n(REPO + "/refs/main")) as f:
            rev = f.read().strip()
        # a revision in the local record: a rebuild walks its paths on the NAS
        ctl_check(self, ["promote", "--wait", os.path.join(mnt, REPO, "snapshots", rev)])

    def test_stats_answered_while_syncs_wait(self):
        NAS.check("latency %d" % LATENCY_MS)
        calls = NAS.state()["calls"]
        syncs = [send(self.sock, b'{"op":"sync"}\n') for _ in range(SYNCS)]
        self.addCleanup(lambda: [s.close() for s in syncs])
        # the rebuild they asked for is walking the NAS: every sync has been
        # read and handed to a worker by now (they were sent before)
        self.assertTrue(wfstest.wait_until(lambda: NAS.state()["calls"] > calls + 1, 20, 0.01),
                        "no rebuild of the local record reached the NAS")
        stats = send(self.sock, b'{"op":"stats"}\n')
        self.addCleanup(stats.close)
        ready, _, _ = select.select([stats] + syncs, [], [], 60)
        self.assertTrue(ready, "nothing answered within 60 s")
        self.assertIn(stats, ready, "a sync was answered before the stats sent while the syncs "
                      "waited: the syncs held every control worker")
        waiting = select.select(syncs, [], [], 0)[0]
        self.assertEqual(waiting, [], "%d syncs answered before the stats" % len(waiting))
        reply = stats.recv(1 << 20)
        self.assertIn(b'"ok"', reply.split(b"\n")[0])
        # and the syncs end, right
        NAS.check("latency 0")
        for s in syncs:
            s.settimeout(60)
            line = b""
            while b"\n" not in line:
                chunk = s.recv(65536)
                self.assertTrue(chunk, "a sync's connection closed without a reply")
                line += chunk
            self.assertIn(b'"ok":true', line.replace(b" ", b""), line[:300])


class StatusBehindHungWalks(unittest.TestCase):
    """The NAS frozen under three walks (doctor, verify, a promote dry
    run: they hold the slow requests' workers, begun before the NAS was
    known down); a `status` sent meanwhile waits behind them, as a walk
    of its own.  Once a reader's call finds the NAS down, that status is
    answered at once, from the record (README "When the NAS fails":
    status answers while it is down), not when the NAS lets go."""

    def setUp(self):
        local = os.path.join(FIX.gen, "local-hung")
        mnt = os.path.join(FIX.gen, "mnt-hung")
        os.mkdir(mnt)
        self.m = wfstest.ForegroundMount(NAS.mnt, local, mnt,
                                         ["auto_promote=off", "nas_timeout=500"]).start()
        self.addCleanup(self.m.cleanup)
        self.addCleanup(self.m.stop)
        self.addCleanup(faultnas.heal_stragglers)
        self.addCleanup(NAS.reset)
        self.mnt, self.sock = mnt, os.path.join(os.path.realpath(local), "wfs.sock")
        with open(FIX.n(REPO + "/refs/main")) as f:
            self.rev = f.read().strip()
        ctl_check(self, ["promote", "--wait", os.path.join(mnt, REPO, "snapshots", self.rev)])

    def test_status_queued_before_the_outage(self):
        NAS.check("hang")
        walks = [subprocess.Popen([wfstest.wfsctl_bin(), "--socket", self.sock] + args,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
                 for args in (["doctor"], ["verify"], ["promote", "--dry-run", REPO])]
        for p in walks:
            self.addCleanup(p.wait, 60)
            self.addCleanup(NAS.reset)  # (before each wait: the walks end)
        NAS.wait_hung(len(walks))
        status = send(self.sock, b'{"op":"status"}\n')
        self.addCleanup(status.close)
        # read by the server (in order: a stats sent after it is answered)
        stats = send(self.sock, b'{"op":"stats"}\n')
        self.addCleanup(stats.close)
        self.assertTrue(select.select([stats], [], [], 30)[0], "stats unanswered")
        self.assertEqual(select.select([status], [], [], 0)[0], [], "status answered at once")
        # a reader's lookup past nas_timeout: the NAS is down
        faultnas.bounded(os.stat, os.path.join(self.mnt, "models--acme--packs"), timeout=5)
        faultnas.wait_nas_state(self, self.sock, "down", 10)
        ready = select.select([status], [], [], 10)[0]
        self.assertTrue(ready, "status queued before the NAS went down still waits behind the "
                        "walks the frozen NAS holds, 10 s after it was found down")
        status.settimeout(10)
        line = b""
        while b"\n" not in line:
            chunk = status.recv(1 << 20)
            self.assertTrue(chunk, "status closed without a reply")
            line += chunk
        rep = json.loads(line.split(b"\n")[0])
        self.assertTrue(rep.get("ok"), rep)
        self.assertEqual(rep["nas"]["state"], "down", rep["nas"])


class BurstOnSlowNas(unittest.TestCase):
    """READS reads of a NAS-served file at once, each O_DIRECT (so each is
    one READ to the daemon, and one call on the NAS), with max_threads=64
    (a FUSE worker for each) and nas_read_ring=off (each read handed to
    one of the 16 NAS threads).  The NAS answers each in LATENCY_MS of a
    1000 ms nas_timeout: the first 16 are answered at ~0.7 s, the other 16
    then start and are answered at ~1.4 s.  A deadline counted from when
    the daemon got the request would pass for those at 1 s: the NAS marked
    down, and their readers given EIO, though it answered every call in
    0.7 s."""

    READS = 32
    LATENCY_MS = 700

    def setUp(self):
        local = os.path.join(FIX.gen, "local-burst")
        mnt = os.path.join(FIX.gen, "mnt-burst")
        os.mkdir(mnt)
        self.m = wfstest.ForegroundMount(NAS.mnt, local, mnt,
                                         ["auto_promote=off", "nas_timeout=1000",
                                          "max_threads=64", "nas_read_ring=off"]).start()
        self.addCleanup(self.m.cleanup)
        self.addCleanup(self.m.stop)
        self.addCleanup(NAS.reset)
        self.mnt, self.sock = mnt, os.path.join(os.path.realpath(local), "wfs.sock")

    def test_reads_queued_behind_slow_reads(self):
        blobs = [e for e in FIX.entries
                 if e["type"] == "file" and e["path"].startswith(REPO + "/blobs/")]
        rel = max(blobs, key=lambda e: e["size"])["path"]
        with open(FIX.n(rel), "rb") as f:
            want = f.read()
        step = len(want) // self.READS // 4096 * 4096
        self.assertGreater(step, 0, "%s: %d bytes" % (rel, len(want)))
        fd = os.open(os.path.join(self.mnt, rel), os.O_RDONLY | os.O_DIRECT)
        self.addCleanup(os.close, fd)
        bufs = [mmap.mmap(-1, 4096) for _ in range(self.READS)]  # aligned
        got = [None] * self.READS

        def read(i):
            try:
                got[i] = bufs[i][:os.preadv(fd, [bufs[i]], i * step)]
            except OSError as e:
                got[i] = e

        NAS.check("latency %d" % self.LATENCY_MS)
        reads = NAS.state()["reads"]
        readers = [threading.Thread(target=read, args=(i,)) for i in range(self.READS)]
        for t in readers:
            t.start()
        for t in readers:
            t.join(60)
        NAS.check("latency 0")
        self.assertFalse([t for t in readers if t.is_alive()], "reads still waiting after 60 s")
        bad = ["%d: %r" % (i * step, g) for i, g in enumerate(got)
               if g != want[i * step:i * step + 4096]]
        self.assertEqual(bad, [], "reads at these offsets were not the file's bytes")
        nas = ctl_json(self, ["--socket", self.sock, "status"])["nas"]
        self.assertEqual((nas["state"], nas["outages"], nas["timeouts"], nas["busy"]),
                         ("up", 0, 0, 0), nas)
        self.assertGreaterEqual(NAS.state()["reads"] - reads, self.READS,
                                "fewer NAS reads than reads: the test's premise")


if __name__ == "__main__":
    wfstest.main()
