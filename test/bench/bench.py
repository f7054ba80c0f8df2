#!/usr/bin/env python3
"""wfs benchmark harness.

Generates a NAS hub fixture with test/mkhub, mounts it with the wfs
daemon, and measures every figure twice in the same run: once reading the NAS
file directly ("direct") and once through the mount ("wfs").  Each figure is
reported as a ratio wfs/direct.

Throughput figures: ratio = wfs/direct, higher is better (1.00 = parity).
Time figures (metadata walk): ratio = time wfs/direct, LOWER is better.
Page-cache figures: fractions of the file size; the ideal is stated per row.

Cold measurements drop the kernel caches first (sync; echo 3 >
/proc/sys/vm/drop_caches), so the harness must run as root.

Promotion figures (need wfsctl, build/tools/wfsctl or WFSCTL_BIN):
  promote  `wfsctl promote --wait` of the big shard vs cp of the same NAS file
           into LOCAL_STORE's filesystem, cp + sync, cp + sha256sum of the
           copy, cp + sha256sum + sync ("direct" = the baseline), MB/s.
  local    after promotion: the seq / mmap / rand figures again, "direct" =
           the verified copy LOCAL_STORE/data/xx/<hash> read directly.
  startup  a separate fixture with --many 1000, that repo promoted, then the
           time from `wfs` to `wfsctl status` answering and a promoted file
           reading back with state local (seconds, no ratio).
Both promote and local evict the copy afterwards, so the order of figures
does not matter.

Comparison and daemon figures:
  compare  the NAS-side read figures (seq, mmap, rand, walk, page-cache
           growth) through kernel overlayfs (the NAS hub as the single,
           read-only lowerdir) and bindfs -r over the same files; columns
           "overlayfs ratio" / "bindfs ratio" = that fs / direct, direct
           re-measured in the same pass.  bindfs is apt-get installed if
           missing (not with --no-install); a filesystem that cannot mount is
           skipped with a note.
  memory   a separate fixture with --many 100000 (--memory-many): wfs mounted
           on it, every entry walked through the mount, then the daemon's
           VmRSS (pid from LOCAL_STORE/wfs.lock) vs the 64 MiB target, and its
           utime+stime over 10 s of idleness (--idle-seconds) after the walk.
startup and memory make their own fixtures: run alone (--only), they skip
the main one.

Extension point: every figure is a function `m_<name>(ctx)` registered in
MEASUREMENTS below.  A measurement adds rows with ctx.row(...).  To add a
figure, write a function and append a Measurement to the list.

Python standard library only.
"""

import argparse
import ctypes
import ctypes.util
import hashlib
import json
import mmap
import os
import platform
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_WFS = os.path.join(REPO, "build", "fs", "wfs")
DEFAULT_MKHUB = os.path.join(REPO, "test", "mkhub")
DEFAULT_WFSCTL = os.path.join(REPO, "build", "tools", "wfsctl")
PAGE = os.sysconf("SC_PAGE_SIZE")


def log(*a):
    print("[bench]", *a, file=sys.stderr, flush=True)


class Skip(Exception):
    """Raised by a measurement that cannot run here (reason in the message)."""


# --------------------------------------------------------------------------
# system helpers

def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def meminfo(key):
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            if k == key:
                return int(v.split()[0]) * 1024
    raise KeyError(key)


def mountinfo():
    """List of (mountpoint, fstype, source)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            mp = left.split()[4].replace("\\040", " ")
            r = right.split()
            out.append((mp, r[0], r[1]))
    return out


def fs_of(path):
    path = os.path.realpath(path)
    best = ("/", "?", "?")
    for mp, fstype, src in mountinfo():
        if (path == mp or path.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best[0]):
            best = (mp, fstype, src)
    return best


def is_mounted(path):
    path = os.path.realpath(path)
    return any(mp == path for mp, _, _ in mountinfo())


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_bytes(path):
    """Bytes of `path` resident in the page cache (what fincore reports).

    Uses fincore(1) if present, else mmap+mincore through ctypes.  Returns
    None if it cannot tell (e.g. the file cannot be mmapped)."""
    if shutil.which("fincore"):
        r = subprocess.run(["fincore", "-b", "-n", "-r", "-o", "RES", path],
                           capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip():
            return int(r.stdout.split()[0])
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            n = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * n)()
            if _libc.mincore(addr, size, vec) != 0:
                return None
            return sum(1 for b in vec if b & 1) * PAGE
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def bdi_read_ahead_path(path):
    """/sys/class/bdi/MAJ:MIN/read_ahead_kb of the filesystem holding path."""
    dev = os.stat(path).st_dev
    return f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"


def read_ahead_kb(path):
    try:
        with open(bdi_read_ahead_path(path)) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def proc_cpu_s(pid):
    """utime+stime (seconds) of a process, all threads; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    fields = s.rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state); utime = field 14, stime = field 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def find_daemon(mnt, local=None):
    """pid of the wfs process serving `mnt`: the pid the daemon writes to
    LOCAL_STORE/wfs.lock, else the process whose argv names `mnt`."""
    if local:
        try:
            with open(os.path.join(local, "wfs.lock")) as f:
                pid = int(f.read().split()[0])
            if os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "wfs":
                return pid
        except (OSError, ValueError, IndexError):
            pass
    mnt = os.path.realpath(mnt)
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == "wfs" and \
                any(os.path.realpath(a) == mnt for a in argv[1:] if a.startswith("/")):
            found.append(int(d))
    return min(found) if found else None


# --------------------------------------------------------------------------
# I/O primitives (the same code path for direct and wfs)

def seq_read(path, bs=MiB):
    """Read the whole file with bs-sized preads into one preallocated buffer."""
    buf = bytearray(bs)
    mv = [buf]
    fd = os.open(path, os.O_RDONLY)
    try:
        off = 0
        t0 = time.perf_counter()
        while True:
            n = os.preadv(fd, mv, off)
            if n <= 0:
                break
            off += n
        dt = time.perf_counter() - t0
    finally:
        os.close(fd)
    return off, dt


