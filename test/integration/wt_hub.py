"""wfs integration tests: a generated NAS hub and a wfs mount of it, work
run as another uid, and small file helpers."""

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile

from wt_base import (child_report, daemon_pids, fork_reporting, is_mounted, mkhub_bin, NOBODY,
                     pids_with_arg, require_mount_capability, run_wfs, stop_daemon, unmount,
                     wait_until)


# ---------------------------------------------------------------- hub + mount

def make_base(prefix):
    """A temp dir under /tmp that uid 65534 can traverse."""
    base = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(base, 0o755)
    return base


def generate_hub(outdir, scale_mib=8, many=200, seed=1):
    """Run test/mkhub; return the parsed manifest."""
    # this interpreter, not the script's "env python3": a launcher in PATH
    # (pyenv's shims) costs most of a second a start
    r = subprocess.run([sys.executable, mkhub_bin(), "--scale-mib", str(scale_mib), "--many", str(many),
                        "--seed", str(seed), outdir], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise AssertionError("mkhub failed (rc %d): %s%s" % (r.returncode, r.stdout, r.stderr))
    with open(os.path.join(outdir, "manifest.json")) as f:
        return json.load(f)


TEST_NAS_TIMEOUT_MS = 2000  # the most wfs allows (NAS_GATE_TIMEOUT_MAX_MS)


class Mount:
    """One running wfs daemon: wfs [opts] NAS LOCAL MNT."""

    def __init__(self, nas, local, mnt, options=()):
        self.nas, self.local, self.mnt = nas, local, mnt
        self.options = list(options)
        self.pids = []
        self.ready_on_return = False
        self.rc = self.out = self.err = None

    def start(self):
        args = []
        opts = list(self.options)
        # The NAS here is a local directory: a call past a 1 s deadline is
        # a sanitizer build starved of CPU by the tests beside it, not a
        # NAS fault.  The tests of the deadline set their own nas_timeout.
        if not any(o.startswith("nas_timeout=") for o in opts):
            opts.append("nas_timeout=%d" % TEST_NAS_TIMEOUT_MS)
        args += ["-o", ",".join(opts)]
        args += [self.nas, self.local, self.mnt]
        self.rc, self.out, self.err = run_wfs(args)
        if self.rc != 0:
            raise AssertionError("wfs %s exited %s\nstdout: %s\nstderr: %s"
                                 % (" ".join(args), self.rc, self.out, self.err))
        self.ready_on_return = is_mounted(self.mnt)
        if not wait_until(lambda: is_mounted(self.mnt), 5):
            raise AssertionError("wfs exited 0 but %s is not mounted 5 s later" % self.mnt)
        self.pids = wait_until(lambda: daemon_pids(self.local, self.mnt), 2)
        return self

    def stop(self):
        """Unmount and check the daemon exited.  Returns a list of problems."""
        problems = unmount(self.mnt)
        if not self.pids:
            problems.append("could not identify the daemon process for %s" % self.mnt)
        problems += stop_daemon(self.pids, self.mnt)
        return problems


class HubFixture:
    """Generated hub + mounted wfs, once per test module.

        FIX = HubFixture()
        def setUpModule(): FIX.setup()
        def tearDownModule(): FIX.teardown()

    Attributes: base, gen (mkhub OUTDIR), hub (NAS), local, mnt, manifest,
    entries (list), by_path (dict).
    The mount is a sibling of the NAS hub (OUTDIR/hub, OUTDIR/mnt) so that a
    relative link leaving the hub leaves the mount the same way."""

    def __init__(self, options=("allow_other",), scale_mib=8, many=200, mount=True):
        self.options = options
        self.scale_mib, self.many = scale_mib, many
        self.do_mount = mount
        self.base = self.gen = self.mnt = None
        self.mount = None

    def setup(self):
        require_mount_capability()
        self.base = make_base("wfs-it-")
        try:
            self.gen = os.path.join(self.base, "gen")
            self.manifest = generate_hub(self.gen, self.scale_mib, self.many)
            self.hub = self.manifest["hub"]
            self.outside = self.manifest["outside"]
            self.entries = self.manifest["entries"]
            self.by_path = {e["path"]: e for e in self.entries}
            self.local = os.path.join(self.gen, "local")
            self.mnt = os.path.join(self.gen, "mnt")
            os.mkdir(self.mnt)
            os.chmod(self.gen, 0o755)
            if self.do_mount:
                self.mount = Mount(self.hub, self.local, self.mnt, self.options).start()
        except BaseException:
            self.teardown(raise_problems=False)
            raise

    def teardown(self, raise_problems=True):
        problems = []
        if self.mount is not None:
            problems = self.mount.stop()
            self.mount = None
        elif self.mnt and is_mounted(self.mnt):  # a start that failed half-way
            pids = daemon_pids(self.local, self.mnt)
            problems = unmount(self.mnt) + stop_daemon(pids, self.mnt)
        if self.base and os.path.isdir(self.base):
            if self.mnt and is_mounted(self.mnt):
                problems.append("not removing %s: still mounted" % self.base)
            else:
                shutil.rmtree(self.base, ignore_errors=True)
        if problems and raise_problems:
            raise AssertionError("teardown: " + "; ".join(problems))

    # --- manifest helpers
    def m(self, rel):
        return os.path.join(self.mnt, rel) if rel else self.mnt

    def n(self, rel):
        return os.path.join(self.hub, rel) if rel else self.hub

    def ref_commit(self, repo, ref="main"):
        """The commit <repo>/refs/<ref> names on the NAS."""
        with open(self.n("%s/refs/%s" % (repo, ref))) as f:
            return f.read().strip()

    def snapshot_entry(self, repo, rel, ref="main"):
        """The manifest entry of <repo>/snapshots/<the commit of ref>/<rel>."""
        return self.by_path["%s/snapshots/%s/%s" % (repo, self.ref_commit(repo, ref), rel)]

    def of(self, type_=None, follow=None):
        return [e for e in self.entries
                if (type_ is None or e["type"] == type_)
                and (follow is None or e.get("follow") == follow)]

    def readable(self):
        """Entries that read as a file through the mount: files and links with
        follow=file."""
        return [e for e in self.entries
                if e["type"] == "file" or (e["type"] == "link" and e.get("follow") == "file")]

    def children(self):
        """dir path ('' = root) -> sorted names of its children, from the manifest."""
        kids = {"": []}
        for e in self.entries:
            if e["type"] == "dir":
                kids.setdefault(e["path"], [])
        for e in self.entries:
            parent, name = os.path.split(e["path"])
            kids.setdefault(parent, []).append(name)
        return {k: sorted(v) for k, v in kids.items()}


# ---------------------------------------------------------------- other uid

class ScratchMounts:
    """A mixin for tests that start their own daemons over a module's
    HubFixture (the class's FIXTURE): a fresh scratch dir per test inside
    the fixture's base (removed with it), mount points made there, and
    a mount a test left (or a refusing wfs made) taken off at cleanup."""

    FIXTURE = None

    def setUp(self):
        self.dir = os.path.join(self.FIXTURE.base, self.id().rsplit(".", 1)[-1])
        os.mkdir(self.dir)

    def path(self, *names):
        return os.path.join(self.dir, *names)

    def new_mnt(self, name="mnt"):
        p = self.path(name)
        os.mkdir(p)
        self.addCleanup(lambda: self.cleanup_mount(p))
        return p

    def cleanup_mount(self, mnt):
        """Undo a mount a refusing wfs should not have made (or a test made)."""
        if is_mounted(mnt):
            pids = pids_with_arg(mnt)
            unmount(mnt)
            stop_daemon(pids, mnt)


def in_child(fn, *args, uid=None, gid=None):
    """Run fn(*args) in a forked child (with uid/gid, and no supplementary
    groups, when uid is given): what it did never touches the test runner,
    a signal that kills it included.  Returns ("ok", result),
    ("errno", errno of the OSError it raised), ("exc", repr of any other
    exception) or ("signal", the signal that killed it)."""
    def child():
        try:
            if uid is not None:
                os.setgroups([])
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
            return ("ok", fn(*args))
        except OSError as e:
            return ("errno", e.errno)
        except BaseException as e:  # noqa: BLE001 -- report, never escape the child
            return ("exc", repr(e))

    pid, r = fork_reporting(child)
    chunks = []
    while True:
        c = os.read(r, 1 << 20)
        if not c:
            break
        chunks.append(c)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "signal", os.WTERMSIG(status)
    return child_report(chunks)


def as_uid(fn, *args, uid=NOBODY, gid=NOBODY):
    """Run fn(*args) in a forked child with uid/gid 65534.  Returns
    (result, None) or (None, errno) (errno of the OSError the call raised)."""
    kind, val = in_child(fn, *args, uid=uid, gid=gid)
    if kind == "ok":
        return val, None
    if kind == "errno":
        return None, val
    raise RuntimeError("child raised %s" % (val,))


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def drop_pages(path):
    """Drop the kernel's cached pages of one file: its next read reaches the
    daemon (or the passthrough backing) again."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def errno_of(fn, *args, **kw):
    """Errno of the OSError fn raises, or None if it succeeded."""
    try:
        fn(*args, **kw)
    except OSError as e:
        return e.errno
    return None


def errname(e):
    return "success" if e is None else errno.errorcode.get(e, str(e))
