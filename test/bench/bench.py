#!/usr/bin/env python3
"""wfs benchmark harness.

Generates a NAS hub fixture with test/mkhub on each rig, mounts it with the
wfs daemon, and measures every figure on both sides in the same run: once
reading the NAS file directly ("direct") and once through the mount ("wfs").
Each figure is reported as a ratio wfs/direct, against its goal (issue 12).

Rigs (--rig disk|mem|both, default both; rigs.py): the same figures on each,
one table each.
  disk  NAS hub and LOCAL_STORE in the work dir (--dir, default /var/tmp):
        the VM's disk, which has a host cache.
  mem   NAS hub and LOCAL_STORE each on its own ext4 on a loop device
        (losetup --direct-io=on) over a file in a tmpfs the bench mounts
        itself: NVMe-class storage.  Sized from the fixture; refused with a
        message when MemAvailable is short; torn down after its figures, on
        errors and on Ctrl-C.

Pairs (--pairs N, default 10): a ratio figure is measured in N rounds, the
side that goes first alternating (direct, wfs | wfs, direct | ...), each
side from the same state (the same file; for cold figures caches dropped
with sync; echo 3 > /proc/sys/vm/drop_caches right before it).  Two rounds
in a row, one with each side first, make an ABBA block, whose ratio is the
geometric mean of the two rounds' ratios: an advantage of reading second
(the disk's host cache gives the second reader up to 2.5x here) cancels in
it.  Reported: the median of each side's values, the median of the N/2
block ratios and their range (lo-hi), which shows the noise; the JSON also
has each round's ratio.  The direct and wfs columns are each side's own
median, not the pair the ratio was taken from: the ratio need not be their
quotient.  A goal's verdict needs 5 blocks (--pairs 10): on fewer it reads
"met?" / "not met?" (with the blocks it had), and "(within spread)" when
the goal's value lies inside the row's lo-hi; a row whose ratio came from
single rounds (no complete block) says so in its note.  Throughput: ratio
= wfs/direct, higher is better.
Time figures (walk): ratio = time wfs/direct, lower is better.  Must run as
root.

Figures (measures.py; --only NAME,... picks some):
  seq       NAS-served: sequential 1 MiB preads of the largest shard, cold
            and warm (warm = read again right after the cold read)
  mmap      NAS-served: mmap, every page copied out, cold
  rand      NAS-served: 4 KiB random preads, the same offsets on each side,
            cold and warm
  walk      find + lstat of the whole tree: cold, warm, and a third walk (time ratio)
  pagecache page-cache growth from one cold read / the file size (no pairs)
  compare   seq, mmap, rand, walk, pagecache through kernel overlayfs (the
            hub as its read-only lower layer), bindfs -r (apt-get
            installed if missing, not with --no-install) and wfs -o
            fuse_uring=on (where the kernel has FUSE over io_uring): columns
            of the same rows, each its own ratio to direct measured in the
            same rounds
  promote   `wfsctl promote --wait` of the largest shard (fsync, O_DIRECT
            re-read, SHA-256) vs the SHA-256 rate of one core (hashlib, i.e.
            OpenSSL, over memory) measured in the same rounds; also vs cp
            into LOCAL_STORE's filesystem, and cp + sync
  revision  `wfsctl promote --wait` of a revision of --shards shards of
            --shard-mib (models--bench--shards, added to the hub by the bench)
            vs the SHA-256 rate of all cores; also vs cp -rL + sync
  many      `wfsctl promote --wait` of the fixture's datasets--acme--many
            (--many small files) vs cp -rL of its snapshot + sync (time)
  local     after promotion of the largest shard: seq, mmap, rand again,
            "direct" = the verified copy LOCAL_STORE/data/xx/<hash> itself
  part      the largest shard's 2nd quarter promoted as one range (promote
            --range Q:Q): seq 1 MiB reads of that quarter through the
            mount, cold and warm, vs the partial copy LOCAL_STORE/parts/<hex>
            read directly (the goal), vs the NAS file (the gain), and vs
            the same quarter of a blob of the same size promoted whole
            (models--bench--twin, added for the figure), through the mount
            (kernel passthrough) and directly
  noise     the seq, mmap and rand visits with the NAS file read directly
            on both sides (A/A): the rig's own spread of block ratios, the
            yardstick for a cold figure's lo-hi
  startup   (once a run, not per rig) a fixture of its own with --many
            --startup-many, that repo promoted, then `wfs` until `wfsctl
            status` answers and a promoted file reads back local, cold/warm,
            --startup-runs times each (default 5): the median run, min-max
  memory    (once a run) a fixture with --many --memory-many, every entry
            walked through a fresh mount, the daemon's VmRSS, then its CPU
            over --idle-seconds of idleness
promote, revision, many, local and part evict their copies afterwards, so the order of
figures does not matter.  startup and memory run in the work dir (the disk).

Extension point: a figure is a function m_<name>(ctx) registered in
measures.MEASUREMENTS; a ratio figure visits its sides with frame.abba()
and adds a row with ctx.pair_row(); goals live in frame.GOALS.

Python standard library only.  Modules: common.py (system helpers),
rigs.py (rigs, fixture), frame.py (goals, Ctx, pairs, the mount), the
figures in reads.py, promotion.py and once.py, measures.py (their
registry), bench.py (this: options, runs, tables).
"""