def mmap_read(path, chunk=MiB):
    """mmap the file and copy every byte out in chunk-sized memcpys (touches
    every page, like a loader copying tensors out of a safetensors mmap)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        t0 = time.perf_counter()
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        try:
            mv = memoryview(mm)
            buf = bytearray(chunk)
            off = 0
            while off < size:
                n = min(chunk, size - off)
                buf[:n] = mv[off:off + n]
                off += n
            mv.release()
        finally:
            mm.close()
        dt = time.perf_counter() - t0
    finally:
        os.close(fd)
    return size, dt


def rand_read(path, offsets, bs=4096):
    buf = bytearray(bs)
    mv = [buf]
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        for off in offsets:
            if os.preadv(fd, mv, off) != bs:
                raise IOError(f"short read at {off} in {path}")
        dt = time.perf_counter() - t0
    finally:
        os.close(fd)
    return len(offsets), dt


def tree_walk(root):
    """find + lstat: every entry below root, lstat each, recurse into dirs
    (never follows symlinks).  Returns (entries, seconds)."""
    t0 = time.perf_counter()
    n = 0
    stack = [root]
    lstat = os.lstat
    isdir = stat.S_ISDIR
    while stack:
        d = stack.pop()
        for e in os.scandir(d):
            p = e.path
            st = lstat(p)
            n += 1
            if isdir(st.st_mode):
                stack.append(p)
    return n, time.perf_counter() - t0


# --------------------------------------------------------------------------
# context and results

class Ctx:
    def __init__(self, args):
        self.args = args
        self.rows = []
        self.errors = []
        self.workdir = None
        self.fixture = None
        self.hub = None
        self.local = None
        self.mnt = None
        self.manifest = None
        self.big = None         # dict: path (mount-relative), nas_real, size
        self.daemon_pid = None
        self.read_ahead = None
        self.extra_mounts = []  # [{"mnt", "local"} (wfs) or {"mnt", "proc"} (bindfs)
        #                         or {"mnt"} (overlayfs)] mounted by a measurement
        self.alt_names = []     # comparison filesystems with columns in the table
        self.compare_info = None

    # paths of the big shard on each side
    def big_path(self, side):
        return os.path.join(self.hub, self.big["nas_real"]) if side == "direct" \
            else os.path.join(self.mnt, self.big["path"])

    def root(self, side):
        return self.hub if side == "direct" else self.mnt

    def order(self, rep, sides=("direct", "wfs")):
        """The sides rotated by rep: with two, direct first on even
        repetitions, wfs first on odd ones."""
        k = rep % len(sides)
        return tuple(sides[k:]) + tuple(sides[:k])

    def daemon_cpu(self):
        return proc_cpu_s(self.daemon_pid) if self.daemon_pid else None

    def run_side(self, side, fn):
        """Run fn() and return (result, daemon CPU seconds spent during it,
        client CPU seconds) -- daemon CPU only meaningful for side == wfs."""
        c0 = self.daemon_cpu()
        t0 = os.times()
        r = fn()
        t1 = os.times()
        c1 = self.daemon_cpu()
        dcpu = (c1 - c0) if (c0 is not None and c1 is not None) else None
        ccpu = (t1.user - t0.user) + (t1.system - t0.system)
        return r, dcpu, ccpu

    def row(self, metric, unit, direct, wfs, kind, note="", extra=None):
        """kind: 'rate' (higher better, ratio wfs/direct), 'time' (lower
        better, ratio = time wfs/direct), 'frac' (ratio wfs/direct, ideal in
        note), 'info' (no ratio)."""
        ratio = None
        if kind != "info" and direct not in (None, 0) and wfs is not None:
            ratio = wfs / direct
        r = {"metric": metric, "unit": unit, "direct": direct, "wfs": wfs,
             "ratio": ratio, "kind": kind, "note": note}
        if extra:
            r.update(extra)
        self.rows.append(r)
        log(f"  {metric}: direct={fmt(direct)} wfs={fmt(wfs)} ratio={fmt(ratio, 3)} {note}")


    def alt(self, metric, unit, kind, direct, values, note=""):
        """Comparison figures (compare): values = {fs name: value}, direct =
        the direct figure measured in the same pass.  Attached to the row of
        the same metric if the wfs figures made one, else a row without wfs."""
        r = next((x for x in self.rows if x["metric"] == metric), None)
        if r is None:
            self.row(metric, unit, direct, None, kind, note)
            r = self.rows[-1]
        elif note:
            r["note"] = (r["note"] + "; " if r["note"] else "") + note
        alt = r.setdefault("alt", {})
        for name, v in values.items():
            if name not in self.alt_names:
                self.alt_names.append(name)
            ratio = v / direct if (v is not None and direct not in (None, 0)) else None
            alt[name] = {"value": v, "direct": direct, "ratio": ratio}
            log(f"  {metric}: {name}={fmt(v)} direct={fmt(direct)} ratio={fmt(ratio, 3)}")


def fmt(v, digits=None):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if digits is not None:
        return f"{v:.{digits}f}"
    if isinstance(v, int):
        return str(v)
    a = abs(v)
    if a >= 1000:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


# --------------------------------------------------------------------------
# measurements: one function each

def seq_measure(ctx, paths, size):
    """Sequential 1 MiB reads, cold then warm; paths = {side: path}, sides
    interleaved (rotated every repetition).  Returns figures: [{"metric",
    "unit", "kind", "values": {side: best}, "daemon_cpu_s"}]."""
    sides = tuple(paths)
    best = {s: {"cold": 0.0, "warm": 0.0} for s in sides}
    dcpu = {"cold": None, "warm": None}
    for rep in range(ctx.args.repeat):
        for side in ctx.order(rep, sides):
            p = paths[side]
            drop_caches()
            (n, dt), dc, _ = ctx.run_side(side, lambda: seq_read(p))
            if n != size:
                raise IOError(f"{side}: read {n} bytes of {p}, expected {size}")
            best[side]["cold"] = max(best[side]["cold"], n / dt / 1e6)
            if side == "wfs":
                dcpu["cold"] = dc
            (n, dt), dc, _ = ctx.run_side(side, lambda: seq_read(p))
            best[side]["warm"] = max(best[side]["warm"], n / dt / 1e6)
            if side == "wfs":
                dcpu["warm"] = dc
    gib = size / (1 << 30)
    return [{"metric": f"seq read 1 MiB {k} ({gib:.2f} GiB)", "unit": "MB/s", "kind": "rate",
             "values": {s: best[s][k] for s in sides}, "daemon_cpu_s": dcpu[k]}
            for k in ("cold", "warm")]


def mmap_measure(ctx, paths):
    """mmap the file and touch (copy out) every page, cold."""
    sides = tuple(paths)
    best = {s: 0.0 for s in sides}
    dcpu = None
    for rep in range(ctx.args.repeat):
        for side in ctx.order(rep, sides):
            p = paths[side]
            drop_caches()
            (n, dt), dc, _ = ctx.run_side(side, lambda: mmap_read(p))
            best[side] = max(best[side], n / dt / 1e6)
            if side == "wfs":
                dcpu = dc
    return [{"metric": "mmap read cold (every page)", "unit": "MB/s", "kind": "rate",
             "values": best, "daemon_cpu_s": dcpu}]


def rand_measure(ctx, paths, size):
    """4 KiB random aligned preads, cold then warm; the same offsets (fixed
    seed) for every side."""
    sides = tuple(paths)
    rng = random.Random(ctx.args.seed)
    nblk = size // 4096
    offs = [rng.randrange(nblk) * 4096 for _ in range(ctx.args.random_count)]
    best = {s: {"cold": 0.0, "warm": 0.0} for s in sides}
    dcpu = {"cold": None, "warm": None}
    for rep in range(ctx.args.repeat):
        for side in ctx.order(rep, sides):
            p = paths[side]
            drop_caches()
            (n, dt), dc, _ = ctx.run_side(side, lambda: rand_read(p, offs))
            best[side]["cold"] = max(best[side]["cold"], n / dt)
            if side == "wfs":
                dcpu["cold"] = dc
            (n, dt), dc, _ = ctx.run_side(side, lambda: rand_read(p, offs))
            best[side]["warm"] = max(best[side]["warm"], n / dt)
            if side == "wfs":
                dcpu["warm"] = dc
    return [{"metric": f"rand read 4 KiB {k} ({len(offs)} ops)", "unit": "IOPS", "kind": "rate",
             "values": {s: best[s][k] for s in sides}, "daemon_cpu_s": dcpu[k]}
            for k in ("cold", "warm")]


def walk_measure(ctx, roots):
    """find + lstat over the whole tree below each root, cold (caches
    dropped) then warm; seconds, best of the repetitions."""
    sides = tuple(roots)
    best = {s: {"cold": None, "warm": None} for s in sides}
    count = {}
    dcpu = {"cold": None, "warm": None}
    for rep in range(ctx.args.repeat):
        for side in ctx.order(rep, sides):
            root = roots[side]
            drop_caches()
            for k in ("cold", "warm"):
                (n, dt), dc, _ = ctx.run_side(side, lambda: tree_walk(root))
                count[side] = n
                b = best[side][k]
                best[side][k] = dt if b is None else min(b, dt)
                if side == "wfs":
                    dcpu[k] = dc
    note = ""
    if len(set(count.values())) > 1:
        note = "ENTRY COUNT DIFFERS " + " ".join(f"{s}={count[s]}" for s in sides)
    return [{"metric": f"walk find+lstat {k} ({count.get('direct')} entries)", "unit": "s",
             "kind": "time", "values": {s: best[s][k] for s in sides},
             "daemon_cpu_s": dcpu[k], "note": note, "entries": count}
            for k in ("cold", "warm")]


def pagecache_measure(ctx, paths, size, nas_path):
    """Page-cache growth (MemInfo Cached) from one cold sequential read of
    each side's path, as a fraction of the file size, and what is resident
    afterwards of the NAS file and of the file read."""
    res = {}
    for side, p in paths.items():
        drop_caches()
        time.sleep(0.5)
        before = meminfo("Cached")
        seq_read(p)
        after = meminfo("Cached")
        nas_res = resident_bytes(nas_path)
        mnt_res = None
        if p != nas_path:
            try:
                mnt_res = resident_bytes(p)
            except OSError:
                mnt_res = None
        res[side] = {"growth": (after - before) / size,
                     "nas_resident": None if nas_res is None else nas_res / size,
                     "mnt_resident": None if mnt_res is None else mnt_res / size}
    return res


def row_figures(ctx, figs, prefix=""):
    """Rows for figures measured on the sides direct and wfs."""
    for f in figs:
        ctx.row(prefix + f["metric"], f["unit"], f["values"]["direct"], f["values"]["wfs"],
                f["kind"], f.get("note", ""),
                extra={"daemon_cpu_s": f["daemon_cpu_s"],
                       **({"entries": f["entries"]} if "entries" in f else {})})


def seq_figures(ctx, paths, size, prefix=""):
    row_figures(ctx, seq_measure(ctx, paths, size), prefix)


def mmap_figures(ctx, paths, prefix=""):
    row_figures(ctx, mmap_measure(ctx, paths), prefix)


def rand_figures(ctx, paths, size, prefix=""):
    row_figures(ctx, rand_measure(ctx, paths, size), prefix)


def nas_paths(ctx):
    return {s: ctx.big_path(s) for s in ("direct", "wfs")}


def m_seq(ctx):
    """Sequential 1 MiB reads of the largest shard (NAS-backed), cold then warm."""
    seq_figures(ctx, nas_paths(ctx), ctx.big["size"])


def m_mmap(ctx):
    """mmap the largest shard (NAS-backed) and touch every page, cold."""
    mmap_figures(ctx, nas_paths(ctx))


def m_rand(ctx):
    """4 KiB random aligned preads in the largest shard (NAS-backed)."""
    rand_figures(ctx, nas_paths(ctx), ctx.big["size"])


def m_walk(ctx):
    """find + lstat over the whole tree, cold (caches dropped) then warm."""
    figs = walk_measure(ctx, {s: ctx.root(s) for s in ("direct", "wfs")})
    for f in figs:
        f["note"] = "time ratio: lower is better" + ("; " + f["note"] if f["note"] else "")
    row_figures(ctx, figs)


PAGECACHE_METRIC = "page cache growth / file size (cold read)"


def m_pagecache(ctx):
    """Page-cache growth from one cold sequential read, as a fraction of the
    file size, and what stays resident of the NAS file after a mount read."""
    res = pagecache_measure(ctx, nas_paths(ctx), ctx.big["size"], ctx.big_path("direct"))
    ctx.row(PAGECACHE_METRIC, "x",
            res["direct"]["growth"], res["wfs"]["growth"], "frac",
            "ideal wfs ~1.0 (one copy); ~2.0 = two copies")
    ctx.row("NAS file resident after read / size", "x",
            res["direct"]["nas_resident"], res["wfs"]["nas_resident"], "info",
            "ideal wfs ~0 (fincore of the NAS file after the mount read)")
    ctx.row("mount file resident after read / size", "x",
            None, res["wfs"]["mnt_resident"], "info",
            "fincore of the file in the mount (- if not mmappable)")


# ---- promotion: wfsctl helpers and the figures that need it ---------------

def wfsctl(ctx, *args, check=True, timeout=3600):
    """Run `wfsctl --json ARGS...`; returns (rc, parsed JSON reply or None,
    stderr).  With check, a non-zero exit or an {"ok": false} reply raises."""
    cmd = [ctx.args.wfsctl, "--json"] + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    reply = None
    out = r.stdout.strip()
    if out:
        try:
            reply = json.loads(out)
        except ValueError:
            try:
                reply = json.loads(out.splitlines()[-1])
            except ValueError:
                reply = None
    if check and (r.returncode != 0 or (reply is not None and reply.get("ok") is False)):
        msg = (reply or {}).get("error") or r.stderr.strip() or out
        raise RuntimeError(f"{' '.join(cmd[1:])}: exit {r.returncode}: {msg}")
    return r.returncode, reply, r.stderr


def wfs_state(path):
    """xattr user.wfs.state of a file in the mount (follows links)."""
    return os.getxattr(path, "user.wfs.state").decode(errors="replace").rstrip("\0")


def wfs_xattr_int(path, name):
    """An integer xattr of a file in the mount (None if the daemon has none)."""
    try:
        return int(os.getxattr(path, name).decode().rstrip("\0"))
    except (OSError, ValueError):
        return None


def passthrough_opens(path):
    """user.wfs.passthrough while the file is open: > 0 when the kernel reads
    the local copy itself (FUSE passthrough), 0 when reads go to the daemon."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, 4096, 0)
        return wfs_xattr_int(path, "user.wfs.passthrough")
    finally:
        os.close(fd)


