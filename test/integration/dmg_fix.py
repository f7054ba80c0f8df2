"""dmg_fix.py - what test_damaged.py and test_versions.py share: a hub of
one repo (a 3 MiB SHA-256-named blob and a small one) with its own
LOCAL_STORE and mount (Store), and DamageCase, a test case over a fresh
Store with the checks they make (bytes through the mount, states, log
lines)."""

import json
import os
import re
import shutil
import subprocess
import unittest

import wfstest
from wfstest import ctl_check, state_of

MiB = 1 << 20
REPO = "models--dmg--a"
BIG, SMALL = "model.safetensors", "config.json"
BIG_SIZE = 3 * MiB + 4321   # head, middle and tail are sampled (64 KiB each)
INDEX_MAX = 256 * MiB       # core/index.h INDEX_MAX_BYTES
SETTLE = 60                 # seconds a re-hash of a few MiB may take, at most


class Store:
    """A hub with one repo (a 3 MiB SHA-256-named blob and a small one),
    LOCAL_STORE and a mount point, in a fresh directory."""

    def __init__(self, local=None):
        self.base = wfstest.make_base("wfs-dmg-")
        self.hub = os.path.join(self.base, "hub")
        self.local = local or os.path.join(self.base, "local")
        self.mnt = os.path.join(self.base, "mnt")
        os.makedirs(self.hub)
        os.makedirs(self.mnt)
        self.data = {BIG: wfstest.det_bytes("dmg-big", BIG_SIZE),
                     SMALL: wfstest.det_bytes("dmg-small", 5000)}
        self.rev = wfstest.make_hf_repo(self.hub, REPO, self.data)
        self.mount = None
        self.logs = []

    def path(self, name):
        return os.path.join(self.mnt, REPO, "snapshots", self.rev, name)

    def key(self, name):
        """The blob's NAS path as the index records it (links resolved)."""
        return os.path.realpath(os.path.join(self.hub, REPO, "snapshots", self.rev, name))

    def start(self, ctl=True, options=()):
        self.mount = wfstest.ForegroundMount(self.hub, self.local, self.mnt,
                                             ["allow_other", "auto_promote=off"]
                                             + list(options)).start()
        if ctl:  # a read-only store has no control socket
            wfstest.wait_ctl(self.mnt)
        return self

    def log(self):
        return self.mount.log() if self.mount else ""

    def stop(self, tc):
        problems = self.mount.stop()
        self.logs.append(self.mount.log())
        self.mount.cleanup()
        self.mount = None
        tc.assertEqual(problems, [], "stopping the daemon")

    def cleanup(self):
        if self.mount is not None:
            self.mount.stop()
            self.mount.cleanup()
            self.mount = None
        if wfstest.is_mounted(self.mnt):
            subprocess.run(["umount", "-l", self.mnt], capture_output=True)

    def remove(self):
        shutil.rmtree(self.base, ignore_errors=True)

    def promote(self, tc, *names):
        ctl_check(tc, ["promote", "--wait"] + [self.path(n) for n in names])
        for n in names:
            tc.assertEqual(state_of(self.path(n)), "local", n)

    def index(self):
        with open(os.path.join(self.local, "index.json")) as f:
            return json.load(f)

    def record(self, name, index=None):
        for r in (index or self.index())["blobs"]:
            if r.get("key") == self.key(name):
                return r
        raise AssertionError("index.json has no record of %s" % self.key(name))

    def has_record(self, name):
        try:
            return self.record(name)["state"] == "local"
        except (OSError, ValueError, AssertionError):
            return False

    def copy(self, name, index=None):
        x = self.record(name, index)["xxh"]
        return os.path.join(self.local, "data", x[:2], x)

    def files(self):
        return sorted(wfstest.store_files(self.local))


class DamageCase(unittest.TestCase):
    """A fresh Store a test; helpers."""

    def setUp(self):
        self.st = Store()

    def tearDown(self):
        self.st.cleanup()
        self.st.remove()

    # ---- helpers

    def wait_log(self, pattern, timeout=SETTLE):
        rx = re.compile(pattern)
        if not wfstest.wait_until(lambda: rx.search(self.st.log()), timeout):
            self.fail("no log line /%s/ within %d s; log:\n%s" % (pattern, timeout, self.st.log()))
        return rx.search(self.st.log())

    def assert_bytes(self, name, why=""):
        """The bytes through the mount are the NAS's (its pages dropped
        first: a read reaches the daemon, or the file it passes through)."""
        p = self.st.path(name)
        wfstest.drop_pages(p)
        got = wfstest.read_file(p)
        self.assertTrue(got == self.st.data[name], "%s: %d bytes through the mount differ from "
                        "the NAS's %d %s" % (name, len(got), len(self.st.data[name]), why))

    def assert_states(self, want):
        """user.wfs.state of each name, and the repo's state counts in
        wfsctl --json status."""
        got = {n: state_of(self.st.path(n)) for n in want}
        self.assertEqual(got, want)
        rep, _ = wfstest.repo_status(self, self.st.mnt, REPO)
        counts = {}
        for s in want.values():
            counts[s] = counts.get(s, 0) + 1
        self.assertEqual(rep.get("states"), counts, "status --json of %s" % REPO)

    def local_both(self):
        """Both blobs verified local, then the daemon stopped (the index
        written at the stop)."""
        self.st.start()
        self.st.promote(self, BIG, SMALL)
        self.st.stop(self)
        return self.st.index()

    def damaged_index(self, damage, reason):
        idx = self.local_both()
        before = self.st.files()
        self.assertEqual(len(before), 2, "two copies in data/")
        path = os.path.join(self.st.local, "index.json")
        damage(path)
        with open(path, "rb") as f:
            damaged = f.read(4096)
        self.st.start()
        self.wait_log(r"index %s unreadable \(%s\); moved aside to %s\.damaged"
                      % (re.escape(path), reason, re.escape(path)), 0)
        self.assertTrue(os.path.exists(path + ".damaged"), "index.json.damaged")
        with open(path + ".damaged", "rb") as f:
            self.assertEqual(f.read(4096), damaged, "index.json.damaged is the damaged index")
        self.assertEqual(os.stat(path + ".damaged").st_mode & 0o777, 0o600)
        # nothing local, every byte from the NAS; data/ kept, not served
        self.assert_states({BIG: "nas", SMALL: "nas"})
        self.assert_bytes(BIG)
        self.assert_bytes(SMALL)
        self.assertEqual(self.st.files(), before, "data/ after an unreadable index")
        self.st.stop(self)
        # the index written since names nothing, but the damaged one is
        # there: data/ kept (the next start removed every copy for good,
        # before the operator could put the index back)
        self.st.start()
        self.wait_log(r"start-up: %s\.damaged is there: files in data/ and parts/ that the "
                      r"index does not name are kept" % re.escape(path), 0)
        self.assertEqual(self.st.files(), before, "data/ at the next start")
        self.st.stop(self)
        # the operator removes it: what the index does not name goes
        os.unlink(path + ".damaged")
        self.st.start()
        for name in (BIG, SMALL):
            self.wait_log(r"start-up: removed unreferenced copy .*/%s"
                          % os.path.basename(self.st.copy(name, idx)), 0)
        self.assertEqual(self.st.files(), [])
        self.assert_states({BIG: "nas", SMALL: "nas"})