import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (ENABLE_URING, GiB, MiB, fmt, fs_of, is_mounted, loadavg, log,  # noqa: E402
                    meminfo, mountinfo, no_interrupts, pid_alive, set_enable_uring)
from measures import (MEASUREMENTS, MIN_BLOCKS, Ctx, GOALS, Skip, mount_main,  # noqa: E402
                      unmount_all, verdict)
from rigs import RIGS, disk_check, generate, mem_check, plan, \
    add_shards_repo, remove_tree  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_WFS = os.path.join(REPO, "build", "fs", "wfs")
DEFAULT_MKHUB = os.path.join(REPO, "test", "mkhub")
DEFAULT_WFSCTL = os.path.join(REPO, "build", "tools", "wfsctl")


# --------------------------------------------------------------------------
# a run

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
    try:
        fuse = subprocess.run(["pkg-config", "--modversion", "fuse3"], capture_output=True,
                              text=True).stdout.strip() or "?"
    except OSError:
        fuse = "?"
    return {"nproc": os.cpu_count(),
            "nproc_affinity": len(os.sched_getaffinity(0)),
            "cpu": cpu,
            "mem_total_bytes": meminfo("MemTotal"),
            "mem_available_bytes": meminfo("MemAvailable"),
            "kernel": platform.release(),
            "libfuse": fuse,
            "workdir": workdir,
            "workdir_fs": f"{fstype} ({src} on {mp})",
            "python": platform.python_version(),
            "loadavg_start": loadavg()}


def load_fixture(ctx, fixture, man, shards):
    ctx.fixture, ctx.manifest, ctx.shards = fixture, man, shards
    ctx.hub = man.get("hub") or os.path.join(fixture, "hub")
    # the largest file the mount presents as a regular file, preferring
    # <repo>/blobs/<id> entries (what a loader ends up opening)
    files = [e for e in man["entries"] if e["type"] == "file"]
    if not files:
        raise RuntimeError("manifest lists no files")
    big = max(files, key=lambda e: (e["size"], "/blobs/" in e["path"]))
    ctx.big = {"path": big["path"], "nas_real": big.get("nas_real", big["path"]),
               "size": big["size"]}
    log(f"largest file: {big['path']} ({big['size'] / MiB:.0f} MiB); revision "
        f"{shards['snapshot']}: {len(shards['shards'])} shards, {shards['bytes'] / MiB:.0f} MiB")


def fixture_for(ctx):
    a, rig = ctx.args, ctx.rig
    if a.fixture and rig.name == "disk":
        fixture = os.path.abspath(a.fixture)
        log(f"reusing fixture {fixture}")
        with open(os.path.join(fixture, "manifest.json")) as f:
            man = json.load(f)
        hub = man.get("hub") or os.path.join(fixture, "hub")
        shards = add_shards_repo(hub, a.shards, a.shard_mib * MiB, a.seed)
        return fixture, man, shards
    return generate(a, rig)


def run_measurement(ctx, m):
    log(f"measuring {m.name}" + (f" ({ctx.rig.name} rig)" if ctx.rig else ""))
    t0 = time.perf_counter()
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
        return False
    finally:
        log(f"  {m.name}: {time.perf_counter() - t0:.0f} s")
    return True


