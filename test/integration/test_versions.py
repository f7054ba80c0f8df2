#!/usr/bin/env python3
"""LOCAL_STORE's index of another version than this wfs writes.

Each test mounts a small hub of its own (dmg_fix.Store: wfs -f, its log in
a file), makes copies local, stops the daemon, changes index.json's
version, and starts again:

  an older index (version 1: no proof of the copies; version 3: pins by
      two reasons in one) -> read: version 1's copies re-hashed in full
      before they serve, version 3's pins kept as pinned by hand; the
      index written at the stop is of this version
  a newer index (a downgrade) -> left as it is, never replaced, no
      records; data/ and parts/ kept: a copy made meanwhile of the same
      bytes as one the index names is left in place at an evict and is
      no candidate for eviction for room; no range copied into a partial
      file it names (EBUSY)
  a newer index over this wfs's size cap (a later wfs may allow more)
      -> left as it is too, not set aside as damage
  an older record.json (version 1) -> written again, of this version, at
      the first build
"""

import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from dmg_fix import BIG, BIG_SIZE, INDEX_MAX, SMALL, DamageCase  # noqa: E402
from wfstest import ctl_check, ctl_json, state_of  # noqa: E402


def setUpModule():
    wfstest.require_mount_capability()
    wfstest.require_wfsctl()


