#!/usr/bin/env python3
"""Links never widen access.  The daemon follows NAS links as root; a link
whose way crosses a directory that others cannot search (a hub-level
blob store kept 0700, a directory with r but no x, another user's private
repo, a locked directory of a -o root= root) must not hand its target to a
reader the NAS keeps out.  Such a link is shown as a link (relative,
inside the mount, for a target in NAS_HUB; as on the NAS for one in
another root), and the kernel walks the way itself, checking each
directory against the reader: what uid 65534 reads through the mount is
what it reads on the NAS, a group member reads what its group may, and
root still reads every byte.  The file stays the blob of the repo that
links to it: `promote` copies it, reads are served from the copy, and the
copy serves while the NAS is gone (the local record keeps the way).

Ways that every class may search keep the old presentation: a repo blob
linking into an open store is a regular file.
"""

import errno
import hashlib
import os
import shutil
import stat
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultnas  # noqa: E402
import wfstest  # noqa: E402
from test_nasgone import Mounted  # noqa: E402  (its daemon over a faultfs NAS)
from wfstest import ctl_check, state_of  # noqa: E402

MiB = 1 << 20
GROUP = 4242                       # a group uid 65534 joins for one case
CLOSED = "models--acc--closed"     # blobs link into a 0700 hub-level store
OPEN = "models--acc--open"         # blobs link into a 0755 one (control)
NOX = "models--acc--nox"           # a snapshot link into a dir with r, no x
PRIV = "models--acc--priv"         # a 0700 repo
EVIL = "models--acc--evil"         # a repo of links into PRIV
EXT = "models--acc--ext"           # blobs link into a further root
GRP = "models--acc--grp"           # blobs link into a 0750 store of GROUP
GRPX = "models--acc--grpx"         # into a 0705 one: GROUP may not search it
DL = "models--acc--dl"             # into the 0700 store through a link to it
REV = "c0" * 20

DATA = {name: wfstest.det_bytes("access-" + name, size) for name, size in (
    ("closed", 2 * MiB), ("open", MiB), ("nox", 4096), ("priv", 3000), ("ref", 40),
    ("ext-locked", 2 * MiB), ("ext-open", 5000), ("ext-rel", 6000), ("grp", 70000),
    ("grpx", 9000), ("dl", 300000))}
DATA["ref"] = REV.encode()


def sha(b):
    return hashlib.sha256(b).hexdigest()