def run_rig(ctx, per_rig):
    """Set up the rig, generate, mount, measure, and tear it all down again
    (on errors and interrupts too)."""
    rig = ctx.rig
    t0 = time.perf_counter()
    try:
        try:
            rig.setup()
            ctx.rig_info = rig.info
            load_fixture(ctx, *fixture_for(ctx))
            mount_main(ctx)
        except (OSError, RuntimeError, subprocess.SubprocessError, KeyError, ValueError) as e:
            log(f"{rig.name} rig: setup failed: {type(e).__name__}: {e}")
            ctx.errors.append({"measurement": "setup", "status": "error",
                               "message": f"{type(e).__name__}: {e}"})
            return 2
        rc = 0
        for m in per_rig:
            if not run_measurement(ctx, m):
                rc = 1
                if ctx.mnt and not is_mounted(ctx.mnt):
                    log("mount is gone; stopping this rig")
                    break
        return rc
    finally:
        with no_interrupts():
            unmount_all(ctx)
            for p in rig.teardown():
                ctx.errors.append({"measurement": "teardown", "status": "error",
                                   "message": p})
        ctx.elapsed = time.perf_counter() - t0
        log(f"{rig.name} rig: {ctx.elapsed:.0f} s")


# --------------------------------------------------------------------------
# output

def ratio_cell(x, kind):
    if not x or x.get("ratio") is None:
        return "-"
    s = fmt(x["ratio"], 2)
    if x.get("lo") is not None and x.get("pairs", 2) != 1 and x["lo"] != x["hi"]:
        s += f" ({fmt(x['lo'], 2)}-{fmt(x['hi'], 2)})"
    return s


def met_cell(r):
    return verdict(r)


def table(rows, alts, out, with_direct=True):
    head = ["figure", "unit"] + (["direct", "wfs", "ratio (ABBA median)", "lo-hi"]
                                 if with_direct else ["wfs"]) + ["goal", ""]
    head += [f"{a} ratio (lo-hi)" for a in alts] + ["daemon CPU s"]
    lines = []
    for r in rows:
        ratio = fmt(r["ratio"], 3) if r["ratio"] is not None else "-"
        if r["kind"] == "time" and r["ratio"] is not None:
            ratio += " (time)"
        spread = f"{fmt(r['lo'], 3)}-{fmt(r['hi'], 3)}" if r.get("lo") is not None else "-"
        cells = [r["metric"], r["unit"]]
        cells += [fmt(r["direct"]), fmt(r["wfs"]), ratio, spread] if with_direct \
            else [fmt(r["wfs"])]
        cells += [r.get("goal") or "-", met_cell(r)]
        cells += [ratio_cell(r.get("alt", {}).get(a), r["kind"]) for a in alts]
        cells.append(fmt(r.get("daemon_cpu_s"), 2) if r.get("daemon_cpu_s") is not None
                     else "-")
        lines.append(cells)
    w = [max(len(str(x[i])) for x in lines + [head]) for i in range(len(head))]

    def line(x):
        return "| " + " | ".join(str(c).ljust(w[i]) for i, c in enumerate(x)) + " |"
    print(line(head), file=out)
    print("|" + "|".join("-" * (n + 2) for n in w) + "|", file=out)
    for x in lines:
        print(line(x), file=out)
    notes = [(r["metric"], r["note"]) for r in rows if r.get("note")]
    for m, n in notes:
        print(f"  - {m}: {n}", file=out)


