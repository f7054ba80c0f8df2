#!/usr/bin/env python3
"""The NAS not mounted: NAS_HUB is its mount point, an empty directory
(faultfs, test/faultfs, stopped and unmounted -- a node booted with wfs
started before the NFS mount, or an `umount -l` of a hung NAS).  Every
source then looks "gone"; that is no proof the files were deleted.

  start_over_empty_mount_point  wfs started over the empty NAS_HUB with a
                    record of it in LOCAL_STORE: it mounts as with the NAS
                    down (status says why), the verified copies are kept
                    (the same files in LOCAL_STORE/data) and serve the
                    local revision; once the NAS is mounted again it is up
                    and the copies are still local, not copied again
  unmounted_under_the_daemon  the NAS unmounted under a running daemon:
                    opens of the local files read their bytes (the NAS is
                    marked down, not every file taken as deleted), the
                    copies are kept; the NAS back: up, the copies local
  other_repo_unmounted_under_the_daemon  a repo the record does not
                    hold, looked up then: EIO (the NAS marked down), not
                    ENOENT; the NAS back: ENOENT again
  listing_unmounted_under_the_daemon  the hub listed then shows the
                    record's repos (the NAS marked down), not an empty hub
  start_with_root_unmounted  a further root (-o root=DIR) holding the
                    repo's blobs, not mounted at a start: every link into
                    it dangles while NAS_HUB answers; the local files
                    still read their bytes (the record answers for them,
                    and keeps its last build), the copies are kept, the
                    root back: the same copies serve

Waits are on the daemon's reported state (stats) and faultfs's mount,
never sleeps; every mount is taken off in the cleanups, failed or not.
"""

import errno
import hashlib
import os
import shutil
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultnas  # noqa: E402
import wfstest  # noqa: E402
from wfstest import ctl_check, state_of  # noqa: E402

MiB = 1 << 20
REPO = "models--acme--gone"
FILES = {"model.safetensors": wfstest.det_bytes("gone-model", 3 * MiB),
         "config.json": b'{"model_type": "gone"}\n',
         "extra.bin": wfstest.det_bytes("gone-extra", MiB)}   # never promoted
LOCAL = ("model.safetensors", "config.json")
NAS_TIMEOUT_MS = 500
DOWN_WAIT = 5       # s: nas_timeout + slack
UP_WAIT = 15        # s: the prober backs off to 2 s between looks


class Hub:
    base = hub = rev = None


def setUpModule():
    faultnas.require_faultfs()
    wfstest.require_wfsctl()
    Hub.base = wfstest.make_base("wfs-it-nasgone-")
    Hub.hub = os.path.join(Hub.base, "hub")
    Hub.rev = wfstest.make_hf_repo(Hub.hub, REPO, FILES)


def tearDownModule():
    if Hub.base:
        shutil.rmtree(Hub.base, ignore_errors=True)


class Mounted(unittest.TestCase):
    """wfs -f over self.nas_dir (with self.options), its control socket
    waited for; self.rev's files by name."""

    options = ()

    def start_wfs(self):
        self.m = wfstest.ForegroundMount(self.nas_dir, self.local, self.mnt,
                                         ["auto_promote=off", "nas_timeout=%d" % NAS_TIMEOUT_MS]
                                         + list(self.options))
        self.m.start()
        wfstest.wait_until(lambda: os.path.exists(self.sock), 10)

    def stop_wfs(self):
        if self.m:
            m, self.m = self.m, None
            problems = m.stop()
            m.cleanup()
            if problems:
                raise AssertionError("wfs: " + "; ".join(problems))

    def p(self, name):
        return os.path.join(self.mnt, REPO, "snapshots", self.rev, name)

    def start_over(self, hub, d):
        """faultfs over @hub, LOCAL_STORE and the mount point, all in the
        directory @d, and wfs started; each taken down at the cleanup."""
        self.nas = faultnas.FaultNAS(hub, os.path.join(d, "nas"), os.path.join(d, "ff.sock"))
        self.nas_dir = self.nas.mnt
        self.nas.start()
        self.addCleanup(self.stop_nas)
        self.local = os.path.join(d, "local")
        self.mnt = os.path.join(d, "mnt")
        os.mkdir(self.mnt)
        self.sock = os.path.join(os.path.realpath(self.local), "wfs.sock")
        self.m = None
        self.start_wfs()
        self.addCleanup(self.stop_wfs)

    def stop_nas(self):
        problems = self.nas.stop()
        if problems:
            raise AssertionError("faultfs: " + "; ".join(problems))


