"""wfs integration tests: passthrough counters, hub repos made by hand,
samplers for auto-promotion and capacity, and the operations tests' tools
(promtool, mount namespaces, a foreground mount)."""

import ctypes
import mmap
import os
import shutil
import signal
import subprocess
import tempfile
import time

from wt_base import (child_report, fork_reporting, is_mounted, reap_child, REPO,
                     skip_or_fail, unmount, wait_until, wfs_bin)
from wt_hub import errname, Mount
from wt_ctl import ctl_json, state_of


# ---------------------------------------------------------------- passthrough

XATTR_DAEMON_READS = "user.wfs.daemon_reads"   # READ requests the daemon served for the inode
XATTR_PASSTHROUGH = "user.wfs.passthrough"     # opens of the inode the kernel serves itself


def xattr_int(path, name):
    """An integer-valued xattr of a path in the mount."""
    v = os.getxattr(path, name).decode(errors="replace").strip()
    try:
        return int(v)
    except ValueError:
        raise AssertionError("xattr %s of %s is not an integer: %r" % (name, path, v))


def daemon_reads(path):
    return xattr_int(path, XATTR_DAEMON_READS)


def passthrough_opens(path):
    return xattr_int(path, XATTR_PASSTHROUGH)


def route_of(tc, mnt, name):
    """(state, error) of a route in `wfsctl --json stats`'s "routes":
    passthrough, io_uring, fuse_uring."""
    r = ctl_json(tc, ["stats", mnt])["metrics"]["routes"][name]
    return r["state"], r["error"]


def kernel_version():
    """(major, minor) of the running kernel."""
    import re
    m = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def kernel_has_fuse_passthrough():
    """FUSE passthrough (FUSE_PASSTHROUGH, backing ids) is in Linux >= 6.9."""
    return kernel_version() >= (6, 9)


def served_bytes(tc, mnt):
    """(local_bytes, nas_bytes) of `wfsctl --json status`'s "served"."""
    st = ctl_json(tc, ["status", mnt])
    s = st.get("served") or {}
    tc.assertIn("local_bytes", s, "wfsctl --json status has no served.local_bytes: %s" % s)
    tc.assertIn("nas_bytes", s, "wfsctl --json status has no served.nas_bytes: %s" % s)
    return s["local_bytes"], s["nas_bytes"]


# ---------------------------------------------------------------- auto-promotion, capacity

def det_bytes(seed, n):
    """n deterministic pseudo-random bytes for `seed` (fast)."""
    import hashlib
    h = hashlib.sha256(str(seed).encode()).digest()
    out, i = bytearray(), 0
    while len(out) < n:
        out += hashlib.sha256(h + i.to_bytes(8, "little")).digest() * 128
        i += 1
    return bytes(out[:n])


def make_hf_repo(hub, repo, files, commit=None, ref="main", real=()):
    """Write one revision of `repo` under `hub` as huggingface_hub does:
    blobs/<sha256 of content>, snapshots/<commit>/<name> -> ../../blobs/<sha>
    (one more ../ per directory level), refs/<ref> = commit (written
    atomically, as moving a ref on a live NAS must be).  `files` maps names
    in the snapshot to bytes; the names in `real` are real files in the
    snapshot (optional packs).  Returns the commit."""
    import hashlib
    base = os.path.join(hub, repo)
    os.makedirs(os.path.join(base, "blobs"), exist_ok=True)
    if commit is None:
        commit = hashlib.sha1(repr((repo, sorted((k, hashlib.sha256(v).hexdigest())
                                                  for k, v in files.items()))).encode()).hexdigest()
    for name, data in files.items():
        p = os.path.join(base, "snapshots", commit, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if name in real:
            with open(p, "wb") as f:
                f.write(data)
            continue
        sha = hashlib.sha256(data).hexdigest()
        bp = os.path.join(base, "blobs", sha)
        if not os.path.exists(bp):
            with open(bp, "wb") as f:
                f.write(data)
        os.symlink("../" * (name.count("/") + 2) + "blobs/" + sha, p)
    if ref:
        set_hf_ref(hub, repo, ref, commit)
    return commit


def set_hf_ref(hub, repo, ref, commit):
    p = os.path.join(hub, repo, "refs", ref)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p + ".tmp", "w") as f:
        f.write(commit)
    os.rename(p + ".tmp", p)