def print_rig(ctx, out):
    a = ctx.args
    info = getattr(ctx, "rig_info", ctx.rig.info)
    print(f"\n### rig {ctx.rig.name}: {info.get('desc', '')}", file=out)
    ra = ctx.read_ahead or {}
    mra = f"{ra.get('wfs_kb')}"
    if ra.get("wfs_kb") != ra.get("wfs_wanted_kb") or \
            ra.get("wfs_kb_at_end", ra.get("wfs_kb")) != ra.get("wfs_kb"):
        mra += (f" (wfs asked for {ra.get('wfs_wanted_kb')}; "
                f"{ra.get('wfs_kb_at_end')} at the end)")
    if ctx.big:
        few = (f", fewer than {MIN_BLOCKS}: verdicts marked ?" if a.pairs // 2 < MIN_BLOCKS
               else "")
        print(f"big file {ctx.big['path']} ({ctx.big['size'] / MiB:.0f} MiB); {a.pairs} rounds "
              f"a figure (median and lo-hi of its {a.pairs // 2} ABBA blocks' ratios{few}); "
              f"bdi read_ahead_kb NAS "
              f"{ra.get('direct_kb')}, mount {mra}, LOCAL_STORE "
              f"{ra.get('local_kb')}; {getattr(ctx, 'elapsed', 0):.0f} s", file=out)
    if ctx.compare_info:
        print(f"compare: {ctx.compare_info}", file=out)
    print(file=out)
    if ctx.rows:
        table(ctx.rows, ctx.alt_names, out)
    for e in ctx.errors:
        print(f"{e['measurement']}: {e['status']}: {e['message']}", file=out)


def print_once(ctx, out):
    if not ctx.rows and not ctx.errors:
        return
    print(f"\n### once a run (work dir {ctx.workdir}, the disk)\n", file=out)
    if ctx.rows:
        table(ctx.rows, [], out, with_direct=False)
    for e in ctx.errors:
        print(f"{e['measurement']}: {e['status']}: {e['message']}", file=out)


def print_summary(ctxs, out):
    keys = [k for k in GOALS]
    by_rig = {c.rig.name: {r["key"]: r for r in c.rows} for c in ctxs if c.rig}
    if not by_rig:
        return
    names = list(by_rig)
    print("\n### goals (issue 12), median ratio per rig\n", file=out)
    print("| figure | goal | " + " | ".join(names) + " |", file=out)
    print("|---|---|" + "---|" * len(names), file=out)
    for k in keys:
        rows = [by_rig[n].get(k) for n in names]
        if not any(rows):
            continue
        r0 = next(r for r in rows if r)
        cells = []
        for r in rows:
            if not r:
                cells.append("-")
                continue
            v = r["ratio"] if GOALS[k][2] == "ratio" else r["wfs"]
            cells.append(f"{fmt(v, 2)} {verdict(r, bold=False)}"
                         if r.get("met") is not None else fmt(v, 2))
        print(f"| {r0['metric']} | {r0['goal']} | " + " | ".join(cells) + " |", file=out)


def print_report(run, out):
    m = run["machine"]
    print(f"command: {run['command']}" + ("  (INTERRUPTED)" if run["interrupted"] else ""),
          file=out)
    print(f"machine: {m['nproc']} CPUs ({m['cpu']}), MemTotal "
          f"{m['mem_total_bytes'] / GiB:.1f} GiB, kernel {m['kernel']}, libfuse {m['libfuse']}; "
          f"loadavg {m['loadavg_start']} at start, {m.get('loadavg_end', '?')} at end", file=out)
    for c in run["ctxs"]:
        if c.rig:
            print_rig(c, out)
    if run["once"]:
        print_once(run["once"], out)
    print_summary(run["ctxs"], out)
    print("\nratio = wfs/direct; rates: higher is better (1.0 = parity); (time) rows: lower "
          "is better.  overlayfs / bindfs / fuse_uring ratios: that mount / direct, in rounds "
          "of their own.  promote rows: direct = the named baseline.  local: rows: direct = "
          "the verified copy in LOCAL_STORE read directly.  part: rows: direct = the named "
          "baseline read in the same rounds.", file=out)
    print("direct and wfs are each the median of that side's own rounds; the ratio is the "
          "median of the ABBA blocks' ratios (each block's from its own two rounds), so it "
          "need not equal wfs/direct of those two columns.", file=out)
    print_verdict_notes(run, out)


