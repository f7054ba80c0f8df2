"""wfs bench: the rigs (where the NAS hub and LOCAL_STORE live) and the
fixture generated on them.

  disk  the NAS hub and LOCAL_STORE are directories in the work dir (--dir,
        default /var/tmp): the VM's disk, with whatever cache its host keeps.
  mem   the NAS hub and LOCAL_STORE each on its own ext4, each on a loop
        device attached with `losetup --direct-io=on` over a file in a tmpfs
        the bench mounts itself (mount -t tmpfs -o size=...), so nothing
        depends on /dev/shm; the loop devices' read_ahead_kb is set
        (--loop-read-ahead-kb, default 4096: the mount's own default).
        "Cold" there means the ext4's page cache is dropped and every read
        goes through the loop device to the tmpfs file: NVMe-class storage
        that no host cache can flatter.  The filesystems are sized from the
        fixture (plan()); the bench refuses to start the rig if MemAvailable
        does not cover the tmpfs plus the page cache the reads fill.
        Everything is torn down again after the rig's figures, on errors and
        on Ctrl-C / SIGTERM (umounts, losetup -d).

Python standard library only.
"""

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time

from common import (GiB, MiB, fs_of, is_mounted, log, meminfo, mounts_below, no_interrupts,
                    run_checked)

SHARDS_REPO = "models--bench--shards"
TWIN_REPO = "models--bench--twin"       # the part figure's blob of the big file's size


# --------------------------------------------------------------------------
# sizes

def plan(a):
    """Estimated sizes (bytes) of what a rig holds, from the options.

    mkhub --scale-mib S writes about S MiB of large files (shards 0.45, 0.25,
    0.05, 0.08, 0.06, 0.04 of S, packs and data 0.08), the largest 0.45 S;
    --many N adds N small blobs and N links; the bench adds SHARDS_REPO
    (--shards x --shard-mib)."""
    scale = a.scale_mib * MiB
    big = int(0.45 * scale)
    rev = a.shards * a.shard_mib * MiB
    hub = int(1.01 * scale) + a.many * 12 * 1024 + 32 * MiB + rev
    part = any(m.name == "part" for m in getattr(a, "selected", []))
    if part:
        hub += big      # the part figure adds TWIN_REPO: a blob of the big file's size
    # NAS fs: the hub plus the ext4's own metadata (journal, inode tables)
    nas_fs = int(hub * 1.06) + 384 * MiB
    # LOCAL_STORE's fs: one figure's copies at a time (the big blob's, the
    # revision's, or cp's: each is removed after its visit, and the daemon
    # evicts least recently used copies for room if one is left behind),
    # with slack, above wfs's min_free (10% by default)
    local_fs = int((max(big, rev) * 1.25 + 512 * MiB) / 0.88)
    if part:            # a quarter of the big file and a whole copy of its twin at once
        local_fs = max(local_fs, int((big * 1.25 * 1.25 + 512 * MiB) / 0.88))
    nas_fs = (nas_fs + MiB - 1) // MiB * MiB
    local_fs = (local_fs + MiB - 1) // MiB * MiB
    tmpfs = nas_fs + local_fs + 16 * MiB
    # page cache while measuring: one copy of the big file at a time (every
    # side starts with caches dropped; cp's source and copy may be two, and
    # the kernel may then drop some of the source's), plus room for the
    # daemon and the bench
    cache = big + GiB // 2
    return {"big": big, "rev": rev, "hub": hub, "nas_fs": nas_fs, "local_fs": local_fs,
            "tmpfs": tmpfs, "cache": cache, "mem_need": tmpfs + cache}


def mem_check(a):
    """None if the mem rig fits in MemAvailable now, else the reason."""
    p = plan(a)
    avail = meminfo("MemAvailable")
    if avail >= p["mem_need"]:
        return None
    return (f"the mem rig needs {p['mem_need'] / GiB:.1f} GiB of free memory "
            f"(a {p['tmpfs'] / GiB:.1f} GiB tmpfs: NAS ext4 {p['nas_fs'] / GiB:.1f} GiB + "
            f"LOCAL_STORE ext4 {p['local_fs'] / GiB:.1f} GiB; and {p['cache'] / GiB:.1f} GiB "
            f"of page cache for the reads), MemAvailable is {avail / GiB:.1f} GiB: lower "
            f"--scale-mib / --shard-mib, or run --rig disk")


