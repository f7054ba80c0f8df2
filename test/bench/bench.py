#!/usr/bin/env python3
"""wfs benchmark harness.

Generates a NAS hub fixture with tools/wfs-mkhub, mounts it with the wfs
daemon, and measures every figure twice in the same run: once reading the NAS
file directly ("direct") and once through the mount ("wfs").  Each figure is
reported as a ratio wfs/direct.

Throughput figures: ratio = wfs/direct, higher is better (1.00 = parity).
Time figures (metadata walk): ratio = time wfs/direct, LOWER is better.
Page-cache figures: fractions of the file size; the ideal is stated per row.

Cold measurements drop the kernel caches first (sync; echo 3 >
/proc/sys/vm/drop_caches), so the harness must run as root.

Extension point: every figure is a function `m_<name>(ctx)` registered in
MEASUREMENTS below.  A measurement adds rows with ctx.row(...).  To add a
figure (e.g. local-blob reads after promotion, promotion throughput vs cp and
cp+sha256sum), write a function and append a Measurement to the list; see the
placeholders at the end of the list.

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
DEFAULT_MKHUB = os.path.join(REPO, "tools", "wfs-mkhub")
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

    # paths of the big shard on each side
    def big_path(self, side):
        return os.path.join(self.hub, self.big["nas_real"]) if side == "direct" \
            else os.path.join(self.mnt, self.big["path"])

    def root(self, side):
        return self.hub if side == "direct" else self.mnt

    def order(self, rep):
        """Direct first on even repetitions, wfs first on odd ones."""
        return ("direct", "wfs") if rep % 2 == 0 else ("wfs", "direct")

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

def m_seq(ctx):
    """Sequential 1 MiB reads of the largest shard, cold then warm."""
    path_d, size = ctx.big_path("direct"), ctx.big["size"]
    best = {s: {"cold": 0.0, "warm": 0.0} for s in ("direct", "wfs")}
    dcpu = {"cold": None, "warm": None}
    for rep in range(ctx.args.repeat):
        for side in ctx.order(rep):
            p = ctx.big_path(side)
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
    for k in ("cold", "warm"):
        ctx.row(f"seq read 1 MiB {k} ({gib:.2f} GiB)", "MB/s",
                best["direct"][k], best["wfs"][k], "rate",
                extra={"daemon_cpu_s": dcpu[k]})


def m_mmap(ctx):
    """mmap the largest shard and touch (copy out) every page, cold."""
    best = {"direct": 0.0, "wfs": 0.0}
    dcpu = None
    for rep in range(ctx.args.repeat):
        for side in ctx.order(rep):
            p = ctx.big_path(side)
            drop_caches()
            (n, dt), dc, _ = ctx.run_side(side, lambda: mmap_read(p))
            best[side] = max(best[side], n / dt / 1e6)
            if side == "wfs":
                dcpu = dc
    ctx.row("mmap read cold (every page)", "MB/s", best["direct"], best["wfs"], "rate",
            extra={"daemon_cpu_s": dcpu})


def m_rand(ctx):
    """4 KiB random aligned preads in the largest shard, cold then warm;
    the same offsets (fixed seed) for both sides."""
    size = ctx.big["size"]
    rng = random.Random(ctx.args.seed)
    nblk = size // 4096
    offs = [rng.randrange(nblk) * 4096 for _ in range(ctx.args.random_count)]
    best = {s: {"cold": 0.0, "warm": 0.0} for s in ("direct", "wfs")}
    dcpu = {"cold": None, "warm": None}
    for rep in range(ctx.args.repeat):
        for side in ctx.order(rep):
            p = ctx.big_path(side)
            drop_caches()
            (n, dt), dc, _ = ctx.run_side(side, lambda: rand_read(p, offs))
            best[side]["cold"] = max(best[side]["cold"], n / dt)
            if side == "wfs":
                dcpu["cold"] = dc
            (n, dt), dc, _ = ctx.run_side(side, lambda: rand_read(p, offs))
            best[side]["warm"] = max(best[side]["warm"], n / dt)
            if side == "wfs":
                dcpu["warm"] = dc
    for k in ("cold", "warm"):
        ctx.row(f"rand read 4 KiB {k} ({len(offs)} ops)", "IOPS",
                best["direct"][k], best["wfs"][k], "rate",
                extra={"daemon_cpu_s": dcpu[k]})


def m_walk(ctx):
    """find + lstat over the whole tree, cold (caches dropped) then warm."""
    best = {s: {"cold": None, "warm": None} for s in ("direct", "wfs")}
    count = {}
    dcpu = {"cold": None, "warm": None}
    for rep in range(ctx.args.repeat):
        for side in ctx.order(rep):
            root = ctx.root(side)
            drop_caches()
            for k in ("cold", "warm"):
                (n, dt), dc, _ = ctx.run_side(side, lambda: tree_walk(root))
                count[side] = n
                b = best[side][k]
                best[side][k] = dt if b is None else min(b, dt)
                if side == "wfs":
                    dcpu[k] = dc
    note = "time ratio: lower is better"
    if count.get("direct") != count.get("wfs"):
        note += f"; ENTRY COUNT DIFFERS direct={count.get('direct')} wfs={count.get('wfs')}"
    for k in ("cold", "warm"):
        ctx.row(f"walk find+lstat {k} ({count.get('direct')} entries)", "s",
                best["direct"][k], best["wfs"][k], "time", note,
                extra={"daemon_cpu_s": dcpu[k], "entries": count})


def m_pagecache(ctx):
    """Page-cache growth from one cold sequential read, as a fraction of the
    file size, and what stays resident of the NAS file after a mount read."""
    size = ctx.big["size"]
    res = {}
    for side in ("direct", "wfs"):
        p = ctx.big_path(side)
        drop_caches()
        time.sleep(0.5)
        before = meminfo("Cached")
        seq_read(p)
        after = meminfo("Cached")
        nas_res = resident_bytes(ctx.big_path("direct"))
        mnt_res = None
        if side == "wfs":
            try:
                mnt_res = resident_bytes(p)
            except OSError:
                mnt_res = None
        res[side] = {"growth": (after - before) / size,
                     "nas_resident": None if nas_res is None else nas_res / size,
                     "mnt_resident": None if mnt_res is None else mnt_res / size}
    ctx.row("page cache growth / file size (cold read)", "x",
            res["direct"]["growth"], res["wfs"]["growth"], "frac",
            "ideal wfs ~1.0 (one copy); ~2.0 = two copies")
    ctx.row("NAS file resident after read / size", "x",
            res["direct"]["nas_resident"], res["wfs"]["nas_resident"], "info",
            "ideal wfs ~0 (fincore of the NAS file after the mount read)")
    ctx.row("mount file resident after read / size", "x",
            None, res["wfs"]["mnt_resident"], "info",
            "fincore of the file in the mount (- if not mmappable)")


# ---- placeholders for later figures (not run by default) ------------------

def m_local(ctx):
    """TODO: local-blob reads after promotion.  Promote the big blob
    (wfsctl promote ... --wait), then repeat m_seq / m_mmap / m_rand against
    the mount; 'direct' = the same bytes read from LOCAL_STORE directly (the
    local copy), so the ratio shows what passthrough achieves."""
    raise Skip("needs wfsctl promote (not available yet)")


def m_promote(ctx):
    """TODO: promotion throughput vs `cp` and `cp + sha256sum` of the same
    NAS file into the same LOCAL_STORE filesystem (caches dropped before
    each): rows 'promote vs cp' and 'promote vs cp+sha256sum' (MB/s)."""
    raise Skip("needs wfsctl promote (not available yet)")


class Measurement:
    def __init__(self, name, fn, default=True):
        self.name, self.fn, self.default = name, fn, default


MEASUREMENTS = [
    Measurement("seq", m_seq),
    Measurement("mmap", m_mmap),
    Measurement("rand", m_rand),
    Measurement("walk", m_walk),
    Measurement("pagecache", m_pagecache),
    # later figures: implement the function, then set default=True
    Measurement("local", m_local, default=False),
    Measurement("promote", m_promote, default=False),
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
    cmd = [a.wfs] + sum((["-o", o] for o in a.wfs_opt), []) + [ctx.hub, ctx.local, ctx.mnt]
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


def unmount(ctx):
    if not ctx.mnt:
        return
    pid = ctx.daemon_pid
    if is_mounted(ctx.mnt):
        log(f"unmounting {ctx.mnt}")
        for cmd in (["umount", ctx.mnt], ["fusermount3", "-u", ctx.mnt],
                    ["umount", "-l", ctx.mnt]):
            if subprocess.run(cmd, capture_output=True).returncode == 0 and \
                    not is_mounted(ctx.mnt):
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
            if ctx.mnt and is_mounted(ctx.mnt):
                log(f"NOT removing {ctx.workdir}: {ctx.mnt} is still mounted")
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
    head = ["metric", "unit", "direct", "wfs", "ratio", "daemon CPU s", "note"]
    rows = []
    for r in ctx.rows:
        ratio = fmt(r["ratio"], 3) if r["ratio"] is not None else "-"
        if r["kind"] == "time" and r["ratio"] is not None:
            ratio += " (time)"
        rows.append([r["metric"], r["unit"], fmt(r["direct"]), fmt(r["wfs"]), ratio,
                     fmt(r.get("daemon_cpu_s"), 2) if r.get("daemon_cpu_s") is not None else "-",
                     r["note"]])
    w = [max(len(str(x[i])) for x in rows + [head]) for i in range(len(head))]
    line = lambda x: " | ".join(str(c).ljust(w[i]) for i, c in enumerate(x)).rstrip()
    print(line(head), file=out)
    print("-+-".join("-" * n for n in w), file=out)
    for x in rows:
        print(line(x), file=out)
    print("ratio = wfs/direct; rates: higher is better (1.0 = parity); "
          "(time) rows: lower is better", file=out)
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
        + ". Environment: WFS_BIN (daemon, default build/fs/wfs), WFS_MKHUB (generator).")
    p.add_argument("--dir", default="/var/tmp",
                   help="parent of the temporary work dir (default /var/tmp)")
    p.add_argument("--size-mib", type=int, default=None,
                   help="wfs-mkhub --scale-mib (default 4600: the largest shard is 0.45 of it, "
                        "so >= 2 GiB; 256 with --quick)")
    p.add_argument("--many", type=int, default=None,
                   help="wfs-mkhub --many (default 10000; 2000 with --quick)")
    p.add_argument("--seed", type=int, default=1, help="fixture and random-offset seed")
    p.add_argument("--repeat", type=int, default=1, help="repetitions per figure, best kept")
    p.add_argument("--random-count", type=int, default=20000, help="4 KiB random reads per pass")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: --size-mib 256 --many 2000 --random-count 5000")
    p.add_argument("--only", default=None,
                   help="comma-separated measurements to run (" + ",".join(names) + ")")
    p.add_argument("--fixture", default=None,
                   help="reuse an existing wfs-mkhub OUTDIR instead of generating (not deleted)")
    p.add_argument("--wfs-opt", action="append", default=[],
                   help="extra -o option for wfs (repeatable)")
    p.add_argument("--fuse-read-ahead-kb", type=int, default=None,
                   help="set the mount's /sys/class/bdi/.../read_ahead_kb after mounting "
                        "(default: leave the kernel's value; the header shows both sides)")
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
    return a


def _on_signal(signum, frame):
    raise SystemExit(128 + signum)


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if os.geteuid() != 0:
        sys.exit("bench.py must run as root (drop_caches, mount)")
    for path, what in ((a.wfs, "WFS_BIN"), (a.mkhub, "WFS_MKHUB")):
        if not (what == "WFS_MKHUB" and a.fixture) and not os.access(path, os.X_OK):
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
            generate(ctx)
            mount(ctx)
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
                if not is_mounted(ctx.mnt):
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