class Versions(DamageCase):
    def test_older_record_written_again(self):
        """record.json of version 1 (an older wfs's) is written again, of
        this version, at the first build, though its entries are the
        same: left as it was, every start read it as version 1 again."""
        self.local_both()
        path = os.path.join(self.st.local, "record.json")
        with open(path) as f:
            text = f.read()
        head = json.loads(text.split("\n", 1)[0] + "]}")
        self.assertGreater(head["version"], 1, "the record this wfs wrote")
        with open(path, "w") as f:
            f.write(text.replace('"version":%d,' % head["version"], '"version":1,', 1))
        self.st.start()
        rep = wfstest.ctl_request(os.path.join(self.st.local, "wfs.sock"), {"op": "sync"})
        self.assertTrue(rep and rep.get("ok"), "sync: %s" % rep)
        with open(path) as f:
            again = json.loads(f.read().split("\n", 1)[0] + "]}")
        self.assertEqual(again["version"], head["version"], "record.json after the first build")
        self.assert_states({BIG: "local", SMALL: "local"})

    def test_newer_version_index(self):
        """An index a later wfs wrote (a downgrade): left as it is, never
        replaced, and no copy of it removed -- moved aside, the next
        start-up would have removed them all."""
        self.local_both()
        before = self.st.files()
        path = os.path.join(self.st.local, "index.json")
        with open(path) as f:
            idx = json.load(f)
        idx["version"] = 99
        with open(path, "w") as f:
            json.dump(idx, f)
        with open(path, "rb") as f:
            newer = f.read()
        for run in (1, 2):
            self.st.start()
            self.wait_log(r"index %s is of version 99, newer than this wfs \(4\): left as it "
                          r"is, not read and never replaced\..* the 2 files in %s are kept"
                          % (re.escape(path), re.escape(os.path.join(self.st.local, "data"))), 0)
            self.assert_states({BIG: "nas", SMALL: "nas"})
            self.assert_bytes(BIG)
            self.assert_bytes(SMALL)
            if run == 1:  # a copy made meanwhile serves, and is not recorded
                self.st.promote(self, SMALL)
                self.assert_bytes(SMALL)
                # evicted: its file is the newer index's copy (the same
                # bytes), which this run leaves in place (it removed it)
                ctl_check(self, ["evict", self.st.path(SMALL)])
                self.assert_states({BIG: "nas", SMALL: "nas"})
                self.wait_log(r"left in place: the index this run does not read", 0)
            self.st.stop(self)
            with open(path, "rb") as f:
                self.assertEqual(f.read(), newer, "index.json of version 99 after run %d" % run)
            self.assertFalse(os.path.exists(path + ".damaged"), "index.json.damaged")
            self.assertEqual(self.st.files(), before, "data/ after run %d" % run)

    def test_newer_version_index_copy_not_evicted_for_room(self):
        """A copy of this run whose file is one the newer index names (the
        same bytes) is no candidate for eviction for room: its file stays,
        so evicting it freed nothing, and the copy it made room for went
        past store_max.  The promote that needs the room says "no room"."""
        self.st.start()
        self.st.promote(self, SMALL)
        self.st.stop(self)
        path = os.path.join(self.st.local, "index.json")
        idx = self.st.index()
        idx["version"] = 99
        with open(path, "w") as f:
            json.dump(idx, f)
        # room for BIG's copy alone (4 KiB blocks), not for SMALL's beside it
        big = -(-BIG_SIZE // 4096) * 4096
        self.st.start(options=["store_max=%d" % (big + 4096)])
        self.st.promote(self, SMALL)  # its file: the newer index's
        rc, out, err = wfstest.run_wfsctl(["promote", "--wait", self.st.path(BIG)])
        self.assertEqual(rc, 1, "promote --wait with no room: %s %s" % (out, err))
        self.assertIn("no room", err)
        self.assert_states({BIG: "nas", SMALL: "local"})
        self.assert_bytes(BIG)
        self.st.stop(self)

    def test_newer_version_index_partial_copy(self):
        """The partial file of a newer index's ranges: a run that leaves
        the index as it is neither writes it (a range copy went into the
        same file) nor removes it (its drop, at an evict, unlinked it), and
        says why it copies no range of that file."""
        self.st.start()
        ctl_check(self, ["promote", "--wait", "--range", "0:1M", self.st.path(BIG)])
        self.assertEqual(state_of(self.st.path(BIG)), "partial")
        self.st.stop(self)
        parts = os.path.join(self.st.local, "parts")
        names = os.listdir(parts)
        self.assertEqual(len(names), 1, "parts/: %s" % names)
        pfile = os.path.join(parts, names[0])

        def look():
            st = os.stat(pfile)
            with open(pfile, "rb") as f:
                return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, f.read())
        before = look()
        path = os.path.join(self.st.local, "index.json")
        idx = self.st.index()
        idx["version"] = 99
        with open(path, "w") as f:
            json.dump(idx, f)
        self.st.start()
        self.wait_log(r"index %s is of version 99" % re.escape(path), 0)
        rc, out, err = wfstest.run_wfsctl(["promote", "--wait", "--pin", "--range", "1M:1M",
                                           self.st.path(BIG)])
        self.assertEqual(rc, 1, "promote --range: %s %s" % (out, err))
        self.assertRegex(err, r"its partial copy in %s is one index %s names, which this run "
                         r"leaves as it is" % (re.escape(parts), re.escape(path)))
        rep = ctl_json(self, ["promote", "--dry-run", self.st.path(BIG)])
        self.assertEqual([b["pinned_by"] for b in rep["blobs"]], [[]],
                         "a refused promote --pin pinned the blob")
        ctl_check(self, ["evict", "--force", self.st.path(BIG)])
        self.assert_bytes(BIG)
        self.st.stop(self)
        self.assertEqual(os.listdir(parts), names, "parts/ after the run")
        self.assertTrue(look() == before, "the partial file was written by the run")

    def test_newer_version_index_over_the_cap(self):
        """An index over this wfs's size cap whose head says a later
        version (whose cap may be larger): left as it is, as any newer
        index -- set aside, it was lost to the wfs that wrote it."""
        idx = self.local_both()
        before = self.st.files()
        path = os.path.join(self.st.local, "index.json")
        idx["version"] = 99
        blobs = idx.pop("blobs")
        idx["blobs"] = blobs  # the head's members first, as wfs lays it out
        with open(path, "w") as f:
            f.write(json.dumps(idx, separators=(",", ":")))
            f.truncate(INDEX_MAX + 1)
        self.st.start()
        self.wait_log(r"index %s is of version 99, newer than this wfs \(4\): left as it is"
                      % re.escape(path), 0)
        self.assert_states({BIG: "nas", SMALL: "nas"})
        self.assert_bytes(BIG)
        self.st.stop(self)
        self.assertEqual(os.path.getsize(path), INDEX_MAX + 1, "index.json after the run")
        self.assertFalse(os.path.exists(path + ".damaged"), "index.json.damaged")
        self.assertEqual(self.st.files(), before, "data/ after the run")

    def test_index_version_1(self):
        """A store as the previous version left it: index version 1 (no
        proof of the copies), modes 0755 / 0644 / 0444.  Tightened, every
        copy re-hashed, local again; the index then written as version 2."""
        idx = self.local_both()
        # the version 1 format (git show HEAD~2:core/index.c): the same
        # fields but the copy's identity, indent 1, keys sorted
        for r in idx["blobs"]:
            for k in [k for k in r if k.startswith("copy_")]:
                del r[k]
        idx["version"] = 1
        ipath = os.path.join(self.st.local, "index.json")
        with open(ipath, "w") as f:
            f.write(json.dumps(idx, indent=1, sort_keys=True))
        os.chmod(ipath, 0o644)
        for d in ("", "data", "tmp"):
            os.chmod(os.path.join(self.st.local, d), 0o755)
        for name in (BIG, SMALL):
            os.chmod(os.path.dirname(self.st.copy(name, idx)), 0o755)
            os.chmod(self.st.copy(name, idx), 0o444)
        # version 1 had no partial copies, nor parts/: made, and not as damage
        os.rmdir(os.path.join(self.st.local, "parts"))
        self.st.start()
        for d, old, new in (("", "0755", "0711"), ("/data", "0755", "0700"),
                            ("/tmp", "0755", "0700"), ("/index.json", "0644", "0600")):
            self.wait_log(r"start-up: tightened the mode of %s%s from %s to %s"
                          % (re.escape(self.st.local), d, old, new), 0)
        self.wait_log(r"index %s was written by an earlier version \(1, no proof of the copies\): "
                      r"its 2 local copies are re-hashed" % re.escape(ipath), 0)
        self.assertNotIn("was missing", self.st.log())
        self.assertTrue(os.path.isdir(os.path.join(self.st.local, "parts")))
        for name in (BIG, SMALL):
            self.wait_log(r"re-verified local copy of %s " % re.escape(self.st.key(name)))
        self.assert_states({BIG: "local", SMALL: "local"})
        self.assert_bytes(BIG)
        self.assert_bytes(SMALL)
        self.st.stop(self)
        new = self.st.index()
        self.assertEqual(new["version"], 4)
        for name in (BIG, SMALL):
            self.assertIn("copy_ino", self.st.record(name, new))
        modes = {d: os.stat(os.path.join(self.st.local, d)).st_mode & 0o777
                 for d in ("", "data", "tmp", "index.json")}
        self.assertEqual(modes, {"": 0o711, "data": 0o700, "tmp": 0o700, "index.json": 0o600})
        # tightened once: not again
        self.st.start()
        self.assertNotIn("tightened", self.st.log())
        self.assert_states({BIG: "local", SMALL: "local"})

    def test_index_version_3_pins(self):
        """A version 3 index had one "pinned" for a pin by hand and a ref
        pin's alike: it is read as a pin by hand, which no ref pin takes
        away (nothing the user pinned is lost); the index is then written
        as version 4, the two apart."""
        self.st.start()
        self.st.promote(self, BIG, SMALL)
        ctl_check(self, ["pin", self.st.path(BIG)])
        self.st.stop(self)
        idx = self.st.index()
        self.assertEqual((self.st.record(BIG, idx)["pinned"], self.st.record(BIG, idx)["ref_pinned"]),
                         (True, False))
        # the version 3 format: the same records without "ref_pinned"
        for r in idx["blobs"]:
            del r["ref_pinned"]
        idx["version"] = 3
        ipath = os.path.join(self.st.local, "index.json")
        with open(ipath, "w") as f:
            f.write(json.dumps(idx, indent=1, sort_keys=True))
        self.st.start()
        self.wait_log(r"index %s was written by an earlier version \(3, one pin for both "
                      r"reasons\): its 1 pinned blobs are read as pinned by hand"
                      % re.escape(ipath), 0)
        rep = ctl_json(self, ["promote", "--dry-run", self.st.path(BIG), self.st.path(SMALL)])
        self.assertEqual({b["key"]: b.get("pinned_by") for b in rep["blobs"]},
                         {self.st.key(BIG): ["hand"], self.st.key(SMALL): []}, rep)
        self.assert_states({BIG: "local", SMALL: "local"})
        self.st.stop(self)
        new = self.st.index()
        self.assertEqual(new["version"], 4)
        self.assertEqual([(r["key"], r["pinned"], r["ref_pinned"]) for r in new["blobs"]
                          if r["pinned"] or r["ref_pinned"]], [(self.st.key(BIG), True, False)])


if __name__ == "__main__":
    wfstest.main()
