"""The fixture of test_partial.py: one NAS hub (test/mkhub plus a generated
safetensors repo and a blob whose bytes do not match its name) on an ext4
image of its own, shared by every test of the module; PartialCase, a
mount with -o auto_promote=off on a LOCAL_STORE of its own per test, with
the reads and waits the tests assert through."""

import json
import mmap
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stfile  # noqa: E402
import wfstest  # noqa: E402
from wfstest import ctl_check, ctl_json, run_wfsctl  # noqa: E402

KiB = 1 << 10
MiB = 1 << 20
SCALE_MIB = 24          # mkhub: the big shard of models--acme--standard is ~11 MiB
ST_REPO = "models--acme--parts"
ST_NAME = "model.safetensors"
ST_TENSORS = [  # (name, dtype, shape, data): rows not divisible by 4, a scalar, an empty one
    ("embed", "BF16", [1003, 384], None),
    ("w_up", "F32", [517, 301], None),
    ("scale", "F64", [], None),
    ("bias", "F16", [7], None),
    ("ln", "I8", [13, 3], None),
    ("big", "F16", [2051, 1024], None),
    ("ids", "I64", [3], None),
    ("empty", "F32", [0, 4], None),
]
WAIT = 60               # s: a copy of a few MiB (under ASan too)
BAD_REPO = "models--acme--badname"
BAD_NAME = "bad.bin"    # 1 MiB whose bytes do not match its SHA-256 name


class Fix:
    base = loop = hub = manifest = None
    by_path = {}
    st_rev = None
    cache = {}          # NAS path -> bytes


def setUpModule():
    wfstest.require_mount_capability()
    wfstest.require_wfsctl()
    if not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        wfstest.skip_or_fail("cannot write /proc/sys/vm/drop_caches")
    Fix.base = wfstest.make_base("wfs-it-partial-")
    unittest.addModuleCleanup(module_cleanup)
    Fix.loop = wfstest.LoopFs(os.path.join(Fix.base, "nas.img"), os.path.join(Fix.base, "nasfs"), 96)
    Fix.loop.setup()
    Fix.manifest = wfstest.generate_hub(os.path.join(Fix.loop.mnt, "gen"), scale_mib=SCALE_MIB, many=0)
    Fix.hub = Fix.manifest["hub"]
    Fix.by_path = {e["path"]: e for e in Fix.manifest["entries"]}
    # a safetensors file of our own, as a snapshot file of a repo of its own
    with tempfile.TemporaryDirectory(dir=Fix.base) as tmp:
        p = os.path.join(tmp, ST_NAME)
        stfile.write_safetensors(p, ST_TENSORS, metadata={"format": "pt"})
        with open(p, "rb") as f:
            data = f.read()
    Fix.st_rev = wfstest.make_hf_repo(Fix.hub, ST_REPO, {ST_NAME: data})
    # a blob whose bytes do not match its SHA-256 name (one byte changed after)
    wfstest.make_hf_repo(Fix.hub, BAD_REPO, {BAD_NAME: bytes(range(256)) * 4096})
    bad = os.path.realpath(os.path.join(Fix.hub, snap_rel(BAD_REPO, BAD_NAME)))
    with open(bad, "r+b") as f:
        f.seek(300000)
        f.write(b"\xff")
    os.sync()


def module_cleanup():
    problems = Fix.loop.teardown() if Fix.loop else []
    if Fix.loop and wfstest.is_mounted(Fix.loop.mnt):
        problems.append("not removing %s: the NAS image is still mounted" % Fix.base)
    elif Fix.base:
        shutil.rmtree(Fix.base, ignore_errors=True)
    if problems:
        raise AssertionError("module cleanup: " + "; ".join(problems))


# ---------------------------------------------------------------- the fixture's files

def snap_rel(repo, name):
    with open(os.path.join(Fix.hub, repo, "refs", "main")) as f:
        rev = f.read().strip()
    return "%s/snapshots/%s/%s" % (repo, rev, name)


def shard(n):
    """(mount-relative path, NAS path) of shard n of models--acme--standard."""
    rel = snap_rel("models--acme--standard", "model-%05d-of-00002.safetensors" % n)
    return rel, os.path.join(Fix.hub, Fix.by_path[rel]["nas_real"])


def st_file():
    rel = snap_rel(ST_REPO, ST_NAME)
    return rel, os.path.realpath(os.path.join(Fix.hub, rel))


def nas_bytes(nas):
    if nas not in Fix.cache:
        Fix.cache[nas] = wfstest.read_file(nas)
    return Fix.cache[nas]


def gaps(have, off, ln):
    """Parts of [off, off+ln) no range of `have` covers."""
    out, pos, end = [], off, off + ln
    for a, n in sorted(have):
        if a + n <= pos:
            continue
        if a >= end:
            break
        if a > pos:
            out.append((pos, a - pos))
        pos = max(pos, a + n)
    if pos < end:
        out.append((pos, end - pos))
    return out


def rarg(ranges):
    args = []
    for off, ln in ranges:
        args += ["--range", "%d:%d" % (off, ln)]
    return args


def pairs(v):
    return [tuple(x) for x in (v or [])]


