#!/usr/bin/env python3
"""fake_ctl_server.py - a stand-in for the wfs daemon's control socket, to
test wfsctl without a mount.

It speaks the protocol of README.md ("Control protocol") strictly: one
JSON object per line each way, requests over 64 KiB or malformed get an error
reply, state-changing ops are checked with SO_PEERCRED, and a request with a
field of the wrong type or an unknown field is refused (so a wfsctl bug shows
up as an error, not as silently ignored input).  Copies are simulated: sizes
are virtual and bytes advance at --speed MiB/s.

  fake_ctl_server.py serve --socket S --tree DIR [--allow-uids U,...]
        make a mount-like tree at DIR (empty files, snapshot links, the
        user.wfs.socket xattr on DIR) and serve S until killed

test_wfsctl.py runs wfsctl through every case against in-process servers
of this module.

Standard library only.
"""
import json
import os
import socket
import socketserver
import struct
import sys
import threading
import time


MiB = 1 << 20
REQ_MAX = 64 << 10
STATES = ("nas", "queued", "copying", "local", "mismatch", "failed")
CHANGING = ("promote", "evict", "pin", "unpin", "verify", "sync")


def hexid(tag, n):
    """A fake content address of n hex digits derived from tag."""
    import hashlib
    return hashlib.sha256(tag.encode()).hexdigest()[:n]


REV1, REV2 = hexid("rev1", 40), hexid("rev2", 40)
REAL = {"pack"}  # tags of real files inside a snapshot (not links to a blob)


def blob_id(tag):
    if tag in REAL:
        return hexid(tag, 32)  # no content address: the daemon's own id
    return hexid(tag, 40 if tag == "cfg" else 64)

# repo -> list of (blob tag, size, behaviour, initial state, [(rev, snapshot file)])
# behaviour: ok | mismatch | fail | drop (back to nas mid-copy) | nospace |
#            stale (demoted by verify) | pinned (local and pinned)
HUB = {
    "models--org--good": [
        ("cfg", 700, "ok", "nas", [(REV1, "config.json"), (REV2, "config.json")]),
        ("s1", 48 * MiB, "ok", "nas", [(REV1, "model-00001-of-00002.safetensors")]),
        ("s2", 32 * MiB, "ok", "nas", [(REV1, "model-00002-of-00002.safetensors"),
                                       (REV2, "sub/model.safetensors")]),
    ],
    "models--org--bad": [
        ("w", 6 * MiB, "mismatch", "nas", [(REV1, "weights.bin")]),
        ("tok", 2 * MiB, "fail", "nas", [(REV1, "tokenizer.json")]),
        ("readme", 300, "ok", "nas", [(REV1, "README.md")]),
    ],
    "models--org--huge": [
        ("pack", 2 << 40, "nospace", "nas", [(REV1, "pack.bin")]),
    ],
    "models--org--flaky": [
        ("f", 16 * MiB, "drop", "nas", [(REV1, "model.safetensors")]),
    ],
    "models--org--kept": [
        ("k1", 5 * MiB, "stale", "local", [(REV1, "a.bin")]),
        ("k2", 3 * MiB, "pinned", "local", [(REV1, "b.bin")]),
        ("k3", 1 * MiB, "ok", "local", [(REV1, "c.bin")]),
    ],
}
CAPACITY = 1 << 40


class Blob:
    def __init__(self, repo, tag, size, behaviour, state, snaps):
        self.repo, self.tag, self.size, self.behaviour = repo, tag, size, behaviour
        self.id = blob_id(tag)
        # a real file inside a snapshot is its own key; hub blobs are keyed
        # by their path under blobs/
        self.key = f"{repo}/snapshots/{snaps[0][0]}/{snaps[0][1]}" if tag in REAL else f"{repo}/blobs/{self.id}"
        self.state, self.done, self.reason = state, size if state == "local" else 0, ""
        self.pinned = behaviour == "pinned"
        self.local_error = False
        self.snaps = snaps
        self.paths = list({self.key: 1, **{f"{repo}/snapshots/{r}/{p}": 1 for r, p in snaps}})
        self.history = [state]
        self.part = None  # local ranges (promote --range): see Hub.promote_ranges

    def set(self, state, reason=""):
        self.state, self.reason = state, reason
        if self.history[-1] != state:
            self.history.append(state)


