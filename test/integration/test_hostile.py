#!/usr/bin/env python3
"""Hostile NAS content and other local users.

A NAS tree with names holding newlines, control characters, invalid UTF-8
and 255 bytes, a path near PATH_MAX, a 100k-entry directory, a 45-hop link
chain, FIFOs, a socket, a device node, links into /proc and /dev, and a
hub whose blobs are absolute links into a blob store beside it, mounted
for real: what the mount shows (DESIGN.md "The namespace"), that nothing
blocks on a FIFO, that replies and the log escape the names, that the
links leaving NAS_HUB are counted at start-up with the root= to name, and
that a link swapped into a parent component of a blob's NAS path between
lookup and open (or copy) is refused, never followed; nor is one swapped in
for a file (or a directory above it) a reader holds open: its attributes
are never the target's.
"""

import errno
import hashlib
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from wfstest import ctl_json, ctl_request, det_bytes, make_hf_repo  # noqa: E402

NAMES = "models--hostile--names"    # hostile names, specials, a chain
STORE_REPO = "models--hostile--store"  # blobs are absolute links into STORE
SWAP = "models--hostile--swap"      # a parent swapped for a link under a reader
HOG = "models--hostile--hog"        # keeps the one copy worker busy
VICTIM = "models--hostile--victim"  # its parent swapped while its copy is queued
BAD_REPO = b"models--hostile--bad\xff"  # a repo whose name is not UTF-8

ODD = {  # valid UTF-8, hostile: promoted, named in replies and the log
    b"new\nline.txt": b"newline\n",
    b"esc\x1b[31mred\x07.txt": b"escape",
    b"tab\there.txt": b"tab",
    b"del\x7f.txt": b"del",
    b"L" * 251 + b".txt": b"two hundred fifty-five",
    "ünï 中.txt".encode(): b"unicode",
}
BAD_FILE = b"bad\xff\xfe.txt"
BAD_DANGLING = b"dang\xff"
BAD_BLOB = b"blob\xff"
BAD_LINK = b"link\xff"
CHAIN = 45                   # links c0 -> c1 -> ... -> c44 -> target.bin
HOPS = 40                    # core/resolve.h HUB_MAX_HOPS
MANY = 100000
SPECIAL_LINKS = {"proc-link": "/proc/self/environ", "dev-link": "/dev/zero"}
SETTLE = 60                  # seconds a start-up scan or a small copy may take

MiB = 1 << 20
F = {}                       # the fixture (setUpModule)


def b(p):
    return os.fsencode(p)


def wait_log(tc, mount, pattern, timeout=SETTLE):
    rx = re.compile(pattern)
    if not wfstest.wait_until(lambda: rx.search(mount.log()), timeout):
        tc.fail("no log line /%s/ within %d s; log:\n%s" % (pattern, timeout, mount.log()[-5000:]))
    return rx.search(mount.log())