def evict(ctx, path):
    wfsctl(ctx, "evict", "--force", path)
    st = wfs_state(path)
    if st != "nas":
        raise RuntimeError(f"after wfsctl evict --force {path}: state {st}, expected nas")


def ensure_nas(ctx, path):
    if wfs_state(path) != "nas":
        log(f"  {path} is {wfs_state(path)}; evicting first")
        evict(ctx, path)


def promote_tree(ctx, mnt, rel, timeout=1800):
    """Promote every blob under mnt/rel and wait until all are local.  Uses
    `wfsctl promote --wait`; if that fails (e.g. a --wait progress request
    over the daemon's 64 KiB limit for ~400+ blobs), falls back to polling
    `wfsctl status`.  Returns (seconds, note or "")."""
    path = os.path.join(mnt, rel)
    repo = rel.split("/", 1)[0]
    t0 = time.perf_counter()
    rc, reply, err = wfsctl(ctx, "promote", "--wait", path, check=False, timeout=timeout)
    note = ""
    if rc != 0:
        first = err.strip().splitlines()[-1] if err.strip() else f"exit {rc}"
        log(f"  `wfsctl promote --wait {rel}` failed: {first}; waiting by polling status")
        note = "promote --wait FAILED"
        if "64 KiB" in first:
            note += " (progress request > 64 KiB)"
        note += "; polled status instead"
        if rc != 0 and (reply is None or reply.get("ok") is not True):
            # the queueing may not have happened: make sure it did
            wfsctl(ctx, "promote", path, check=False)
    deadline = t0 + timeout
    while True:
        _, st, _ = wfsctl(ctx, "status", path)
        r = next((x for x in st.get("repos", []) if x.get("repo") == repo), None)
        if r is None:
            raise RuntimeError(f"wfsctl status {path}: repo {repo} not listed")
        states = r.get("states", {})
        bad = {k: v for k, v in states.items() if k in ("failed", "mismatch", "nas")}
        busy = {k: v for k, v in states.items() if k in ("queued", "copying", "verifying")}
        if not busy:
            if bad:
                flagged = st.get("flagged", [])[:3]
                raise RuntimeError(f"promote {rel}: states {states}; flagged {flagged}")
            break
        if time.perf_counter() > deadline:
            raise RuntimeError(f"promote {rel}: still {states} after {timeout} s")
        time.sleep(0.05)
    return time.perf_counter() - t0, note