def put(path, data, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def repo(hub, name, links):
    """A repo whose snapshot REV holds the links {name: text}; refs/main."""
    for entry, text in links.items():
        p = os.path.join(hub, name, "snapshots", REV, entry)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        os.symlink(text, p)
    wfstest.set_hf_ref(hub, name, "main", REV)


def blob_link(hub, name, key, target):
    """<name>/blobs/<sha> -> target, and the snapshot's w.bin linking to it
    as huggingface_hub writes it."""
    blobs = os.path.join(hub, name, "blobs")
    os.makedirs(blobs, exist_ok=True)
    os.symlink(target, os.path.join(blobs, sha(DATA[key])))
    repo(hub, name, {"w.bin": "../../blobs/" + sha(DATA[key])})


def build_hub(hub, root):
    """The NAS hub and the further root; returns {mount-relative path:
    data} of each entry reached through a closed way."""
    put(os.path.join(hub, ".closed", sha(DATA["closed"])), DATA["closed"])
    put(os.path.join(hub, ".open", sha(DATA["open"])), DATA["open"])
    put(os.path.join(hub, ".grp", sha(DATA["grp"])), DATA["grp"], 0o640)
    # (relative: the outage case reads this hub through faultfs, where an
    # absolute link would leave NAS_HUB)
    blob_link(hub, CLOSED, "closed", "../../.closed/" + sha(DATA["closed"]))
    put(os.path.join(hub, ".closed", sha(DATA["dl"])), DATA["dl"])
    os.symlink(".closed", os.path.join(hub, ".dl"))
    blob_link(hub, DL, "dl", "../../.dl/" + sha(DATA["dl"]))
    blob_link(hub, OPEN, "open", "../../.open/" + sha(DATA["open"]))
    blob_link(hub, GRP, "grp", os.path.join(hub, ".grp", sha(DATA["grp"])))
    put(os.path.join(hub, ".grpx", sha(DATA["grpx"])), DATA["grpx"])
    blob_link(hub, GRPX, "grpx", "../../.grpx/" + sha(DATA["grpx"]))
    put(os.path.join(hub, NOX, "snapshots", REV, "nox", "f"), DATA["nox"])
    repo(hub, NOX, {"via": "nox/f"})
    put(os.path.join(hub, PRIV, "blobs", sha(DATA["priv"])), DATA["priv"])
    repo(hub, PRIV, {"config.json": "../../blobs/" + sha(DATA["priv"])})
    repo(hub, EVIL, {"steal_ref": "../../../%s/refs/main" % PRIV,
                     "steal_cfg": "../../../%s/snapshots/%s/config.json" % (PRIV, REV),
                     "probe_yes": "../../../%s/./blobs/%s" % (PRIV, sha(DATA["priv"])),
                     "probe_no": "../../../%s/./blobs/nope" % PRIV,
                     "probe_yes2": "../../snapshots/../../%s/blobs/%s" % (PRIV, sha(DATA["priv"])),
                     "probe_no2": "../../snapshots/../../%s/blobs/nope" % PRIV})
    put(os.path.join(root, "locked", "x"), DATA["ext-locked"])
    put(os.path.join(root, "open", "y"), DATA["ext-open"])
    put(os.path.join(root, "locked", "z"), DATA["ext-rel"])
    blobs = os.path.join(hub, EXT, "blobs")
    os.makedirs(blobs)
    os.symlink(os.path.join(root, "locked", "x"), os.path.join(blobs, sha(DATA["ext-locked"])))
    os.symlink(os.path.join(root, "open", "y"), os.path.join(blobs, sha(DATA["ext-open"])))
    # (relative: from NAS_HUB's place on this host into the root)
    os.symlink(os.path.relpath(os.path.join(root, "locked", "z"), blobs),
               os.path.join(blobs, sha(DATA["ext-rel"])))
    repo(hub, EXT, {"locked.bin": "../../blobs/" + sha(DATA["ext-locked"]),
                    "open.bin": "../../blobs/" + sha(DATA["ext-open"]),
                    "rel.bin": "../../blobs/" + sha(DATA["ext-rel"])})
    os.chmod(os.path.join(hub, ".closed"), 0o700)
    os.chmod(os.path.join(hub, NOX, "snapshots", REV, "nox"), 0o744)
    os.chmod(os.path.join(hub, PRIV), 0o700)
    os.chmod(os.path.join(root, "locked"), 0o700)
    os.chown(os.path.join(hub, ".grp"), 0, GROUP)
    os.chown(os.path.join(hub, ".grp", sha(DATA["grp"])), 0, GROUP)
    os.chmod(os.path.join(hub, ".grp"), 0o750)
    os.chown(os.path.join(hub, ".grpx"), 0, GROUP)
    os.chmod(os.path.join(hub, ".grpx"), 0o705)
    snap = "snapshots/%s/" % REV
    return {CLOSED + "/" + snap + "w.bin": DATA["closed"],
            DL + "/" + snap + "w.bin": DATA["dl"],
            CLOSED + "/blobs/" + sha(DATA["closed"]): DATA["closed"],
            NOX + "/" + snap + "via": DATA["nox"],
            EVIL + "/" + snap + "steal_ref": DATA["ref"],
            EVIL + "/" + snap + "steal_cfg": DATA["priv"],
            EXT + "/" + snap + "locked.bin": DATA["ext-locked"],
            EXT + "/blobs/" + sha(DATA["ext-locked"]): DATA["ext-locked"],
            EXT + "/" + snap + "rel.bin": DATA["ext-rel"],
            GRP + "/" + snap + "w.bin": DATA["grp"]}


def read_in_group(path):
    """Read @path as uid 65534 with GROUP as a supplementary group."""
    os.setgroups([GROUP])
    os.setresgid(wfstest.NOBODY, wfstest.NOBODY, wfstest.NOBODY)
    os.setresuid(wfstest.NOBODY, wfstest.NOBODY, wfstest.NOBODY)
    return wfstest.read_file(path)


class Fix:
    base = hub = root = closed = None


def setUpModule():
    wfstest.require_mount_capability()
    wfstest.require_wfsctl()
    Fix.base = wfstest.make_base("wfs-it-access-")
    Fix.hub = os.path.join(Fix.base, "hub")
    Fix.root = os.path.join(Fix.base, "root")
    os.makedirs(Fix.hub)
    os.makedirs(Fix.root)
    Fix.closed = build_hub(Fix.hub, Fix.root)


def tearDownModule():
    if Fix.base:
        shutil.rmtree(Fix.base, ignore_errors=True)


class ClosedWays(wfstest.ScratchMounts, unittest.TestCase):
    FIXTURE = Fix

    def setUp(self):
        super().setUp()
        self.local = self.path("local")
        self.mnt = self.new_mnt()
        self.m = wfstest.ForegroundMount(Fix.hub, self.local, self.mnt,
                                         ["allow_other", "auto_promote=off", "root=" + Fix.root])
        self.m.start()
        self.addCleanup(self.stop)
        self.sock = os.path.join(os.path.realpath(self.local), "wfs.sock")
        wfstest.wait_until(lambda: os.path.exists(self.sock), 10)

    def stop(self):
        problems = self.m.stop()
        self.m.cleanup()
        self.assertEqual(problems, [], "wfs")

    def nas(self, rel):
        return os.path.join(Fix.hub, rel)

    def mount(self, rel):
        return os.path.join(self.mnt, rel)

    def test_nobody_reads_nothing_the_nas_denies(self):
        """Before: every path below read its target's bytes as uid 65534
        through the mount, and stat showed its size and mode."""
        for rel in sorted(Fix.closed):
            data, err = wfstest.as_uid(wfstest.read_file, self.nas(rel))
            self.assertEqual(err, errno.EACCES, "%s on the NAS as uid 65534: %s (the fixture "
                             "must deny it)" % (rel, wfstest.errname(err)))
            data, err = wfstest.as_uid(wfstest.read_file, self.mount(rel))
            self.assertIsNone(data, "%s: uid 65534 read %d bytes through the mount" %
                              (rel, len(data or b"")))
            self.assertEqual(err, errno.EACCES, "%s through the mount as uid 65534" % rel)
            _, err = wfstest.as_uid(os.stat, self.mount(rel))
            self.assertEqual(err, errno.EACCES, "%s: stat through the mount as uid 65534" % rel)

    def test_root_reads_every_byte(self):
        for rel, want in sorted(Fix.closed.items()):
            self.assertEqual(sha(wfstest.read_file(self.mount(rel))), sha(want), rel)

    def test_group_member_reads_as_on_the_nas(self):
        """A group member reads the 0750 store's file, as on the NAS; of
        the 0705 one (others may search it, the group may not) it reads
        nothing, as on the NAS, where others read it."""
        rel = GRP + "/snapshots/%s/w.bin" % REV
        for where in (self.nas(rel), self.mount(rel)):
            kind, val = wfstest.in_child(read_in_group, where)
            self.assertEqual(kind, "ok", "%s as uid 65534 in group %d: %s" % (where, GROUP, val))
            self.assertEqual(sha(val), sha(DATA["grp"]), where)
        rel = GRPX + "/snapshots/%s/w.bin" % REV
        for where in (self.nas(rel), self.mount(rel)):
            self.assertEqual(wfstest.in_child(read_in_group, where), ("errno", errno.EACCES),
                             "%s as uid 65534 in group %d" % (where, GROUP))
            data, err = wfstest.as_uid(wfstest.read_file, where)
            self.assertIsNone(err, "%s as uid 65534: %s" % (where, wfstest.errname(err)))
            self.assertEqual(sha(data), sha(DATA["grpx"]), where)

    def test_shown_as_links_open_ways_as_files(self):
        closed_blob = CLOSED + "/blobs/" + sha(DATA["closed"])
        self.assertEqual(os.readlink(self.mount(closed_blob)), "../../.closed/" +
                         sha(DATA["closed"]), "a repo blob behind a closed store")
        ext_blob = EXT + "/blobs/" + sha(DATA["ext-locked"])
        self.assertEqual(os.readlink(self.mount(ext_blob)), os.readlink(self.nas(ext_blob)),
                         "a repo blob behind a locked directory of a further root: as on "
                         "the NAS")
        # a relative text into the root: absolute, as the NAS resolves it
        # (as written it would lead from the mount's place)
        rel_blob = EXT + "/blobs/" + sha(DATA["ext-rel"])
        self.assertEqual(os.readlink(self.mount(rel_blob)),
                         os.path.join(Fix.root, "locked", "z"))
        # a chain's own first hop, as written: not its target's name in a
        # repo uid 65534 cannot list, nor, by its form, whether it leads
        # anywhere
        for name in ("steal_cfg", "probe_yes", "probe_no", "probe_yes2", "probe_no2"):
            rel = EVIL + "/snapshots/%s/%s" % (REV, name)
            self.assertEqual(os.readlink(self.mount(rel)), os.readlink(self.nas(rel)), rel)
        rc, out, err = wfstest.run_wfsctl(["--socket", self.sock, "promote",
                                           self.mount(ext_blob)])
        self.assertEqual(rc, 1, "promote of a link shown as on the NAS: %s %s" % (out, err))
        self.assertIn("past a directory not every user may search", err)
        for rel, data in ((OPEN + "/blobs/" + sha(DATA["open"]), DATA["open"]),
                          (EXT + "/blobs/" + sha(DATA["ext-open"]), DATA["ext-open"])):
            st = os.lstat(self.mount(rel))
            self.assertTrue(stat.S_ISREG(st.st_mode), "%s: an open way, mode %o" %
                            (rel, st.st_mode))
            self.assertEqual(st.st_mode & 0o777, 0o444, rel)
            data_as, err = wfstest.as_uid(wfstest.read_file, self.mount(rel))
            self.assertIsNone(err, "%s as uid 65534: %s" % (rel, wfstest.errname(err)))
            self.assertEqual(sha(data_as), sha(data), rel)

    def test_promoted_closed_blob_is_served_from_its_copy(self):
        w = self.mount(CLOSED + "/snapshots/%s/w.bin" % REV)
        self.assertEqual(state_of(w), "nas")
        ctl_check(self, ["--socket", self.sock, "promote", "--wait", self.mount(CLOSED)])
        copies = wfstest.store_files(self.local)
        self.assertEqual(len(copies), 1, "LOCAL_STORE/data: %s" % sorted(copies))
        # opened before anything else asks the file's state: read from the
        # copy, by the kernel itself (an open by passthrough) or by the
        # daemon (local bytes), never from the NAS
        local = wfstest.served_bytes(self, self.mnt)[0]
        fd = os.open(w, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            got = os.pread(fd, len(DATA["closed"]) + 1, 0)
            pt = wfstest.passthrough_opens(w)
        finally:
            os.close(fd)
        self.assertEqual(sha(got), sha(DATA["closed"]))
        self.assertTrue(pt >= 1 or wfstest.served_bytes(self, self.mnt)[0] > local,
                        "the local blob was read from the NAS")
        self.assertEqual(state_of(w), "local", "the closed-way blob after its repo's promote")
        _, err = wfstest.as_uid(wfstest.read_file, w)
        self.assertEqual(err, errno.EACCES, "uid 65534, the blob local")


class ClosedWayOutage(Mounted):
    """The closed-way blob promoted, then wfs started again over the NAS's
    empty mount point: the local record keeps the link, the store's
    directory and the file, so the snapshot's name still reads the copy."""

    options = ("allow_other",)

    def setUp(self):
        faultnas.require_faultfs()
        d = os.path.join(Fix.base, "outage")
        os.mkdir(d)
        self.start_over(Fix.hub, d)

    def test_copy_serves_with_the_nas_gone(self):
        """(And the blob behind a link to the store: the record keeps the
        link to the directory its way passes.)"""
        w = os.path.join(self.mnt, CLOSED, "snapshots", REV, "w.bin")
        dl = os.path.join(self.mnt, DL, "snapshots", REV, "w.bin")
        ctl_check(self, ["--socket", self.sock, "promote", "--wait",
                         os.path.join(self.mnt, CLOSED), os.path.join(self.mnt, DL)])
        self.assertEqual((state_of(w), state_of(dl)), ("local", "local"))
        self.stop_wfs()
        self.assertEqual(self.nas.stop(), [], "faultfs stop")
        self.assertEqual(os.listdir(self.nas.mnt), [], "the NAS's mount point")
        self.start_wfs()
        self.assertEqual(faultnas.nas_of_stats(self, self.sock)["state"], "down")
        self.assertEqual(sha(wfstest.read_file(w)), sha(DATA["closed"]),
                         "the closed-way blob's copy with the NAS gone")
        self.assertEqual(sha(wfstest.read_file(dl)), sha(DATA["dl"]),
                         "through a link to the store, with the NAS gone")
        self.assertEqual(os.readlink(os.path.join(self.mnt, CLOSED, "blobs",
                                                  sha(DATA["closed"]))),
                         "../../.closed/" + sha(DATA["closed"]))
        _, err = wfstest.as_uid(wfstest.read_file, w)
        self.assertEqual(err, errno.EACCES, "uid 65534 with the NAS gone: the record keeps "
                         "the store directory's mode")


if __name__ == "__main__":
    wfstest.main()
