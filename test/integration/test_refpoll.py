#!/usr/bin/env python3
"""A ref pin (`wfsctl pin --ref`) on a NAS that hangs (faultfs `hang`):
the daemon reads the pinned ref every ref_poll seconds, so a hung NAS is
all but sure to catch that read.

  HungPoll  the pin settled (its revision local), the NAS frozen: the
            poll's read of refs/main waits at most nas_timeout and marks
            the NAS down (nothing else asks the NAS meanwhile); the local
            file reads right; an unmount ends the daemon while the NAS is
            still frozen (the poll held the automatic-promotion thread,
            and the daemon's exit, until the NAS let go)

Waits are on the daemon's reported state and faultfs's, never sleeps;
the NAS is released and every mount taken off in the cleanups.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultnas  # noqa: E402
import wfstest  # noqa: E402
from wfstest import ctl_check, ctl_json, state_of  # noqa: E402

MiB = 1 << 20
REPO = "models--acme--polled"
FILES = {"model.safetensors": wfstest.det_bytes("polled", MiB)}
NAS_TIMEOUT_MS = 500
DOWN_WAIT = 10      # s: ref_poll + nas_timeout + slack


class HungPoll(unittest.TestCase):
    def setUp(self):
        faultnas.require_faultfs()
        wfstest.require_wfsctl()
        self.base = wfstest.make_base("wfs-it-refpoll-")
        self.addCleanup(shutil.rmtree, self.base, True)
        hub = os.path.join(self.base, "hub")
        self.rev = wfstest.make_hf_repo(hub, REPO, FILES)
        self.nas = faultnas.FaultNAS(hub, os.path.join(self.base, "nas"),
                                     os.path.join(self.base, "ff.sock")).start()
        self.addCleanup(self.stop_nas)
        self.addCleanup(faultnas.heal_stragglers)
        local = os.path.join(self.base, "local")
        self.mnt = os.path.join(self.base, "mnt")
        os.mkdir(self.mnt)
        self.m = wfstest.ForegroundMount(self.nas.mnt, local, self.mnt,
                                         ["auto_promote=off", "ref_poll=0.2",
                                          "nas_timeout=%d" % NAS_TIMEOUT_MS]).start()
        self.addCleanup(self.stop_wfs)
        self.sock = os.path.join(os.path.realpath(local), "wfs.sock")
        wfstest.wait_until(lambda: os.path.exists(self.sock), 10)

    def stop_nas(self):
        problems = self.nas.stop()  # released first (reset), then unmounted
        if problems:
            raise AssertionError("faultfs: " + "; ".join(problems))

    def stop_wfs(self):
        if self.nas.alive():
            self.nas.reset()  # a daemon stuck in the NAS can leave now
        problems = self.m.stop()
        self.m.cleanup()
        if problems:
            raise AssertionError("wfs: " + "; ".join(problems))

    def settled(self):
        pins = ctl_json(self, ["--socket", self.sock, "status"]).get("ref_pins") or []
        return (len(pins) == 1 and pins[0].get("commit") == self.rev and not pins[0].get("pending")
                and state_of(self.p()) == "local")

    def p(self):
        return os.path.join(self.mnt, REPO, "snapshots", self.rev, "model.safetensors")

    def test_poll_on_a_hung_nas(self):
        ctl_check(self, ["--socket", self.sock, "pin", "--ref", "main", REPO])
        self.assertTrue(wfstest.wait_until(self.settled, 30, 0.1), "the ref pin never settled: %s"
                        % ctl_json(self, ["--socket", self.sock, "status"]).get("ref_pins"))
        # the local record built (the copy's rebuild, a walk of the NAS,
        # done), so that nothing but the poll asks the NAS from now on
        rep = wfstest.ctl_request(self.sock, {"op": "sync"}, timeout=60)
        self.assertTrue(rep and rep.get("ok"), "sync: %s" % rep)
        self.nas.check("hang")
        nas = faultnas.wait_nas_state(self, self.sock, "down", DOWN_WAIT)
        self.assertGreaterEqual(nas["timeouts"], 1, nas)
        r = faultnas.bounded(faultnas.pread_file, self.p(), 0, MiB, timeout=10)
        self.assertTrue(r["done"] and r["errno"] is None, "the local file on a hung NAS: %s" % r)
        self.assertEqual(hashlib.sha256(r["value"]).digest(),
                         hashlib.sha256(FILES["model.safetensors"]).digest())
        self.assertGreaterEqual(self.nas.state()["hung"], 1, "the NAS let a call go")
        subprocess.run(["umount", self.mnt], check=True, timeout=30)
        try:
            self.m.proc.wait(timeout=wfstest.EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.fail("the daemon still runs %d s after its unmount, the NAS frozen; its log "
                      "ends:\n%s" % (wfstest.EXIT_TIMEOUT, self.m.log()[-2000:]))


if __name__ == "__main__":
    wfstest.main()
