"""test/hubcheck.py: the shapes of a hub cache that test/mkhub generates, and
its self-check: names that must be content hashes (SHA-256 for 64 hex, git
blob SHA-1 for 40), links that must resolve as the manifest says (or fail
with its errno), refs of exactly 40 hex, safetensors headers that parse and
weight maps that match their shards. mkhub imports it; standard library only.
"""

import errno
import hashlib
import json
import os
import re
import stat
import struct

MIB = 1 << 20
CHUNK = 8 * MIB
REPO_RE = re.compile(r"^(models|datasets|spaces)--[^/]+$")
HEX40 = re.compile(r"^[0-9a-f]{40}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")

DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4,
              "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}

class GenError(Exception):
    pass


def parts(rel):
    return rel.split("/")


def repo_blob_of(rel):
    """If rel is <repo>/blobs/<id>, return (repo, id), else None."""
    p = parts(rel)
    if len(p) == 3 and REPO_RE.match(p[0]) and p[1] == "blobs":
        return p[0], p[2]
    return None


def snapshot_repo_of(rel):
    """If rel is <repo>/snapshots/<rev>/<path...>, return repo, else None."""
    p = parts(rel)
    if len(p) >= 4 and REPO_RE.match(p[0]) and p[1] == "snapshots":
        return p[0]
    return None