class Hub:
    def __init__(self, speed_mib):
        self.lock = threading.Lock()
        self.speed = speed_mib * MiB
        self.blobs = [Blob(repo, *b) for repo, bl in HUB.items() for b in bl]
        self.requests = []       # every parsed request, for the tests
        self.served = [123 * MiB, 4567 * MiB]
        # the NAS's state and the local record, as core/metrics.c reports them
        self.nas = {"state": "up", "since": int(time.time()) - 3600, "outages": 0,
                    "timeouts": 0, "failed_down": 0, "busy": 0, "from_record": 0, "stuck": 0,
                    "reason": "", "timeout_ms": 1000}
        self.record = {"kept": True, "files": 3, "entries": 9, "built": int(time.time()) - 60,
                       "builds": 2, "looks": 61}
        self.sync_error = None   # (errno name, message): how the next syncs fail
        self.old_daemon = False  # answer sync as a daemon without it does
        self.nas_errors = {}     # path -> (errno name, message): the NAS fails it
        self.ref_commit = REV1   # the revision a ref pin names (read from the NAS)
        self.ref_pins = []       # status's "ref_pins"

    def local_bytes(self):
        return sum(b.size for b in self.blobs if b.state == "local")

    def select(self, path):
        """Blobs under a mount-relative path, or None if it names nothing."""
        if path == "":
            return list(self.blobs)
        out = [b for b in self.blobs if any(p == path or p.startswith(path + "/") for p in b.paths)]
        return out or None

    def tick(self, dt):
        with self.lock:
            active = [b for b in self.blobs if b.state == "copying"]
            for b in active:
                b.done = min(b.size, b.done + int(self.speed * dt))
                if b.behaviour == "fail" and b.done >= b.size // 2:
                    b.done = b.size // 2
                    b.set("failed", f"NAS read error at offset {b.done}: Input/output error")
                elif b.behaviour == "drop" and b.done >= b.size // 3:
                    b.done = 0
                    b.set("nas", "evicted to make room for a pinned blob; store full")
                elif b.done >= b.size and b.behaviour == "mismatch":
                    b.set("mismatch", f"sha256 of the NAS content is {hexid('x', 64)}, not {b.id}")
                elif b.done >= b.size:
                    b.set("local")
            for b in self.blobs:
                p = b.part
                if p and p["copying"]:
                    p["done"] = min(p["want"], p["done"] + int(self.speed * dt))
                    if p["done"] == p["want"]:
                        p["copying"], p["have"] = False, p["asked"]
                    # ranges covering the whole file become its copy: no "part" then
                    if not p["copying"] and sum(n for _, n in p["have"]) >= b.size:
                        b.part, b.done = None, b.size
                        b.set("local")
            if len([b for b in self.blobs if b.state == "copying"]) < 2:
                for b in self.blobs:
                    if b.state == "queued":
                        b.set("copying")
                        break

    # ---- ops ----
    def op_status(self, req):
        path = req.get("path", "")
        sel = self.select(path) or []
        repos = []
        for repo in HUB:
            rb = [b for b in sel if b.repo == repo]
            if not rb:
                continue
            states = {}
            for b in rb:
                states[b.state] = states.get(b.state, 0) + 1
            revs = []
            for rev in sorted({r for b in rb for r, _ in b.snaps}):
                vb = [b for b in rb if any(r == rev for r, _ in b.snaps)]
                revs.append(count(vb, rev=rev))
            repos.append(dict(count(rb, repo=repo), states=states, revisions=revs))
        down = self.nas["state"] == "down"
        return {"nas": dict(self.nas, path="/nas/hub"), "local": "/var/lib/wfs", "mount": "/mnt/hub",
                "record": dict(self.record),
                "from": "record" if down else "nas",
                "repos": [dict(r, **{"from": "record" if down else "nas"}) for r in repos],
                "copies": [{"key": b.key, "id": b.id, "state": b.state, "bytes_done": b.done,
                            "size": b.size}
                           for b in self.blobs if b.state == "copying"],
                "served": {"local_bytes": self.served[0], "nas_bytes": self.served[1], "opens": 0},
                "ref_pins": list(self.ref_pins),
                "flagged": [{"key": b.key, "id": b.id, "state": b.state, "reason": b.reason,
                             "local_error": b.local_error}
                            for b in self.blobs if b.state in ("mismatch", "failed") or b.local_error],
                "store": {"blobs": sum(b.state == "local" for b in self.blobs),
                          "bytes": self.local_bytes(),
                          "free_bytes": CAPACITY - self.local_bytes(),
                          "queued": sum(b.state == "queued" for b in self.blobs),
                          "copying": sum(b.state == "copying" for b in self.blobs)}}

    def promote_ranges(self, req):
        """promote --range of one file: its ranges copied at the hub's speed
        (no overlap with ones already local, in this stand-in)."""
        sel = self.paths_to_blobs(req["paths"])
        if len(req["paths"]) != 1 or len(sel) != 1:
            raise ReqError("EINVAL", "--range and --part take exactly one file")
        b, asked = sel[0], sorted(req["ranges"])
        want = sum(n for _, n in asked)
        if not req["dry_run"]:
            b.part = {"asked": asked, "have": [], "want": want, "done": 0, "copying": True}
        return {"path": req["paths"][0], "key": b.key, "ranges": asked, "bytes": want,
                "size": b.size, "bytes_to_copy": want,
                "space_available": CAPACITY - self.local_bytes(), "dry_run": req["dry_run"],
                "refused": []}

    def op_promote(self, req):
        if "ranges" in req:
            return self.promote_ranges(req)
        sel = self.paths_to_blobs(req["paths"])
        need = sum(b.size for b in sel if b.state not in ("local", "mismatch"))
        for b in sel:
            if req["pin"]:
                b.pinned = True
            if req["dry_run"] or b.state in ("local", "queued", "copying"):
                continue
            if b.behaviour == "nospace":
                b.set("nas", f"does not fit: needs {b.size} bytes, {CAPACITY - self.local_bytes()} available")
            elif b.state != "mismatch":
                b.done = 0
                b.set("queued")
        return {"blobs": [{"key": b.key, "id": b.id, "size": b.size, "state": b.state}
                          for b in sel],
                "bytes_to_copy": need, "space_available": CAPACITY - self.local_bytes()}

    def op_stats(self, req):
        states = {s: sum(b.state == s for b in self.blobs) for s in STATES}
        m = {"version": "fake", "served": {"local_bytes": self.served[0], "nas_bytes": self.served[1]},
             "opens": 7, "passthrough_opens": 2,
             "promotions": {"started": 5, "verified": 4, "cancelled": 0, "failed": 1,
                            "failed_by_reason": {"io_error": 1}, "auto_queued": 0,
                            "held": {"no_room": 0, "excluded": 0}, "retries": 2},
             "mismatches": 0, "demotions": 0, "evictions": 0, "index_writes": 3,
             "store": {"blobs": states["local"], "bytes": self.local_bytes(),
                       "free_bytes": CAPACITY - self.local_bytes()},
             "queue": {"queued": states["queued"], "in_flight": states["copying"]},
             "blobs": states, "local_read_errors": 0,
             "nas": dict(self.nas), "record": dict(self.record)}
        rep = {"metrics": m}
        if req["prometheus"]:
            rep["prometheus"] = "wfs_nas_up %d\n" % (self.nas["state"] == "up")
        return rep

    def op_sync(self, req):
        if self.old_daemon:
            raise ReqError("EINVAL", 'unknown op "sync"')
        if self.sync_error:
            raise ReqError(*self.sync_error)
        self.record["files"] = sum(b.state == "local" for b in self.blobs)
        self.record["built"] = int(time.time())
        return {"record_files": self.record["files"], "record": dict(self.record)}

    def op_progress(self, req):
        bykey = {b.key: b for b in self.blobs}
        # a key the daemon does not know: as core/control.c answers it
        return {"blobs": [progress_of(bykey[k]) if k in bykey else
                          {"key": k, "state": "unknown", "reason": "no such blob"}
                          for k in req["keys"]],
                "nas": dict(self.nas)}

    def op_evict(self, req):
        n, skipped = 0, []
        for b in self.paths_to_blobs(req["paths"]):
            if b.pinned and not req["force"]:
                skipped.append({"key": b.key, "id": b.id, "reason": "pinned (evict --force to drop it)"})
                continue
            if b.state in ("local", "queued", "copying"):
                b.done, b.pinned = 0, False
                b.set("nas")
                n += 1
        return {"evicted": n, "skipped": skipped}

    def op_pin(self, req, pinned=True):
        if "ref" in req:
            return {"count": 2, "repo": req["paths"][0], "commit": self.ref_commit}
        sel = self.paths_to_blobs(req["paths"])
        for b in sel:
            b.pinned = pinned
        return {"count": len(sel)}

    def op_unpin(self, req):
        return self.op_pin(req, False)

    def op_verify(self, req):
        checked, demoted = 0, []
        for b in self.paths_to_blobs(req["paths"]):
            if b.state != "local":
                continue
            checked += 1
            if b.behaviour == "stale":
                b.done = 0
                b.set("nas")
                demoted.append({"key": b.key, "reason": "NAS source changed: size 5242880 -> 5242881"})
        return {"checked": checked, "demoted": demoted}

    def paths_to_blobs(self, paths):
        out = []
        for p in paths:
            if p in self.nas_errors:
                raise ReqError(*self.nas_errors[p])
            sel = self.select(p)
            if sel is None:
                raise ReqError("ENOENT", f"{p}: no such file or directory in the mount")
            out += [b for b in sel if b not in out]
        return out


