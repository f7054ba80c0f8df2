#!/usr/bin/env python3
"""Files held open across a NAS outage, on the fault-injecting NAS of
test_nasfault.py (faultnas.FaultNAS: test/faultfs).

  HeldAcrossVanish  a file not local, opened and read before its NAS
                    vanished (kill -9 of faultfs: the mount, and every
                    descriptor of it, answers ENOTCONN); faultfs started
                    again on the same path and the daemon seeing it up:
                    reads on the descriptor held meanwhile give the NAS's
                    bytes, and leave the NAS up (the dead descriptor the
                    daemon held is not the NAS failing); the same for a
                    file with a local range (`promote --range`): its bytes
                    outside the range read right on the held descriptor

Every call that could hang runs in a thread with a bounded join; waits are
on the daemon's reported state, never sleeps; tearDown puts the NAS back
to health first.
"""

import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultnas  # noqa: E402
import wfstest  # noqa: E402
from wfstest import ctl_json, errname, run_wfsctl  # noqa: E402

FIX = wfstest.HubFixture(options=(), scale_mib=4, many=0, mount=False)
NAS = None
REPO = "models--acme--standard"
BLOB_RE = re.compile(r"^(models|datasets)--[^/]+/blobs/[^/]+$")

NAS_TIMEOUT_MS = 500
DOWN_WAIT = 5       # s: status says nas down (nas_timeout + slack)
UP_WAIT = 15        # s: the prober backs off to 2 s between looks (+ its deadline + slack)
READ_WAIT = 10      # s: a read on the held descriptor answers within this


def setUpModule():
    global NAS
    NAS = faultnas.module_nas(FIX)


def tearDownModule():
    faultnas.stop_nas(NAS, FIX)


class HeldAcrossVanish(unittest.TestCase):
    def setUp(self):
        local = os.path.join(FIX.gen, "local-held")
        self.mnt = os.path.join(FIX.gen, "mnt-held")
        os.makedirs(self.mnt, exist_ok=True)
        self.m = wfstest.ForegroundMount(NAS.mnt, local, self.mnt,
                                         ["auto_promote=off", "nas_timeout=%d" % NAS_TIMEOUT_MS]).start()
        self.addCleanup(self.m.cleanup)
        self.addCleanup(self.m.stop)
        self.addCleanup(faultnas.heal_stragglers)
        self.addCleanup(lambda: NAS.reset() if NAS.alive() else NAS.restore())
        self.sock = os.path.join(os.path.realpath(local), "wfs.sock")

    def nas(self):
        return ctl_json(self, ["--socket", self.sock, "status"])["nas"]

    def blob(self, rank):
        """The rank-th biggest blob (a real file under blobs/): entry, bytes."""
        e = sorted((x for x in FIX.entries if x["type"] == "file" and BLOB_RE.match(x["path"])),
                   key=lambda x: (-x["size"], x["path"]))[rank]
        self.assertGreaterEqual(e["size"], 1 << 20, "the blob is too small")
        with open(FIX.n(e["path"]), "rb") as f:
            return e, f.read()

    def test_read_after_nas_back(self):
        e, want = self.blob(0)
        self.read_across_vanish(e, want)

    def test_partial_file_read_after_nas_back(self):
        """Bytes outside the local range come from the NAS: the same."""
        e, want = self.blob(1)
        path = os.path.join(self.mnt, e["path"])
        wfstest.ctl_check(self, ["promote", "--range", "5000:3000", "--wait", path])
        self.assertEqual(wfstest.state_of(path), "partial")
        self.read_across_vanish(e, want)

    def read_across_vanish(self, e, want):
        path = os.path.join(self.mnt, e["path"])
        fd = os.open(path, os.O_RDONLY)
        self.addCleanup(os.close, fd)
        self.assertEqual(os.pread(fd, 4096, len(want) // 2), want[len(want) // 2:][:4096])
        NAS.vanish()
        # nothing else asks the NAS now: a status walks it and meets it gone
        run_wfsctl(["--socket", self.sock, "status"], timeout=30)
        faultnas.wait_nas_state(self, self.sock, "down", DOWN_WAIT)
        NAS.restore()
        up = faultnas.wait_nas_state(self, self.sock, "up", UP_WAIT)
        wfstest.drop_pages(path)  # each read below reaches the daemon
        # first the page a partial file's local range (5000:3000) lies in: the
        # kernel's retry of a failed read, page by page, meets it first
        for off, n in ((5000, 3000), (0, 16384), (len(want) // 2, 4096), (len(want) - 4096, 4096)):
            r = faultnas.bounded(os.pread, fd, n, off, timeout=READ_WAIT)
            self.assertTrue(r["done"], "pread at %d on the held descriptor: blocked" % off)
            self.assertIsNone(r["errno"], "pread at %d on the descriptor held across the outage, "
                              "the NAS back: %s; the daemon's log ends:\n%s"
                              % (off, errname(r["errno"]), self.m.log()[-2000:]))
            self.assertEqual(r["value"], want[off:off + n], "pread at %d" % off)
        now = self.nas()
        self.assertEqual((now["state"], now["outages"]), ("up", up["outages"]),
                         "reads on the held descriptor marked the NAS down: %s" % now)
        self.assertRegex(self.m.log(), r"read \S+/%s: its NAS descriptor died; opened again: "
                         r"the same file" % re.escape(e["path"]))


if __name__ == "__main__":
    wfstest.main()