class NasGone(Mounted):
    def setUp(self):
        d = os.path.join(Hub.base, self.id().rsplit(".", 1)[-1])
        os.mkdir(d)
        self.rev = Hub.rev
        self.start_over(Hub.hub, d)

    def promote(self):
        ctl_check(self, ["--socket", self.sock, "promote", "--wait"] + [self.p(n) for n in LOCAL])
        for n in LOCAL:
            self.assertEqual(state_of(self.p(n)), "local", n)
        copies = wfstest.store_files(self.local)
        self.assertEqual(len(copies), len(LOCAL), "LOCAL_STORE/data: %s" % sorted(copies))
        return {rel: st.st_ino for rel, st in copies.items()}

    def unmount_nas(self):
        """faultfs stopped and unmounted: NAS_HUB is the empty mount point."""
        problems = self.nas.stop()
        self.assertEqual(problems, [], "faultfs stop")
        self.assertEqual(os.listdir(self.nas.mnt), [], "the NAS's mount point is not empty")

    def assert_copies_kept(self, before, when):
        now = {rel: st.st_ino for rel, st in wfstest.store_files(self.local).items()}
        self.assertEqual(now, before, "%s: the verified copies in LOCAL_STORE/data changed "
                         "(deleted or made again); the daemon's log ends:\n%s"
                         % (when, self.m.log()[-3000:] if self.m else ""))

    def assert_local_reads(self, when):
        for n in LOCAL:
            with open(self.p(n), "rb") as f:
                got = f.read()
            self.assertEqual(hashlib.sha256(got).digest(), hashlib.sha256(FILES[n]).digest(),
                             "%s: %s reads wrong bytes" % (when, n))
            self.assertEqual(state_of(self.p(n)), "local", "%s: %s" % (when, n))

    def nas_back(self, copies):
        self.nas.start()
        faultnas.wait_nas_state(self, self.sock, "up", UP_WAIT)
        self.assert_local_reads("the NAS mounted again")
        self.assert_copies_kept(copies, "the NAS mounted again")

    def test_start_over_empty_mount_point(self):
        copies = self.promote()
        self.stop_wfs()
        self.unmount_nas()
        self.start_wfs()
        self.assert_copies_kept(copies, "wfs started over the empty NAS_HUB")
        nas = faultnas.nas_of_stats(self, self.sock)
        self.assertEqual(nas["state"], "down", "wfs started over the empty NAS_HUB: %s" % nas)
        self.assertIn("empty", nas["reason"])
        self.assert_local_reads("wfs started over the empty NAS_HUB")
        self.assertEqual(wfstest.errno_of(wfstest.read_file, self.p("extra.bin")), errno.EIO,
                         "a file not local while the NAS is not mounted")
        self.nas_back(copies)

    def test_unmounted_under_the_daemon(self):
        copies = self.promote()
        self.unmount_nas()
        # opens of the local files the kernel holds: the NAS says each is
        # gone, as it says of everything
        self.assert_local_reads("the NAS unmounted under the daemon")
        nas = faultnas.wait_nas_state(self, self.sock, "down", DOWN_WAIT)
        self.assertIn("empty", nas["reason"])
        self.assert_copies_kept(copies, "the NAS unmounted under the daemon")
        self.nas_back(copies)

    def test_other_repo_unmounted_under_the_daemon(self):
        """A repo the record does not hold, looked up as the NAS is
        unmounted: EIO (the NAS is down), not ENOENT -- which the kernel
        caches, and which tells a client the repo was deleted."""
        self.promote()
        other = os.path.join(self.mnt, "models--acme--other")
        self.assertEqual(wfstest.errno_of(os.stat, other), errno.ENOENT, "the NAS up")
        self.unmount_nas()
        self.assertEqual(wfstest.errno_of(os.stat, other + "2"), errno.EIO,
                         "a repo not in the record, the NAS not mounted")
        nas = faultnas.nas_of_stats(self, self.sock)
        self.assertEqual(nas["state"], "down", nas)
        self.nas.start()
        faultnas.wait_nas_state(self, self.sock, "up", UP_WAIT)
        self.assertEqual(wfstest.errno_of(os.stat, other + "3"), errno.ENOENT, "the NAS back")

    def test_listing_unmounted_under_the_daemon(self):
        self.promote()
        self.unmount_nas()
        # (nothing listed the hub before: the kernel has no listing of it)
        self.assertEqual(os.listdir(self.mnt), [REPO], "the hub's listing, the NAS not mounted")
        nas = faultnas.nas_of_stats(self, self.sock)
        self.assertEqual(nas["state"], "down", nas)
        self.assertEqual(sorted(os.listdir(os.path.dirname(self.p("x")))), sorted(LOCAL),
                         "the revision's listing, the NAS not mounted")
        self.nas.start()
        faultnas.wait_nas_state(self, self.sock, "up", UP_WAIT)