def disk_check(a, where):
    """None if the disk rig fits in the free space of `where`, else the reason."""
    p = plan(a)
    need = p["hub"] + p["local_fs"]
    sv = os.statvfs(where)
    free = sv.f_bavail * sv.f_frsize
    if free >= need:
        return None
    return (f"the disk rig needs about {need / GiB:.1f} GiB in {where} (NAS hub "
            f"{p['hub'] / GiB:.1f} GiB, LOCAL_STORE and cp copies {p['local_fs'] / GiB:.1f} "
            f"GiB), {free / GiB:.1f} GiB free: lower --scale-mib, or use --dir")


# --------------------------------------------------------------------------
# rigs

class Rig:
    """A place for the NAS hub (nas_root) and for LOCAL_STORE and cp's
    copies (store_root), both made by setup() and gone after teardown()."""
    name = "?"

    def __init__(self, a, workdir):
        self.args = a
        self.dir = os.path.join(workdir, self.name)
        self.nas_root = os.path.join(self.dir, "nas")
        self.store_root = os.path.join(self.dir, "store")
        self.mnt_root = os.path.join(self.dir, "mnt")
        self.info = {"rig": self.name}
        self._undo = []     # [(what, fn)] run in reverse by teardown

    def describe(self):
        return self.info.get("desc", self.name)

    def setup(self):
        for d in (self.dir, self.mnt_root):
            os.makedirs(d, exist_ok=True)

    def teardown(self):
        """Undo setup in reverse; Ctrl-C is ignored meanwhile (a half torn
        down rig is worse than a slow exit).  Returns a list of problems."""
        problems = []
        with no_interrupts():
            while self._undo:
                what, fn = self._undo.pop()
                try:
                    fn()
                except Exception as e:     # keep undoing the rest
                    problems.append(f"{what}: {e}")
                    log(f"teardown {self.name}: {what}: {e}")
        return problems


class DiskRig(Rig):
    name = "disk"

    def setup(self):
        super().setup()
        why = disk_check(self.args, self.dir)
        if why:
            raise RuntimeError(why)
        os.makedirs(self.nas_root, exist_ok=True)
        os.makedirs(self.store_root, exist_ok=True)
        src = fs_desc(self.dir)
        self.info.update({"desc": f"NAS hub and LOCAL_STORE in {self.dir} ({src})",
                          "nas_dev": src, "store_dev": src})
        if not self.args.keep:
            self._undo.append((f"rm -r {self.dir}", lambda: remove_tree(self.dir)))