def store_blocks(local):
    """Bytes of blocks taken by the copies (every regular file under
    LOCAL_STORE/data and LOCAL_STORE/tmp): what store_max bounds."""
    total = 0
    for sub in ("data", "tmp"):
        for root, dirs, files in os.walk(os.path.join(local, sub)):
            for n in files:
                try:
                    total += os.lstat(os.path.join(root, n)).st_blocks * 512
                except FileNotFoundError:
                    pass
    return total


class Sampler:
    """Calls fn() every `step` seconds in a thread until stop(); keeps the
    largest value seen and how many samples were taken."""

    def __init__(self, fn, step=0.005):
        import threading
        self.fn, self.step = fn, step
        self.max, self.n, self.errors = None, 0, []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                v = self.fn()
            except Exception as e:  # noqa: BLE001 -- reported by the test
                self.errors.append(repr(e))
                v = None
            if v is not None and (self.max is None or v > self.max):
                self.max = v
            self.n += 1
            time.sleep(self.step)

    def start(self):
        self._t.start()
        return self

    def stop(self):
        self._stop.set()
        self._t.join(10)
        return self.max


CLOCK_REALTIME_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5)


def next_use_tick(timeout=10):
    """The store stamps each use of a copy with CLOCK_REALTIME_COARSE (its
    LRU order; room for a request is made only from copies used before it),
    a clock that moves a few milliseconds at a time.  Wait until it has moved
    on: whatever the daemon stamps after this is later than every stamp it
    made before the call."""
    t = time.clock_gettime_ns(CLOCK_REALTIME_COARSE)
    if not wait_until(lambda: time.clock_gettime_ns(CLOCK_REALTIME_COARSE) > t, timeout, 0.001):
        raise AssertionError("CLOCK_REALTIME_COARSE did not move in %d s" % timeout)


def wait_states(paths, want, timeout, step=0.05):
    """Poll until every path's user.wfs.state is in `want`; returns
    {path: last state} of those that are not."""
    if isinstance(want, str):
        want = (want,)
    last = {}

    def ok():
        last.clear()
        for p in paths:
            try:
                s = state_of(p)
            except OSError as e:
                s = "error " + errname(e.errno)
            if s not in want:
                last[p] = s
        return not last
    wait_until(ok, timeout, step)
    return dict(last)


def blob_pinned(tc, path):
    """Whether the blob behind a mount path is pinned (wfsctl promote
    --dry-run --json reports it without changing anything)."""
    rep = ctl_json(tc, ["promote", "--dry-run", "--force", path])
    blobs = rep.get("blobs") or []
    tc.assertEqual(len(blobs), 1, "dry run of %s: %s" % (path, rep))
    return bool(blobs[0].get("pinned"))


# ---------------------------------------------------------------- operations

def promtool_bin():
    return shutil.which("promtool")


def require_promtool():
    if not promtool_bin():
        skip_or_fail("promtool not found (Debian package prometheus; tools/install-deps installs it)")


