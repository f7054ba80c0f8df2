#!/usr/bin/env python3
"""The wfs command line: refusals of bad command lines (non-zero exit, the
offending path on stderr, no mount left), --help/--version, readiness on
return, a NAS revision appearing without remount, and a clean unmount;
`wfsctl evict --force` of a pinned file whose copy is in flight leaves it
unpinned on the NAS, as the command says."""

import collections
import ctypes
import errno
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402

FIX = wfstest.HubFixture(mount=False)


def setUpModule():
    FIX.setup()


def tearDownModule():
    FIX.teardown()


def mountinfo_path(field):
    """A path field of /proc/self/mountinfo or /proc/self/mounts as the
    path it is (space, tab, newline and backslash are octal escapes)."""
    return re.sub(r"\\([0-3][0-7][0-7])", lambda m: chr(int(m.group(1), 8)), field)


def proc_field(pid, name, tid=None):
    """A field of /proc/PID/status (or of its thread TID's), as text."""
    path = "/proc/%d/status" % pid if tid is None else "/proc/%d/task/%d/status" % (pid, tid)
    with open(path) as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    raise KeyError(name)


def sig_bit(mask, sig):
    """Is signal `sig` in a /proc signal mask (hex, bit sig-1)?"""
    return bool(int(mask, 16) >> (sig - 1) & 1)


def threads_taking(pid, sig):
    """'name: tid' of each thread of pid but the main one not blocking sig."""
    out = []
    for tid in sorted(int(t) for t in os.listdir("/proc/%d/task" % pid)):
        try:
            if tid != pid and not sig_bit(proc_field(pid, "SigBlk", tid), sig):
                out.append("%s: %d" % (proc_field(pid, "Name", tid), tid))
        except (OSError, KeyError):
            pass  # the thread ended meanwhile
    return out


class HeldThread:
    """Hold one thread of another process in a ptrace stop (PTRACE_SEIZE,
    PTRACE_INTERRUPT) for the with-block; let it go (PTRACE_DETACH) after.
    The test is skipped where ptrace is refused (a container's profile)."""

    SEIZE, INTERRUPT, DETACH, WALL = 0x4206, 0x4207, 17, 0x40000000

    def __init__(self, test, tid):
        self.test, self.tid = test, tid
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p,
                                     ctypes.c_void_p]

    def call(self, req):
        if self.libc.ptrace(req, self.tid, None, None) != 0:
            e = ctypes.get_errno()
            raise OSError(e, "ptrace(%#x, %d): %s" % (req, self.tid, os.strerror(e)))

    def __enter__(self):
        try:
            self.call(self.SEIZE)
        except OSError as e:
            if e.errno == errno.EPERM:
                wfstest.skip_or_fail(str(e))
            raise
        self.call(self.INTERRUPT)
        os.waitpid(self.tid, self.WALL)  # the stop
        return self

    def __exit__(self, *exc):
        self.call(self.DETACH)


