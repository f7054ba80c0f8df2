"""wfs bench: what every figure is measured with.  The goals, the read
primitives both sides share, Ctx (a rig's fixture, mount and rows), abba()
(the pairs) and the rig's wfs mount.

Pairs: abba() visits the sides of a figure --pairs times (rounds), alternating
which side goes first (direct, wfs | wfs, direct | direct, wfs ...; with more
sides every other round runs in reverse), each visit starting from the same
state (caches dropped for cold figures, the same file).  Two rounds in a row
make an ABBA block; the ratio of a figure is the median over its blocks of
each block's ratio, the geometric mean of its two rounds' ratios (see
block_ratios() for why); lo-hi is the blocks' range.  A goal's verdict
stands on at least MIN_BLOCKS (5) blocks: on fewer it reads "met?" / "not
met?", and "(within spread)" when the goal's value lies inside lo-hi
(goal_flags(), verdict()).
"""

import hashlib
import math
import mmap
import os
import random
import stat
import subprocess
import threading
import time

from common import (bdi_read_ahead_path, drops_mark, find_daemon, fmt, foreign_drops, GiB,
                    is_mounted, log, median, MiB, proc_cpu_s, read_ahead_kb, unmount_one,
                    wait_daemon_exit, wait_mounted)


# --------------------------------------------------------------------------
# goals (issue 12 and, for the rows outside its table, the passthrough issue)

# key: (op, value, applies to "ratio" or "wfs", wording)
GOALS = {
    "nas.seq.cold": (">=", 0.90, "ratio"),
    "nas.seq.warm": (">=", 0.90, "ratio"),
    "nas.mmap.cold": (">=", 0.90, "ratio"),
    "nas.rand.cold": (">=", 0.90, "ratio"),
    "nas.rand.warm": (">=", 0.90, "ratio"),
    "walk.cold": ("<=", 1.50, "ratio"),
    "walk.warm": ("<=", 1.10, "ratio"),
    "pagecache": ("<=", 1.05, "wfs"),
    "local.seq.cold": (">=", 0.97, "ratio"),
    "local.seq.warm": (">=", 0.97, "ratio"),
    "local.mmap.cold": (">=", 0.95, "ratio"),
    "local.rand.cold": (">=", 0.90, "ratio"),
    "local.rand.warm": (">=", 0.90, "ratio"),
    "part.seq.cold": (">=", 0.90, "ratio"),
    "part.seq.warm": (">=", 0.90, "ratio"),
    "promote.blob": (">=", 0.80, "ratio"),
    "promote.rev": (">=", 0.70, "ratio"),
    "startup.cold": ("<=", 1.0, "wfs"),
    "startup.warm": ("<=", 1.0, "wfs"),
    "memory.rss": ("<=", 64.0, "wfs"),
    "memory.idle": ("<=", 0.05, "wfs"),
}


def goal_text(key):
    g = GOALS.get(key)
    if not g:
        return ""
    op, v, what = g
    return f"{op} {v:g}" + ("x" if what == "ratio" else "")


def goal_met(row):
    g = GOALS.get(row.get("key"))
    if not g:
        return None
    op, v, what = g
    x = row.get(what)
    if x is None:
        return None
    return x >= v if op == ">=" else x <= v


# a verdict stands on the median of at least this many ABBA blocks (ratio
# figures) or runs (startup); on fewer it is printed as "met?" / "not met?"
MIN_BLOCKS = 5


def goal_flags(row):
    """Why a row's verdict is not firm, as words for its cell: "few" (fewer
    than MIN_BLOCKS ABBA blocks, or startup runs: "1 block", "3 runs",
    "single rounds" where no block was complete) and "within spread" (the
    goal's value lies inside the row's lo-hi: blocks, or runs, fell on both
    sides of it).  [] for a firm verdict or a row without one."""
    g = GOALS.get(row.get("key"))
    if not g or row.get("met") is None:
        return []
    out = []
    if "blocks" in row:
        n, what = row["blocks"], "block"
    else:
        n, what = row.get("samples"), row.get("sample_kind", "run")
    if n is not None and n < MIN_BLOCKS:
        out.append(f"{n} {what}{'' if n == 1 else 's'}" if n else "single rounds")
    lo, hi = row.get("lo"), row.get("hi")
    if lo is not None and hi is not None and lo != hi and lo <= g[1] <= hi:
        out.append("within spread")
    return out


def verdict(row, bold=True):
    """The goal cell: "met" / "not met", "?" appended when it stands on
    fewer than MIN_BLOCKS blocks (or runs), then goal_flags() in brackets:
    "met? (2 blocks)", "not met (within spread)".  "" without a goal."""
    if row.get("met") is None:
        return ""
    flags = row.get("met_flags") or []
    few = any(f != "within spread" for f in flags)
    s = ("met" if row["met"] else "not met") + ("?" if few else "")
    if bold and not row["met"]:
        s = f"**{s}**"
    return s + (f" ({', '.join(flags)})" if flags else "")