def sys_cpu():
    """Aggregate /proc/stat cpu jiffies: (busy, iowait, total)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq = v[:7]
    steal = v[7] if len(v) > 7 else 0
    total = sum(v[:8])
    return (user + nice + system + irq + softirq + steal, iowait, total)


def cpu_split(a, b):
    """System-wide fractions of all CPUs between two sys_cpu() samples."""
    dt = (b[2] - a[2]) or 1
    return {"busy": (b[0] - a[0]) / dt, "iowait": (b[1] - a[1]) / dt}


def run_cmd_timed(cmd):
    """Run cmd (check) and return (seconds, its CPU seconds, stdout)."""
    t0c = os.times()
    t0 = time.perf_counter()
    r = subprocess.run(cmd, check=True, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    t1c = os.times()
    cpu = (t1c.children_user - t0c.children_user) + (t1c.children_system - t0c.children_system)
    return dt, cpu, r.stdout


def local_copy_path(ctx, size):
    """The one file in LOCAL_STORE/data of this size (the big blob's copy)."""
    found = []
    for dirpath, _, names in os.walk(os.path.join(ctx.local, "data")):
        for n in names:
            p = os.path.join(dirpath, n)
            if os.lstat(p).st_size == size:
                found.append(p)
    if len(found) != 1:
        raise RuntimeError(f"expected one file of {size} bytes under {ctx.local}/data, "
                           f"found {len(found)}: {found[:3]}")
    return found[0]


def big_sha256(ctx):
    for e in ctx.manifest["entries"]:
        if e["path"] == ctx.big["path"]:
            return e.get("sha256")
    return None


def m_promote(ctx):
    """Promotion throughput of the big shard with all verification
    (`wfsctl promote --wait`: XXH3-128 while reading, fsync, O_DIRECT re-read,
    SHA-256 of the content address) vs `cp` of the same NAS file into the
    filesystem of LOCAL_STORE, `cp` + `sync`, `cp` + `sha256sum` of the copy,
    and cp + sha256sum + sync.  Caches dropped before each.  The copy is
    evicted after every promotion, so later figures see the NAS state."""
    size = ctx.big["size"]
    nas, mp = ctx.big_path("direct"), ctx.big_path("wfs")
    want = big_sha256(ctx)
    cpdir = os.path.join(ctx.workdir, "cp-baseline")
    os.makedirs(cpdir, exist_ok=True)
    dst = os.path.join(cpdir, "copy")
    same_fs = os.stat(cpdir).st_dev == os.stat(ctx.local).st_dev
    sv = os.statvfs(cpdir)
    if sv.f_bavail * sv.f_frsize < 2 * size + (256 << 20):
        raise Skip(f"not enough free space in {cpdir} for two copies of {size} bytes")
    ensure_nas(ctx, mp)
    # guest caches are dropped before every pass, but a VM's host may cache
    # the disk too: read the NAS file once, untimed, so that every pass
    # (promote and the baselines alike) starts from the same host state
    seq_read(nas)
    t = {k: None for k in ("wfs", "cp", "cp+sync", "cp+sha", "cp+sha+sync")}
    dcpu = None
    ccpu = {}
    split = {}

    def best(k, v):
        t[k] = v if t[k] is None else min(t[k], v)

    try:
        for rep in range(ctx.args.repeat):
            for side in ctx.order(rep):
                if side == "wfs":
                    drop_caches()
                    c0, s0 = ctx.daemon_cpu(), sys_cpu()
                    t0 = time.perf_counter()
                    _, reply, _ = wfsctl(ctx, "promote", "--wait", mp)
                    dt = time.perf_counter() - t0
                    c1, s1 = ctx.daemon_cpu(), sys_cpu()
                    st = wfs_state(mp)
                    if st != "local":
                        raise RuntimeError(f"after promote --wait: state {st}, expected local")
                    if t["wfs"] is None or dt < t["wfs"]:
                        dcpu = (c1 - c0) if None not in (c0, c1) else None
                        split["wfs"] = cpu_split(s0, s1)
                    best("wfs", dt)
                    log(f"  promote --wait: {dt:.2f} s, {size / dt / 1e6:.0f} MB/s, "
                        f"daemon CPU {fmt(dcpu, 2)} s")
                    evict(ctx, mp)
                else:
                    # cp, then sync
                    drop_caches()
                    s0 = sys_cpu()
                    t_cp, cpu_cp, _ = run_cmd_timed(["cp", nas, dst])
                    t_sync, _, _ = run_cmd_timed(["sync"])
                    s1 = sys_cpu()
                    if t["cp+sync"] is None or t_cp + t_sync < t["cp+sync"]:
                        split["cp+sync"] = cpu_split(s0, s1)
                        ccpu["cp"] = cpu_cp
                    best("cp", t_cp)
                    best("cp+sync", t_cp + t_sync)
                    os.unlink(dst)
                    os.sync()
                    # cp, sha256sum of the copy, then sync
                    drop_caches()
                    s0 = sys_cpu()
                    t_cp, _, _ = run_cmd_timed(["cp", nas, dst])
                    t_sha, cpu_sha, out = run_cmd_timed(["sha256sum", dst])
                    t_sync, _, _ = run_cmd_timed(["sync"])
                    s1 = sys_cpu()
                    got = out.split()[0] if out else ""
                    if want and got != want:
                        raise RuntimeError(f"sha256sum of the cp copy {got} != {want}")
                    if t["cp+sha"] is None or t_cp + t_sha < t["cp+sha"]:
                        split["cp+sha"] = cpu_split(s0, s1)
                        ccpu["sha256sum"] = cpu_sha
                    best("cp+sha", t_cp + t_sha)
                    best("cp+sha+sync", t_cp + t_sha + t_sync)
                    os.unlink(dst)
                    os.sync()
                    log(f"  cp {t['cp']:.2f} s, cp+sync {t['cp+sync']:.2f} s, cp+sha256sum "
                        f"{t['cp+sha']:.2f} s, +sync {t['cp+sha+sync']:.2f} s (best so far)")
    finally:
        if os.path.exists(dst):
            os.unlink(dst)
        try:
            if wfs_state(mp) != "nas":
                evict(ctx, mp)
        except (OSError, RuntimeError) as e:
            log(f"  evict after promote failed: {e}")
    mbs = {k: (size / v / 1e6 if v else None) for k, v in t.items()}
    gib = size / (1 << 30)
    fsnote = "" if same_fs else "; cp target NOT on LOCAL_STORE's fs"
    pw = split.get("wfs", {})
    ctx.row(f"promote --wait vs cp ({gib:.2f} GiB)", "MB/s", mbs["cp"], mbs["wfs"], "rate",
            f"direct = cp NAS->LOCAL_STORE fs{fsnote}; promote: sys CPU busy "
            f"{pw.get('busy', 0) * 100:.0f}% iowait {pw.get('iowait', 0) * 100:.0f}%; "
            f"cp CPU {fmt(ccpu.get('cp'), 2)} s",
            extra={"daemon_cpu_s": dcpu, "seconds": t, "same_fs": same_fs,
                   "cpu_split": split, "client_cpu_s": ccpu})
    ctx.row("promote --wait vs cp + sync", "MB/s", mbs["cp+sync"], mbs["wfs"], "rate",
            "direct = cp then sync (data on disk)", extra={"daemon_cpu_s": dcpu})
    ctx.row("promote --wait vs cp + sha256sum", "MB/s", mbs["cp+sha"], mbs["wfs"], "rate",
            f"direct = cp then sha256sum of the copy (page cache); "
            f"sha256sum CPU {fmt(ccpu.get('sha256sum'), 2)} s",
            extra={"daemon_cpu_s": dcpu})
    ctx.row("promote --wait vs cp + sha256sum + sync", "MB/s", mbs["cp+sha+sync"], mbs["wfs"],
            "rate", "direct = cp, sha256sum, sync; --wait polls every 0.25 s",
            extra={"daemon_cpu_s": dcpu})


def m_local(ctx):
    """Local-blob reads after promotion of the big shard: the same seq /
    mmap / rand figures as for the NAS, 'direct' = reading the verified
    copy LOCAL_STORE/data/xx/<hash> itself, 'wfs' = the file in the mount.
    Evicts the copy afterwards."""
    size = ctx.big["size"]
    mp = ctx.big_path("wfs")
    try:
        if wfs_state(mp) != "local":
            drop_caches()
            t0 = time.perf_counter()
            wfsctl(ctx, "promote", "--wait", mp)
            log(f"  promoted {ctx.big['path']} in {time.perf_counter() - t0:.2f} s")
        if wfs_state(mp) != "local":
            raise RuntimeError(f"{mp}: state {wfs_state(mp)} after promote, expected local")
        lp = local_copy_path(ctx, size)
        log(f"  local copy {lp}")
        # the copy holds the NAS bytes (spot check: head, middle, tail)
        with open(lp, "rb") as a, open(ctx.big_path("direct"), "rb") as b:
            for off in (0, size // 2, max(0, size - MiB)):
                a.seek(off)
                b.seek(off)
                if a.read(MiB) != b.read(MiB):
                    raise RuntimeError(f"local copy {lp} differs from the NAS file at {off}")
        _, st0, _ = wfsctl(ctx, "status", ctx.mnt)
        dr0 = wfs_xattr_int(mp, "user.wfs.daemon_reads")
        pt = passthrough_opens(mp)
        paths = {"direct": lp, "wfs": mp}
        seq_figures(ctx, paths, size, "local: ")
        mmap_figures(ctx, paths, "local: ")
        rand_figures(ctx, paths, size, "local: ")
        _, st1, _ = wfsctl(ctx, "status", ctx.mnt)
        dr1 = wfs_xattr_int(mp, "user.wfs.daemon_reads")
        st = wfs_state(mp)
        s0, s1 = st0.get("served", {}), st1.get("served", {})
        dl = s1.get("local_bytes", 0) - s0.get("local_bytes", 0)
        dn = s1.get("nas_bytes", 0) - s0.get("nas_bytes", 0)
        dr = None if None in (dr0, dr1) else dr1 - dr0
        how = ("kernel passthrough" if pt else "daemon-served") if pt is not None else "?"
        ctx.row("local: READ requests the daemon served", "count", None, dr, "info",
                f"reads were {how} (user.wfs.passthrough={fmt(pt)} while open); wfsctl "
                f"'served' delta: local {dl / (1 << 30):.2f} GiB, NAS {dn / (1 << 30):.2f} GiB; "
                f"state after: {st}",
                extra={"served_local_bytes": dl, "served_nas_bytes": dn,
                       "daemon_reads": dr, "passthrough_opens": pt})
        if st != "local":
            raise RuntimeError(f"{mp}: state {st} after the local reads, expected local")
    finally:
        try:
            if wfs_state(mp) != "nas":
                evict(ctx, mp)
        except (OSError, RuntimeError) as e:
            log(f"  evict after local failed: {e}")


def wait_daemon_exit(pid, timeout=10.0):
    if not pid:
        return True
    deadline = time.perf_counter() + timeout
    while pid_alive(pid):
        if time.perf_counter() > deadline:
            return False
        time.sleep(0.02)
    return True


def wfs_argv(a, hub, local, mnt, opts=()):
    """The daemon's command line: OPTS, then --wfs-opt (which may override)."""
    return [a.wfs] + sum((["-o", o] for o in list(opts) + list(a.wfs_opt)), []) + [hub, local, mnt]


def many_fixture(ctx, name, n):
    """A hub of its own, `mkhub --scale-mib 1 --many N` in WORKDIR/NAME,
    and where to mount it.  Returns (manifest, hub, the mount's record in
    ctx.extra_mounts ({"mnt", "local"}: cleaned up at exit), wfs argv,
    seconds the generator took)."""
    a = ctx.args
    d = os.path.join(ctx.workdir, name)
    fx = os.path.join(d, "fixture")
    os.makedirs(d, exist_ok=True)
    cmd = [a.mkhub, "--scale-mib", "1", "--many", str(n), "--seed", str(a.seed), fx]
    log("  generating:", " ".join(cmd))
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=sys.stderr)
    gen_s = time.perf_counter() - t0
    log(f"  generated in {gen_s:.1f} s")
    with open(os.path.join(fx, "manifest.json")) as f:
        man = json.load(f)
    hub = man.get("hub") or os.path.join(fx, "hub")
    local, mnt = os.path.join(d, "local"), os.path.join(d, "mnt")
    os.makedirs(mnt, exist_ok=True)
    m = {"mnt": mnt, "local": local}
    ctx.extra_mounts.append(m)
    return man, hub, m, wfs_argv(a, hub, local, mnt), gen_s


def m_startup(ctx):
    """Start-up with N verified blobs (--startup-many, default 1000): a
    separate fixture with `mkhub --many N`, its datasets--acme--many repo
    promoted, unmounted; then time `wfs` (returns when mounted) until
    `wfsctl status` answers and one promoted file reads back (right bytes)
    with user.wfs.state = local.  Cold (caches dropped) and warm; seconds."""
    a = ctx.args
    n = a.startup_many
    man, hub, m, wcmd, _ = many_fixture(ctx, "startup", n)
    local, mnt = m["local"], m["mnt"]
    repo = "datasets--acme--many"
    # a snapshot entry of the repo (a link to its blob), as a loader opens it
    probe = next((e for e in man["entries"] if e["path"].startswith(repo + "/snapshots/")
                  and e["type"] == "link" and e.get("follow") == "file"), None)
    if probe is None:
        raise RuntimeError(f"no snapshot link in {repo} of the startup fixture")
    probe_path = os.path.join(mnt, probe["path"])

    def do_mount():
        r = subprocess.run(wcmd, timeout=120, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"wfs exited {r.returncode}: {r.stderr.strip()}")

    def do_unmount():
        pid = find_daemon(mnt, local)
        subprocess.run(["umount", mnt], check=True, capture_output=True)
        if not wait_daemon_exit(pid):
            raise RuntimeError(f"daemon {pid} still alive 10 s after umount {mnt}")

    do_mount()
    drop_caches()
    dt, pnote = promote_tree(ctx, mnt, repo)
    _, st, _ = wfsctl(ctx, "status", mnt)
    r = next(x for x in st["repos"] if x["repo"] == repo)
    blobs = st.get("store", {}).get("blobs")
    log(f"  promoted {repo}: {r['local_files']}/{r['files']} files local, store blobs {blobs}, "
        f"in {dt:.2f} s")
    if wfs_state(probe_path) != "local":
        raise RuntimeError(f"{probe_path}: not local after promotion")
    do_unmount()

    res = {"cold": [], "warm": []}
    reps = max(a.repeat, 3)
    for rep in range(reps):
        for mode in ("cold", "warm"):
            if mode == "cold":
                drop_caches()
            t0 = time.perf_counter()
            do_mount()
            t1 = time.perf_counter()
            deadline = t0 + 30
            while True:
                rc, reply, _ = wfsctl(ctx, "status", mnt, check=False, timeout=30)
                if rc == 0 and reply and reply.get("ok"):
                    break
                if time.perf_counter() > deadline:
                    raise RuntimeError("wfsctl status did not answer within 30 s of mounting")
                time.sleep(0.01)
            t2 = time.perf_counter()
            while True:
                stt = wfs_state(probe_path)
                if stt == "local":
                    with open(probe_path, "rb") as f:
                        data = f.read()
                    if hashlib.sha256(data).hexdigest() != probe["sha256"]:
                        raise RuntimeError(f"{probe_path}: wrong bytes after remount")
                    if wfs_state(probe_path) == "local":
                        break
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"{probe_path}: state {stt} 30 s after mounting")
                time.sleep(0.01)
            t3 = time.perf_counter()
            pid = find_daemon(mnt, local)
            cpu = proc_cpu_s(pid) if pid else None
            lr = next((x for x in reply.get("repos", []) if x.get("repo") == repo), {})
            if lr.get("local_files") != r["local_files"]:
                log(f"  NOTE: first status shows {lr.get('local_files')} local files of "
                    f"{r['local_files']} promoted")
            res[mode].append({"total": t3 - t0, "mount": t1 - t0, "status": t2 - t1,
                              "read": t3 - t2, "daemon_cpu_s": cpu,
                              "local_files": lr.get("local_files"),
                              "store_blobs": reply.get("store", {}).get("blobs")})
            log(f"  startup {mode}: {t3 - t0:.3f} s (wfs {t1 - t0:.3f}, status {t2 - t1:.3f}, "
                f"read {t3 - t2:.3f}), daemon CPU {fmt(cpu, 2)} s, "
                f"{lr.get('local_files')} local files at first status")
            do_unmount()
    ctx.extra_mounts.remove(m)
    for i, mode in enumerate(("cold", "warm")):
        runs = res[mode]
        b = min(runs, key=lambda x: x["total"])
        worst = max(x["total"] for x in runs)
        ctx.row(f"startup {mode}, {r['local_files']} local blobs (store {blobs})", "s",
                None, b["total"], "info",
                f"target: well under 1 s; wfs {b['mount']:.3f} + status {b['status']:.3f} + "
                f"read {b['read']:.3f}; worst of {len(runs)} {worst:.3f}; "
                f"{b['local_files']} local at 1st status"
                + (f"; {pnote}" if pnote and i == 0 else ""),
                extra={"daemon_cpu_s": b["daemon_cpu_s"], "runs": runs,
                       "promote_s": dt, "promote_note": pnote})


