#!/usr/bin/env python3
"""The control server while long requests hold its workers, on a NAS that
is slow but up (test/faultfs `latency`, under nas_timeout).

  SyncsLeaveAWorker  four `sync` requests at once (each waits for the local
                     record's rebuild, which walks the slow NAS for seconds)
                     take at most the slow requests' share of the workers:
                     a `stats` sent while they wait is answered before any
                     of them (README "Control protocol": one worker is
                     always left for the quick requests, so the progress
                     polls of `promote --wait` do not wait behind them)

Waits are on what the daemon and faultfs report, never sleeps.
"""

import os
import select
import socket
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultnas  # noqa: E402
import wfstest  # noqa: E402
from wfstest import ctl_check  # noqa: E402

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
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(60)
    s.connect(sock_path)
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


if __name__ == "__main__":
    wfstest.main()