# --------------------------------------------------------------------------
# I/O primitives (the same code path for every side)

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


def seq_read_range(path, off, length, bs=MiB):
    """Bytes [off, off+length) with bs-sized preads (the last one shorter)
    into one preallocated buffer.  Returns (bytes read, seconds)."""
    buf = bytearray(bs)
    mv = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        pos, end = off, off + length
        t0 = time.perf_counter()
        while pos < end:
            n = os.preadv(fd, [mv[:min(bs, end - pos)]], pos)
            if n <= 0:
                break
            pos += n
        dt = time.perf_counter() - t0
    finally:
        mv.release()
        os.close(fd)
    return pos - off, dt


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


_SHA_BUF = []


def sha256_rate(threads, per_thread=GiB):
    """MB/s of SHA-256 (hashlib, i.e. OpenSSL's, as the daemon's libcrypto)
    over a 64 MiB in-memory buffer: `threads` threads hash per_thread bytes
    each at once (hashlib drops the GIL while hashing)."""
    if not _SHA_BUF:
        _SHA_BUF.append(random.Random(7).randbytes(64 * MiB))
    buf = _SHA_BUF[0]
    reps = max(1, per_thread // len(buf))

    def work():
        h = hashlib.sha256()
        for _ in range(reps):
            h.update(buf)
        h.digest()

    ts = [threading.Thread(target=work) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    return threads * reps * len(buf) / dt / 1e6


def ncpu():
    return len(os.sched_getaffinity(0))


# --------------------------------------------------------------------------
# context, pairs and rows

def round_ratios(base, vals):
    """vals[i] / base[i] for each round, None where a side has no value."""
    return [v / b if b and v is not None else None for b, v in zip(base, vals)]


def block_ratios(per_round):
    """The ratio of each ABBA block: the geometric mean of the ratios of two
    rounds in a row, one with each side first.  Measured on these rigs (the
    'noise' figure, direct against itself), the side that reads second in a
    round can be 2.5x faster (the disk: the host caches what the first side
    read) or slower (the memory rig's NAS mmap cold in some runs; the cause
    is the host's, not known); that multiplies one round's ratio and divides the other's, so it
    cancels in the block, while a median of single rounds keeps it whenever
    one order is in the majority (an odd number of rounds).  A block with a
    round missing is left out, and so is a last round without its partner."""
    return [math.sqrt(a * b) for a, b in zip(per_round[0::2], per_round[1::2])
            if a is not None and b is not None and a > 0 and b > 0]


def ratio_fields(per_round):
    """ratio / lo / hi (over ABBA blocks) and round_median of a figure; with
    no complete block (a single round, or a round of every block missing),
    the rounds' own figures, and single_rounds True (the row says so)."""
    ratios = [x for x in per_round if x is not None]
    blocks = block_ratios(per_round)
    use = blocks or ratios
    return {"ratio": median(use), "lo": min(use) if use else None,
            "hi": max(use) if use else None, "blocks": len(blocks),
            "single_rounds": not blocks and bool(ratios),
            "round_median": median(ratios)}


def blocks_note(ctx, f):
    """What a row must say when its ratio is not the median of the header's
    --pairs/2 ABBA blocks: taken from single rounds (no block complete), or
    from fewer blocks (a round missing).  "" otherwise."""
    want = ctx.args.pairs // 2
    if f["single_rounds"]:
        return ("no complete ABBA block: ratio and lo-hi over single rounds, not blocks "
                "(the order a round took is not cancelled)")
    if f["blocks"] < want:
        return f"{f['blocks']} of {want} ABBA blocks complete (rounds missing)"
    return ""


class Ctx:
    """What the figures of one rig share: the rig, its fixture and mount,
    and the rows made."""

    def __init__(self, args, rig=None, workdir=None):
        self.args = args
        self.rig = rig
        self.workdir = workdir or (rig.dir if rig else None)
        self.rows = []
        self.errors = []
        self.fixture = None
        self.hub = None
        self.local = None
        self.mnt = None
        self.manifest = None
        self.big = None         # {"path" (mount-relative), "nas_real", "size"}
        self.shards = None      # the revision of rigs.add_shards_repo
        self.daemon_pid = None
        self.read_ahead = None
        self.extra_mounts = []  # [{"mnt", "local"} (wfs) or {"mnt", "proc"} (bindfs)
        #                         or {"mnt"} (overlayfs)] mounted by a measurement
        self.alt_names = []     # comparison filesystems with columns in the table
        self.compare_info = None

    def big_path(self, side):
        return os.path.join(self.hub, self.big["nas_real"]) if side == "direct" \
            else os.path.join(self.mnt, self.big["path"])

    def root(self, side):
        return self.hub if side == "direct" else self.mnt

    def daemon_cpu(self):
        return proc_cpu_s(self.daemon_pid) if self.daemon_pid else None

    def timed(self, side, fn):
        """fn() and the daemon CPU seconds it cost (side wfs only, else None)."""
        c0 = self.daemon_cpu() if side == "wfs" else None
        r = fn()
        c1 = self.daemon_cpu() if side == "wfs" else None
        return r, (c1 - c0) if None not in (c0, c1) else None

    def row(self, key, metric, unit, direct, wfs, kind, note="", extra=None):
        """A single figure.  kind: 'rate' (higher better, ratio wfs/direct),
        'time' (lower better, ratio = time wfs/direct), 'frac' (ratio
        wfs/direct), 'info' (no ratio)."""
        ratio = None
        if kind != "info" and direct not in (None, 0) and wfs is not None:
            ratio = wfs / direct
        r = {"key": key, "metric": metric, "unit": unit, "direct": direct, "wfs": wfs,
             "ratio": ratio, "lo": None, "hi": None, "pairs": None, "kind": kind,
             "note": note, "goal": goal_text(key)}
        if extra:
            r.update(extra)
        r["met"] = goal_met(r)
        r["met_flags"] = goal_flags(r)
        self.rows.append(r)
        log(f"  {metric}: direct={fmt(direct)} wfs={fmt(wfs)} ratio={fmt(ratio, 3)} {note}")
        return r

    def pair_row(self, key, metric, unit, kind, base, vals, cpu=None, note="", extra=None,
                 res=None):
        """A figure measured in rounds: base[i] and vals[i] from round i.
        direct/wfs = medians, ratio = median of the ABBA blocks' ratios
        (block_ratios), lo-hi their range, daemon_cpu_s = median of cpu[i].
        The rounds' own ratios are kept too (ratios, round_median).  res: the
        Rounds measured (its redone / disturbed rounds are noted)."""
        if res is not None and res.note():
            note = (note + "; " if note else "") + res.note()
        per_round = round_ratios(base, vals)
        ratios = [x for x in per_round if x is not None]
        f = ratio_fields(per_round)
        bnote = blocks_note(self, f)
        if bnote:
            note = (note + "; " if note else "") + bnote
        r = {"key": key, "metric": metric, "unit": unit, "kind": kind,
             "direct": median(base), "wfs": median(vals), **f,
             "pairs": len(ratios), "ratios": ratios, "values": {"direct": base, "wfs": vals},
             "daemon_cpu_s": median(cpu) if cpu else None, "note": note,
             "goal": goal_text(key)}
        if extra:
            r.update(extra)
        r["met"] = goal_met(r)
        r["met_flags"] = goal_flags(r)
        self.rows.append(r)
        log(f"  {metric}: direct={fmt(r['direct'])} wfs={fmt(r['wfs'])} "
            f"ratio={fmt(r['ratio'], 3)} ({fmt(r['lo'], 3)}-{fmt(r['hi'], 3)}, "
            f"{r['blocks']} blocks of {len(ratios)} rounds; rounds "
            f"{' '.join(fmt(x, 2) for x in ratios)}) {note}")
        return r

    def alt(self, key, metric, unit, kind, name, base, vals, note=""):
        """Comparison figures: a filesystem `name` and direct measured in the
        same pairs, attached to the row of `key` (made without wfs figures if
        there is none)."""
        r = next((x for x in self.rows if x["key"] == key), None)
        if r is None:
            r = self.row(key, metric, unit, median(base), None, kind, note)
        elif note and f"compare rounds: {note}" not in r["note"]:
            r["note"] = (r["note"] + "; " if r["note"] else "") + f"compare rounds: {note}"
        per_round = round_ratios(base, vals)
        if name not in self.alt_names:
            self.alt_names.append(name)
        f = ratio_fields(per_round)
        # a figure of one visit (pagecache) has no blocks by design
        bnote = blocks_note(self, f) if len(per_round) > 1 else ""
        if bnote and f"{name}: {bnote}" not in r["note"]:
            r["note"] = (r["note"] + "; " if r["note"] else "") + f"{name}: {bnote}"
        x = r.setdefault("alt", {})[name] = {
            "value": median(vals), "direct": median(base), **f,
            "ratios": [v for v in per_round if v is not None]}
        log(f"  {metric}: {name}={fmt(median(vals))} ratio={fmt(x['ratio'], 3)}")


class Rounds(dict):
    """{side: [dict per round]}, and how many rounds were redone / kept
    though disturbed."""
    redone = 0
    disturbed = 0

    def note(self):
        out = []
        if self.redone:
            out.append(f"{self.redone} round(s) redone: another process dropped caches "
                       "during them")
        if self.disturbed:
            out.append(f"{self.disturbed} round(s) kept though another process dropped "
                       "caches during them (--redo exhausted)")
        return "; ".join(out)


def abba(ctx, sides, visit, n=None):
    """Visit every side n (--pairs) times; round i in the order of `sides`
    when i is even, reversed when odd (two sides: A B, B A, A B, ...).
    visit(side) -> dict of figures.  A round during which another process
    dropped the caches (its cold/warm state is then not what the visit set
    up) is measured again, at most --redo times a figure.  Returns
    Rounds {side: [dict per round]}."""
    n = n or ctx.args.pairs
    sides = tuple(sides)
    out = Rounds({s: [] for s in sides})
    i = 0
    while i < n:
        mark = drops_mark()
        got = {}
        for s in (sides if i % 2 == 0 else sides[::-1]):
            got[s] = visit(s)
        foreign = foreign_drops(mark)
        if foreign:
            if out.redone < ctx.args.redo:
                out.redone += 1
                log(f"  round {i + 1}: another process dropped caches {foreign} time(s) "
                    "during it: measuring it again")
                continue
            out.disturbed += 1
        for s in sides:
            out[s].append(got[s])
        i += 1
    return out


def col(res, side, k):
    return [v.get(k) for v in res[side]]


def gib_s(size):
    return f"{size / GiB:.2f} GiB"


def wfs_argv(a, hub, local, mnt, opts=()):
    """The daemon's command line: OPTS, then --wfs-opt (which may override)."""
    return [a.wfs] + sum((["-o", o] for o in list(opts) + list(a.wfs_opt)), []) + [hub, local, mnt]


# ---- mounts -----------------------------------------------------------------

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


def mount_main(ctx):
    """The rig's wfs mount of the fixture, auto_promote=off: NAS-served
    figures must stay NAS-served; nothing becomes local unless a figure
    promotes it (an --wfs-opt auto_promote=... overrides)."""
    a = ctx.args
    ctx.local = os.path.join(ctx.rig.store_root, "local")
    ctx.mnt = os.path.join(ctx.rig.mnt_root, "wfs")
    os.makedirs(ctx.mnt, exist_ok=True)
    cmd = wfs_argv(a, ctx.hub, ctx.local, ctx.mnt, ["auto_promote=off"])
    log("mounting:", " ".join(cmd))
    r = subprocess.run(cmd, timeout=120, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"wfs exited {r.returncode}: {r.stderr.strip()}")
    if not wait_mounted(ctx.mnt, timeout=10):
        raise RuntimeError(f"wfs returned 0 but {ctx.mnt} is not a mount")
    ctx.daemon_pid = find_daemon(ctx.mnt, ctx.local)
    if a.fuse_read_ahead_kb is not None:
        with open(bdi_read_ahead_path(ctx.mnt), "w") as f:
            f.write(f"{a.fuse_read_ahead_kb}\n")
        want = a.fuse_read_ahead_kb
    else:
        # the daemon sets the mount's read-ahead itself (-o readahead_kb,
        # default 4096) once FUSE's INIT is done: give it a moment, and say
        # so if it does not hold
        want = 4096
        for o in a.wfs_opt:
            if o.startswith("readahead_kb="):
                want = int(o.split("=", 1)[1])
        deadline = time.perf_counter() + 3
        while read_ahead_kb(ctx.mnt) != want and time.perf_counter() < deadline:
            time.sleep(0.05)
    ctx.read_ahead = {"direct_kb": read_ahead_kb(ctx.hub), "wfs_kb": read_ahead_kb(ctx.mnt),
                      "local_kb": read_ahead_kb(ctx.local), "wfs_wanted_kb": want}
    if ctx.read_ahead["wfs_kb"] != want:
        log(f"  WARNING: the mount's read_ahead_kb is {ctx.read_ahead['wfs_kb']}, wfs asked "
            f"for {want}: measuring it as it is")
    log(f"  mounted, daemon pid {ctx.daemon_pid}, bdi read_ahead_kb "
        f"NAS={ctx.read_ahead['direct_kb']} mount={ctx.read_ahead['wfs_kb']} "
        f"LOCAL_STORE={ctx.read_ahead['local_kb']}")


def unmount_all(ctx):
    if ctx.read_ahead and ctx.mnt and is_mounted(ctx.mnt):
        ctx.read_ahead["wfs_kb_at_end"] = read_ahead_kb(ctx.mnt)
    for m in list(reversed(ctx.extra_mounts)):
        unmount_extra(ctx, m)
    if ctx.mnt and is_mounted(ctx.mnt):
        unmount_one(ctx.mnt, ctx.daemon_pid)
    elif ctx.daemon_pid:
        wait_daemon_exit(ctx.daemon_pid)