class MemRig(Rig):
    name = "mem"

    def setup(self):
        super().setup()
        a = self.args
        why = mem_check(a)
        if why:
            raise RuntimeError(why)
        p = plan(a)
        self.tmpfs = os.path.join(self.dir, "tmpfs")
        os.makedirs(self.tmpfs, exist_ok=True)
        self._undo.append((f"rm -r {self.dir}", lambda: remove_tree(self.dir)))
        # each undo is registered as soon as there is something to undo: an
        # unmount before its mount (umount_retry passes over what is not
        # mounted, and a mount that failed late is still undone)
        self._undo.append((f"umount {self.tmpfs}", lambda: umount_retry(self.tmpfs)))
        run_checked(["mount", "-t", "tmpfs", "-o", f"size={p['tmpfs'] // MiB}m,mode=0700",
                     "wfs-bench", self.tmpfs])
        devs = {}
        for what, root, size in (("nas", self.nas_root, p["nas_fs"]),
                                 ("store", self.store_root, p["local_fs"])):
            img = os.path.join(self.tmpfs, f"{what}.img")
            with open(img, "wb") as f:
                f.truncate(size)
            dev = run_checked(["losetup", "--find", "--show", "--direct-io=on", img]).strip()
            ra = f"/sys/block/{os.path.basename(dev)}/queue/read_ahead_kb"
            ra_was = {}
            self._undo.append((f"losetup -d {dev}",
                               lambda d=dev, r=ra, w=ra_was: detach(d, r, w.get("kb"))))
            # a loop device keeps the read-ahead its previous user set: set
            # it, and put the old value back at teardown, before the detach
            # (a detach does not always reset it: over a tmpfs file, 6.18
            # kept the 4096 set here)
            was = sysfs(ra)
            with open(ra, "w") as f:
                f.write(f"{a.loop_read_ahead_kb}\n")
            if was.isdigit() and int(was) != a.loop_read_ahead_kb:
                ra_was["kb"] = was
            dio = sysfs(f"/sys/block/{os.path.basename(dev)}/loop/dio")
            if dio != "1":
                log(f"WARNING: {dev} did not take --direct-io=on (loop/dio = {dio})")
            run_checked(["mkfs.ext4", "-q", "-F", "-m", "0", "-L", f"wfs-bench-{what}",
                         "-E", "lazy_itable_init=0,lazy_journal_init=0", dev])
            os.makedirs(root, exist_ok=True)
            self._undo.append((f"umount {root}", lambda r=root: umount_retry(r)))
            run_checked(["mount", "-t", "ext4", dev, root])
            devs[what] = {"dev": dev, "size": size, "dio": dio, "read_ahead_kb": sysfs(ra)}
        self.info.update({
            "desc": (f"NAS hub on ext4 on {devs['nas']['dev']} ({p['nas_fs'] / GiB:.1f} GiB), "
                     f"LOCAL_STORE on ext4 on {devs['store']['dev']} "
                     f"({p['local_fs'] / GiB:.1f} GiB); loop devices --direct-io=on "
                     f"(dio {devs['nas']['dio']}/{devs['store']['dio']}), read_ahead_kb "
                     f"{devs['nas']['read_ahead_kb']}, over files in a "
                     f"{p['tmpfs'] / GiB:.1f} GiB tmpfs"),
            "devices": devs, "tmpfs_bytes": p["tmpfs"],
            "mem_available_at_setup": meminfo("MemAvailable")})
        log(f"mem rig: {self.info['desc']}")


RIGS = {"disk": DiskRig, "mem": MemRig}