def part_files(local):
    d = os.path.join(local, "parts")
    try:
        return sorted(os.listdir(d))
    except FileNotFoundError:
        return []


def allocated(path):
    return os.stat(path).st_blocks * 512


def index_of(local):
    with open(os.path.join(local, "index.json")) as f:
        return json.load(f)


def index_rec(local, key):
    try:
        idx = index_of(local)
    except (OSError, ValueError):
        return None, None
    for b in idx.get("blobs", []):
        if b.get("key") == key:
            return idx, b
    return idx, None


def index_ranges(rec):
    return [(r["off"], r["len"]) for r in (rec or {}).get("ranges", [])]


# ---------------------------------------------------------------- mounts

class PartialCase(unittest.TestCase):
    OPTS = ("auto_promote=off",)

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix=self.id().rsplit(".", 2)[-2] + "-", dir=Fix.base)
        os.chmod(self.dir, 0o755)
        self.local = os.path.join(self.dir, "local")
        self.mnt = os.path.join(self.dir, "mnt")
        os.mkdir(self.mnt)
        self.m = None
        self.addCleanup(self._stop)

    def _stop(self):
        problems = []
        if self.m is not None:
            problems = self.m.stop()
            self.m = None
        elif wfstest.is_mounted(self.mnt):
            pids = wfstest.daemon_pids(self.local, self.mnt)
            problems = wfstest.unmount(self.mnt) + wfstest.stop_daemon(pids, self.mnt)
        if problems:
            raise AssertionError("stopping the mount: " + "; ".join(problems))

    def start(self, opts=()):
        self.m = wfstest.Mount(Fix.hub, self.local, self.mnt, list(self.OPTS) + list(opts)).start()
        self.sock = wfstest.wait_ctl(self.mnt)
        return self.m

    def p(self, rel):
        return os.path.join(self.mnt, rel)

    # --- the daemon's view
    def key_of(self, rel):
        rep = ctl_json(self, ["promote", "--dry-run", "--range", "0:1", self.p(rel)])
        return rep["key"]

    def blob(self, key):
        rep = wfstest.ctl_request(self.sock, {"op": "progress", "keys": [key]})
        self.assertTrue(rep and rep.get("ok") is not False and rep.get("blobs"),
                        "progress of %s: %s" % (key, rep))
        return rep["blobs"][0]

    def part(self, key):
        return self.blob(key).get("part") or {}

    def wait_settled(self, key, timeout=WAIT):
        """Until no range of the blob is wanted, copying or unproven."""
        last = [None]

        def done():
            last[0] = self.part(key)
            return not last[0].get("copying") and not last[0].get("unproven")
        self.assertTrue(wfstest.wait_until(done, timeout, 0.05),
                        "ranges of %s still copying/unproven after %d s: %s" % (key, timeout, last[0]))
        return last[0]

    def promote(self, rel, ranges, *extra):
        return run_wfsctl(["promote"] + list(extra) + rarg(ranges) + [self.p(rel)])

    def promote_ok(self, rel, ranges, *extra):
        return ctl_check(self, ["promote"] + list(extra) + rarg(ranges) + [self.p(rel)])

    # --- reading through the mount
    def assert_whole(self, rel, data, what=""):
        wfstest.drop_caches()
        got = wfstest.read_file(self.p(rel))
        if got != data:
            self.fail("%s%s: a whole read differs from the NAS (%s)" % (what, rel, first_diff(got, data)))

    def assert_preads(self, rel, data, cases, what=""):
        """pread each (off, len) with the file's pages dropped before each,
        no read-ahead: every read reaches the daemon."""
        bad = []
        fd = os.open(self.p(rel), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            for off, ln in cases:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                got = os.pread(fd, ln, off)
                if got != data[off:off + ln]:
                    bad.append((off, ln, first_diff(got, data[off:off + ln])))
        finally:
            os.close(fd)
        self.assertEqual(bad, [], "%s%s: %d of %d preads (off, len, where) differ from the NAS"
                         % (what, rel, len(bad), len(cases)))

    def assert_mmap(self, rel, data, what=""):
        wfstest.drop_caches()
        fd = os.open(self.p(rel), os.O_RDONLY)
        try:
            m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            try:
                got = m[:]
            finally:
                m.close()
        finally:
            os.close(fd)
        if got != data:
            self.fail("%s%s: mmap of the whole file differs from the NAS (%s)"
                      % (what, rel, first_diff(got, data)))


def first_diff(got, want):
    if len(got) != len(want):
        return "%d bytes, %d expected" % (len(got), len(want))
    for i in range(0, len(want), 4096):
        if got[i:i + 4096] != want[i:i + 4096]:
            j = next(k for k in range(i, min(i + 4096, len(want))) if got[k] != want[k])
            return "first difference at +%d" % j
    return "equal"


def edge_cases(ranges, size):
    """(off, len) reads at and around every range edge, small and 128K+."""
    out = []
    for off, ln in ranges:
        for e in (off, off + ln):
            for d in (-1, 0, 1):
                for n in (1, 2, 4095, 4097, 128 * KiB + 3, 200001):
                    if 0 <= e + d <= size:
                        out.append((e + d, n))
            out.append((max(0, e - 64 * KiB), 128 * KiB))   # edge in the middle
    return out