def remove(path):
    """Remove a link, a file or a tree, if there."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def scan_line(mount):
    m = re.search(r"start-up: (no link|\d+ links?) under the repos' blobs/ and snapshots/ .*",
                  mount.log())
    return m.group(0) if m else None


def build_tree(base):
    hub, store = os.path.join(base, "hub"), os.path.join(base, "store")
    os.makedirs(hub)
    os.makedirs(store)
    F.update(base=base, hub=hub, store=store)

    # NAMES: ordinary files, then everything hostile in sub-directories of
    # the revision
    rev = make_hf_repo(hub, NAMES, {"config.json": b"{}\n",
                                    "model.safetensors": det_bytes("hostile", 200000)})
    snap = b(os.path.join(hub, NAMES, "snapshots", rev))
    F.update(rev=rev, snap=snap)
    os.makedirs(os.path.join(snap, b"odd"))
    for name, data in ODD.items():
        with open(os.path.join(snap, b"odd", name), "wb") as f:
            f.write(data)
    bad = os.path.join(snap, b"bad")
    os.makedirs(bad)
    with open(os.path.join(bad, BAD_FILE), "wb") as f:
        f.write(b"invalid utf-8 name")
    os.symlink(b"nowhere\xfe", os.path.join(bad, BAD_DANGLING))
    with open(os.path.join(b(hub), b(NAMES), b"blobs", BAD_BLOB), "wb") as f:
        f.write(b"blob with an invalid name")
    os.symlink(b"../../../blobs/" + BAD_BLOB, os.path.join(bad, BAD_LINK))

    special = os.path.join(snap, b"special")
    os.makedirs(special)
    os.mkfifo(os.path.join(special, b"fifo"))
    os.mknod(os.path.join(special, b"null"), stat.S_IFCHR | 0o666, os.makedev(1, 3))
    # sun_path holds 108 bytes: bind short, then move the socket in place
    short = tempfile.mktemp(prefix="wfs-sock-", dir="/tmp")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(short)
    os.rename(short, os.path.join(special, b"sock"))
    s.close()
    os.symlink(b"fifo", os.path.join(special, b"to-fifo"))
    for name, target in SPECIAL_LINKS.items():
        os.symlink(target, os.path.join(special, b(name)))
    os.mkfifo(os.path.join(b(hub), b(NAMES), b"blobs", b"fifo-blob"))
    os.mkfifo(os.path.join(b(hub), b(NAMES), b"refs", b"fifo"))

    chain = os.path.join(snap, b"chain")
    os.makedirs(chain)
    with open(os.path.join(chain, b"target.bin"), "wb") as f:
        f.write(b"end of the chain")
    for i in range(CHAIN):
        nxt = b"c%d" % (i + 1) if i + 1 < CHAIN else b"target.bin"
        os.symlink(nxt, os.path.join(chain, b"c%d" % i))

    # STORE_REPO: huggingface_hub layout, but each blob an absolute link
    # into a blob store beside the hub (sharded by the first two digits)
    files = {"a.bin": det_bytes("store-a", 3000), "b.bin": det_bytes("store-b", 4000),
             "c.bin": det_bytes("store-c", 5000)}
    make_hf_repo(hub, STORE_REPO, files)
    blobs = os.path.join(hub, STORE_REPO, "blobs")
    for sha in os.listdir(blobs):
        real = os.path.join(store, sha[:2], sha)
        os.makedirs(os.path.dirname(real), exist_ok=True)
        os.rename(os.path.join(blobs, sha), real)
        os.symlink(real, os.path.join(blobs, sha))
    F["store_escapes"] = 2 * len(files)  # each blob link and each snapshot link

    # the swaps (part 5)
    F["swap_data"] = det_bytes("swap", 64 * 1024)
    F["swap_rev"] = make_hf_repo(hub, SWAP, {"model.safetensors": F["swap_data"]})
    F["hog_rev"] = make_hf_repo(hub, HOG, {"model.safetensors": bytes(64 * MiB)})
    F["victim_data"] = det_bytes("victim", MiB)
    F["victim_rev"] = make_hf_repo(hub, VICTIM, {"model.safetensors": F["victim_data"]})

    # a repo whose name is not UTF-8, with one real file in a snapshot
    bad_snap = os.path.join(b(hub), BAD_REPO, b"snapshots", b"0" * 40)
    os.makedirs(bad_snap)
    os.makedirs(os.path.join(b(hub), BAD_REPO, b"blobs"))
    with open(os.path.join(bad_snap, b"model.bin"), "wb") as f:
        f.write(b"in a repo named badly")

    # a path near PATH_MAX (4096 with its NUL) from / on the NAS and in the
    # mount (MNT is as long as HUB), and one past it
    deep = os.path.join(hub, "deep")
    room = 4090 - len(deep) - len("/file.bin")
    parts = []
    while room > 0:
        n = min(200, room - 1)
        parts.append("d" * n)
        room -= n + 1
    F["deep_rel"] = os.path.join("deep", *parts)
    os.makedirs(os.path.join(hub, F["deep_rel"]))
    F["deep_file"] = os.path.join(F["deep_rel"], "file.bin")
    with open(os.path.join(hub, F["deep_file"]), "wb") as f:
        f.write(b"deep")
    fd = os.open(os.path.join(hub, F["deep_rel"]), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.mkdir("o" * 100, dir_fd=fd)
        fd2 = os.open("o" * 100, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(os.open("beyond.bin", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd2))
        os.close(fd2)
    finally:
        os.close(fd)

    many = os.path.join(hub, "many")
    os.makedirs(many)
    for i in range(MANY):
        os.close(os.open(os.path.join(many, "f%06d" % i), os.O_CREAT | os.O_WRONLY, 0o644))


def setUpModule():
    wfstest.require_mount_capability()
    wfstest.require_wfsctl()
    base = wfstest.make_base("wfs-hostile-")
    F["base"] = base
    try:
        build_tree(base)
        F["local"], F["mnt"] = os.path.join(base, "local"), os.path.join(base, "mnt")
        os.makedirs(F["mnt"])
        F["mount"] = wfstest.ForegroundMount(F["hub"], F["local"], F["mnt"],
                                             ["allow_other", "auto_promote=off"]).start()
        F["sock"] = wfstest.wait_ctl(F["mnt"])
    except BaseException:
        tearDownModule()
        raise


def tearDownModule():
    mount = F.pop("mount", None)
    if mount is not None:
        mount.stop()
        mount.cleanup()
    if F.get("base"):
        if F.get("mnt") and wfstest.is_mounted(F["mnt"]):
            wfstest.unmount(F["mnt"])
        shutil.rmtree(F["base"], ignore_errors=True)


def m(*parts):
    """A path in the mount, as bytes (names may not be UTF-8)."""
    return os.path.join(b(F["mnt"]), *[b(p) for p in parts])


def n(*parts):
    """The same path on the NAS."""
    return os.path.join(b(F["hub"]), *[b(p) for p in parts])


def snap(*parts):
    return m(NAMES, "snapshots", F["rev"], *parts)


class Names(unittest.TestCase):
    def test_hostile_names_listed_and_read(self):
        self.assertEqual(sorted(os.listdir(snap("odd"))), sorted(ODD))
        for name, data in ODD.items():
            p = os.path.join(snap("odd"), name)
            self.assertTrue(stat.S_ISREG(os.lstat(p).st_mode), name)
            self.assertEqual(wfstest.read_file(p), data, name)

    def test_invalid_utf8(self):
        bad = snap("bad")
        self.assertEqual(sorted(os.listdir(bad)), sorted([BAD_FILE, BAD_DANGLING, BAD_LINK]))
        self.assertEqual(wfstest.read_file(os.path.join(bad, BAD_FILE)), b"invalid utf-8 name")
        self.assertEqual(os.readlink(os.path.join(bad, BAD_DANGLING)), b"nowhere\xfe")
        # a snapshot entry that is a blob of its repo: the link huggingface_hub writes
        self.assertEqual(os.readlink(os.path.join(bad, BAD_LINK)), b"../../../blobs/" + BAD_BLOB)
        self.assertEqual(wfstest.read_file(os.path.join(bad, BAD_LINK)),
                         b"blob with an invalid name")

    def test_path_near_path_max(self):
        p = m(F["deep_file"])
        self.assertGreater(len(p), 4080)
        self.assertEqual(wfstest.read_file(p), b"deep")
        # past PATH_MAX the daemon cannot name the NAS path: an error for
        # that name (or the entry is left out), and the mount goes on
        fd = os.open(m(F["deep_rel"]), os.O_RDONLY | os.O_DIRECTORY)
        try:
            got = wfstest.errno_of(os.stat, "o" * 100, dir_fd=fd)
            self.assertIn(got, (None, errno.ENAMETOOLONG, errno.ENOENT), wfstest.errname(got))
        finally:
            os.close(fd)
        self.assertEqual(wfstest.read_file(snap("config.json")), b"{}\n")

    def test_many_entries(self):
        self.assertEqual(len(os.listdir(m("many"))), MANY)

    def test_link_chain_at_the_resolver_limit(self):
        chain = snap("chain")
        for i in range(CHAIN):
            p = os.path.join(chain, b"c%d" % i)
            st = os.lstat(p)
            if CHAIN - i > HOPS:  # more hops than the resolver follows: the link itself
                self.assertTrue(stat.S_ISLNK(st.st_mode), "c%d" % i)
                self.assertEqual(os.readlink(p), b"c%d" % (i + 1))
            else:
                self.assertTrue(stat.S_ISREG(st.st_mode), "c%d: mode %o" % (i, st.st_mode))
                self.assertEqual(wfstest.read_file(p), b"end of the chain")

    def test_specials_hidden_links_shown(self):
        sp = snap("special")
        self.assertEqual(sorted(os.listdir(sp)), sorted(b(k) for k in SPECIAL_LINKS))
        for name in (b"fifo", b"null", b"sock", b"to-fifo"):
            self.assertEqual(wfstest.errno_of(os.lstat, os.path.join(sp, name)), errno.ENOENT,
                             name)
            self.assertEqual(wfstest.errno_of(os.open, os.path.join(sp, name),
                                              os.O_RDONLY | os.O_NONBLOCK), errno.ENOENT, name)
        for name, target in SPECIAL_LINKS.items():
            p = os.path.join(sp, b(name))
            self.assertTrue(stat.S_ISLNK(os.lstat(p).st_mode), name)
            self.assertEqual(os.readlink(p), b(target))
        self.assertNotIn(b"fifo-blob", os.listdir(m(NAMES, "blobs")))
        self.assertNotIn(b"fifo", os.listdir(m(NAMES, "refs")))

    def test_fifo_ref_is_never_opened(self):
        # pins read refs/<ref> on the NAS: a FIFO there is refused at once
        rep = ctl_request(F["sock"], {"op": "pin", "ref": "fifo", "paths": [NAMES]}, timeout=30)
        self.assertIsNotNone(rep, "no reply to a pin of a FIFO ref")
        self.assertIs(rep.get("ok"), False, rep)
        self.assertEqual(rep.get("errno"), "EINVAL", rep)
        rep = ctl_request(F["sock"], {"op": "status"}, timeout=30)
        self.assertTrue(rep and rep.get("ok"), rep)


class Replies(unittest.TestCase):
    def test_doctor_names_invalid_utf8(self):
        rep = ctl_request(F["sock"], {"op": "doctor", "path": NAMES})
        self.assertTrue(rep and rep.get("ok"), rep)
        links = {(e["path"], e["target"], e["problem"]) for e in rep["links"]}
        rel = "%s/snapshots/%s/" % (NAMES, F["rev"])
        self.assertIn((rel + "bad/dang\\xff", "nowhere\\xfe", "dangling"), links)
        for name, target in SPECIAL_LINKS.items():
            self.assertIn((rel + "special/" + name, target, "escapes"), links)
        loops = {p for p, t, why in links if why == "loop"}
        self.assertEqual(loops, {rel + "chain/c%d" % i for i in range(CHAIN - HOPS)})

    def test_promote_reply_names_and_log_escapes(self):
        mount = F["mount"]
        out = ctl_json(self, ["promote", "--wait", snap("odd").decode()])
        self.assertTrue(out.get("ok"), out)
        for name, data in ODD.items():
            p = os.path.join(snap("odd"), name)
            self.assertEqual(wfstest.state_of(p), "local", name)
            self.assertEqual(wfstest.read_file(p), data, name)
        # the keys, control characters and all, name the NAS files exactly
        rep = ctl_request(F["sock"], {"op": "promote", "paths": [
            "%s/snapshots/%s/odd" % (NAMES, F["rev"])]})
        self.assertTrue(rep and rep.get("ok"), rep)
        keys = {e["key"] for e in rep["blobs"]}
        self.assertEqual(keys, {os.path.join(n(NAMES, "snapshots", F["rev"], "odd"), k).decode()
                                for k in ODD})
        # one event, one line: a newline or ESC in a name is written \xNN
        key = os.path.join(n(NAMES, "snapshots", F["rev"], "odd"), b"new\nline.txt").decode()
        esc = key.replace("\n", "\\x0a")
        wait_log(self, mount, r"verified %s \(" % re.escape(esc), 0)
        log = mount.log()
        self.assertNotIn("\x1b", log)
        self.assertNotIn("\x07", log)
        prefix = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d wfs\[\w+\]: ")
        bad = [ln for ln in log.splitlines() if not prefix.match(ln)]
        self.assertEqual(bad, [], "log lines that do not start an event")

    def test_refused_write_logged_escaped(self):
        p = os.path.join(snap("bad"), BAD_FILE)
        self.assertEqual(wfstest.errno_of(os.open, p, os.O_WRONLY), errno.EROFS)
        with open(F["mount"].logf.name, "rb") as f:
            raw = f.read()
        self.assertNotIn(b"\xff\xfe", raw)
        wait_log(self, F["mount"], r"refused write open of \S*/bad/bad\\xff\\xfe\.txt", 0)

    def test_status_parses(self):
        rep = ctl_json(self, ["status", F["mnt"]])
        names = [r.get("repo") for r in rep["repos"]]
        for repo in (NAMES, STORE_REPO, SWAP):
            self.assertIn(repo, names)

    # core/status.c names repos, revisions and blob keys with json_string(),
    # which gives NULL for invalid UTF-8: the entry loses its name until it
    # uses reply_path() (core/reply.h).
    def test_status_names_invalid_utf8(self):
        rep = ctl_json(self, ["status", F["mnt"]])
        self.assertIn("models--hostile--bad\\xff", [r.get("repo") for r in rep["repos"]])


class NotUtf8Names(unittest.TestCase):
    """Names that are not UTF-8 can be named to wfsctl, end to end: it sends
    them as "path_hex"/"paths_hex" (JSON strings are UTF-8), the daemon
    takes the bytes."""

    def test_name_with_byte_e9(self):
        repo, rev = b"models--hostile--caf\xe9", "e" * 40
        snapdir = os.path.join(b(F["hub"]), repo, b"snapshots", b(rev))
        os.makedirs(snapdir)
        os.makedirs(os.path.join(b(F["hub"]), repo, b"blobs"))
        data = det_bytes("e9", 300000)
        with open(os.path.join(snapdir, b"caf\xe9.bin"), "wb") as f:
            f.write(data)
        with open(os.path.join(b(F["hub"]), repo, b"blobs", b"blob\xe9"), "wb") as f:
            f.write(b"a blob named with \xe9")
        os.symlink(b"../../blobs/blob\xe9", os.path.join(snapdir, b"lien\xe9.bin"))
        path = m(repo, "snapshots", rev, b"caf\xe9.bin")
        # as str, the way the shell hands wfsctl the bytes (surrogateescape)
        p, top = os.fsdecode(path), os.fsdecode(m(repo))
        rel = "models--hostile--caf\\xe9/snapshots/%s/caf\\xe9.bin" % rev

        rep = ctl_json(self, ["promote", "--dry-run", p])
        self.assertEqual([(x["key"], x["state"]) for x in rep["blobs"]],
                         [(os.fsdecode(n(repo, "snapshots", rev, b"caf\xe9.bin"))
                           .replace("\udce9", "\\xe9"), "nas")], rep)
        wfstest.ctl_check(self, ["promote", "--wait", p])
        self.assertEqual(wfstest.state_of(path), "local")
        self.assertEqual(wfstest.read_file(path), data)
        out, _ = wfstest.ctl_check(self, ["status", p])
        rep = ctl_json(self, ["status", top])
        self.assertEqual([(r["repo"], r["files"], r["local_files"]) for r in rep["repos"]],
                         [("models--hostile--caf\\xe9", 2, 1)], rep)
        self.assertEqual(ctl_json(self, ["verify", p]).get("checked"), 1)
        self.assertEqual(ctl_json(self, ["pin", p]).get("count"), 1)
        self.assertEqual(ctl_json(self, ["unpin", p]).get("count"), 1)
        self.assertEqual(ctl_json(self, ["evict", p]).get("evicted"), 1)
        self.assertEqual(wfstest.state_of(path), "nas")
        rep = ctl_json(self, ["promote", "--wait", "--range", "0:4K", p])
        self.assertEqual(wfstest.state_of(path), "partial")
        # status names the partial file escaped, and still finds its ranges
        rep = ctl_json(self, ["status", top])
        self.assertEqual([(x["key"], x["nranges"], x["ranges"]) for x in rep["partial"]
                          if "caf\\xe9.bin" in x["key"]],
                         [(os.fsdecode(n(repo, "snapshots", rev, b"caf\xe9.bin"))
                           .replace("\udce9", "\\xe9"), 1, [[0, 4096]])], rep["partial"])
        ctl_json(self, ["evict", p])
        rep = ctl_json(self, ["doctor", top])
        self.assertEqual(rep.get("links"), [], rep)
        # the directory whose name is not UTF-8: both files, the link's blob too
        wfstest.ctl_check(self, ["promote", "--wait", top])
        lien = m(repo, "snapshots", rev, b"lien\xe9.bin")
        self.assertEqual((wfstest.state_of(path), wfstest.state_of(lien)), ("local", "local"))
        self.assertEqual(wfstest.read_file(lien), b"a blob named with \xe9")
        wfstest.ctl_check(self, ["evict", top])

        # a ref pin of this repo: the index is still written with it (a
        # pin's name went through a UTF-8-only writer, and every later
        # write of the index failed)
        os.makedirs(os.path.join(b(F["hub"]), repo, b"refs"))
        with open(os.path.join(b(F["hub"]), repo, b"refs", b"main"), "w") as f:
            f.write(rev)
        self.addCleanup(lambda: wfstest.run_wfsctl(["unpin", "--ref", "main", top]))
        wfstest.ctl_check(self, ["pin", "--ref", "main", top])
        rep = ctl_request(F["sock"], {"op": "sync"}, timeout=30)
        self.assertTrue(rep and rep.get("ok"), rep)
        pins = ctl_request(F["sock"], {"op": "status"}, timeout=30).get("ref_pins") or []
        self.assertEqual([(x["repo"], x["ref"]) for x in pins],
                         [("models--hostile--caf\\xe9", "main")], pins)
        wfstest.ctl_check(self, ["unpin", "--ref", "main", top])
        rep = ctl_request(F["sock"], {"op": "sync"}, timeout=30)
        self.assertTrue(rep and rep.get("ok"), rep)
        wfstest.ctl_check(self, ["evict", top])

        # the protocol: the bytes in hex, and what it refuses
        hexrel = os.path.join(repo, b"snapshots", b(rev), b"caf\xe9.bin").hex()
        rep = ctl_request(F["sock"], {"op": "promote", "paths_hex": [hexrel], "dry_run": True})
        self.assertTrue(rep and rep.get("ok"), rep)
        self.assertEqual(len(rep["blobs"]), 1, rep)
        rep = ctl_request(F["sock"], {"op": "status", "path_hex": repo.hex()})
        self.assertEqual([r["repo"] for r in rep["repos"]], ["models--hostile--caf\\xe9"], rep)
        for req in ({"op": "promote", "paths_hex": ["zz"]}, {"op": "promote", "paths_hex": [""]},
                    {"op": "promote", "paths_hex": ["6100"]}, {"op": "status", "path_hex": 5},
                    # two hex digits a byte: not a sign, a blank or 0x
                    {"op": "status", "path_hex": "-1"}, {"op": "status", "path_hex": "+1"},
                    {"op": "status", "path_hex": " a"}, {"op": "status", "path_hex": "0x61"},
                    {"op": "promote", "paths_hex": [hexrel], "paths": [rel]},
                    {"op": "status", "path_hex": repo.hex(), "path": "x"}):
            rep = ctl_request(F["sock"], req)
            self.assertEqual((rep.get("ok"), rep.get("errno")), (False, "EINVAL"), (req, rep))
        # the reply's escaped text is not the name (it is a name of its own)
        rep = ctl_request(F["sock"], {"op": "promote", "paths": [rel], "dry_run": True})
        self.assertEqual((rep.get("ok"), rep.get("errno")), (False, "ENOENT"), rep)
        self.assertIn(rel, rep.get("error", ""))


class Terminal(unittest.TestCase):
    def test_wfsctl_prints_no_control_characters(self):
        """wfsctl's human output replaces the control characters of NAS
        names, link targets and reasons ('?', as its tables do): a name
        cannot forge a line or drive the terminal."""
        repo, rev = "models--hostile--ctl", "c" * 40
        snapdir = os.path.join(F["hub"], repo, "snapshots", rev)
        os.makedirs(snapdir)
        os.symlink(b"gone\x1b[31m\nFAKE LINE", os.path.join(b(snapdir), b"dang\x1b]0;x\x07\n"))
        # U+009B, C1's one-character ESC [ (UTF-8 c2 9b)
        os.symlink(b"gone", os.path.join(b(snapdir), b"c1\xc2\x9b2Jname"))
        rc, out, err = wfstest.run_wfsctl(["doctor", os.path.join(F["mnt"], repo)])
        self.assertEqual(rc, 1, "doctor of a dangling link: %s%s" % (out, err))
        self.assertIn("dang?]0;x??", out)
        self.assertIn("gone?[31m?FAKE LINE", out)
        self.assertIn("c1?2Jname", out)
        # the daemon's error names the file
        p = os.fsdecode(os.path.join(snap("odd"), b"new\nline.txt"))
        rc, out2, err = wfstest.run_wfsctl(["promote", "--range", "0:1G", p])
        self.assertEqual(rc, 1, "a range past the end: %s%s" % (out2, err))
        self.assertIn("odd/new?line.txt: range 0:1073741824 is past the end", err)
        # a ref pin names its repo
        esc = "models--hostile--ref\x1b]0;x\x07\nFAKE"
        ev = wfstest.make_hf_repo(F["hub"], esc, {"a.bin": b"a"})
        top = os.fsdecode(m(esc))
        self.assertTrue(wfstest.wait_until(lambda: os.path.isdir(top), 10))
        rc, out3, err3 = wfstest.run_wfsctl(["pin", "--ref", "main", top])
        self.assertEqual(rc, 0, out3 + err3)
        self.assertIn("pinned models--hostile--ref?]0;x??FAKE refs/main (revision %s" % ev, out3)
        wfstest.ctl_check(self, ["unpin", "--ref", "main", top])
        for text in (out, out2, err, out3):
            self.assertFalse(any(c in text for c in "\x1b\x07\x9b"), repr(text))
            self.assertFalse(any(ln.startswith("FAKE") for ln in text.splitlines()), repr(text))


class Scan(unittest.TestCase):
    def test_links_leaving_the_hub_counted_at_start(self):
        mount = F["mount"]
        total = F["store_escapes"] + len(SPECIAL_LINKS)
        line = wait_log(self, mount, r"start-up: \d+ links under the repos' blobs/ and "
                        r"snapshots/ lead outside NAS_HUB .*").group(0)
        self.assertIn("start-up: %d links under the repos' blobs/ and snapshots/ lead outside "
                      "NAS_HUB %s and are shown as links, never followed: %d into %s "
                      "(-o root=%s would serve them), %d elsewhere"
                      % (total, F["hub"], F["store_escapes"], F["store"], F["store"],
                         len(SPECIAL_LINKS)), line)
        self.assertEqual(len(re.findall("start-up: .* under the repos' blobs/", mount.log())), 1)


class Swapped(unittest.TestCase):
    """A link swapped into a parent component of a blob's NAS path between
    the lookup and the open (or the copy), leading to a file with the very
    bytes of the blob: following it would succeed, so only a refusal
    passes."""

    def swap_in_link(self, repo):
        blobs = os.path.join(F["hub"], repo, "blobs")
        elsewhere = os.path.join(F["base"], "elsewhere-" + repo)
        shutil.copytree(blobs, elsewhere)
        os.rename(blobs, blobs + ".moved")
        os.symlink(elsewhere, blobs)

        def restore():
            os.unlink(blobs)
            os.rename(blobs + ".moved", blobs)
            shutil.rmtree(elsewhere)
        self.addCleanup(restore)

    def test_reader_refused(self):
        sha = os.listdir(os.path.join(F["hub"], SWAP, "blobs"))[0]
        dfd = os.open(os.path.join(F["mnt"], SWAP, "blobs"), os.O_RDONLY | os.O_DIRECTORY)
        self.addCleanup(os.close, dfd)
        self.assertTrue(stat.S_ISREG(os.stat(sha, dir_fd=dfd).st_mode))  # looked up
        # held open: the kernel keeps the name however its caches are
        # dropped meanwhile (test/run's solo lane drops them)
        keep = os.open(sha, os.O_RDONLY, dir_fd=dfd)
        self.addCleanup(os.close, keep)
        self.swap_in_link(SWAP)

        def read():
            fd = os.open(sha, os.O_RDONLY, dir_fd=dfd)
            try:
                return os.read(fd, 1 << 20)
            finally:
                os.close(fd)
        got = wfstest.errno_of(read)
        self.assertIn(got, (errno.EIO, errno.ELOOP), "open through a swapped-in link: %s"
                      % wfstest.errname(got))
        wait_log(self, F["mount"], r"open %s: Too many levels of symbolic links"
                 % re.escape(os.path.join(F["hub"], SWAP, "blobs", sha)), 0)

    def test_name_swapped_for_blob_link_reopens(self):
        """A snapshot's real file replaced on the NAS by the link
        huggingface_hub writes (a mirror re-synced with links) while the
        kernel still holds the name (a snapshot name is kept blob_timeout,
        60 s): the open answers ESTALE, open(2) looks the name up again and
        reads the same bytes through the new link -- not EIO."""
        repo, name = "models--hostile--resync", "model.safetensors"
        data = det_bytes("resync", 10000)
        rev = make_hf_repo(F["hub"], repo, {name: data}, real=(name,))
        self.addCleanup(remove, os.path.join(F["hub"], repo))
        rel = os.path.join(repo, "snapshots", rev, name)
        self.assertEqual(wfstest.read_file(os.path.join(F["mnt"], rel)), data)
        # held open: the kernel keeps the name (and its inode) however its
        # caches are dropped meanwhile (test/run's solo lane drops them)
        keep = os.open(os.path.join(F["mnt"], rel), os.O_RDONLY)
        self.addCleanup(os.close, keep)
        # what huggingface_hub would have written: the blob, then the link
        sha = hashlib.sha256(data).hexdigest()
        with open(os.path.join(F["hub"], repo, "blobs", sha), "wb") as f:
            f.write(data)
        nas = os.path.join(F["hub"], rel)
        os.symlink("../../blobs/" + sha, nas + ".tmp")
        os.rename(nas + ".tmp", nas)
        got = wfstest.errno_of(wfstest.read_file, os.path.join(F["mnt"], rel))
        self.assertIsNone(got, "open of a name the NAS swapped for its blob's link: %s"
                          % wfstest.errname(got))
        self.assertEqual(wfstest.read_file(os.path.join(F["mnt"], rel)), data)
        self.assertEqual(os.readlink(os.path.join(F["mnt"], rel)), "../../blobs/" + sha)
        wait_log(self, F["mount"], r"open %s: a link on the NAS now: stale" % re.escape(nas), 0)

    def test_getattr_follows_no_link(self):
        """A file held open, then on the NAS the file itself, or a directory
        above it, swapped for a link to a root-only file outside NAS_HUB:
        once the attributes time out (attr_timeout, 1 s: not a blob), the
        GETATTR of the held inode says ESTALE, never the target's size."""
        secret = os.path.join(F["base"], "getattr-secret.bin")
        with open(secret, "wb") as f:
            f.write(det_bytes("secret", 4321))
        os.chmod(secret, 0o600)
        outside = os.path.join(F["base"], "getattr-outside")
        os.makedirs(outside)
        os.link(secret, os.path.join(outside, "file.bin"))
        for what in ("file", "dir"):
            top = os.path.join(F["hub"], "getattr-" + what)
            os.makedirs(top)
            self.addCleanup(remove, top + ".moved")
            self.addCleanup(remove, top)
            nas = os.path.join(top, "file.bin")
            with open(nas, "wb") as f:
                f.write(det_bytes(what, 1000))
            fd = os.open(os.path.join(F["mnt"], "getattr-" + what, "file.bin"), os.O_RDONLY)
            self.addCleanup(os.close, fd)
            self.assertEqual(os.fstat(fd).st_size, 1000, what)
            if what == "file":
                os.unlink(nas)
                os.symlink(secret, nas)
            else:
                os.rename(top, top + ".moved")
                os.symlink(outside, top)

            def changed():
                """fstat until it fails or shows other attributes (the
                kernel asks the daemon once they timed out)."""
                try:
                    return os.fstat(fd).st_size != 1000 and ("size", os.fstat(fd).st_size)
                except OSError as e:
                    return ("errno", e.errno)
            got = wfstest.wait_until(changed, 10, 0.05)
            self.assertEqual(got, ("errno", errno.ESTALE), "fstat of a file held open, its %s "
                             "swapped for a link on the NAS (the target is %d bytes)" % (what, 4321))
            wait_log(self, F["mount"], r"getattr %s: .* on the NAS now: stale"
                     % re.escape(os.path.join(top, "file.bin")), 0)

    def test_lookup_in_a_swapped_directory_follows_no_link(self):
        """A directory the kernel holds, swapped on the NAS for a link to a
        root-only directory outside NAS_HUB: a name looked up in it before
        its attributes time out is looked up in the directory as it is now
        (a link: ESTALE, and the kernel's own walk then meets the link),
        never through the link by the daemon -- whose lstat, as root,
        answered the size of a file the reader may not see."""
        outside = os.path.join(F["base"], "lookup-outside")
        os.makedirs(outside)
        os.chmod(outside, 0o700)
        with open(os.path.join(outside, "other.bin"), "wb") as f:
            f.write(det_bytes("lookup secret", 4321))
        top = os.path.join(F["hub"], "lookup-dir")
        os.makedirs(top)
        self.addCleanup(remove, top + ".moved")
        self.addCleanup(remove, top)
        with open(os.path.join(top, "a.bin"), "wb") as f:
            f.write(det_bytes("lookup a", 1000))
        seen = os.path.join(F["mnt"], "lookup-dir")
        self.assertEqual(os.listdir(seen), ["a.bin"])  # the kernel holds the directory
        os.rename(top, top + ".moved")
        os.symlink(outside, top)
        size, err = wfstest.as_uid(lambda p: os.stat(p).st_size, os.path.join(seen, "other.bin"))
        self.assertIsNone(size, "uid %d saw the size of a root-only file outside NAS_HUB "
                          "through a directory swapped for a link" % wfstest.NOBODY)
        self.assertIn(err, (errno.ESTALE, errno.EACCES, errno.ENOENT), wfstest.errname(err))

    def test_copy_refused(self):
        # A mount of its own: one copy worker, slowed, so the victim's copy
        # waits in the queue behind the hog's while its parent is swapped.
        # The blob store beside the hub is a root= here: its links are not
        # counted as leaving.
        local, mnt = os.path.join(F["base"], "local2"), os.path.join(F["base"], "mnt2")
        os.makedirs(mnt, exist_ok=True)
        mount = wfstest.ForegroundMount(F["hub"], local, mnt, [
            "allow_other", "auto_promote=off", "copy_workers=1", "promote_mbps=2",
            "root=" + F["store"]]).start()

        def stop():
            mount.stop()
            mount.cleanup()
        self.addCleanup(stop)
        sock = wfstest.wait_ctl(mnt)
        line = wait_log(self, mount, r"start-up: \d+ links under .*").group(0)
        self.assertIn(": %d elsewhere" % len(SPECIAL_LINKS), line)
        self.assertNotIn("root=", line)

        hog = "%s/snapshots/%s/model.safetensors" % (HOG, F["hog_rev"])
        victim = "%s/snapshots/%s/model.safetensors" % (VICTIM, F["victim_rev"])
        key = os.path.realpath(os.path.join(F["hub"], victim))
        rep = ctl_request(sock, {"op": "promote", "paths": [hog]})
        self.assertTrue(rep and rep.get("ok"), rep)
        self.assertEqual(wfstest.wait_state(os.path.join(mnt, hog), "copying", SETTLE), "copying")
        rep = ctl_request(sock, {"op": "promote", "paths": [victim]})
        self.assertTrue(rep and rep.get("ok"), rep)
        self.assertEqual([e["state"] for e in rep["blobs"]], ["queued"], rep)

        self.swap_in_link(VICTIM)
        rep = ctl_request(sock, {"op": "progress", "keys": [key]})
        self.assertEqual(rep["blobs"][0]["state"], "queued",
                         "the copy must start after the swap: %s" % rep)
        rep = ctl_request(sock, {"op": "evict", "paths": [hog]})  # cancels the hog
        self.assertTrue(rep and rep.get("ok"), rep)

        def settled():
            r = ctl_request(sock, {"op": "progress", "keys": [key]})
            return r and r["blobs"][0]["state"] not in ("queued", "copying") and r["blobs"][0]
        got = wfstest.wait_until(settled, SETTLE)
        self.assertTrue(got, "the victim's copy did not settle")
        self.assertEqual(got["state"], "failed", got)
        self.assertIn("cannot open %s: Too many levels of symbolic links" % key, got["reason"])
        wait_log(self, mount, r"promotion of %s failed: cannot open" % re.escape(key), 0)
        self.assertEqual(wfstest.store_files(local), {}, "a copy was made")


if __name__ == "__main__":
    wfstest.main()