def print_verdict_notes(run, out):
    """The footer's words on flagged verdicts, for the flags the tables show."""
    rows = [r for c in run["ctxs"] for r in c.rows]
    if run["once"]:
        rows += run["once"].rows
    flags = {f for r in rows for f in r.get("met_flags") or []}
    if any(f != "within spread" for f in flags):
        print(f"met? / not met?: the verdict stands on fewer than {MIN_BLOCKS} ABBA blocks "
              f"(startup: runs), the number in brackets; the project's rule needs the median "
              f"of {MIN_BLOCKS} or more (--pairs {2 * MIN_BLOCKS}, --startup-runs "
              f"{MIN_BLOCKS}): not a result.", file=out)
    if "single rounds" in flags or any("single rounds" in (r.get("note") or "") for r in rows):
        print("single rounds: no ABBA block was complete, so the ratio and lo-hi are over "
              "single rounds, where an advantage of going second is not cancelled.", file=out)
    if "within spread" in flags:
        print("(within spread): the goal's value lies inside the row's lo-hi (blocks, or "
              "startup runs, on both sides of it): the median's verdict, not a clear one.",
              file=out)


def as_json(run):
    def ctx_json(c):
        return {"rig": c.rig.name if c.rig else None,
                "info": getattr(c, "rig_info", c.rig.info if c.rig else None),
                "big_file": c.big, "shards": c.shards and {k: v for k, v in c.shards.items()
                                                          if k != "shards"},
                "read_ahead_kb": c.read_ahead, "compare": c.compare_info,
                "elapsed_s": getattr(c, "elapsed", None),
                "results": c.rows, "errors": c.errors}
    a = run["args"]
    return {"command": run["command"], "machine": run["machine"],
            "config": {k: getattr(a, k) for k in (
                "rig", "pairs", "redo", "scale_mib", "many", "shards", "shard_mib", "seed",
                "random_count", "wfs", "wfs_opt", "wfsctl", "mkhub", "startup_many",
                "startup_runs", "memory_many", "fuse_read_ahead_kb", "loop_read_ahead_kb",
                "quick")},
            "measurements": [m.name for m in a.selected],
            "plan": plan(a),
            "rigs": [ctx_json(c) for c in run["ctxs"] if c.rig],
            "once": ctx_json(run["once"]) if run["once"] else None,
            "interrupted": run["interrupted"], "elapsed_s": run["elapsed"]}


# --------------------------------------------------------------------------