def progress_of(b):
    """A blob as core/reply.c shows it: with local ranges, state "partial"
    and a "part" object."""
    out = {"key": b.key, "id": b.id, "state": b.state, "bytes_done": b.done, "size": b.size,
           "reason": b.reason}
    p = b.part
    if p:
        if b.state in ("nas", "failed"):  # core/store_part.c blob_info_state_name
            out["state"] = "partial"
        out["part"] = {"local_bytes": sum(n for _, n in p["have"]), "nranges": len(p["have"]),
                       "ranges": p["have"], "want_bytes": p["want"], "done_bytes": p["done"],
                       "copying": p["copying"], "unproven": False, "reason": ""}
    return out


def count(blobs, **extra):
    d = dict(extra)
    d.update(files=len(blobs), bytes=sum(b.size for b in blobs),
             local_files=sum(b.state == "local" for b in blobs),
             local_bytes=sum(b.size for b in blobs if b.state == "local"))
    return d


class ReqError(Exception):
    def __init__(self, errno_name, msg):
        super().__init__(msg)
        self.errno_name = errno_name


# field -> type, per op; every other field is refused
SCHEMA = {
    "status": {"path": str},
    "promote": {"paths": list, "pin": bool, "dry_run": bool, "force": bool, "ranges": "ranges"},
    "progress": {"keys": list},
    "evict": {"paths": list, "force": bool},
    "pin": {"paths": list, "ref": str},
    "unpin": {"paths": list, "ref": str},
    "verify": {"paths": list, "full": bool},
    "stats": {"prometheus": bool},
    "sync": {},
}
OPTIONAL = {("status", "path"), ("pin", "ref"), ("unpin", "ref"), ("promote", "ranges")}