# ---- comparison filesystems: kernel overlayfs and bindfs ------------------

def wait_mounted(mnt, proc=None, timeout=15.0):
    deadline = time.perf_counter() + timeout
    while not is_mounted(mnt):
        if proc is not None and proc.poll() is not None:
            return False
        if time.perf_counter() > deadline:
            return False
        time.sleep(0.05)
    return True


def mount_overlay(ctx, hub, mnt):
    """Read-only kernel overlayfs over the NAS hub (no upperdir).  Tries the
    NAS hub as the single lowerdir; kernels that want at least two lower
    layers without an upper one (6.18 says "at least 2 lowerdir are needed
    while upperdir nonexistent") get lowerdir=HUB:EMPTY, an empty directory
    below the hub.  Returns (None, the lowerdir used) or (reason, None)."""
    os.makedirs(mnt, exist_ok=True)
    empty = os.path.join(os.path.dirname(mnt), "overlay-empty")
    os.makedirs(empty, exist_ok=True)
    errs = []
    for lower, shown in ((hub, "NAS_HUB"), (f"{hub}:{empty}", "NAS_HUB:EMPTY")):
        cmd = ["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower}", mnt]
        log("  mounting:", " ".join(cmd))
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if r.returncode == 0 and is_mounted(mnt):
            ctx.extra_mounts.append({"mnt": mnt})
            return None, shown
        if is_mounted(mnt):
            subprocess.run(["umount", mnt], capture_output=True)
        errs.append(f"lowerdir={shown}: exit {r.returncode}: "
                    + " ".join(r.stderr.split()[:12]))
    return "mount -t overlay failed: " + "; ".join(errs), None