def parse_args(argv):
    names = [m.name for m in MEASUREMENTS]
    p = argparse.ArgumentParser(
        description="wfs benchmark: every figure as the median ratio of ABBA blocks of "
                    "--pairs alternating rounds (direct vs through the mount), on the disk "
                    "and/or on a memory-backed rig, against the goals of issue 12. Needs root.",
        epilog="measurements: " + ", ".join(
            f"{m.name}{'' if m.default else ' (off by default)'}"
            f"{' (once a run)' if m.once else ''}" for m in MEASUREMENTS)
        + ". Environment: WFS_BIN (daemon, default build/fs/wfs), WFSCTL_BIN (client, "
        "default build/tools/wfsctl), WFS_MKHUB (generator).")
    p.add_argument("--rig", choices=("disk", "mem", "both"), default="both",
                   help="where the NAS hub and LOCAL_STORE live: the work dir's disk, ext4 on "
                        "memory-backed loop devices, or both in turn (default both)")
    p.add_argument("--pairs", type=int, default=None,
                   help="rounds a ratio figure, even: N/2 ABBA blocks (default 10; 2 with "
                        "--quick)")
    p.add_argument("--redo", type=int, default=5,
                   help="a figure's rounds during which another process dropped the caches "
                        "(/proc/vmstat drop_pagecache) are measured again, at most this many "
                        "times a figure (default 5)")
    p.add_argument("--dir", default="/var/tmp",
                   help="parent of the temporary work dir (default /var/tmp)")
    p.add_argument("--scale-mib", "--size-mib", dest="scale_mib", type=int, default=None,
                   help="mkhub --scale-mib: about the hub's size; the largest shard is 0.45 of "
                        "it (default 4600: a 2 GiB shard; 256 with --quick)")
    p.add_argument("--many", type=int, default=None,
                   help="mkhub --many (default 10000; 2000 with --quick)")
    p.add_argument("--shards", type=int, default=8,
                   help="shards in the revision of the revision figure (default 8)")
    p.add_argument("--shard-mib", type=int, default=None,
                   help="size of each (default scale/16, at most 256)")
    p.add_argument("--seed", type=int, default=1, help="fixture and random-offset seed")
    p.add_argument("--random-count", type=int, default=None,
                   help="4 KiB random reads a pass (default 20000; 5000 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: --scale-mib 256 --many 2000 --random-count 5000 --pairs 2 "
                        "--startup-many 200 --memory-many 5000 --idle-seconds 2 (1 ABBA "
                        "block a figure: its verdicts read met? / not met?, not results)")
    p.add_argument("--only", default=None,
                   help="comma-separated measurements to run (" + ",".join(names) + ")")
    p.add_argument("--fixture", default=None,
                   help="disk rig: reuse an existing mkhub OUTDIR instead of generating (not "
                        "deleted; the bench adds models--bench--shards to its hub)")
    p.add_argument("--walk-cpus", default=None, metavar="R,D",
                   help="walk figures only: pin the walker to CPU R and the daemon's threads "
                        "to CPU D (R,R: both on one CPU), to see what the scheduler's placement "
                        "costs a FUSE round trip")
    p.add_argument("--wfs-opt", action="append", default=[],
                   help="extra -o option for wfs (repeatable)")
    p.add_argument("--fuse-read-ahead-kb", type=int, default=None,
                   help="set the mount's /sys/class/bdi/.../read_ahead_kb after mounting "
                        "(default: leave the daemon's value; the header shows each side's)")
    p.add_argument("--loop-read-ahead-kb", type=int, default=4096,
                   help="mem rig: read_ahead_kb of its loop devices (default 4096, as the "
                        "mount's readahead_kb default; a loop device otherwise keeps whatever "
                        "its previous user set)")
    p.add_argument("--startup-many", type=int, default=None,
                   help="verified blobs for the startup figure (default 1000)")
    p.add_argument("--startup-runs", type=int, default=5,
                   help="startup figure: cold and warm starts each (default 5, also with "
                        "--quick); reported: the median run and the runs' min-max; fewer "
                        "than 5 mark its verdict 'met?'")
    p.add_argument("--memory-many", type=int, default=None,
                   help="files in the hub of the memory figure (default 100000)")
    p.add_argument("--idle-seconds", type=float, default=None,
                   help="idle time over which the memory figure reads the daemon's CPU "
                        "(default 10)")
    p.add_argument("--no-install", action="store_true",
                   help="compare: do not apt-get install bindfs when it is missing")
    p.add_argument("--keep", action="store_true",
                   help="keep the work dir (the mem rig is always torn down)")
    p.add_argument("--json", action="store_true", help="print results as JSON on stdout")
    p.add_argument("--json-file", default=None,
                   help="also write the results as JSON to this file (with the tables on stdout)")
    a = p.parse_args(argv)
    q = a.quick

    def dflt(name, normal, quick):
        if getattr(a, name) is None:
            setattr(a, name, quick if q else normal)
    dflt("pairs", 10, 2)
    dflt("scale_mib", 4600, 256)
    dflt("many", 10000, 2000)
    dflt("random_count", 20000, 5000)
    dflt("startup_many", 1000, 200)
    dflt("memory_many", 100000, 5000)
    dflt("idle_seconds", 10.0, 2.0)
    if a.shard_mib is None:
        a.shard_mib = max(1, min(256, a.scale_mib // 16))
    if a.startup_runs < 1:
        p.error(f"--startup-runs {a.startup_runs}: must be >= 1")
    if a.pairs < 2 or a.pairs % 2:
        p.error(f"--pairs {a.pairs}: must be even and >= 2 (each ABBA block is two rounds, "
                "one with each side first)")
    if a.only:
        sel = [s.strip() for s in a.only.split(",") if s.strip()]
        bad = [s for s in sel if s not in names]
        if bad:
            p.error(f"unknown measurement(s): {', '.join(bad)}")
        a.selected = [m for m in MEASUREMENTS if m.name in sel]
    else:
        a.selected = [m for m in MEASUREMENTS if m.default]
    a.rigs = ["disk", "mem"] if a.rig == "both" else [a.rig]
    a.wfs = os.environ.get("WFS_BIN", DEFAULT_WFS)
    a.mkhub = os.environ.get("WFS_MKHUB", DEFAULT_MKHUB)
    a.wfsctl = os.environ.get("WFSCTL_BIN", DEFAULT_WFSCTL)
    return a


def _on_signal(signum, frame):
    raise SystemExit(128 + signum)


def enable_fuse_uring(a):
    """--wfs-opt fuse_uring=on: enable_uring set for the run; returns the
    value to put back (None: nothing was changed)."""
    if "fuse_uring=on" not in a.wfs_opt:
        return None
    was = set_enable_uring("1")
    if was is None:
        sys.exit(f"bench.py: --wfs-opt fuse_uring=on, but this kernel has no {ENABLE_URING}")
    return was


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench.py must run as root (drop_caches, mounts, loop devices)")
    per_rig = [m for m in a.selected if not m.once]
    once = [m for m in a.selected if m.once]
    need_ctl = any(m.name in ("promote", "revision", "local", "part", "startup")
                   for m in a.selected)
    for path, what in ((a.wfs, "WFS_BIN"), (a.mkhub, "WFS_MKHUB"), (a.wfsctl, "WFSCTL_BIN")):
        if what == "WFSCTL_BIN" and not need_ctl:
            continue
        if not os.access(path, os.X_OK):
            sys.exit(f"{what}: {path} is not an executable")
    if not per_rig:
        a.rigs = []
    stale = [mp for mp, fstype, src in mountinfo() if fstype == "tmpfs" and src == "wfs-bench"]
    if stale:
        log(f"NOTE: mem rig tmpfs of another (or a killed) bench run still mounted: "
            f"{', '.join(stale)}; if no bench is running: umount its ext4s (nas, store next "
            "to it), losetup -d their loop devices (losetup -a), then umount it")
    # refuse before spending minutes on the disk rig
    if "mem" in a.rigs:
        why = mem_check(a)
        if why:
            sys.exit(f"bench.py: {why}")
    os.makedirs(a.dir, exist_ok=True)
    if "disk" in a.rigs:
        why = disk_check(a, a.dir)
        if why:
            sys.exit(f"bench.py: {why}")
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _on_signal)
    # Ctrl-C: KeyboardInterrupt, even when started with SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)

    uring_was = enable_fuse_uring(a)
    workdir = tempfile.mkdtemp(prefix="wfs-bench-", dir=a.dir)
    machine = machine_info(workdir)
    log(f"work dir {workdir} ({machine['workdir_fs']}); rigs {', '.join(a.rigs) or '-'}; "
        f"{a.pairs} rounds ({a.pairs // 2} ABBA blocks) a figure")
    run = {"args": a, "machine": machine, "ctxs": [], "once": None, "interrupted": False,
           "command": "test/bench/bench.py " + " ".join(shlex.quote(x) for x in argv)}
    t_start = time.perf_counter()
    rc = 0
    try:
        for name in a.rigs:
            ctx = Ctx(a, RIGS[name](a, workdir))
            run["ctxs"].append(ctx)
            rc = max(rc, run_rig(ctx, per_rig))
        if once:
            ctx = Ctx(a, None, os.path.join(workdir, "once"))
            os.makedirs(ctx.workdir, exist_ok=True)
            run["once"] = ctx
            try:
                for m in once:
                    if not run_measurement(ctx, m):
                        rc = max(rc, 1)
            finally:
                with no_interrupts():
                    unmount_all(ctx)
    except (KeyboardInterrupt, SystemExit) as e:
        # everything is torn down by now (run_rig's finally): say so, and
        # print what was measured
        rc = 130 if isinstance(e, KeyboardInterrupt) else (e.code or 1)
        log(f"interrupted ({type(e).__name__}); mounts, loop devices and tmpfs torn down")
        run["interrupted"] = True
    finally:
        with no_interrupts():
            if uring_was is not None:
                set_enable_uring(uring_was)
            if not a.keep:
                try:
                    remove_tree(workdir)
                except RuntimeError as e:
                    log(str(e))
            else:
                log(f"kept {workdir}")
    run["elapsed"] = time.perf_counter() - t_start
    machine["loadavg_end"] = loadavg()
    if a.json_file:
        with open(a.json_file, "w") as f:
            json.dump(as_json(run), f, indent=2)
            f.write("\n")
    if a.json:
        json.dump(as_json(run), sys.stdout, indent=2)
        print()
    else:
        print_report(run, sys.stdout)
        print(f"elapsed {run['elapsed']:.0f} s", file=sys.stdout)
    return rc


if __name__ == "__main__":
    sys.exit(main())