class FurtherRootGone(Mounted):
    """The repo's blobs are links into a further root (-o root=DIR, a
    filesystem of its own: faultfs here), and that root is not mounted
    when wfs starts (its empty mount point seen): every such link dangles
    on the NAS, while NAS_HUB answers.  The local copies keep serving --
    the record answers for the names it has, as for a NAS that is down --
    and a file not local is shown as the NAS shows it."""

    def setUp(self):
        d = os.path.join(Hub.base, self.id().rsplit(".", 1)[-1])
        os.mkdir(d)
        self.hub, src = os.path.join(d, "hub"), os.path.join(d, "store-src")
        self.root = faultnas.FaultNAS(src, os.path.join(d, "store"), os.path.join(d, "ff.sock"))
        self.rev = wfstest.make_hf_repo(self.hub, REPO, FILES)
        self.nas_dir, self.options = self.hub, ("root=" + self.root.mnt,)
        blobs = os.path.join(self.hub, REPO, "blobs")
        os.mkdir(src)
        for sha in os.listdir(blobs):
            shutil.move(os.path.join(blobs, sha), os.path.join(src, sha))
            os.symlink(os.path.join(self.root.mnt, sha), os.path.join(blobs, sha))
        self.root.start()
        self.addCleanup(self.root.stop)
        self.local, self.mnt = os.path.join(d, "local"), os.path.join(d, "mnt")
        os.mkdir(self.mnt)
        self.sock = os.path.join(os.path.realpath(self.local), "wfs.sock")
        self.m = None

    def test_start_with_root_unmounted(self):
        self.start_wfs()
        self.addCleanup(self.stop_wfs)
        ctl_check(self, ["--socket", self.sock, "promote", "--wait"] + [self.p(n) for n in LOCAL])
        copies = {rel: st.st_ino for rel, st in wfstest.store_files(self.local).items()}
        self.assertEqual(len(copies), len(LOCAL), "LOCAL_STORE/data: %s" % sorted(copies))
        self.stop_wfs()
        self.assertEqual(self.root.stop(), [], "faultfs stop")
        self.assertEqual(os.listdir(self.root.mnt), [], "the root's mount point is not empty")
        self.start_wfs()  # a new mount: the kernel holds no name of it
        for n in LOCAL:
            self.assertEqual(os.stat(self.p(n)).st_size, len(FILES[n]), n)
            with open(self.p(n), "rb") as f:
                got = f.read()
            self.assertEqual(hashlib.sha256(got).digest(), hashlib.sha256(FILES[n]).digest(),
                             "%s reads wrong bytes, its root not mounted; the daemon's log "
                             "ends:\n%s" % (n, self.m.log()[-3000:]))
            self.assertEqual(state_of(self.p(n)), "local", n)
        extra = hashlib.sha256(FILES["extra.bin"]).hexdigest()
        self.assertEqual(wfstest.errno_of(wfstest.read_file, self.p("extra.bin")), errno.ENOENT,
                         "a file not local, its root not mounted: the NAS's dangling link")
        self.assertTrue(os.path.islink(os.path.join(self.mnt, REPO, "blobs", extra)))
        now = {rel: st.st_ino for rel, st in wfstest.store_files(self.local).items()}
        self.assertEqual(now, copies, "the verified copies in LOCAL_STORE/data changed")
        nas = faultnas.nas_of_stats(self, self.sock)
        self.assertEqual(nas["state"], "up", "NAS_HUB answers: %s" % nas)
        # the root mounted again: the same copies serve, nothing copied again
        self.root.start()
        rep = wfstest.ctl_request(self.sock, {"op": "sync"}, timeout=30)
        self.assertTrue(rep and rep.get("ok"), "sync, the root back: %s" % rep)
        for n in LOCAL:
            self.assertEqual(wfstest.read_file(self.p(n)), FILES[n], "the root back: %s" % n)
            self.assertEqual(state_of(self.p(n)), "local", "the root back: %s" % n)
        now = {rel: st.st_ino for rel, st in wfstest.store_files(self.local).items()}
        self.assertEqual(now, copies, "the root back: the copies in LOCAL_STORE/data changed")
        log = self.m.log()
        for word in ("vanished", "demoted", "evicted"):
            self.assertNotIn(word, log, "the daemon's log:\n" + log)
        self.assertIn("the record keeps its last build", log)
        self.assertIn("record: built again", log)

if __name__ == "__main__":
    wfstest.main()