def sysfs(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def fs_desc(path):
    mp, fstype, src = fs_of(path)
    return f"{fstype} on {src}, mounted at {mp}"


def umount_retry(path, tries=5):
    """umount path; a busy one is retried for a few seconds, then unmounted
    lazily (its device is freed once the last user goes)."""
    for i in range(tries):
        if not is_mounted(path):
            return
        r = subprocess.run(["umount", path], capture_output=True, text=True)
        if r.returncode == 0:
            return
        time.sleep(1)
    r = subprocess.run(["umount", "-l", path], capture_output=True, text=True)
    if r.returncode != 0 and is_mounted(path):
        raise RuntimeError(f"cannot unmount {path}: {r.stderr.strip()}")
    raise RuntimeError(f"{path} was busy: unmounted lazily (still in use by someone)")


def detach(dev, ra_path=None, ra_kb=None):
    """losetup -d dev; first, if ra_kb, write it to ra_path (the device's
    read_ahead_kb as its previous user left it; a failure to is reported
    after the detach)."""
    err = None
    if ra_kb is not None:
        try:
            with open(ra_path, "w") as f:
                f.write(f"{ra_kb}\n")
        except OSError as e:
            err = f"putting back {ra_path} = {ra_kb}: {e}"
    r = subprocess.run(["losetup", "-d", dev], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"losetup -d {dev}: {r.stderr.strip()}")
    if err:
        raise RuntimeError(err)


def remove_tree(d):
    """rm -r d, but never into a mount."""
    if not os.path.exists(d):
        return
    still = mounts_below(d)
    if still:
        raise RuntimeError(f"not removing {d}: {', '.join(still)} still mounted")
    shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------
# the fixture

def generate(a, rig):
    """mkhub into rig.nas_root/fixture, then SHARDS_REPO into its hub.
    Returns (fixture dir, manifest dict, shards info)."""
    fixture = os.path.join(rig.nas_root, "fixture")
    cmd = [a.mkhub, "--scale-mib", str(a.scale_mib), "--many", str(a.many),
           "--seed", str(a.seed), fixture]
    log("generating:", " ".join(cmd))
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    with open(os.path.join(fixture, "manifest.json")) as f:
        man = json.load(f)
    hub = man.get("hub") or os.path.join(fixture, "hub")
    shards = add_shards_repo(hub, a.shards, a.shard_mib * MiB, a.seed)
    log(f"  generated in {time.perf_counter() - t0:.1f} s")
    return fixture, man, shards


def add_shards_repo(hub, n, size, seed):
    """A revision of n shards of `size` bytes each, huggingface_hub layout:
    HUB/models--bench--shards/blobs/<sha256>, snapshots/<rev>/model-0000i-
    of-0000n.safetensors -> ../../blobs/<sha256>, refs/main.  Random bytes
    from a seeded generator (the same seed, the same bytes).  Returns
    {"repo", "rev", "snapshot" (hub-relative), "bytes", "shards": [...]}."""
    repo = os.path.join(hub, SHARDS_REPO)
    if os.path.isdir(repo):
        return read_shards_repo(hub)
    rev = hashlib.sha1(f"wfs-bench-shards:{seed}:{n}:{size}".encode()).hexdigest()
    snap = os.path.join(repo, "snapshots", rev)
    blobs = os.path.join(repo, "blobs")
    os.makedirs(snap, exist_ok=True)
    os.makedirs(blobs, exist_ok=True)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    out = []
    chunk = 8 * MiB
    for i in range(n):
        rng = random.Random(f"wfs-bench-shard:{seed}:{i}")
        tmp = os.path.join(blobs, f".tmp-{i}")
        h = hashlib.sha256()
        left = size
        with open(tmp, "wb") as f:
            while left > 0:
                b = rng.randbytes(min(chunk, left))
                h.update(b)
                f.write(b)
                left -= len(b)
        digest = h.hexdigest()
        os.rename(tmp, os.path.join(blobs, digest))
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        os.symlink(f"../../blobs/{digest}", os.path.join(snap, name))
        out.append({"name": name, "sha256": digest, "size": size})
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(rev)
    return {"repo": SHARDS_REPO, "rev": rev,
            "snapshot": f"{SHARDS_REPO}/snapshots/{rev}", "bytes": n * size, "shards": out}


def add_twin_repo(hub, size, seed):
    """A repo of one blob of `size` seeded random bytes (another blob of the
    big file's size, for the part figure): HUB/TWIN_REPO/blobs/<sha256>,
    snapshots/<rev>/model.safetensors -> it, refs/main.  Returns
    {"repo", "blob", "snapshot" (hub-relative paths), "sha256", "size"}."""
    repo = os.path.join(hub, TWIN_REPO)
    blobs = os.path.join(repo, "blobs")
    rev = hashlib.sha1(f"wfs-bench-twin:{seed}:{size}".encode()).hexdigest()
    snap = os.path.join(repo, "snapshots", rev)
    for d in (blobs, snap, os.path.join(repo, "refs")):
        os.makedirs(d, exist_ok=True)
    rng = random.Random(f"wfs-bench-twin:{seed}")
    tmp = os.path.join(blobs, ".tmp")
    h = hashlib.sha256()
    left = size
    with open(tmp, "wb") as f:
        while left > 0:
            b = rng.randbytes(min(8 * MiB, left))
            h.update(b)
            f.write(b)
            left -= len(b)
    digest = h.hexdigest()
    os.rename(tmp, os.path.join(blobs, digest))
    link = os.path.join(snap, "model.safetensors")
    if not os.path.islink(link):
        os.symlink(f"../../blobs/{digest}", link)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(rev)
    return {"repo": TWIN_REPO, "blob": f"{TWIN_REPO}/blobs/{digest}",
            "snapshot": f"{TWIN_REPO}/snapshots/{rev}/model.safetensors", "sha256": digest,
            "size": size}


def read_shards_repo(hub):
    """add_shards_repo's description of an existing SHARDS_REPO (a reused
    --fixture): the revision refs/main names, its links."""
    repo = os.path.join(hub, SHARDS_REPO)
    with open(os.path.join(repo, "refs", "main")) as f:
        rev = f.read().strip()
    snap = os.path.join(repo, "snapshots", rev)
    out = []
    for name in sorted(os.listdir(snap)):
        digest = os.path.basename(os.readlink(os.path.join(snap, name)))
        out.append({"name": name, "sha256": digest,
                    "size": os.stat(os.path.join(snap, name)).st_size})
    return {"repo": SHARDS_REPO, "rev": rev, "snapshot": f"{SHARDS_REPO}/snapshots/{rev}",
            "bytes": sum(x["size"] for x in out), "shards": out}