def check(req):
    if not isinstance(req, dict):
        raise ReqError("EINVAL", "request is not a JSON object")
    op = req.get("op")
    if op not in SCHEMA:
        raise ReqError("EINVAL", f"unknown op {op!r}")
    fields = SCHEMA[op]
    for k in req:
        if k != "op" and k not in fields:
            raise ReqError("EINVAL", f"{op}: unknown field {k!r}")
    for k, t in fields.items():
        if k not in req:
            if (op, k) in OPTIONAL:
                continue
            raise ReqError("EINVAL", f"{op}: missing field {k!r}")
        if t == "ranges":  # [[offset, length], ...]
            if not (isinstance(req[k], list) and req[k] and all(
                    isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r)
                    and r[0] >= 0 and r[1] > 0 for r in req[k])):
                raise ReqError("EINVAL", f"{op}: {k} must be a list of [offset, length]")
            continue
        if not isinstance(req[k], t):
            raise ReqError("EINVAL", f"{op}: {k} must be {t.__name__}")
        if t is list and not all(isinstance(x, str) for x in req[k]):
            raise ReqError("EINVAL", f"{op}: {k} must hold strings")
    for p in req.get("paths", []) + ([req["path"]] if "path" in req else []):
        if p.startswith("/") or ".." in p.split("/"):
            raise ReqError("EINVAL", f"{p}: not a mount-relative path")
    return op