def ensure_bindfs(ctx):
    """Path of bindfs, installing the Debian package if missing (unless
    --no-install).  Returns (path or None, note)."""
    b = shutil.which("bindfs")
    if b:
        return b, ""
    if ctx.args.no_install:
        return None, "bindfs not installed (--no-install)"
    if not shutil.which("apt-get"):
        return None, "bindfs not installed and no apt-get"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    log("  bindfs missing: apt-get install -y bindfs")
    for cmds in ([["apt-get", "install", "-y", "-q", "bindfs"]],
                 [["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "bindfs"]]):
        try:
            for c in cmds:
                r = subprocess.run(c, capture_output=True, text=True, timeout=600, env=env,
                                   stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as e:
            r = None
            err = str(e)
        b = shutil.which("bindfs")
        if b:
            return b, "bindfs installed by the bench (apt-get)"
        err = r.stderr.strip().splitlines()[-1] if r is not None and r.stderr.strip() else \
            (err if r is None else f"exit {r.returncode}")
    return None, f"bindfs not installed and apt-get install failed: {err}"


def bindfs_version(b):
    try:
        r = subprocess.run([b, "--version"], capture_output=True, text=True, timeout=10)
        return (r.stdout or r.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "bindfs"


def mount_bindfs(ctx, b, hub, mnt):
    """bindfs -r (read-only mirror, default options otherwise) in the
    foreground as a child of ours, so its pid is known.  Returns (None, proc)
    or (reason, None)."""
    os.makedirs(mnt, exist_ok=True)
    logf = open(os.path.join(ctx.workdir, "bindfs.log"), "w")
    cmd = [b, "-f", "-r", hub, mnt]
    log("  mounting:", " ".join(cmd))
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                            start_new_session=True)
    logf.close()
    m = {"mnt": mnt, "proc": proc}
    ctx.extra_mounts.append(m)
    if not wait_mounted(mnt, proc):
        unmount_extra(ctx, m)
        with open(os.path.join(ctx.workdir, "bindfs.log")) as f:
            err = f.read().strip()
        return f"bindfs did not mount (exit {proc.returncode}): {' '.join(err.split())}", None
    if ctx.args.fuse_read_ahead_kb is not None:
        with open(bdi_read_ahead_path(mnt), "w") as f:
            f.write(f"{ctx.args.fuse_read_ahead_kb}\n")
    return None, proc


def m_compare(ctx):
    """The NAS-side read figures (seq cold/warm, mmap cold, rand 4 KiB
    cold/warm, walk cold/warm, page-cache growth) through kernel overlayfs
    (mount -t overlay, the NAS hub as its single read-only lowerdir) and
    bindfs (-r, default options; installed with apt-get if missing) over the
    same files, as ratios to direct measured in the same pass (sides
    interleaved).  They land in columns of the rows the wfs figures made."""
    hub = ctx.hub
    rel = ctx.big["nas_real"]
    size = ctx.big["size"]
    cdir = os.path.join(ctx.workdir, "compare")
    notes = []
    mnts = {}
    b, bnote = ensure_bindfs(ctx)
    if bnote:
        notes.append(bnote)
    try:
        why, lower = mount_overlay(ctx, hub, os.path.join(cdir, "overlay"))
        if why:
            notes.append(f"overlayfs rows skipped: {why}")
        else:
            mnts["overlayfs"] = os.path.join(cdir, "overlay")
        if b:
            why, proc = mount_bindfs(ctx, b, hub, os.path.join(cdir, "bindfs"))
            if why:
                notes.append(f"bindfs rows skipped: {why}")
            else:
                mnts["bindfs"] = os.path.join(cdir, "bindfs")
        else:
            notes.append("bindfs rows skipped")
        for n in notes:
            ctx.errors.append({"measurement": "compare", "status": "note", "message": n})
        if not mnts:
            raise Skip("; ".join(notes))
        ra = {k: read_ahead_kb(v) for k, v in mnts.items()}
        parts = []
        if "overlayfs" in mnts:
            parts.append(f"overlayfs = mount -t overlay -o lowerdir={lower} (read-only, "
                         "no upperdir" + (", EMPTY an empty dir: the kernel wants 2 lower "
                                          "layers without an upper" if ":" in lower else "")
                         + ")")
        if "bindfs" in mnts:
            parts.append(f"bindfs = {bindfs_version(b)} -r NAS_HUB (FUSE, default options), "
                         f"bdi read_ahead_kb {ra['bindfs']}")
        ctx.compare_info = "; ".join(parts)
        names = list(mnts)
        paths = {"direct": os.path.join(hub, rel)}
        paths.update({k: os.path.join(v, rel) for k, v in mnts.items()})
        for k, p in paths.items():
            if os.stat(p).st_size != size:
                raise RuntimeError(f"{k}: {p} is not {size} bytes")

        def alt_rows(figs):
            for f in figs:
                ctx.alt(f["metric"], f["unit"], f["kind"], f["values"]["direct"],
                        {k: f["values"][k] for k in names}, f.get("note", ""))

        alt_rows(seq_measure(ctx, paths, size))
        alt_rows(mmap_measure(ctx, paths))
        alt_rows(rand_measure(ctx, paths, size))
        roots = {"direct": hub}
        roots.update(mnts)
        alt_rows(walk_measure(ctx, roots))
        res = pagecache_measure(ctx, paths, size, paths["direct"])
        ctx.alt(PAGECACHE_METRIC, "x", "frac", res["direct"]["growth"],
                {k: res[k]["growth"] for k in names})
        for k in names:
            log(f"  {k}: NAS file resident after its read {fmt(res[k]['nas_resident'])}, "
                f"mount file {fmt(res[k]['mnt_resident'])} (x size)")
    finally:
        for m in [m for m in ctx.extra_mounts if m["mnt"].startswith(cdir + "/")]:
            unmount_extra(ctx, m)


# ---- daemon memory and idle CPU with a large hub ---------------------------

def proc_status(pid, keys=("VmRSS", "VmHWM", "RssAnon", "RssFile", "Threads")):
    """Fields of /proc/PID/status: kB fields in bytes, others as ints."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in keys:
                v = v.split()
                out[k] = int(v[0]) * (1024 if len(v) > 1 and v[1] == "kB" else 1)
    return out


def proc_ticks(pid):
    """utime+stime of a process in clock ticks (None if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


def m_memory(ctx):
    """Daemon memory with a large hub: a fixture of its own from `mkhub
    --scale-mib 1 --many N` (--memory-many, default 100,000), a fresh wfs
    mount, every entry walked through it (find + lstat, caches dropped
    first), then VmRSS of the daemon (pid from LOCAL_STORE/wfs.lock) against
    the 64 MiB target.  Then idle: --idle-seconds (default 10) of nothing,
    and the daemon's utime+stime delta over them (target ~0).  Finally the
    RSS again after dropping the kernel's caches (the kernel FORGETs the
    inodes: what the daemon gives back)."""
    a = ctx.args
    n = a.memory_many
    man, hub, m, wcmd, gen_s = many_fixture(ctx, "memory", n)
    local, mnt = m["local"], m["mnt"]
    del man
    try:
        log("  mounting:", " ".join(wcmd))
        r = subprocess.run(wcmd, timeout=120, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"wfs exited {r.returncode}: {r.stderr.strip()}")
        if not wait_mounted(mnt):
            raise RuntimeError(f"wfs returned 0 but {mnt} is not a mount")
        with open(os.path.join(local, "wfs.lock")) as f:
            pid = int(f.read().split()[0])
        if os.path.basename(os.readlink(f"/proc/{pid}/exe")) != "wfs":
            raise RuntimeError(f"pid {pid} in {local}/wfs.lock is not wfs")
        st0 = proc_status(pid)
        drop_caches()
        (nd, dtd) = tree_walk(hub)
        drop_caches()
        c0 = proc_cpu_s(pid)
        (nw, dtw) = tree_walk(mnt)
        walk_cpu = proc_cpu_s(pid) - c0
        st1 = proc_status(pid)
        log(f"  walked {nw} entries in {dtw:.2f} s (direct {nd} in {dtd:.2f} s); daemon "
            f"VmRSS {st0['VmRSS'] / MiB:.1f} MiB at mount -> {st1['VmRSS'] / MiB:.1f} MiB")
        k0, w0 = proc_ticks(pid), time.perf_counter()
        time.sleep(a.idle_seconds)
        k1, w1 = proc_ticks(pid), time.perf_counter()
        idle_ticks = k1 - k0
        idle_s = idle_ticks / os.sysconf("SC_CLK_TCK")
        st2 = proc_status(pid)
        drop_caches()
        time.sleep(2)
        st3 = proc_status(pid)
        log(f"  idle {w1 - w0:.1f} s: {idle_ticks} ticks ({idle_s:.2f} s) of daemon CPU; "
            f"VmRSS after dropping caches {st3['VmRSS'] / MiB:.1f} MiB")
    finally:
        unmount_extra(ctx, m)
    rss = st1["VmRSS"] / MiB
    target = 64
    verdict = "met" if rss <= target else f"NOT met ({rss / target:.1f}x the target)"
    cnote = "" if nd == nw else f"; ENTRY COUNT DIFFERS direct={nd} wfs={nw}"
    ctx.row(f"daemon VmRSS after walking {nw} entries ({n}-file hub)", "MiB", None, rss, "info",
            f"target <= {target} MiB: {verdict}; at mount {st0['VmRSS'] / MiB:.1f}, "
            f"anon {st1.get('RssAnon', 0) / MiB:.1f}, HWM {st1['VmHWM'] / MiB:.1f}, "
            f"{st1.get('Threads')} threads; walk {dtw:.1f} s vs direct {dtd:.1f} s; "
            f"fixture made in {gen_s:.0f} s{cnote}",
            extra={"daemon_cpu_s": walk_cpu, "status_at_mount": st0, "status_after_walk": st1,
                   "status_after_idle": st2, "status_after_drop": st3,
                   "entries": {"direct": nd, "wfs": nw}, "walk_s": {"direct": dtd, "wfs": dtw},
                   "mkhub_s": gen_s})
    ctx.row("daemon VmRSS after drop_caches (kernel forgot inodes)", "MiB", None,
            st3["VmRSS"] / MiB, "info", "what the daemon gives back once the kernel FORGETs")
    ctx.row(f"daemon CPU while idle {w1 - w0:.0f} s after the walk", "s", None, idle_s, "info",
            f"target ~0; utime+stime delta {idle_ticks} ticks "
            f"(1 tick = 1/{os.sysconf('SC_CLK_TCK')} s)",
            extra={"daemon_cpu_s": idle_s, "ticks": idle_ticks})


class Measurement:
    """needs_main: the measurement uses the main fixture and mount (when no
    selected one does, neither is made)."""
    def __init__(self, name, fn, default=True, needs_main=True):
        self.name, self.fn, self.default, self.needs_main = name, fn, default, needs_main


MEASUREMENTS = [
    Measurement("seq", m_seq),
    Measurement("mmap", m_mmap),
    Measurement("rand", m_rand),
    Measurement("walk", m_walk),
    Measurement("pagecache", m_pagecache),
    Measurement("compare", m_compare),
    Measurement("promote", m_promote),
    Measurement("local", m_local),
    Measurement("startup", m_startup, needs_main=False),
    Measurement("memory", m_memory, needs_main=False),
]


# --------------------------------------------------------------------------
# setup / teardown

def machine_info(workdir):
    mp, fstype, src = fs_of(workdir)
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"nproc": os.cpu_count(),
            "nproc_affinity": len(os.sched_getaffinity(0)),
            "cpu": cpu,
            "mem_total_bytes": meminfo("MemTotal"),
            "kernel": platform.release(),
            "workdir": workdir,
            "workdir_fs": f"{fstype} ({src} on {mp})",
            "python": platform.python_version(),
            "loadavg_start": loadavg()}


def generate(ctx):
    a = ctx.args
    if a.fixture:
        ctx.fixture = os.path.abspath(a.fixture)
        log(f"reusing fixture {ctx.fixture}")
    else:
        ctx.fixture = os.path.join(ctx.workdir, "fixture")
        cmd = [a.mkhub, "--scale-mib", str(a.size_mib), "--many", str(a.many),
               "--seed", str(a.seed), ctx.fixture]
        log("generating:", " ".join(cmd))
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        log(f"  generated in {time.perf_counter() - t0:.1f} s")
    with open(os.path.join(ctx.fixture, "manifest.json")) as f:
        ctx.manifest = json.load(f)
    ctx.hub = ctx.manifest.get("hub") or os.path.join(ctx.fixture, "hub")
    # the largest file the mount presents as a regular file, preferring
    # <repo>/blobs/<id> entries (what a loader ends up opening)
    files = [e for e in ctx.manifest["entries"] if e["type"] == "file"]
    if not files:
        raise RuntimeError("manifest lists no files")
    big = max(files, key=lambda e: (e["size"], "/blobs/" in e["path"]))
    ctx.big = {"path": big["path"], "nas_real": big.get("nas_real", big["path"]),
               "size": big["size"]}
    log(f"largest file: {big['path']} ({big['size'] / MiB:.0f} MiB), "
        f"NAS real {ctx.big['nas_real']}")
    if big["size"] < 2 << 30 and not a.quick:
        log(f"WARNING: largest file is {big['size'] / MiB:.0f} MiB, < 2 GiB "
            "(raise --size-mib)")


def mount(ctx):
    a = ctx.args
    ctx.local = os.path.join(ctx.workdir, "local")
    ctx.mnt = os.path.join(ctx.workdir, "mnt")
    os.makedirs(ctx.mnt, exist_ok=True)
    # NAS-path figures must stay NAS-path: nothing becomes local unless a
    # measurement promotes it (an --wfs-opt auto_promote=... overrides).
    cmd = wfs_argv(a, ctx.hub, ctx.local, ctx.mnt, ["auto_promote=off"])
    log("mounting:", " ".join(cmd))
    r = subprocess.run(cmd, timeout=120, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"wfs exited {r.returncode}: {r.stderr.strip()}")
    for _ in range(100):
        if is_mounted(ctx.mnt):
            break
        time.sleep(0.1)
    else:
        raise RuntimeError(f"wfs returned 0 but {ctx.mnt} is not a mount")
    ctx.daemon_pid = find_daemon(ctx.mnt, ctx.local)
    if a.fuse_read_ahead_kb is not None:
        with open(bdi_read_ahead_path(ctx.mnt), "w") as f:
            f.write(f"{a.fuse_read_ahead_kb}\n")
    ctx.read_ahead = {"direct_kb": read_ahead_kb(ctx.hub), "wfs_kb": read_ahead_kb(ctx.mnt)}
    log(f"  mounted ({fs_of(ctx.mnt)[1]}), daemon pid {ctx.daemon_pid}, "
        f"bdi read_ahead_kb direct={ctx.read_ahead['direct_kb']} wfs={ctx.read_ahead['wfs_kb']}")


def unmount_extra(ctx, m):
    """Unmount one of ctx.extra_mounts and forget it: a wfs mount ("local":
    its daemon is waited for), bindfs ("proc": our child, waited for, else
    SIGTERM), or a kernel mount (overlayfs)."""
    try:
        if "local" in m:
            unmount_one(m["mnt"], find_daemon(m["mnt"], m["local"])
                        if is_mounted(m["mnt"]) else None)
        else:
            unmount_one(m["mnt"], None)
        proc = m.get("proc")
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log(f"{proc.args[0]} {proc.pid} still alive after unmount; SIGTERM")
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    except OSError as e:
        log(f"unmounting {m['mnt']}: {e}")
    if m in ctx.extra_mounts:
        ctx.extra_mounts.remove(m)


def unmount(ctx):
    for m in list(reversed(ctx.extra_mounts)):
        unmount_extra(ctx, m)
    if not ctx.mnt:
        return
    unmount_one(ctx.mnt, ctx.daemon_pid)


def unmount_one(mnt, pid):
    if is_mounted(mnt):
        log(f"unmounting {mnt}")
        for cmd in (["umount", mnt], ["fusermount3", "-u", mnt],
                    ["umount", "-l", mnt]):
            if subprocess.run(cmd, capture_output=True).returncode == 0 and \
                    not is_mounted(mnt):
                break
            time.sleep(1)
    if pid:
        for _ in range(100):
            if not pid_alive(pid):
                break
            time.sleep(0.1)
        else:
            log(f"daemon {pid} still alive after unmount; SIGTERM")
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def cleanup(ctx):
    try:
        unmount(ctx)
    finally:
        if ctx.workdir and not ctx.args.keep:
            # every mount below the work dir, whoever made it: never rmtree into one
            wd = os.path.realpath(ctx.workdir)
            still = [mp for mp, _, _ in mountinfo() if mp == wd or mp.startswith(wd + "/")]
            if still:
                log(f"NOT removing {ctx.workdir}: {', '.join(still)} still mounted")
            else:
                shutil.rmtree(ctx.workdir, ignore_errors=True)
        elif ctx.workdir:
            log(f"kept {ctx.workdir}")


# --------------------------------------------------------------------------
# output

def print_table(ctx, machine, out):
    m = machine
    print(f"machine: nproc={m['nproc']} ({m['cpu']}), MemTotal={m['mem_total_bytes'] / (1 << 30):.1f} GiB, "
          f"kernel {m['kernel']}, work dir fs {m['workdir_fs']}", file=out)
    if ctx.read_ahead:
        print(f"bdi read_ahead_kb: direct {ctx.read_ahead['direct_kb']}, wfs mount "
              f"{ctx.read_ahead['wfs_kb']}; loadavg {m['loadavg_start']} at start, "
              f"{m.get('loadavg_end', '?')} at end", file=out)
    if ctx.big:
        print(f"big file: {ctx.big['path']} ({ctx.big['size'] / MiB:.0f} MiB); "
              f"repeat={ctx.args.repeat} (best of)", file=out)
    if ctx.compare_info:
        print(f"compare: {ctx.compare_info}", file=out)
    alts = ctx.alt_names
    head = ["metric", "unit", "direct", "wfs", "ratio"] + [f"{a} ratio" for a in alts] + \
        ["daemon CPU s", "note"]
    rows = []
    for r in ctx.rows:
        ratio = fmt(r["ratio"], 3) if r["ratio"] is not None else "-"
        if r["kind"] == "time" and r["ratio"] is not None:
            ratio += " (time)"
        acells = []
        for a in alts:
            x = r.get("alt", {}).get(a)
            acells.append(fmt(x["ratio"], 3) if x and x["ratio"] is not None else "-")
        rows.append([r["metric"], r["unit"], fmt(r["direct"]), fmt(r["wfs"]), ratio] + acells +
                    [fmt(r.get("daemon_cpu_s"), 2) if r.get("daemon_cpu_s") is not None else "-",
                     r["note"]])
    w = [max(len(str(x[i])) for x in rows + [head]) for i in range(len(head))]
    line = lambda x: " | ".join(str(c).ljust(w[i]) for i, c in enumerate(x)).rstrip()
    print(line(head), file=out)
    print("-+-".join("-" * n for n in w), file=out)
    for x in rows:
        print(line(x), file=out)
    print("ratio = wfs/direct; rates: higher is better (1.0 = parity); "
          "(time) rows: lower is better", file=out)
    if alts:
        print(", ".join(f"{a} ratio" for a in alts) + " = that filesystem/direct over the "
              "same NAS file or tree, with direct measured again in the same pass (sides "
              "interleaved), so each column is its own in-run comparison", file=out)
    if any(r["metric"].startswith("promote") for r in ctx.rows):
        print("promote rows: direct = the named baseline (cp of the NAS file into "
              "LOCAL_STORE's filesystem, caches dropped), wfs = wfsctl promote --wait",
              file=out)
    if any(r["metric"].startswith("local:") for r in ctx.rows):
        print("local: rows: after promotion; direct = reading the verified copy "
              "LOCAL_STORE/data/xx/<hash> itself, wfs = the file in the mount", file=out)
    for e in ctx.errors:
        print(f"{e['measurement']}: {e['status']}: {e['message']}", file=out)


# --------------------------------------------------------------------------

def parse_args(argv):
    names = [m.name for m in MEASUREMENTS]
    p = argparse.ArgumentParser(
        description="wfs benchmark: every figure as a ratio to reading the same NAS file "
                    "directly, in the same run. Needs root (drops caches, mounts).",
        epilog="measurements: " + ", ".join(
            f"{m.name}{'' if m.default else ' (off by default)'}" for m in MEASUREMENTS)
        + ". Environment: WFS_BIN (daemon, default build/fs/wfs), WFSCTL_BIN (client, "
        "default build/tools/wfsctl), WFS_MKHUB (generator).")
    p.add_argument("--dir", default="/var/tmp",
                   help="parent of the temporary work dir (default /var/tmp)")
    p.add_argument("--size-mib", type=int, default=None,
                   help="mkhub --scale-mib (default 4600: the largest shard is 0.45 of it, "
                        "so >= 2 GiB; 256 with --quick)")
    p.add_argument("--many", type=int, default=None,
                   help="mkhub --many (default 10000; 2000 with --quick)")
    p.add_argument("--seed", type=int, default=1, help="fixture and random-offset seed")
    p.add_argument("--repeat", type=int, default=1, help="repetitions per figure, best kept")
    p.add_argument("--random-count", type=int, default=20000, help="4 KiB random reads per pass")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: --size-mib 256 --many 2000 --random-count 5000")
    p.add_argument("--only", default=None,
                   help="comma-separated measurements to run (" + ",".join(names) + ")")
    p.add_argument("--fixture", default=None,
                   help="reuse an existing mkhub OUTDIR instead of generating (not deleted)")
    p.add_argument("--wfs-opt", action="append", default=[],
                   help="extra -o option for wfs (repeatable)")
    p.add_argument("--fuse-read-ahead-kb", type=int, default=None,
                   help="set the mount's /sys/class/bdi/.../read_ahead_kb after mounting "
                        "(default: leave the kernel's value; the header shows both sides)")
    p.add_argument("--startup-many", type=int, default=1000,
                   help="verified blobs for the startup figure (mkhub --many; default 1000)")
    p.add_argument("--memory-many", type=int, default=100000,
                   help="files in the hub of the memory figure (mkhub --many; "
                        "default 100000)")
    p.add_argument("--idle-seconds", type=float, default=10.0,
                   help="idle time over which the memory figure reads the daemon's CPU "
                        "(default 10)")
    p.add_argument("--no-install", action="store_true",
                   help="compare: do not apt-get install bindfs when it is missing "
                        "(its rows are then skipped)")
    p.add_argument("--keep", action="store_true", help="keep the work dir")
    p.add_argument("--json", action="store_true", help="print results as JSON on stdout")
    a = p.parse_args(argv)
    if a.size_mib is None:
        a.size_mib = 256 if a.quick else 4600
    if a.many is None:
        a.many = 2000 if a.quick else 10000
    if a.quick and a.random_count == 20000:
        a.random_count = 5000
    if a.only:
        sel = [s.strip() for s in a.only.split(",") if s.strip()]
        bad = [s for s in sel if s not in names]
        if bad:
            p.error(f"unknown measurement(s): {', '.join(bad)}")
        a.selected = [m for m in MEASUREMENTS if m.name in sel]
    else:
        a.selected = [m for m in MEASUREMENTS if m.default]
    a.wfs = os.environ.get("WFS_BIN", DEFAULT_WFS)
    a.mkhub = os.environ.get("WFS_MKHUB", DEFAULT_MKHUB)
    a.wfsctl = os.environ.get("WFSCTL_BIN", DEFAULT_WFSCTL)
    return a


def _on_signal(signum, frame):
    raise SystemExit(128 + signum)


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if os.geteuid() != 0:
        sys.exit("bench.py must run as root (drop_caches, mount)")
    need_ctl = any(m.name in ("promote", "local", "startup") for m in a.selected)
    for path, what in ((a.wfs, "WFS_BIN"), (a.mkhub, "WFS_MKHUB"), (a.wfsctl, "WFSCTL_BIN")):
        if what == "WFSCTL_BIN" and not need_ctl:
            continue
        if not (what == "WFS_MKHUB" and a.fixture and not any(
                m.name in ("startup", "memory") for m in a.selected)) and \
                not os.access(path, os.X_OK):
            sys.exit(f"{what}: {path} is not an executable")
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _on_signal)

    ctx = Ctx(a)
    os.makedirs(a.dir, exist_ok=True)
    ctx.workdir = tempfile.mkdtemp(prefix="wfs-bench-", dir=a.dir)
    machine = machine_info(ctx.workdir)
    log(f"work dir {ctx.workdir} ({machine['workdir_fs']})")
    t_start = time.perf_counter()
    rc = 0
    try:
        try:
            if any(m.needs_main for m in a.selected):
                generate(ctx)
                mount(ctx)
            else:
                log("no selected measurement needs the main fixture: not generated")
        except (OSError, RuntimeError, subprocess.SubprocessError, KeyError, ValueError) as e:
            log(f"setup failed: {type(e).__name__}: {e}")
            ctx.errors.append({"measurement": "setup", "status": "error",
                               "message": f"{type(e).__name__}: {e}"})
            rc = 2
            a.selected = []
        for m in a.selected:
            log(f"measuring {m.name}")
            try:
                m.fn(ctx)
                if ctx.daemon_pid and not pid_alive(ctx.daemon_pid):
                    raise RuntimeError("daemon died")
            except Skip as e:
                ctx.errors.append({"measurement": m.name, "status": "skipped", "message": str(e)})
                log(f"  skipped: {e}")
            except Exception as e:
                ctx.errors.append({"measurement": m.name, "status": "error",
                                   "message": f"{type(e).__name__}: {e}"})
                log(f"  ERROR: {type(e).__name__}: {e}")
                rc = 1
                if ctx.mnt and not is_mounted(ctx.mnt):
                    log("mount is gone; stopping")
                    break
    finally:
        cleanup(ctx)
    elapsed = time.perf_counter() - t_start
    machine["loadavg_end"] = loadavg()
    machine["read_ahead_kb"] = ctx.read_ahead
    if a.json:
        json.dump({"machine": machine,
                   "config": {"size_mib": a.size_mib, "many": a.many, "seed": a.seed,
                              "repeat": a.repeat, "random_count": a.random_count,
                              "wfs": a.wfs, "wfs_opt": a.wfs_opt, "mkhub": a.mkhub,
                              "wfsctl": a.wfsctl, "startup_many": a.startup_many,
                              "fuse_read_ahead_kb": a.fuse_read_ahead_kb,
                              "quick": a.quick, "big_file": ctx.big,
                              "measurements": [m.name for m in a.selected]},
                   "results": ctx.rows, "errors": ctx.errors,
                   "elapsed_s": elapsed}, sys.stdout, indent=2)
        print()
    else:
        print_table(ctx, machine, sys.stdout)
        print(f"elapsed {elapsed:.0f} s", file=sys.stdout)
    return rc


if __name__ == "__main__":
    sys.exit(main())