class Cli(wfstest.ScratchMounts, unittest.TestCase):
    FIXTURE = FIX

    def start(self, local, mnt, options=()):
        m = wfstest.Mount(FIX.hub, local, mnt, options)
        self.addCleanup(lambda: self.cleanup_mount(mnt))
        return m.start()

    def expect_refusal(self, args, offending, mnt=None):
        before = collections.Counter(wfstest.mount_lines())
        rc, out, err = wfstest.run_wfs(args, timeout=20)
        new = list((collections.Counter(wfstest.mount_lines()) - before).elements())
        # other processes on this machine may mount meanwhile: only mounts of
        # this command's own paths count
        new = [l for l in new if any(a in l for a in args if a.startswith("/"))]
        if mnt is not None:
            self.cleanup_mount(mnt)
        cmd = "wfs " + " ".join(args)
        self.assertIsNotNone(rc, "%s did not return within 20 s" % cmd)
        self.assertNotEqual(rc, 0, "%s exited 0 (stdout %r, stderr %r)" % (cmd, out, err))
        self.assertEqual(new, [], "%s left new mount entries" % cmd)
        self.assertTrue(err.strip(), "%s: nothing on stderr" % cmd)
        if offending is not None:
            self.assertIn(offending, err, "%s: stderr does not name %s:\n%s" % (cmd, offending, err))
        return err

    # ------------------------------------------------------------ refusals

    def test_no_args(self):
        self.expect_refusal([], None)

    def test_two_args(self):
        self.expect_refusal([FIX.hub, self.path("local")], None)

    def test_nas_missing(self):
        nas = self.path("no-such-hub")
        mnt = self.new_mnt()
        self.expect_refusal([nas, self.path("local"), mnt], nas, mnt)

    def test_nas_is_a_file(self):
        nas = self.path("hub-file")
        open(nas, "w").close()
        mnt = self.new_mnt()
        err = self.expect_refusal([nas, self.path("local"), mnt], nas, mnt)
        # the reason, not root's EACCES from access(X_OK) on a file
        self.assertIn("not a directory", err)

    def test_mountpoint_missing(self):
        mnt = self.path("no-such-mnt")
        self.expect_refusal([FIX.hub, self.path("local"), mnt], mnt, mnt)
        self.assertFalse(os.path.lexists(mnt), "wfs created the missing mount point")

    def test_mountpoint_is_a_file(self):
        mnt = self.path("mnt-file")
        open(mnt, "w").close()
        self.expect_refusal([FIX.hub, self.path("local"), mnt], mnt, mnt)

    def test_mountpoint_already_mounted(self):
        mnt = self.new_mnt()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "wfs-test-tmpfs", mnt],
                           capture_output=True, text=True)
        if r.returncode != 0:
            wfstest.skip_or_fail("cannot mount a tmpfs: " + r.stderr.strip())
        self.addCleanup(lambda: subprocess.run(["umount", mnt], capture_output=True))
        before = wfstest.mount_points().count(mnt)
        rc, out, err = wfstest.run_wfs([FIX.hub, self.path("local"), mnt], timeout=20)
        entries = wfstest.mount_points().count(mnt)
        fs = wfstest.mount_entry(mnt)
        if entries > before:  # a FUSE mount stacked on the tmpfs: take it off first
            pids = wfstest.pids_with_arg(mnt)
            subprocess.run(["umount", mnt], capture_output=True)
            wfstest.stop_daemon(pids, mnt)
        self.assertIsNotNone(rc, "wfs did not return within 20 s")
        self.assertNotEqual(rc, 0, "wfs mounted over an existing mount (stderr %r)" % err)
        self.assertEqual(entries, before, "a new mount was stacked on %s: %s" % (mnt, fs))
        self.assertEqual(fs[2], "tmpfs")
        self.assertIn(mnt, err, "stderr does not name the mount point:\n" + err)

    def test_mountpoint_over_nas_hub(self):
        """A mount on NAS_HUB (the engine's cache path, say), above it or
        in it would read the NAS through itself: it once came up and gave
        EIO for everything.  Refused, naming both paths."""
        hub = os.path.realpath(FIX.hub)
        inside = os.path.join(hub, "models--acme--standard", "snapshots")
        for mnt in (hub, os.path.dirname(hub), inside):
            err = self.expect_refusal([FIX.hub, self.path("local"), mnt], mnt, mnt)
            self.assertIn("NAS_HUB " + hub, err)
            self.assertFalse(os.path.exists(self.path("local")), "LOCAL_STORE created")

    def test_local_store_inside_mountpoint(self):
        mnt = self.new_mnt()
        for local in (os.path.join(mnt, "store"), mnt):
            err = self.expect_refusal([FIX.hub, local, mnt], local, mnt)
            self.assertIn("MOUNTPOINT " + mnt, err)
        self.assertEqual(os.listdir(mnt), [], "LOCAL_STORE created under the mount point")

    def test_mountpoint_dead_mount(self):
        """wfs again on a mount whose daemon died (ENOTCONN): refused, and
        the message says what to do."""
        local, mnt = self.path("local"), self.new_mnt()
        m = self.start(local, mnt)
        wfstest.kill_daemon(self, m.pids)
        self.addCleanup(lambda: wfstest.drop_dead_mount(self, mnt))

        def dead():
            try:
                os.stat(mnt)
            except OSError as e:
                return e.errno == errno.ENOTCONN
            return False
        # (until then the kernel answers from the attributes it holds)
        self.assertTrue(wfstest.wait_until(dead, 10), "the dead mount never said ENOTCONN")
        rc, out, err = wfstest.run_wfs([FIX.hub, local, mnt], timeout=20)
        self.assertEqual(rc, 1, "wfs on a dead mount: %s%s" % (out, err))
        self.assertIn("MOUNTPOINT " + mnt, err)
        self.assertIn("unmount it first", err)

    def test_local_store_not_creatable(self):
        blocker = self.path("a-file")
        open(blocker, "w").close()
        local = os.path.join(blocker, "local")
        mnt = self.new_mnt()
        self.expect_refusal([FIX.hub, local, mnt], local, mnt)

    def test_second_daemon_same_local_store(self):
        local = self.path("local")
        mnt1, mnt2 = self.new_mnt("mnt1"), self.new_mnt("mnt2")
        m1 = self.start(local, mnt1)
        self.expect_refusal([FIX.hub, local, mnt2], local, mnt2)
        # the first daemon keeps serving
        e = next(e for e in FIX.entries if e["type"] == "file")
        data = wfstest.read_file(os.path.join(mnt1, e["path"]))
        self.assertEqual(hashlib.sha256(data).hexdigest(), e["sha256"], "first mount broken by the attempt")
        self.assertEqual(m1.stop(), [])

    # ------------------------------------------------------------ -o values

    # (option, what is wrong with it): each must be refused with exit status
    # 2, the option named on stderr, before anything is created or mounted
    BAD_VALUES = [
        ("readahead_kb=abc", "not a number"),
        ("readahead_kb=4096x", "trailing junk"),
        ("max_threads=16x", "trailing junk"),
        ("metrics_interval=15s", "trailing unit"),
        ("max_threads= 4", "leading space"),
        ("readahead_kb=-1", "a sign"),
        ("readahead_kb=0x10", "hex"),
        ("readahead_kb=2000000", "above range"),
        ("readahead_kb=99999999999999999999999", "overflows"),
        ("max_threads=0", "below range"),
        ("max_threads=1025", "more OPENs in flight than passthrough can track"),
        ("copy_workers=65", "above range"),
        ("metrics_interval=0", "below range"),
        ("auto_opens=three", "not a number"),
        ("entry_timeout=abc", "not a number"),
        ("attr_timeout=1s", "trailing junk"),
        ("entry_timeout=1e3", "exponent"),
        ("negative_timeout=inf", "not a number"),
        ("blob_timeout=-1", "a sign"),
        ("blob_timeout=1.2.3", "two dots"),
        ("ref_poll=0", "below range"),
        ("promote_mbps=fast", "not a number"),
        ("auto_mbps=-3", "a sign"),
        ("store_max=10X", "bad suffix"),
        ("store_max=1.5", "a fraction of a byte"),
        ("auto_bytes=1MM", "trailing junk"),
        ("min_free=100%", "above range"),
        ("min_free=x%", "not a number"),
        ("passthrough=maybe", "bad boolean"),
        ("passthrough=ON", "booleans are lower case"),
        ("auto_promote=enabled", "bad boolean"),
        ("auto_siblings=2", "bad boolean"),
        ("readahead_kb=", "empty value"),
        ("passthrough=", "empty value"),
        ("auto_promote=", "empty value"),
        ("store_max=", "empty value"),
        ("exclude=", "empty value"),
        ("readahead_kb", "no value"),
        ("log=file", "not a log target"),
        ("metrics_file=relative/wfs.prom", "not absolute"),
        ("exclude_from=/nonexistent/globs", "missing file"),
    ]

    def mounted_at(self, path):
        """Mount entries at `path` in /proc/self/mountinfo (field 5)."""
        path = os.path.realpath(path)
        unescape = lambda s: re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)  # noqa: E731
        with open("/proc/self/mountinfo") as f:
            return [l for l in f.read().splitlines()
                    if len(l.split(" ")) > 4 and unescape(l.split(" ")[4]) == path]

    def test_bad_option_values(self):
        mnt = self.new_mnt()
        for opt, why in self.BAD_VALUES:
            with self.subTest(opt=opt, why=why):
                local = self.path("local-" + re.sub(r"[^a-z0-9]+", "_", opt))
                args = ["-o", opt, FIX.hub, local, mnt]
                rc, out, err = wfstest.run_wfs(args, timeout=20)
                if self.mounted_at(mnt):
                    self.cleanup_mount(mnt)
                    self.fail("wfs %s (%s) left a mount" % (" ".join(args), why))
                self.assertEqual(rc, 2, "wfs -o %s (%s): exit status %s, stderr %r" % (opt, why, rc, err))
                name = opt.split("=", 1)[0]
                self.assertIn("wfs: -o " + name, err,
                              "wfs -o %s (%s): stderr does not name the option: %r" % (opt, why, err))
                self.assertFalse(os.path.exists(local),
                                 "wfs -o %s (%s) created LOCAL_STORE before refusing" % (opt, why))
                self.assertEqual(out, "", "wfs -o %s: stdout %r" % (opt, out))

    def test_bad_option_value_says_what_it_expects(self):
        rc, out, err = wfstest.run_wfs(["-o", "readahead_kb=abc", FIX.hub, self.path("local"),
                                        self.new_mnt()], timeout=20)
        self.assertEqual(rc, 2)
        self.assertIn("wfs: -o readahead_kb=abc: expects a whole number of KiB (0-1048576)", err)

    # option sets that must mount: every boolean spelling (on/off, yes/no,
    # true/false, 1/0, the bare name), sizes with suffixes, decimals, and
    # the fstab words mount(8) passes along with FUSE options
    GOOD_VALUES = [
        ["passthrough=on", "auto_promote=off", "auto_siblings=yes"],
        ["passthrough=no", "auto_promote=true", "auto_siblings=false"],
        ["passthrough=1", "auto_promote=0", "auto_siblings"],
        ["store_max=2GiB", "auto_bytes=1.5M", "min_free=512m", "readahead_kb=8192",
         "entry_timeout=0.5", "blob_timeout=120", "promote_mbps=2.5", "auto_mbps=100",
         "max_threads=8", "auto_opens=0", "ref_poll=.5", "exclude=*.gguf"],
        ["min_free=5%", "store_max=1T", "auto_bytes=4096"],
        ["defaults", "rw", "_netdev", "nofail", "x-systemd.automount", "comment=x", "nodev", "nosuid"],
    ]

    def test_good_option_values(self):
        mnt = self.new_mnt()
        for i, opts in enumerate(self.GOOD_VALUES):
            with self.subTest(opts=",".join(opts)):
                m = self.start(self.path("local%d" % i), mnt, opts)
                self.assertEqual(sorted(os.listdir(mnt)), FIX.children()[""])
                if "nosuid" in opts:
                    mopts = self.mounted_at(mnt)[0].split(" ")[5].split(",")
                    self.assertIn("nosuid", mopts, "FUSE option nosuid not passed on")
                    self.assertIn("nodev", mopts, "FUSE option nodev not passed on")
                self.assertEqual(m.stop(), [])

    # ------------------------------------------------------------ help / version

    def _info(self, flag):
        rc, out, err = wfstest.run_wfs([flag], timeout=10)
        self.assertEqual(rc, 0, "wfs %s exited %s (stderr %r)" % (flag, rc, err))
        self.assertTrue(out.strip(), "wfs %s printed nothing on stdout (stderr %r)" % (flag, err))
        return out

    def test_help(self):
        out = self._info("--help")
        self.assertRegex(out, r"(?i)usage", "--help output has no usage line")

    def test_version(self):
        out = self._info("--version")
        self.assertRegex(out, r"\d", "--version output has no version number")

    # ------------------------------------------------------------ mounting

    def test_ready_when_wfs_returns(self):
        mnt = self.new_mnt()
        m = self.start(self.path("local"), mnt)
        self.assertTrue(m.ready_on_return, "wfs exited 0 before %s appeared in /proc/self/mounts" % mnt)
        self.assertEqual(wfstest.mount_entry(mnt)[2].split(".")[0], "fuse")
        self.assertEqual(sorted(os.listdir(mnt)), FIX.children()[""])
        self.assertEqual(m.stop(), [])

    def test_caller_pipes_closed(self):
        # `out=$(wfs ...)`, subprocess.run(capture_output=True), a systemd
        # Type=forking unit: all wait for EOF; the daemon must not keep the
        # caller's stdout/stderr open
        mnt = self.new_mnt()
        self.addCleanup(lambda: self.cleanup_mount(mnt))
        try:
            r = subprocess.run([wfstest.wfs_bin(), FIX.hub, self.path("local"), mnt],
                               capture_output=True, timeout=20)
        except subprocess.TimeoutExpired:
            self.fail("wfs with piped stdout/stderr: no EOF within 20 s (daemon holds the caller's pipes)")
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_a_name_looked_up_before_it_existed_appears(self):
        """An engine that looked for a ref before its download ended: the
        kernel holds "no such name" for negative_timeout (1 s), no longer,
        though nothing lists the directory (a listing would refresh it)."""
        repo = next(e["path"].split("/refs/")[0] for e in FIX.entries
                    if e["type"] == "file" and e["path"].endswith("/refs/main"))
        mnt = self.new_mnt()
        self.start(self.path("local"), mnt)
        name = "refs/late-%d" % random.randrange(1 << 30)
        rel, nas = os.path.join(mnt, repo, name), os.path.join(FIX.hub, repo, name)
        self.assertEqual(wfstest.errno_of(os.stat, rel), errno.ENOENT)
        with open(nas, "w") as f:
            f.write("0" * 40)
        self.addCleanup(os.unlink, nas)
        t0 = time.monotonic()
        # The promise is a bound, not a speed: 15 s is negative_timeout
        # with room for a loaded machine.
        seen = wfstest.wait_until(lambda: wfstest.errno_of(os.stat, rel) is None, 15)
        self.assertTrue(seen, "%s still ENOENT 15 s after the NAS made it" % rel)
        print("\n  visible %.2f s after the NAS made it" % (time.monotonic() - t0), file=sys.stderr)

    def test_new_revision_appears(self):
        refs = [e for e in FIX.entries if e["type"] == "file" and e["path"].endswith("/refs/main")]
        self.assertTrue(refs, "no <repo>/refs/main in the manifest")
        repo = refs[0]["path"].split("/refs/")[0]
        blob = next(e for e in FIX.entries if e["type"] == "file" and "blob_id" in e
                    and e["path"].startswith(repo + "/blobs/"))
        mnt = self.new_mnt()
        self.start(self.path("local"), mnt)
        m = lambda rel: os.path.join(mnt, repo, rel)  # noqa: E731
        n = lambda rel: os.path.join(FIX.hub, repo, rel)  # noqa: E731

        # what an engine did before: read the ref, list the snapshots
        with open(m("refs/main"), "rb") as f:
            old = f.read()
        with open(n("refs/main"), "rb") as f:
            self.assertEqual(old, f.read())
        before = os.listdir(m("snapshots"))

        commit = hashlib.sha1(random.randbytes(16)).hexdigest()
        os.mkdir(n("snapshots/" + commit))
        os.mkdir(n("snapshots/%s/sub" % commit))
        os.symlink("../../blobs/" + blob["blob_id"], n("snapshots/%s/added.bin" % commit))
        os.symlink("../../../blobs/" + blob["blob_id"], n("snapshots/%s/sub/added.bin" % commit))
        with open(n("refs/main"), "w") as f:  # in place, as huggingface_hub writes it
            f.write(commit)
        t0 = time.monotonic()

        def ok_list():
            try:
                return commit in os.listdir(m("snapshots"))
            except OSError:
                return False

        def ok_link():
            try:
                return (os.readlink(m("snapshots/%s/added.bin" % commit)) == "../../blobs/" + blob["blob_id"]
                        and os.readlink(m("snapshots/%s/sub/added.bin" % commit))
                        == "../../../blobs/" + blob["blob_id"])
            except OSError:
                return False

        def ok_bytes():
            try:
                d = wfstest.read_file(m("snapshots/%s/sub/added.bin" % commit))
            except OSError:
                return False
            return hashlib.sha256(d).hexdigest() == blob["sha256"]

        def ok_ref():
            try:
                with open(m("refs/main"), "rb") as f:
                    return f.read() == commit.encode()
            except OSError:
                return False

        checks = {"snapshots/ lists the new commit": ok_list, "new links read back": ok_link,
                  "new link gives the blob bytes": ok_bytes, "refs/main reads the new commit": ok_ref}
        # The promise is a bound, not a speed: the cache timeouts (1 s by
        # default) pass, then the NAS is asked again.  15 s is that bound
        # with room for a loaded machine.
        seen = {}
        while time.monotonic() - t0 < 15.0 and len(seen) < len(checks):
            for name, fn in checks.items():
                if name not in seen and fn():
                    seen[name] = time.monotonic() - t0
            time.sleep(0.05)
        late = [name for name in checks if name not in seen]
        self.assertEqual(late, [], "not visible within 15 s of the NAS change (visible: %s; old ref %r; "
                         "snapshots before: %s)" % ({k: round(v, 2) for k, v in seen.items()}, old, before))

    def test_readahead_raised(self):
        """-o readahead_kb= reaches the mount's bdi once INIT is answered,
        also on a mount point whose name mountinfo escapes (a space)."""
        for name in ("mnt", "mnt point"):
            with self.subTest(mount_point=name):
                self.readahead_raised(self.new_mnt(name))

    def readahead_raised(self, mnt):
        self.start(self.path("local-" + os.path.basename(mnt).replace(" ", "_")), mnt,
                   ["readahead_kb=4096"])

        def bdi():
            with open("/proc/self/mountinfo") as f:
                lines = [l for l in f if mountinfo_path(l.split(" ")[4]) == os.path.realpath(mnt)]
            return lines[-1].split(" ")[2] if lines else None

        dev = bdi()
        self.assertIsNotNone(dev, "mount not in mountinfo")
        ra = "/sys/class/bdi/%s/read_ahead_kb" % dev

        def value():
            with open(ra) as f:
                return f.read().strip()
        # set by the worker that wrote the INIT reply, right after it: wait
        # for it (the bound only stops a hang)
        wfstest.wait_until(lambda: value() == "4096", 10)
        self.assertEqual(value(), "4096", ra)

    def test_log_stderr_in_the_background(self):
        """`wfs -o log=stderr ... 2>>FILE` without -f: the daemon's lines go
        to FILE (they once went to /dev/null once it detached)."""
        local, mnt, logp = self.path("local"), self.new_mnt(), self.path("wfs.log")
        with open(logp, "ab") as lf:
            r = subprocess.run([wfstest.wfs_bin(), "-o", "log=stderr", FIX.hub, local, mnt],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=lf,
                               timeout=wfstest.WFS_TIMEOUT)
        self.addCleanup(lambda: self.cleanup_mount(mnt))
        self.assertEqual(r.returncode, 0)
        with self.assertRaises(OSError) as cm:
            os.mkdir(os.path.join(mnt, "refused-dir"))
        self.assertEqual(cm.exception.errno, errno.EROFS)

        def log():
            with open(logp, errors="replace") as f:
                return f.read()
        self.assertTrue(wfstest.wait_until(lambda: "refused mkdir of refused-dir" in log(), 10),
                        "the refused mkdir is not in the log the daemon was given:\n" + log())

    def test_install_deps_help(self):
        """tools/install-deps --help explains itself; any other argument is
        refused (it once ignored its arguments: --help installed packages).
        PATH has no apt-get here, so nothing could be installed anyway."""
        script = os.path.join(wfstest.REPO, "tools", "install-deps")
        env = dict(os.environ, PATH="/nonexistent")
        r = subprocess.run([script, "--help"], env=env, capture_output=True, text=True, timeout=30)
        self.assertEqual((r.returncode, r.stdout.split("\n")[0]), (0, "usage: tools/install-deps"),
                         r.stdout + r.stderr)
        r = subprocess.run([script, "--frobnicate"], env=env, capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("--frobnicate", r.stderr)

    def test_unknown_option_refused_first(self):
        """An -o word neither wfs nor FUSE knows (a typo) is refused, exit
        2, before LOCAL_STORE is made or opened."""
        local, mnt = self.path("local"), self.new_mnt()
        rc, out, err = wfstest.run_wfs(["-o", "entry_timout=5", FIX.hub, local, mnt], timeout=20)
        self.cleanup_mount(mnt)
        self.assertEqual(rc, 2, "exit status %s, stderr %r" % (rc, err))
        self.assertIn("entry_timout", err)
        self.assertFalse(os.path.exists(local), "LOCAL_STORE made before the refusal")

    def test_nas_hub_path_with_comma_and_backslash(self):
        """NAS_HUB is passed to FUSE as fsname=: its commas and backslashes
        must not split or escape the option list."""
        hub = self.path("hub,a\\b")
        os.makedirs(os.path.join(hub, "models--a--b", "refs"))
        mnt = self.new_mnt()
        m = wfstest.Mount(hub, self.path("local"), mnt, ()).start()
        self.addCleanup(lambda: self.cleanup_mount(mnt))
        self.assertEqual(os.listdir(mnt), ["models--a--b"])
        src = [mountinfo_path(l.split(" ")[0]) for l in wfstest.mount_lines()
               if mountinfo_path(l.split(" ")[1]) == os.path.realpath(mnt)]
        self.assertEqual(src, [os.path.realpath(hub)], "the mount's source (fsname)")
        self.assertEqual(m.stop(), [])

    def test_sigterm_exits_0(self):
        """systemctl stop sends SIGTERM: a clean stop, exit status 0 (wfs.1:
        1 means the mount could not be made)."""
        mnt = self.new_mnt()
        m = wfstest.ForegroundMount(FIX.hub, self.path("local"), mnt, []).start()
        self.addCleanup(m.cleanup)
        self.addCleanup(lambda: self.cleanup_mount(mnt))
        m.proc.send_signal(signal.SIGTERM)
        self.assertEqual(m.proc.wait(wfstest.EXIT_TIMEOUT), 0, m.log())
        self.assertFalse(wfstest.is_mounted(mnt))

    def test_sigterm_with_files_open_exits_0(self):
        """The same with files open: the kernel sends no RELEASE for them,
        and the daemon frees them itself (under ASan their leak made the
        exit status 1)."""
        mnt = self.new_mnt()
        m = wfstest.ForegroundMount(FIX.hub, self.path("local"), mnt, []).start()
        self.addCleanup(m.cleanup)
        self.addCleanup(lambda: self.cleanup_mount(mnt))
        fds = []
        try:
            for e in sorted(FIX.readable(), key=lambda e: -e["size"])[:3]:
                fds.append(os.open(os.path.join(mnt, e["path"]), os.O_RDONLY))
                self.assertEqual(len(os.pread(fds[-1], 4096, 0)), min(4096, e["size"]))
            m.proc.send_signal(signal.SIGTERM)
            self.assertEqual(m.proc.wait(wfstest.EXIT_TIMEOUT), 0, m.log())
        finally:
            for fd in fds:
                os.close(fd)
        self.assertFalse(wfstest.is_mounted(mnt))

    def mounts_on(self, mnt):
        """The file system types mounted on `mnt`, oldest first."""
        path = os.path.realpath(os.path.dirname(mnt)) + "/" + os.path.basename(mnt)
        return [l.split(" ")[2] for l in wfstest.mount_lines()
                if mountinfo_path(l.split(" ")[1]) == path]

    def stop_with_another_mount(self, mnt, other):
        """SIGTERM a daemon whose mount point `other` has mounted a tmpfs
        on (after a lazy unmount, or on top): the tmpfs stays.  (The
        daemon's unmount once detached whatever was newest on the path.)"""
        m = wfstest.ForegroundMount(FIX.hub, self.path("local"), mnt, []).start()
        self.addCleanup(m.cleanup)
        self.addCleanup(lambda: self.cleanup_mount(mnt))
        fd = os.open(os.path.join(mnt, "version.txt"), os.O_RDONLY)  # keeps it busy
        try:
            other()
            self.addCleanup(lambda: subprocess.run(["umount", mnt], capture_output=True))
            self.assertEqual(self.mounts_on(mnt)[-1], "tmpfs")
            m.proc.send_signal(signal.SIGTERM)
            self.assertEqual(m.proc.wait(wfstest.EXIT_TIMEOUT), 0, m.log())
        finally:
            os.close(fd)
        self.assertEqual(self.mounts_on(mnt)[-1:], ["tmpfs"],
                         "the mount made on %s while the daemon ran, after its stop; log:\n%s"
                         % (mnt, m.log()[-2000:]))
        self.assertIn("another mount is there now", m.log())

    def test_sigterm_leaves_a_mount_made_since(self):
        mnt = self.new_mnt()

        def remount():
            subprocess.run(["umount", "-l", mnt], check=True)
            subprocess.run(["mount", "-t", "tmpfs", "since", mnt], check=True)
        self.stop_with_another_mount(mnt, remount)
        self.assertEqual(self.mounts_on(mnt), ["tmpfs"])

    def test_sigterm_leaves_a_mount_on_top(self):
        mnt = self.new_mnt()
        self.stop_with_another_mount(
            mnt, lambda: subprocess.run(["mount", "-t", "tmpfs", "ontop", mnt], check=True))

    def test_stop_signal_reaches_the_main_thread(self):
        """A signal sent to the process goes to any thread that does not
        block it.  libfuse's loop ends only when its main thread is woken by
        the handler; a SIGTERM taken by another thread set the exit flag and
        woke nobody -- the daemon ran on until some request reached the
        mount (a CI run: 19 s, its NAS frozen).  Made to happen: the main
        thread held by ptrace when SIGTERM comes, so the kernel gives it to
        another thread if one takes it.  Every other thread must block it
        (the signal stays pending), and the main thread, let go, must stop
        the daemon: exit status 0, the mount gone."""
        mnt = self.new_mnt()
        m = wfstest.ForegroundMount(FIX.hub, self.path("local"), mnt, []).start()
        self.addCleanup(m.cleanup)
        self.addCleanup(lambda: self.cleanup_mount(mnt))
        pid = m.proc.pid
        with HeldThread(self, pid):
            os.kill(pid, signal.SIGTERM)
            # until a thread takes it, or none can (every other one blocks it)
            wfstest.wait_until(lambda: not sig_bit(proc_field(pid, "ShdPnd"), signal.SIGTERM)
                               or not threads_taking(pid, signal.SIGTERM), 10)
            takers = threads_taking(pid, signal.SIGTERM)
            pending = sig_bit(proc_field(pid, "ShdPnd"), signal.SIGTERM)
        why = ("SIGTERM %s; threads not blocking it: %s"
               % ("still pending" if pending else "taken by a thread other than main", takers))
        try:
            rc = m.proc.wait(wfstest.EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            m.proc.kill()
            m.proc.wait()
            self.fail("the daemon still ran %d s after SIGTERM (%s); log:\n%s"
                      % (wfstest.EXIT_TIMEOUT, why, m.log()[-2000:]))
        self.assertEqual(rc, 0, m.log())
        self.assertFalse(wfstest.is_mounted(mnt))
        # it stopped; with no thread but main to take it, it always will
        self.assertEqual((pending, takers), (True, []), why)

    def test_unmount_leaves_nothing(self):
        local, mnt = self.path("local"), self.new_mnt()
        m = self.start(local, mnt)
        pids = m.pids
        self.assertTrue(pids, "no process found serving %s (argv or %s/wfs.lock)" % (mnt, local))
        r = subprocess.run(["umount", mnt], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, "umount: " + r.stderr)
        gone = wfstest.wait_until(lambda: not any(wfstest.pid_alive(p) for p in pids), wfstest.EXIT_TIMEOUT)
        self.assertTrue(gone, "daemon %s still running %d s after umount"
                        % ([p for p in pids if wfstest.pid_alive(p)], wfstest.EXIT_TIMEOUT))
        self.assertNotIn(mnt, wfstest.mount_points())
        self.assertEqual(os.listdir(mnt), [], "mount point not empty after unmount")
        # the lock is released: the same LOCAL_STORE mounts again
        m2 = self.start(local, mnt)
        self.assertEqual(sorted(os.listdir(mnt)), FIX.children()[""])
        self.assertEqual(m2.stop(), [])

    def test_wfsctl_names_a_dead_mount(self):
        """After kill -9 of the daemon, wfsctl on a path deep in its dead
        mount names the mount point, not the path, as the mount that is
        not connected."""
        wfstest.require_wfsctl()
        mnt = self.new_mnt()
        m = self.start(self.path("local"), mnt)
        for pid in m.pids:
            os.kill(pid, signal.SIGKILL)
        self.assertTrue(wfstest.wait_until(lambda: wfstest.errno_of(os.stat, mnt) == errno.ENOTCONN,
                                           wfstest.EXIT_TIMEOUT), "the mount is not dead")
        deep = os.path.join(mnt, "models--acme--standard", "snapshots")
        rc, out, err = wfstest.run_wfsctl(["status", deep])
        self.assertEqual(rc, 1, out + err)
        self.assertIn("wfsctl: %s: the wfs mount at %s is not connected" % (deep, mnt), err)

    def test_wfsctl_names_a_mount_it_cannot_enter(self):
        """Without -o allow_other other users cannot enter the mount:
        wfsctl, asked about a path deep in it, names the mount."""
        wfstest.require_wfsctl()
        mnt = self.new_mnt()
        self.start(self.path("local"), mnt)
        deep = os.path.join(mnt, "models--acme--standard", "snapshots")
        rc, out, err = wfstest.run_wfsctl(["status", deep], uid=wfstest.NOBODY)
        self.assertEqual(rc, 1, out + err)
        self.assertIn("wfsctl: %s: no access to %s to look for a wfs mount" % (deep, mnt), err)
        # with --socket too (it said "not inside a wfs mount")
        sock = os.path.join(os.path.realpath(self.path("local")), "wfs.sock")
        rc, out, err = wfstest.run_wfsctl(["--socket", sock, "status", deep], uid=wfstest.NOBODY)
        self.assertEqual(rc, 1, out + err)
        self.assertIn("wfsctl: %s: no access to %s to look for a wfs mount" % (deep, mnt), err)
        self.assertIn("with --socket, name the path relative to the mount root", err)

    def test_promote_wait_long_keys(self):
        """promote --wait polls the blobs' keys (NAS paths) in batches: 201
        files deep in a snapshot, with names of 240 bytes, make requests
        of 200 keys over the daemon's 64 KiB, and the wait must not fail
        for it (the promote itself went through)."""
        wfstest.require_wfsctl()
        hub, mnt, repo = self.path("hub"), self.new_mnt(), "models--acme--long"
        os.mkdir(hub)
        names = ["d" * 250 + "/f%03d" % i + "x" * 236 for i in range(201)]
        wfstest.make_hf_repo(hub, repo, {n: b"%d" % i for i, n in enumerate(names)}, real=names)
        m = wfstest.Mount(hub, self.path("local"), mnt, ["auto_promote=off"])
        self.addCleanup(lambda: self.cleanup_mount(mnt))
        m.start()
        rc, out, err = wfstest.run_wfsctl(["promote", "--wait", os.path.join(mnt, repo)])
        self.assertEqual(rc, 0, out + err)
        self.assertIn("promote: 201 blobs local", out)

    def test_evict_force_mid_copy_unpins(self):
        wfstest.require_wfsctl()
        local, mnt = self.path("local"), self.new_mnt()
        # 0.5 MB/s (a third of the cap a copy): the largest file (~3.6 MiB)
        # copies for seconds
        self.start(local, mnt, ["promote_mbps=1.5", "auto_promote=off"])
        sock = wfstest.wait_ctl(mnt)
        e = max(FIX.readable(), key=lambda x: x.get("size", 0))
        f = os.path.join(mnt, e["path"])
        rep = wfstest.ctl_json(self, ["promote", "--pin", f])
        key = rep["blobs"][0]["key"]

        def blob():
            r = wfstest.ctl_request(sock, {"op": "progress", "keys": [key]})
            return (r or {}).get("blobs", [{}])[0]
        b = wfstest.wait_until(lambda: (lambda x: x if x.get("state") == "copying" and
                                        x.get("bytes_done", 0) > 0 else None)(blob()), 20)
        self.assertTrue(b, "the copy of %s did not start: %s" % (e["path"], blob()))
        self.assertTrue(b["pinned"], b)
        rc, out, err = wfstest.run_wfsctl(["evict", "--force", f])
        self.assertEqual(rc, 0, "evict --force: %s%s" % (out, err))
        b = blob()
        self.assertLess(b.get("bytes_done", 0), e["size"], "the copy ended before the evict: %s" % b)
        self.assertEqual(out.strip(), "evicted 1 blob; reads go to the NAS again", out + err)
        self.assertFalse(b["pinned"], "still pinned right after evict --force: %s" % b)
        b = wfstest.wait_until(lambda: (lambda x: x if x.get("state") == "nas" else None)(blob()), 20)
        self.assertTrue(b, "not on the NAS after evict --force: %s" % blob())
        self.assertFalse(b["pinned"], b)
        st = wfstest.ctl_json(self, ["status", f])
        self.assertEqual(wfstest.state_of(f), "nas")
        self.assertEqual(wfstest.store_files(local), {}, "a copy left in data/")
        self.assertEqual(wfstest.tmp_entries(local), [], "a temporary file left in tmp/")
        repo = [r for r in st["repos"] if r["repo"] == e["path"].split("/")[0]]
        self.assertTrue(repo, "status --json %s: no repo: %s" % (f, json.dumps(st)[:2000]))
        self.assertEqual(repo[0]["pinned_files"], 0, "status --json still counts it pinned: %s"
                         % repo[0])
        self.assertEqual(set(repo[0]["states"]), {"nas"}, repo[0])
        with open(f, "rb") as fh:
            self.assertEqual(hashlib.sha256(fh.read()).hexdigest(), e["sha256"])


if __name__ == "__main__":
    wfstest.main()