class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        srv = self.server
        if srv.mode == "turn_away":  # the daemon at its caps: refused unread, closed
            self.wfile.write(b'{"ok":false,"errno":"EAGAIN","error":"too many connections '
                             b'(at most 16 of other users at once): try again later"}\n')
            return
        line = self.rfile.readline(REQ_MAX + 1)
        if srv.mode == "cut":  # a daemon that died while it wrote its reply
            self.wfile.write(b'{"ok":true,"metrics":{"served":{"local_bytes":1,')
            return
        if srv.mode == "garbage":
            self.wfile.write(b"this is not json\n")
            return
        if srv.mode == "huge":
            try:
                for _ in range(257):
                    self.wfile.write(b" " * MiB)
            except OSError:
                pass  # wfsctl hung up once it had seen enough
            return
        if srv.mode == "silent":
            return
        if srv.mode == "hang":  # a stopped daemon: the line read, no reply ever
            srv.stop.wait()
            return
        try:
            if len(line) > REQ_MAX or (len(line) == REQ_MAX + 1 and not line.endswith(b"\n")):
                raise ReqError("E2BIG", "request over 64 KiB")
            if not line.endswith(b"\n"):
                raise ReqError("EINVAL", "request not terminated by a newline")
            try:
                req = json.loads(line)
            except ValueError as e:
                raise ReqError("EINVAL", f"malformed JSON: {e}")
            op = check(req)
            with srv.hub.lock:
                srv.hub.requests.append(req)
                # the daemon's caps turn a connection away with EAGAIN
                if op == "progress" and srv.busy_polls > 0:
                    srv.busy_polls -= 1
                    raise ReqError("EAGAIN", "too many connections (at most 128 at once): "
                                   "try again later")
            if op in CHANGING and not req.get("dry_run"):
                cred = self.request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                               struct.calcsize("3i"))
                uid = struct.unpack("3i", cred)[1]
                if uid not in srv.allow_uids:
                    raise ReqError("EPERM", f"{op}: uid {uid} is neither root nor the mount owner")
            with srv.hub.lock:
                rep = getattr(srv.hub, "op_" + op)(req)
            rep = dict({"ok": True}, **rep)
        except ReqError as e:
            rep = {"ok": False, "error": str(e), "errno": e.errno_name}
        self.wfile.write(json.dumps(rep).encode() + b"\n")


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path, hub, allow_uids=None, mode="normal"):
        if os.path.exists(path):
            os.unlink(path)
        super().__init__(path, Handler)
        self.hub, self.mode = hub, mode
        self.busy_polls = 0  # progress requests to turn away with EAGAIN first
        self.allow_uids = allow_uids if allow_uids is not None else {0, os.getuid()}
        self.stop = threading.Event()
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()
        threading.Thread(target=self.copier, daemon=True).start()

    def copier(self):
        while not self.stop.wait(0.05):
            self.hub.tick(0.05)

    def close(self):
        self.stop.set()
        self.shutdown()
        self.server_close()


def make_tree(root, sock):
    """A directory shaped like the mount (empty files; snapshot links as the
    daemon shows them), marked as the mount root."""
    for repo, blobs in HUB.items():
        for tag, _size, _b, _s, snaps in blobs:
            bid = blob_id(tag)
            os.makedirs(f"{root}/{repo}/blobs", exist_ok=True)
            if tag not in REAL:
                open(f"{root}/{repo}/blobs/{bid}", "w").close()
            for rev, path in snaps:
                entry = f"{root}/{repo}/snapshots/{rev}/{path}"
                os.makedirs(os.path.dirname(entry), exist_ok=True)
                depth = path.count("/")
                if tag in REAL:
                    open(entry, "w").close()
                elif not os.path.lexists(entry):
                    os.symlink("../" * (2 + depth) + f"blobs/{bid}", entry)
    os.setxattr(root, "user.wfs.socket", sock.encode())


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "serve":
        import argparse
        ap = argparse.ArgumentParser(prog="fake_ctl_server.py serve")
        ap.add_argument("--socket", required=True)
        ap.add_argument("--tree", required=True)
        ap.add_argument("--speed", type=float, default=40)
        ap.add_argument("--allow-uids", default="")
        a = ap.parse_args(sys.argv[2:])
        os.makedirs(a.tree, exist_ok=True)
        sock = os.path.abspath(a.socket)
        make_tree(a.tree, sock)
        allow = {int(u) for u in a.allow_uids.split(",") if u} or None
        Server(sock, Hub(a.speed), allow_uids=allow)
        print(f"serving {sock}; mount root {os.path.abspath(a.tree)}", flush=True)
        threading.Event().wait()
    print(__doc__, file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