def parse_safetensors(path):
    """Validate a safetensors file; return {name: (dtype, shape, (start, end))}."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise GenError("%s: short safetensors file" % path)
        (n,) = struct.unpack("<Q", raw)
        if n % 8 or 8 + n > size:
            raise GenError("%s: bad header length %d" % (path, n))
        hb = f.read(n)
    if not hb.startswith(b"{") or not hb.rstrip(b" ").endswith(b"}"):
        raise GenError("%s: header is not a JSON object padded with spaces" % path)
    hdr = json.loads(hb.decode())
    hdr.pop("__metadata__", None)
    spans = []
    out = {}
    for name, t in hdr.items():
        nb = DTYPE_SIZE[t["dtype"]]
        for d in t["shape"]:
            nb *= d
        s, e = t["data_offsets"]
        if e - s != nb:
            raise GenError("%s: tensor %s size mismatch" % (path, name))
        spans.append((s, e))
        out[name] = (t["dtype"], t["shape"], (s, e))
    spans.sort()
    pos = 0
    for s, e in spans:
        if s != pos:
            raise GenError("%s: data not contiguous at %d" % (path, pos))
        pos = e
    if pos != size - 8 - n:
        raise GenError("%s: data covers %d of %d bytes" % (path, pos, size - 8 - n))
    return out



# --------------------------------------------------------------------------------------
# self-check against the real filesystem
# --------------------------------------------------------------------------------------

def file_hashes(path, cache):
    if path not in cache:
        h256 = hashlib.sha256()
        size = os.path.getsize(path)
        h1 = hashlib.sha1(b"blob %d\0" % size)
        with open(path, "rb") as f:
            while True:
                b = f.read(CHUNK)
                if not b:
                    break
                h256.update(b)
                h1.update(b)
        cache[path] = (size, h256.hexdigest(), h1.hexdigest())
    return cache[path]


def check_name(name, sizes_hashes):
    _, s256, s1 = sizes_hashes
    if HEX64.match(name):
        return s256 == name
    if HEX40.match(name):
        return s1 == name
    return True


def self_check(man):
    hub = man["hub"]
    errs = []
    by_path = {e["path"]: e for e in man["entries"]}
    on_disk = set()
    for root, dirs, files in os.walk(hub):
        for n in dirs + files:
            on_disk.add(os.path.relpath(os.path.join(root, n), hub))
    if on_disk != set(by_path):
        errs.append("manifest/disk mismatch: only on disk %s, only in manifest %s"
                    % (sorted(on_disk - set(by_path))[:5], sorted(set(by_path) - on_disk)[:5]))
    cache = {}
    real_hub = os.path.realpath(hub)
    for e in man["entries"]:
        p = e["path"]
        ap = os.path.join(hub, p)
        try:
            st = os.lstat(ap)
        except FileNotFoundError:
            continue  # reported above as a manifest/disk mismatch
        t = e["type"]
        fol = e.get("follow")
        if t == "dir":
            if not stat.S_ISDIR(st.st_mode):
                errs.append("%s: expected NAS dir" % p)
            continue
        if stat.S_ISREG(st.st_mode) and (t != "file" or e["nas_real"] != p):
            errs.append("%s: NAS regular file must be presented as itself" % p)
        if t == "link" and fol in ("ENOENT", "ELOOP", "escape"):
            if os.readlink(ap) != e["target"]:
                errs.append("%s: target not verbatim" % p)
            try:
                os.stat(ap)
                got = "ok"
            except OSError as x:
                got = x.errno
            if fol == "ENOENT" and got != errno.ENOENT:
                errs.append("%s: expected ENOENT, got %s" % (p, got))
            if fol == "ELOOP" and got != errno.ELOOP:
                errs.append("%s: expected ELOOP, got %s" % (p, got))
            if fol == "escape":
                rp = os.path.realpath(ap)
                if got != "ok" or rp.startswith(real_hub + "/"):
                    errs.append("%s: expected an existing target outside the hub" % p)
            continue
        if t == "link" and fol == "dir":
            if not os.path.isdir(ap):
                errs.append("%s: expected dir" % p)
            continue
        # file presentation or link with follow=file
        if t == "link":
            if fol != "file":
                errs.append("%s: unknown follow %r" % (p, fol))
                continue
            tp = os.path.normpath(os.path.join(os.path.dirname(p), e["target"]))
            rb = repo_blob_of(tp)
            if not rb or rb[1] != e.get("blob_id") or tp not in by_path or tp.split("/")[0] != p.split("/")[0]:
                errs.append("%s: link target %s is not this repo's blob %s" % (p, tp, e.get("blob_id")))
            if os.path.realpath(os.path.join(hub, tp)) != os.path.realpath(ap):
                errs.append("%s: target and NAS link resolve differently" % p)
        rp = os.path.realpath(ap)
        want = os.path.join(real_hub, e["nas_real"])
        if rp != want:
            errs.append("%s: realpath %s != nas_real %s" % (p, rp, want))
            continue
        if not stat.S_ISREG(os.stat(ap).st_mode):
            errs.append("%s: does not resolve to a regular file" % p)
            continue
        sh = file_hashes(rp, cache)
        if sh[0] != e["size"] or sh[1] != e["sha256"]:
            errs.append("%s: size/sha256 mismatch" % p)
        if "blob_id" in e and not check_name(e["blob_id"], sh):
            errs.append("%s: blob id %s is not the content hash" % (p, e["blob_id"]))
        pp = p.split("/")
        if len(pp) == 3 and pp[0] == "blobs" and not check_name(pp[2], sh):
            errs.append("%s: store name is not the content hash" % p)
        if p.endswith(".safetensors"):
            try:
                parse_safetensors(rp)
            except (GenError, ValueError, KeyError) as x:
                errs.append(str(x))
    # refs and indexes
    for e in man["entries"]:
        p = e["path"]
        pp = p.split("/")
        if len(pp) >= 3 and REPO_RE.match(pp[0]) and pp[1] == "refs" and e["type"] == "file":
            with open(os.path.join(hub, p), "rb") as f:
                c = f.read()
            if not HEX40.match(c.decode(errors="replace")):
                errs.append("%s: ref is not exactly 40 hex" % p)
            elif "%s/snapshots/%s" % (pp[0], c.decode()) not in by_path:
                errs.append("%s: ref names a missing snapshot" % p)
        if p.endswith("/model.safetensors.index.json") and snapshot_repo_of(p):
            with open(os.path.join(hub, p)) as f:
                wm = json.load(f)["weight_map"]
            snapdir = os.path.dirname(p)
            want = {}
            try:
                for shard in set(wm.values()):
                    sp = os.path.join(hub, snapdir, shard)
                    for name in parse_safetensors(sp):
                        want[name] = shard
            except (GenError, OSError, ValueError, KeyError) as x:
                errs.append("%s: %s" % (p, x))
                continue
            if want != wm:
                errs.append("%s: weight_map does not match the shards" % p)
    o = man["outside"]
    if stat.S_IMODE(os.stat(o).st_mode) != 0o700:
        errs.append("outside/ mode is not 0700")
    if stat.S_IMODE(os.stat(os.path.join(o, "secret.bin")).st_mode) != 0o600:
        errs.append("outside/secret.bin mode is not 0600")
    return errs