def promtool_check(text):
    """`promtool check metrics` on `text`.  Returns (ok, what promtool said)."""
    r = subprocess.run([promtool_bin(), "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    return r.returncode == 0 and not (r.stdout + r.stderr).strip(), (r.stdout + r.stderr).strip()


def prom_samples(text):
    """Prometheus text -> {'name{labels}': float} (the exposition as written)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out


CLONE_NEWNS = 0x00020000


def enter_slave_mntns():
    """unshare(CLONE_NEWNS) and make every mount a slave of ours: mounts made
    outside later still arrive here, nothing mounted here leaks out (what a
    container with rslave / HostToContainer propagation sees)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        e = ctypes.get_errno()
        raise OSError(e, "unshare(CLONE_NEWNS): " + os.strerror(e))
    sh("mount", "--make-rslave", "/")


def sh(*argv, env=None, timeout=60):
    """Run a command; raise AssertionError with its output unless it exits 0.
    Returns stdout."""
    r = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise AssertionError("%s exited %d: %s%s" % (" ".join(argv), r.returncode, r.stdout,
                                                     r.stderr))
    return r.stdout


class MntnsChild:
    """fn(*args) in a forked child living in its own mount namespace (see
    enter_slave_mntns).  start() returns at once; result() waits and gives
    fn's return value, or raises AssertionError with the child's traceback.
    Pipes made before start() are shared with the child (for hand-shakes)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args
        self.pid = None
        self.rfd = None

    def start(self):
        def child():
            try:
                enter_slave_mntns()
                return ("ok", self.fn(*self.args))
            except BaseException:  # noqa: BLE001 -- report, never escape the child
                import traceback
                return ("exc", traceback.format_exc())

        self.pid, self.rfd = fork_reporting(child)
        return self

    def result(self, timeout=120):
        chunks = []
        deadline = time.monotonic() + timeout
        import select
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.rfd], [], [], left)[0]:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                os.close(self.rfd)
                raise AssertionError("mount-namespace child did not finish within %d s" % timeout)
            c = os.read(self.rfd, 65536)
            if not c:
                break
            chunks.append(c)
        os.close(self.rfd)
        os.waitpid(self.pid, 0)
        kind, val = child_report(chunks)
        if kind != "ok":
            raise AssertionError("in the mount-namespace child:\n" + val)
        return val


def in_mntns(fn, *args, timeout=120):
    return MntnsChild(fn, *args).start().result(timeout)


class ForegroundMount(Mount):
    """wfs -f -o log=stderr,... in the background, its log in a file
    (Mount runs it detached, logging to syslog).  `wrapper`: a command
    (argv list) the daemon is run under, e.g. test/confine."""

    wrapper = ()

    def start(self):
        self.logf = tempfile.NamedTemporaryFile(prefix="wfs-log-", suffix=".txt", delete=False)
        opts = ["log=stderr"] + self.options
        args = list(self.wrapper) + [wfs_bin(), "-f", "-o", ",".join(opts), self.nas,
                                     self.local, self.mnt]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self.logf,
                                     stderr=self.logf)
        if not wait_until(lambda: is_mounted(self.mnt) or self.proc.poll() is not None, 10):
            self.proc.kill()
        if not is_mounted(self.mnt):
            self.proc.wait()
            said = self.log()
            self.logf.close()
            self.cleanup()  # (its text is in the failure)
            raise AssertionError("wfs -f %s: no mount (rc %s); log:\n%s"
                                 % (" ".join(args), self.proc.returncode, said))
        self.logf.close()  # the daemon has its own descriptor
        self.pids = [self.proc.pid]
        return self

    def log(self):
        with open(self.logf.name, errors="replace") as f:
            return f.read()

    def stop(self, expect_rc=0):
        """Unmount, wait for the daemon, and return the problems: among
        them an exit status other than @expect_rc (a crash or an abort at
        shutdown passed in the plain build)."""
        problems = unmount(self.mnt) + reap_child(self.proc, "wfs -f")
        rc = self.proc.returncode
        if not problems and expect_rc is not None and rc != expect_rc:
            problems.append("wfs -f exited %s after its unmount, not %s%s"
                            % (rc, expect_rc, " (killed by signal %d)" % -rc if rc < 0 else ""))
        # unmounted from outside, the daemon must not unmount again (libfuse
        # would say "failed to unmount ...: Invalid argument", or detach
        # whatever was mounted there since)
        again = [l for l in self.log().splitlines() if "failed to unmount" in l]
        if again:
            problems.append("wfs -f unmounted %s again after its umount: %s" % (self.mnt, again[0]))
        # the room's tally found the counts kept as copies come and go wrong
        # (core/store_copies.c): a bug whatever the test was about
        bug = [l for l in self.log().splitlines() if "accounting bug" in l]
        if bug:
            problems.append("wfs -f: %s" % bug[0])
        return problems

    def cleanup(self):
        try:
            os.unlink(self.logf.name)
        except OSError:
            pass


def confine_bin():
    """test/confine: a command run with calls refused (seccomp) as a
    container may refuse them; WFS_CONFINE or <repo>/build/test/confine."""
    return os.environ.get("WFS_CONFINE") or os.path.join(REPO, "build", "test", "confine")


def require_confine():
    p = confine_bin()
    if not (os.path.isfile(p) and os.access(p, os.X_OK)):
        skip_or_fail("confine (WFS_CONFINE) not found or not executable: " + p)


class NoRingMount(ForegroundMount):
    """ForegroundMount with the daemon run under `test/confine
    --no-io-uring`."""

    wrapper = (confine_bin(), "--no-io-uring")


class NoEnterMount(ForegroundMount):
    """ForegroundMount with the daemon run under `test/confine
    --no-io-uring-enter`: rings are made, nothing submitted on one reaches
    the kernel."""

    wrapper = (confine_bin(), "--no-io-uring-enter")


class NoOpenat2Mount(ForegroundMount):
    """ForegroundMount with the daemon run under `test/confine
    --openat2=EPERM`: io_uring allowed, openat2 refused as a seccomp profile
    older than the call refused it."""

    wrapper = (confine_bin(), "--openat2=EPERM")


class NoBackingMount(ForegroundMount):
    """ForegroundMount with the daemon run under `test/confine
    --no-backing-open`: passthrough negotiated, every backing file
    refused, as the kernel refuses one to a daemon whose CAP_SYS_ADMIN is
    not the initial user namespace's."""

    wrapper = (confine_bin(), "--no-backing-open")


class RoSysMount(ForegroundMount):
    """ForegroundMount with the daemon run under `test/confine --ro-sys`: a
    mount namespace of its own with /sys read-only (a container's); its
    mount shows in the test's namespace only below a shared mount."""

    wrapper = (confine_bin(), "--ro-sys")


def add_big_repo(hub, repo="models--ops--big", size=48 << 20):
    """A repo with one LFS blob of `size` random bytes (named by its SHA-256)
    and a snapshot link to it, written into the NAS hub.  Returns a dict:
    repo, rev, blob and snap (hub-relative paths), sha256, size."""
    import hashlib
    data = os.urandom(size)
    sha = hashlib.sha256(data).hexdigest()
    rev = hashlib.sha1(repo.encode()).hexdigest()
    top = os.path.join(hub, repo)
    os.makedirs(os.path.join(top, "blobs"))
    os.makedirs(os.path.join(top, "refs"))
    os.makedirs(os.path.join(top, "snapshots", rev))
    with open(os.path.join(top, "blobs", sha), "wb") as f:
        f.write(data)
    with open(os.path.join(top, "refs", "main"), "w") as f:
        f.write(rev)
    os.symlink("../../blobs/" + sha, os.path.join(top, "snapshots", rev, "model.safetensors"))
    return {"repo": repo, "rev": rev, "blob": "%s/blobs/%s" % (repo, sha),
            "snap": "%s/snapshots/%s/model.safetensors" % (repo, rev), "sha256": sha, "size": size}


# ---------------------------------------------------------------- manual pages

def man_page(name):
    """The roff source of doc/NAME."""
    with open(os.path.join(REPO, "doc", name)) as f:
        return f.read()


def text_section(text, start, end):
    """Lines of `text` from the first line starting with `start` up to (not
    including) the next line starting with any of `end` ("" : a blank line)."""
    out, on = [], False
    for ln in text.splitlines():
        if on and any((ln.strip() == "") if e == "" else ln.startswith(e) for e in end):
            break
        if ln.startswith(start):
            on = True
        if on:
            out.append(ln)
    return out


def resident_bytes(path):
    """Bytes of `path` in the page cache: fincore, else mincore via ctypes."""
    if shutil.which("fincore"):
        r = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                           capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip().isdigit():
            return int(r.stdout.strip())
    size = os.path.getsize(path)
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        npages = (size + page - 1) // page
        vec = ctypes.create_string_buffer(npages)
        if libc.mincore(addr, size, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(1 for b in vec.raw if b & 1) * page
