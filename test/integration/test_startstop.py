#!/usr/bin/env python3
"""How wfs starts and ends, where the caller or the system is unusual:
started with its standard descriptors closed, a start that fails after
the daemon has forked (its threads cannot start), a connection aborted
from outside (fusectl), the caller's -o fsname= and subtype=, and a
MOUNTPOINT inside LOCAL_STORE.  test_cli.py has the ordinary cases."""

import collections
import os
import signal
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402

FIX = wfstest.HubFixture(mount=False)


def setUpModule():
    FIX.setup()


def tearDownModule():
    FIX.teardown()


def pids_cgroup_parent():
    """A directory in which a pids cgroup can be made: cgroup v1's pids
    hierarchy, or the v2 root when it offers the pids controller."""
    if os.path.isfile("/sys/fs/cgroup/pids/cgroup.procs"):
        return "/sys/fs/cgroup/pids"
    try:
        with open("/sys/fs/cgroup/cgroup.subtree_control") as f:
            if "pids" in f.read().split():  # (turned on by the system, not here)
                return "/sys/fs/cgroup"
    except OSError:
        pass
    return None


class StartStop(wfstest.ScratchMounts, unittest.TestCase):
    FIXTURE = FIX

    def stop(self, mnt):
        pids = wfstest.pids_with_arg(mnt)
        self.assertEqual(wfstest.unmount(mnt) + wfstest.stop_daemon(pids, mnt), [])

    # ------------------------------------------------ descriptors 0-2 closed

    def test_started_with_std_fds_closed(self):
        """`wfs ... <&- >&- 2>&-` (a supervisor that closes them): the
        store's lock and the control socket once took descriptor 0, 1 or
        2, which the daemon then pointed at /dev/null -- a second daemon
        mounted the same store, and wfsctl found no one listening."""
        local, mnt, mnt2 = self.path("local"), self.new_mnt(), self.new_mnt("mnt2")
        sh = 'exec "$0" "$@" <&- >&- 2>&-'
        r = subprocess.run(["sh", "-c", sh, wfstest.wfs_bin(), FIX.hub, local, mnt], timeout=20)
        self.assertEqual(r.returncode, 0)
        self.assertTrue(wfstest.is_mounted(mnt))
        rc, out, err = wfstest.run_wfs([FIX.hub, local, mnt2], timeout=20)
        self.assertNotEqual(rc, 0, "a second daemon mounted the same LOCAL_STORE")
        self.assertIn("in use by another wfs daemon", err)
        self.assertFalse(wfstest.is_mounted(mnt2))
        rc, out, err = wfstest.run_wfsctl(["--socket", os.path.join(local, "wfs.sock"), "status"])
        self.assertEqual(rc, 0, "wfsctl status: %s" % err)
        self.stop(mnt)

    def test_foreground_stderr_closed_logs_nowhere_else(self):
        """wfs -f -o log=stderr with stderr closed: its lines go nowhere,
        never into LOCAL_STORE's files (they went into wfs.lock, which
        took descriptor 2)."""
        local, mnt = self.path("local"), self.new_mnt()
        sh = 'exec "$0" "$@" 2>&-'
        p = subprocess.Popen(["sh", "-c", sh, wfstest.wfs_bin(), "-f", "-o", "log=stderr",
                              FIX.hub, local, mnt])
        self.addCleanup(lambda: p.poll() is None and (p.kill(), p.wait()))
        self.assertTrue(wfstest.wait_until(lambda: wfstest.is_mounted(mnt), 10))
        self.assertEqual(sorted(os.listdir(mnt)), FIX.children()[""])
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(wfstest.EXIT_TIMEOUT), 0)
        with open(os.path.join(local, "wfs.lock")) as f:
            self.assertEqual(f.read(), "%d\n" % p.pid)

    # ------------------------------------------------ a start that fails late

    def test_threads_that_cannot_start_fail_the_command(self):
        """A pids limit lets the mount and the fork through but not every
        thread: wfs exited 0 (the caller was let go at the fork) while the
        daemon unmounted and went.  Now exit 0 means a mount that serves,
        and a failure exits 1, names what could not start, and leaves no
        mount.  Tried at several limits: each one must give either."""
        parent = pids_cgroup_parent()
        if parent is None:
            wfstest.skip_or_fail("no pids cgroup controller to limit the daemon's threads")
        cg = os.path.join(parent, "wfs-test-%d" % os.getpid())
        try:
            os.mkdir(cg)
        except OSError as e:
            wfstest.skip_or_fail("cannot make a pids cgroup in %s: %s" % (parent, e))
        self.addCleanup(self.remove_cgroup, cg)
        seen = collections.Counter()
        for limit in (3, 4, 5, 6, 7, 8, 10, 12, 16, 1000):
            with open(os.path.join(cg, "pids.max"), "w") as f:
                f.write(str(limit))
            local, mnt = self.path("local%d" % limit), self.new_mnt("mnt%d" % limit)
            sh = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
            rc, out, err = wfstest.run_captured(
                ["sh", "-c", sh, cg, wfstest.wfs_bin(), "-o", "copy_workers=4",
                 FIX.hub, local, mnt], 30)
            what = "pids.max %d: rc %s, stderr %r" % (limit, rc, err)
            self.assertIn(rc, (0, 1), what)
            if rc == 0:
                self.assertTrue(wfstest.is_mounted(mnt), "exit 0 and no mount: " + what)
                self.assertEqual(sorted(os.listdir(mnt)), FIX.children()[""], what)
                self.stop(mnt)
                seen["mounted"] += 1
            else:
                self.assertFalse(wfstest.is_mounted(mnt), "exit 1 and a mount left: " + what)
                self.assertRegex(err, r"^wfs: ", what)
                seen["late" if "cannot start the" in err else "early"] += 1
            self.assertTrue(wfstest.wait_until(lambda: not wfstest.pids_with_arg(mnt), 10),
                            "a daemon left in the cgroup: " + what)
        self.assertGreater(seen["mounted"], 0, seen)
        self.assertGreater(seen["late"], 0, "no limit made a thread fail after the fork: %s"
                           % seen)

    def remove_cgroup(self, cg):
        """rmdir `cg`, its processes (a daemon a failed check left) killed."""
        with open(os.path.join(cg, "cgroup.procs")) as f:
            pids = [int(p) for p in f.read().split()]
        for p in pids:
            os.kill(p, signal.SIGKILL)
        wfstest.wait_until(lambda: not any(wfstest.pid_alive(p) for p in pids), 10)
        os.rmdir(cg)

    # ------------------------------------------------ aborted from outside

    def test_connection_aborted_from_outside(self):
        """fusectl's abort ends the connection but leaves the mount, which
        answers ENOTCONN and refuses the next wfs there: the daemon, still
        the mount's, unmounts it as it stops (exit 0), and wfs mounts there
        again."""
        ctl = self.path("fusectl")  # its own mount of it: /sys/fs/fuse's is left as it is
        os.mkdir(ctl)
        r = subprocess.run(["mount", "-t", "fusectl", "none", ctl], capture_output=True, text=True)
        if r.returncode != 0:
            wfstest.skip_or_fail("cannot mount fusectl: " + r.stderr.strip())
        self.addCleanup(lambda: subprocess.run(["umount", ctl], capture_output=True))
        local, mnt = self.path("local"), self.new_mnt()
        m = wfstest.ForegroundMount(FIX.hub, local, mnt, []).start()
        self.addCleanup(m.cleanup)
        dev = os.stat(mnt).st_dev  # fusectl names it by the kernel's dev_t
        abort = os.path.join(ctl, str(os.major(dev) << 20 | os.minor(dev)), "abort")
        with open(abort, "w") as f:
            f.write("1")
        self.assertEqual(m.proc.wait(wfstest.EXIT_TIMEOUT), 0, m.log())
        self.assertFalse(wfstest.is_mounted(mnt), "a dead mount left; log:\n" + m.log())
        self.assertIn("aborted from outside", m.log())
        m2 = wfstest.Mount(FIX.hub, local, mnt).start()
        self.assertEqual(sorted(os.listdir(mnt)), FIX.children()[""])
        self.assertEqual(m2.stop(), [])

    # ------------------------------------------------ options and paths

    def test_fsname_and_subtype_of_the_caller(self):
        """-o fsname= and subtype= are passed on to FUSE (wfs --help):
        they were overridden by wfs's own (NAS_HUB, wfs)."""
        local, mnt = self.path("local"), self.new_mnt()
        m = wfstest.Mount(FIX.hub, local, mnt, ["fsname=myhub", "subtype=mine"]).start()
        fields = wfstest.mount_entry(mnt)
        self.assertEqual((fields[0], fields[2]), ("myhub", "fuse.mine"))
        self.assertEqual(sorted(os.listdir(mnt)), FIX.children()[""])
        self.assertEqual(m.stop(), [])

    def test_mountpoint_inside_local_store(self):
        """A mount on LOCAL_STORE/data hid every copy from the daemon (each
        promotion failed EROFS): any MOUNTPOINT inside LOCAL_STORE is
        refused, naming both."""
        local = self.path("local")
        for sub in ("data", "elsewhere"):
            mnt = os.path.join(local, sub)
            os.makedirs(mnt)
            self.addCleanup(lambda mnt=mnt: self.cleanup_mount(mnt))
            rc, out, err = wfstest.run_wfs([FIX.hub, local, mnt], timeout=20)
            self.assertEqual(rc, 1, err)
            self.assertFalse(wfstest.is_mounted(mnt))
            self.assertIn("MOUNTPOINT %s: inside LOCAL_STORE %s" % (mnt, local), err)

    def test_local_store_and_nas_hub_apart(self):
        """A LOCAL_STORE on the NAS was made there, showed in the mount's
        listing, and its "local" copies were the NAS's; a NAS_HUB inside
        LOCAL_STORE would serve the store's own files: both refused, naming
        both, nothing made.  A store not made yet is judged by where its
        existing parent leads: through a symlink into NAS_HUB it is inside."""
        outer = self.path("outer")
        nas = os.path.join(outer, "nas")
        os.makedirs(nas)
        link = os.path.join(outer, "link")
        os.symlink("nas", link)
        store = os.path.join(nas, "store")
        cases = ((store, store, "inside"), (nas, nas, "is"), (outer, outer, "holds"),
                 (os.path.join(link, "store"), store, "inside"),
                 (os.path.join(link, "a", "b"), os.path.join(nas, "a", "b"), "inside"))
        for i, (local, named, how) in enumerate(cases):
            mnt = self.new_mnt("mnt%d" % i)
            rc, out, err = wfstest.run_wfs([nas, local, mnt], timeout=20)
            self.assertEqual(rc, 1, err)
            self.assertFalse(wfstest.is_mounted(mnt))
            self.assertIn("LOCAL_STORE %s: %s NAS_HUB %s" % (named, how, nas), err)
            self.assertEqual(os.listdir(nas), [], "NAS_HUB after the refusal of %s" % local)

    def test_local_store_with_dotdot(self):
        """A ".." after a link is the link target's parent, as the kernel
        makes it: srv/lnk/../store with lnk -> NAS/sub is NAS/store,
        refused (it was taken lexically as srv/store, accepted, and made
        on the NAS).  A ".." after a directory not made yet is refused:
        where it leads is known only once it is made."""
        outer = self.path("outer")
        nas = os.path.join(outer, "nas")
        os.makedirs(os.path.join(nas, "sub"))
        os.makedirs(os.path.join(outer, "srv"))
        os.symlink("../nas/sub", os.path.join(outer, "srv", "lnk"))
        local = os.path.join(outer, "srv", "lnk", "..", "store")
        mnt = self.new_mnt("mnt-dotdot")
        rc, out, err = wfstest.run_wfs([nas, local, mnt], timeout=20)
        self.assertEqual(rc, 1, err)
        self.assertIn("LOCAL_STORE %s: inside NAS_HUB %s" % (os.path.join(nas, "store"), nas),
                      err)
        local = os.path.join(outer, "new", "..", "store")
        rc, out, err = wfstest.run_wfs([nas, local, mnt], timeout=20)
        self.assertEqual(rc, 1, err)
        self.assertIn('LOCAL_STORE %s: ".." after a directory that does not exist yet' % local,
                      err)
        self.assertFalse(wfstest.is_mounted(mnt))
        self.assertEqual(sorted(os.listdir(nas)), ["sub"], "NAS_HUB after the refusals")
        self.assertEqual(sorted(os.listdir(outer)), ["nas", "srv"], "made beside NAS_HUB")

    def test_local_store_of_another_user(self):
        """A store another user owns is one that user can change under the
        daemon (its copies, or its socket swapped for a link the daemon's
        chmod followed): refused, naming the owner; nothing mounted or
        made in it.  A parent others may write is said, not refused."""
        local = self.path("theirs")
        os.mkdir(local)
        os.chown(local, wfstest.NOBODY, wfstest.NOBODY)
        mnt = self.new_mnt("mnt-theirs")
        rc, out, err = wfstest.run_wfs([FIX.hub, local, mnt], timeout=20)
        self.assertEqual(rc, 1, err)
        self.assertFalse(wfstest.is_mounted(mnt))
        self.assertIn("LOCAL_STORE %s: owned by uid %d" % (local, wfstest.NOBODY), err)
        self.assertEqual(os.listdir(local), [], "the refused store")
        shared = self.path("shared")
        os.mkdir(shared)
        os.chmod(shared, 0o777)
        local = os.path.join(shared, "store")
        mnt = self.new_mnt("mnt-shared")
        rc, out, err = wfstest.run_wfs([FIX.hub, local, mnt], timeout=20)
        self.assertEqual(rc, 0, err)
        self.assertTrue(wfstest.is_mounted(mnt))
        self.assertIn("its parent %s (uid 0, mode 0777) may be written by another user"
                      % shared, err)


if __name__ == "__main__":
    wfstest.main()
