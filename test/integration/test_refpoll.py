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

  MovingPin the ref moved on the NAS to a revision with a changed and an
            extra file, the pin part way (the changed file local, the
            extra one still copying: promote_mbps=1), the NAS frozen (or
            gone: faultfs killed):
            refs/main through the mount names a revision every file of
            which reads right -- the old one, all local, not the new one
            with its missing file EIO for an engine offline (the record
            showed the NAS's new ref) -- and status says so; once the NAS
            answers, refs/main is the NAS's again

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



# pack.gguf: an optional pack an exclusion glob keeps on the NAS (not
# local in either revision; the pin settles without it)
OLD = {"config.json": b'{"v": 1}', "model.safetensors": wfstest.det_bytes("moving", MiB),
       "pack.gguf": wfstest.det_bytes("moving-pack", 64 << 10)}
NEW = {"config.json": b'{"v": 2, "longer": true}', "model.safetensors": OLD["model.safetensors"],
       "pack.gguf": OLD["pack.gguf"],
       "extra.safetensors": wfstest.det_bytes("moving-extra", 8 * MiB)}


class MovingPin(unittest.TestCase):
    """A ref pin moving to a new revision when the NAS freezes."""

    def setUp(self):
        faultnas.require_faultfs()
        wfstest.require_wfsctl()
        self.base = wfstest.make_base("wfs-it-refmove-")
        self.addCleanup(shutil.rmtree, self.base, True)
        self.hub = os.path.join(self.base, "hub")
        self.old = wfstest.make_hf_repo(self.hub, REPO, OLD)
        self.nas = faultnas.FaultNAS(self.hub, os.path.join(self.base, "nas"),
                                     os.path.join(self.base, "ff.sock")).start()
        self.addCleanup(HungPoll.stop_nas, self)
        self.addCleanup(faultnas.heal_stragglers)
        local = os.path.join(self.base, "local")
        self.mnt = os.path.join(self.base, "mnt")
        os.mkdir(self.mnt)
        # promote_mbps=1 over 2 workers: the 8 MiB extra file takes some
        # 25 s to copy, the config a few ms -- the window the NAS freezes in
        self.m = wfstest.ForegroundMount(self.nas.mnt, local, self.mnt,
                                         ["auto_promote=off", "ref_poll=0.2", "copy_workers=2",
                                          "promote_mbps=1", "exclude=*.gguf",
                                          "nas_timeout=%d" % NAS_TIMEOUT_MS]).start()
        self.addCleanup(HungPoll.stop_wfs, self)
        self.sock = os.path.join(os.path.realpath(local), "wfs.sock")
        wfstest.wait_until(lambda: os.path.exists(self.sock), 10)

    def p(self, rev, name):
        return os.path.join(self.mnt, REPO, "snapshots", rev, name)

    def pin(self):
        pins = ctl_json(self, ["--socket", self.sock, "status"]).get("ref_pins") or []
        return pins[0] if len(pins) == 1 else {}

    def sync(self):
        rep = wfstest.ctl_request(self.sock, {"op": "sync"}, timeout=60)
        self.assertTrue(rep and rep.get("ok"), "sync: %s" % rep)

    def read_ref(self):
        r = faultnas.bounded(faultnas.pread_file, os.path.join(self.mnt, REPO, "refs", "main"),
                             0, 4096, timeout=10)
        self.assertTrue(r["done"] and r["errno"] is None, "refs/main: %s" % r)
        return r["value"].decode()

    def test_frozen_while_moving(self):
        self.moving(lambda: self.nas.check("hang"), self.nas.reset)

    def test_gone_while_moving(self):
        self.moving(self.nas.vanish, self.nas.restore)

    def moving(self, down, up):
        ctl_check(self, ["--socket", self.sock, "pin", "--ref", "main", REPO])
        self.assertTrue(wfstest.wait_until(
            lambda: self.pin().get("commit") == self.old and not self.pin().get("pending"), 30,
            0.1), "the ref pin never settled: %s" % self.pin())
        self.sync()  # the record shows refs/main at the old revision, all local
        new = wfstest.make_hf_repo(self.hub, REPO, NEW)
        self.assertTrue(wfstest.wait_until(
            lambda: state_of(self.p(new, "config.json")) == "local", 30, 0.05),
            "the new config was never copied: %s" % self.pin())
        self.assertEqual(self.pin().get("pending"), new)
        self.sync()  # the record built while the ref pin moves
        self.assertNotEqual(state_of(self.p(new, "extra.safetensors")), "local",
                            "the extra file was copied before the NAS froze: no window")
        down()
        # an engine's read of what is not local meets the outage (the
        # poll, listing the revision it moves to, waits on a frozen NAS
        # unbounded: README known limits)
        faultnas.bounded(faultnas.pread_file, self.p(new, "extra.safetensors"), 0, 4096,
                         timeout=10)
        faultnas.wait_nas_state(self, self.sock, "down", DOWN_WAIT)

        rev = self.read_ref()
        want = {self.old: OLD, new: NEW}.get(rev)
        self.assertIsNotNone(want, "refs/main names %r, neither revision" % rev)
        for name, data in sorted(want.items()):
            if name.endswith(".gguf"):
                continue  # kept on the NAS on purpose: EIO while it is down
            r = faultnas.bounded(faultnas.pread_file, self.p(rev, name), 0, len(data) + 1,
                                 timeout=10)
            self.assertTrue(r["done"] and r["errno"] is None,
                            "refs/main names %s (the old is %s): %s: %s"
                            % (rev, self.old, name, {k: r.get(k) for k in ("done", "errno")}))
            self.assertEqual(hashlib.sha256(r["value"]).hexdigest(),
                             hashlib.sha256(data).hexdigest(), "%s of %s" % (name, rev))
        self.assertEqual(rev, self.old, "refs/main while the NAS is down")
        held = ctl_json(self, ["--socket", self.sock, "status"])["record"].get("refs_held")
        self.assertEqual(held, [{"path": REPO + "/refs/main", "shows": self.old, "nas": new}])
        out = ctl_check(self, ["--socket", self.sock, "status"])[0]
        self.assertIn("%s/refs/main: the NAS names %s, not all local yet; while the NAS is down "
                      "it shows %s" % (REPO, new, self.old), out)

        up()
        faultnas.wait_nas_state(self, self.sock, "up", DOWN_WAIT)
        self.assertTrue(wfstest.wait_until(lambda: self.read_ref() == new, 10, 0.1),
                        "refs/main once the NAS answers: %s, the NAS has %s"
                        % (self.read_ref(), new))


if __name__ == "__main__":
    wfstest.main()
