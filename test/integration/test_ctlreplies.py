#!/usr/bin/env python3
"""What the control socket's replies say: status and dry runs by anyone
create no blob records; status of a path outside every repo lists none;
stats of a path that is not there names it; doctor PATH lists its own
flagged blobs, and flagged lists are capped with a total; wfsctl(1)'s JSON
OUTPUT names every top-level field of each --json reply, and the members
of stats' "metrics", and the replies carry those and no others; pin and
unpin count what they changed, pin --ref says what is missing, and evict
--force leaves a ref pin alone.  Who may ask, and bad requests:
test_control.py."""

import hashlib
import os
import re
import shutil
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from ctl_fix import FIX, a_shard  # noqa: E402
from wfstest import ctl_check, ctl_json, run_wfsctl, state_of, NOBODY  # noqa: E402

SOCK = None


def setUpModule():
    global SOCK
    SOCK = wfstest.setup_with_ctl(FIX)


def tearDownModule():
    FIX.teardown()


class StatusAndDryRuns(unittest.TestCase):
    def test_status_of_a_path_outside_every_repo(self):
        """status of the hub's version.txt or its .locks names no repo: it
        once listed "version.txt" as a repo of 0 files."""
        for rel in ("version.txt", ".locks"):
            st = ctl_json(self, ["status", FIX.m(rel)])
            self.assertEqual(st["repos"], [], "status %s: %s" % (rel, st["repos"]))
        st = ctl_json(self, ["status", FIX.m("models--acme--standard/refs")])
        self.assertEqual([r["repo"] for r in st["repos"]], ["models--acme--standard"])
        rc, out, err = run_wfsctl(["status", FIX.m("version.txt")])
        self.assertEqual(rc, 0, err)
        self.assertIn("repos: none here", out)
        self.assertNotRegex(out, r"(?m)^version\.txt ")

    def test_a_folder_with_dashes_is_no_repo(self):
        """A top-level folder with "--" in its name but no repo kind
        ("backup--old"; HUB-LAYOUT.md: models--, datasets--, spaces--) is
        not a repo: status lists no such repo, and a file in it is read
        from the NAS and never copied, like any file outside a repo.
        status once listed it, and promote copied the file."""
        data = b"not a repo's blob\n" * 256
        sha = hashlib.sha256(data).hexdigest()
        os.makedirs(FIX.n("backup--old/blobs"))
        self.addCleanup(shutil.rmtree, FIX.n("backup--old"))
        with open(FIX.n("backup--old/blobs/" + sha), "wb") as f:
            f.write(data)
        data0 = wfstest.store_files(FIX.local)
        st = ctl_json(self, ["status", FIX.mnt])
        self.assertNotIn("backup--old", [r["repo"] for r in st["repos"]])
        self.assertIn("models--acme--standard", [r["repo"] for r in st["repos"]])
        path = FIX.m("backup--old/blobs/" + sha)
        self.assertTrue(wfstest.read_file(path) == data, "read through the mount")
        rc, out, err = run_wfsctl(["promote", "--wait", path])
        self.assertEqual(rc, 1, "promote of a file outside every repo: %s%s" % (out, err))
        self.assertIn("not weight data", err)
        self.assertEqual(wfstest.store_files(FIX.local), data0, "data/ changed")

    def test_status_and_dry_run_create_no_blobs(self):
        """status (by anyone) and a dry run of promote walk the tree without
        creating blob records: files the store does not know are reported
        from the NAS.  A request that may change state does create them."""
        repo = "models--peek--fresh"
        files = {"config.json": b'{"a": 1}', "model.safetensors": wfstest.det_bytes(71, 300000),
                 "tokenizer.json": wfstest.det_bytes(72, 5000)}
        rev = wfstest.make_hf_repo(FIX.hub, repo, files)
        size = sum(len(v) for v in files.values())

        def known():
            # every blob record, by state (wfs_blobs)
            st = ctl_json(self, ["stats", FIX.mnt])
            return sum(st["metrics"]["blobs"].values())
        before = known()
        for uid in (NOBODY, None):
            st = ctl_json(self, ["status", FIX.mnt], uid=uid)
            r = [x for x in st.get("repos", []) if x.get("repo") == repo]
            self.assertEqual(len(r), 1, "status as uid %s does not list %s" % (uid, repo))
            self.assertEqual((r[0]["files"], r[0]["bytes"], r[0]["local_files"], r[0]["states"]),
                             (3, size, 0, {"nas": 3}), r[0])
            st = ctl_json(self, ["status", FIX.m(repo)], uid=uid)
            self.assertEqual([(v["rev"], v["files"], v["bytes"]) for v in st["repos"][0]["revisions"]],
                             [(rev, 3, size)], st["repos"][0])
        rep, _ = wfstest.as_uid(wfstest.ctl_request, SOCK, {"op": "promote", "paths": [repo], "dry_run": True})
        self.assertTrue(rep and rep.get("ok"), rep)
        self.assertEqual((rep["bytes_to_copy"], sorted(b["state"] for b in rep["blobs"]),
                          sorted(b["size"] for b in rep["blobs"])),
                         (size, ["nas"] * 3, sorted(len(v) for v in files.values())), rep)
        self.assertEqual(known(), before, "status or a dry run created blob records")
        # the count does see new records: verify (owner only) creates them
        ctl_check(self, ["verify", FIX.m(repo)])
        self.assertEqual(known(), before + 3)
        rep = wfstest.ctl_request(SOCK, {"op": "promote", "paths": [repo], "dry_run": True})
        self.assertEqual((rep["bytes_to_copy"], len(rep["blobs"])), (size, 3), rep)

    def test_stats_of_a_path_that_does_not_exist(self):
        """stats PATH asks the mount PATH is in; a PATH there that names
        nothing is refused, naming it (a typo), and one that exists works."""
        missing = FIX.m("models--no--such")
        rc, out, err = run_wfsctl(["stats", missing])
        self.assertEqual((rc, out), (1, ""), "stats of a missing path: %s" % err)
        self.assertIn("%s: No such file or directory" % missing, err)
        st = ctl_json(self, ["stats", FIX.m(FIX.readable()[0]["path"])])
        self.assertIn("blobs", st.get("metrics", {}), st)


class Doctor(unittest.TestCase):
    def test_doctor_path_lists_its_own_flagged_blobs(self):
        """doctor PATH checks the tree under PATH: a blob flagged in another
        repo (its bytes do not match its SHA-256 name) makes doctor of that
        repo, and of the whole mount, exit 1 -- not doctor of a clean one."""
        import hashlib
        repo, rev = "models--doctor--bad", "d" * 40
        sha = hashlib.sha256(b"what the name says").hexdigest()
        os.makedirs(FIX.n("%s/snapshots/%s" % (repo, rev)))
        os.makedirs(FIX.n(repo + "/blobs"))
        with open(FIX.n("%s/blobs/%s" % (repo, sha)), "wb") as f:
            f.write(b"other bytes")
        os.symlink("../../blobs/" + sha, FIX.n("%s/snapshots/%s/model.bin" % (repo, rev)))
        self.assertTrue(wfstest.wait_until(lambda: os.path.isdir(FIX.m(repo)), 10))
        rc, out, err = run_wfsctl(["promote", "--wait", FIX.m(repo)])
        self.assertEqual(rc, 1, out + err)
        self.assertIn("mismatch", err)
        clean = "models--acme--standard"
        rc, out, err = run_wfsctl(["doctor", FIX.m(clean)])
        self.assertEqual(rc, 0, "doctor of %s: %s%s" % (clean, out, err))
        self.assertIn(", 0 flagged blobs", out)
        for path in (FIX.m(repo), FIX.m("%s/snapshots/%s/model.bin" % (repo, rev)), FIX.mnt):
            rep = wfstest.parse_json_out(run_wfsctl(["--json", "doctor", path])[1])
            self.assertIn(FIX.n("%s/blobs/%s" % (repo, sha)),
                          [b["key"] for b in rep["flagged"] if b["state"] == "mismatch"], (path, rep))


class ManyFlagged(unittest.TestCase):
    def test_flagged_lists_are_capped_with_a_total(self):
        """Flagged blobs are listed up to 200 in status and doctor replies,
        with their number in "flagged_total": tens of thousands of them
        must not make a reply larger than wfsctl reads.  The text says how
        many more there are; doctor exits 1 on the total."""
        import hashlib
        cap, n = 200, 205
        repo, rev = "models--many--bad", "e" * 40
        os.makedirs(FIX.n("%s/snapshots/%s" % (repo, rev)))
        os.makedirs(FIX.n(repo + "/blobs"))
        for i in range(n):
            sha = hashlib.sha256(b"what the name says %d" % i).hexdigest()
            with open(FIX.n("%s/blobs/%s" % (repo, sha)), "wb") as f:
                f.write(b"other bytes %d" % i)
            os.symlink("../../blobs/" + sha, FIX.n("%s/snapshots/%s/f%03d.bin" % (repo, rev, i)))
        self.assertTrue(wfstest.wait_until(lambda: os.path.isdir(FIX.m(repo)), 10))
        rc, out, err = run_wfsctl(["promote", "--wait", FIX.m(repo)], timeout=120)
        self.assertEqual(rc, 1, out + err)
        rep = ctl_json(self, ["status", FIX.mnt])
        total = rep["flagged_total"]
        self.assertGreaterEqual(total, n, rep["flagged"][:3])
        self.assertEqual(len(rep["flagged"]), cap)
        rc, out, err = run_wfsctl(["status", FIX.mnt])
        self.assertEqual(rc, 0, err)
        self.assertIn("!!! %d flagged blobs, served from the NAS:" % total, out)
        self.assertIn("  ... and %d more\n" % (total - cap), out)
        rep = wfstest.parse_json_out(run_wfsctl(["--json", "doctor", FIX.m(repo)])[1])
        self.assertEqual((len(rep["flagged"]), rep["flagged_total"]), (cap, n))
        rc, out, err = run_wfsctl(["doctor", FIX.m(repo)])
        self.assertEqual(rc, 1, out + err)
        self.assertIn(", %d flagged blobs\n" % n, out)
        self.assertIn("  ... and %d more\n" % (n - cap), out)


def _expand_braces(name):
    """"a.{b,c}.d" -> {"a.b.d", "a.c.d"} (several groups: every pairing)."""
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return {name}
    out = set()
    for alt in m.group(1).split(","):
        out |= _expand_braces(name[:m.start()] + alt + name[m.end():])
    return out


def json_output_doc():
    """doc/wfsctl.1's JSON OUTPUT: ({subsection: {field: (type, stable,
    optional)}} of each reply's top-level fields, the names of stats'
    "metrics" members as dotted paths)."""
    def unroff(t):
        return t.replace("\\-", "-")
    lines = wfstest.text_section(wfstest.man_page("wfsctl.1"), ".SH JSON OUTPUT", (".SH EXIT",))
    fields, metrics, cur, prev = {}, set(), None, ""
    for ln in lines:
        m = re.match(r'^\.SS "(.*)"$', ln)
        f = re.match(r'^\.BR (\w+) " \((.+), (stable|informational)(, optional)?\)"$', ln)
        k = re.match(r"^\.B ([a-z_.{},]+)$", ln)
        if m:
            cur = unroff(m.group(1))
        elif f and prev.startswith(".TP"):
            fields.setdefault(cur, {})[f.group(1)] = (f.group(2), f.group(3) == "stable",
                                                      bool(f.group(4)))
        elif k and prev.startswith(".TP") and cur == "stats":
            metrics |= _expand_braces(k.group(1))
        prev = ln
    return fields, metrics


def _leaves(obj, prefix=""):
    """The dotted paths of every member of `obj` that is not an object."""
    out = set()
    for key, val in obj.items():
        path = prefix + key
        out |= _leaves(val, path + ".") if isinstance(val, dict) else {path}
    return out


_TYPES = {"boolean": bool, "integer": int, "number": (int, float), "string": str,
          "object": dict, "array": list}


class JsonOutputDocumented(unittest.TestCase):
    """Scripts read `wfsctl --json` by wfsctl(1)'s JSON OUTPUT: each reply
    documented there carries every field the page names for it (of the
    type it says), and no top-level field the page does not name; stats'
    "metrics" has exactly the members the page lists.  A field dropped
    from a reply, or added to one without a word in the page, fails."""

    def test_replies_have_the_documented_fields(self):
        doc, metrics = json_output_doc()
        for title in ("status", "doctor", "evict", "verify", "promote, promote --dry-run"):
            self.assertTrue([f for f, (_, stable, _) in doc.get(title, {}).items() if stable],
                            "wfsctl.1 JSON OUTPUT: no stable field under %r" % title)
        repo = "models--json--doc"
        big = wfstest.det_bytes(81, 200000)
        wfstest.make_hf_repo(FIX.hub, repo, {"config.json": b'{"json": 1}', "model.bin": big})
        self.addCleanup(shutil.rmtree, FIX.n(repo), True)
        self.addCleanup(run_wfsctl, ["evict", "--force", FIX.m(repo)])
        self.addCleanup(run_wfsctl, ["unpin", "--ref", "main", FIX.m(repo)])
        self.assertTrue(wfstest.wait_until(lambda: os.path.isdir(FIX.m(repo)), 10))
        rev = FIX.ref_commit(repo)
        cfg = FIX.m("%s/snapshots/%s/config.json" % (repo, rev))
        model = FIX.m("%s/snapshots/%s/model.bin" % (repo, rev))
        shard = FIX.m(a_shard()["path"])

        def reply(args, rc=0):
            got_rc, out, err = run_wfsctl(["--json"] + args)
            self.assertEqual(got_rc, rc, "wfsctl --json %s: %s%s" % (" ".join(args), out, err))
            rep = wfstest.parse_json_out(out)
            self.assertIsNotNone(rep, "wfsctl --json %s printed no JSON: %s%s"
                                 % (" ".join(args), out, err))
            return rep
        # (subsection of JSON OUTPUT, the replies it documents); order
        # matters: promote --wait makes something local to verify
        runs = [
            ("promote, promote --dry-run", [["promote", "--dry-run", FIX.m(repo)]]),
            ("promote --wait", [["promote", "--wait", cfg]]),
            ("promote --range, promote --part",
             [["promote", "--dry-run", "--range", "0:100", model],
              ["promote", "--dry-run", "--range", "0:5", cfg],
              ["promote", "--dry-run", "--part", "1/2", shard]]),
            ("verify", [["verify", FIX.m(repo)]]),
            ("pin, unpin", [["pin", cfg], ["unpin", cfg]]),
            ("pin --ref, unpin --ref", [["pin", "--ref", "main", FIX.m(repo)],
                                        ["unpin", "--ref", "main", FIX.m(repo)]]),
            ("evict", [["evict", FIX.m(repo)]]),
            ("doctor", [["doctor", FIX.m(repo)]]),
            ("status", [["status", FIX.mnt]]),
            ("stats", [["stats", FIX.mnt]]),
        ]
        replies = {title: [reply(args) for args in argss] for title, argss in runs}
        replies["Errors"] = [reply(["evict", FIX.m(repo + "/no-such-file")], rc=1)]
        self.assertEqual(sorted(replies), sorted(doc),
                         "the subsections of wfsctl.1 JSON OUTPUT that list fields vs those "
                         "this test checks")
        for title, reps in replies.items():
            want = doc[title]
            seen = set()
            for rep in reps:
                seen |= set(rep)
                self.assertEqual(sorted(set(rep) - set(want)), [],
                                 "%s: fields in the reply that wfsctl.1 JSON OUTPUT does not "
                                 "document: %s" % (title, rep))
                for field, (typ, _, optional) in want.items():
                    if field not in rep:
                        self.assertTrue(optional, "%s: wfsctl.1 documents %r, the reply has "
                                        "none: %s" % (title, field, rep))
                        continue
                    kind = list if typ.startswith("array") else _TYPES[typ]
                    self.assertIsInstance(rep[field], kind, "%s: %r is not %s: %s"
                                          % (title, field, typ, rep))
                    if kind is int:
                        self.assertNotIsInstance(rep[field], bool, (title, field))
            self.assertEqual(sorted(set(want) - seen), [],
                             "%s: fields wfsctl.1 documents that no reply carried" % title)
        self.assertEqual(replies["Errors"][0]["ok"], False)
        got = _leaves(replies["stats"][0]["metrics"])
        self.assertEqual(sorted(got - metrics), [],
                         "stats: metrics members wfsctl.1 JSON OUTPUT does not list")
        self.assertEqual(sorted(metrics - got), [],
                         "stats: metrics members wfsctl.1 JSON OUTPUT lists, the reply has not")


class RefExamples(unittest.TestCase):
    def test_the_refs_wfsctl_gives_as_examples_pin(self):
        """`wfsctl pin --help` names example REFs; each pins a ref of a hub
        as huggingface_hub lays it out (a PR ref is refs/refs/pr/1: the
        example once was pr/1, which no hub has)."""
        rc, out, err = run_wfsctl(["pin", "--help"])
        m = re.search(r"--ref REF .*?\(([^)]*), \.\.\.\)", out)
        self.assertIsNotNone(m, out)
        refs = [r.strip() for r in m.group(1).split(",")]
        self.assertGreater(len(refs), 1, refs)
        repo = "models--acme--standard"
        for ref in refs:
            self.addCleanup(lambda ref=ref: run_wfsctl(["unpin", "--ref", ref, FIX.m(repo)]))
            got = ctl_json(self, ["pin", "--ref", ref, FIX.m(repo)])
            self.assertEqual(got.get("ref"), ref, got)


class EvictRefPinned(unittest.TestCase):
    def test_evict_force_leaves_a_ref_pin_alone(self):
        """`evict --force` of what a ref pin holds once said "evicted; reads
        go to the NAS again", cleared the pin, and the ref pin copied it
        all back at its next look.  It is not evicted, and says why."""
        repo = "models--acme--packs"
        self.addCleanup(lambda: run_wfsctl(["evict", "--force", FIX.m(repo)]))
        self.addCleanup(lambda: run_wfsctl(["unpin", "--ref", "main", FIX.m(repo)]))
        ctl_json(self, ["pin", "--ref", "main", FIX.m(repo)])

        def settled():
            st = ctl_json(self, ["status", FIX.m(repo)])
            rp = [p for p in st["ref_pins"] if p["repo"] == repo]
            return rp and rp[0]["files"] and rp[0]["local_files"] == rp[0]["files"]
        self.assertTrue(wfstest.wait_until(settled, 60), "the ref pin's revision never became local")
        files = [e for e in FIX.of("link", "file") if e["path"].startswith(repo + "/snapshots/")]
        self.assertTrue(files)
        for force in ([], ["--force"]):
            rc, out, err = run_wfsctl(["evict"] + force + [FIX.m(repo)])
            self.assertEqual(rc, 1, "evict %s of a ref-pinned repo: %s%s" % (force, out, err))
            self.assertIn("pinned by a ref pin", err)
            self.assertIn("evicted 0 blobs", out)
            for e in files:
                self.assertEqual(state_of(FIX.m(e["path"])), "local", e["path"])


class PinCounts(unittest.TestCase):
    def test_pin_and_unpin_say_what_changed(self):
        """`unpin PATH` once said "unpinned N blobs" for every blob under
        PATH, pinned or not, and `pin` did the same for blobs pinned
        already: a second unpin read as if it had done something.  The
        reply counts what changed ("changed") beside what PATH covers
        ("count"), and the line says the rest was left as it was."""
        p = FIX.m(a_shard()["path"])
        self.addCleanup(lambda: run_wfsctl(["unpin", p]))
        run_wfsctl(["unpin", p])
        # (op, pinned by hand before, changed, the line it prints)
        steps = (("pin", False, 1, "pinned 1 blob\n"),
                 ("pin", True, 0, "pinned 0 of 1 blob (the other 1 already pinned)\n"),
                 ("unpin", True, 1, "unpinned 1 blob\n"),
                 ("unpin", False, 0, "unpinned 0 of 1 blob (the other 1 not pinned by hand)\n"))
        for op, before, changed, line in steps:
            ctl_check(self, ["pin" if before else "unpin", p])
            got = ctl_json(self, [op, p])
            self.assertEqual((got.get("count"), got.get("changed")), (1, changed), (op, got))
            ctl_check(self, ["pin" if before else "unpin", p])
            out, _ = ctl_check(self, [op, p])
            self.assertEqual(out, line, (op, before))


class RefMissing(unittest.TestCase):
    def test_pin_ref_says_what_is_missing(self):
        """pin --ref of a repo that is not there, of a ref it does not have,
        of a ref naming a revision with no snapshot: each said "no refs/REF,
        or no snapshot of the revision it names"; and a bad ref name only
        "Invalid argument"."""
        repo = "models--acme--standard"
        ref = os.path.join(FIX.hub, repo, "refs", "ahead")
        with open(ref, "w") as f:
            f.write("f" * 40)   # a revision not downloaded (yet)
        self.addCleanup(os.unlink, ref)
        for args, want in ((["models--acme--nosuch"], "models--acme--nosuch: no such repo"),
                           (["--ref", "nosuch", repo], repo + ": no refs/nosuch"),
                           (["--ref", "ahead", repo], repo + ": refs/ahead names a revision "
                            "with no snapshot"),
                           (["--ref", "../main", repo], repo + ": refs/../main: not a ref name")):
            if "--ref" not in args:
                args = ["--ref", "main"] + [FIX.m(args[0])]
            else:
                args = args[:-1] + [FIX.m(args[-1])]
            rc, out, err = run_wfsctl(["pin"] + args)
            self.assertEqual(rc, 1, "pin %s: %s%s" % (args, out, err))
            self.assertIn(want, err)
        # a folder with refs and snapshots that is not a repo by the hub's
        # rule: refused as not weight data, and no pin kept behind the
        # refusal (it was saved, and status showed it "cannot list" on)
        rev = "a" * 40
        folder = os.path.join(FIX.hub, "backup--old")
        os.makedirs(os.path.join(folder, "refs"))
        os.makedirs(os.path.join(folder, "snapshots", rev))
        self.addCleanup(shutil.rmtree, folder)
        with open(os.path.join(folder, "refs", "main"), "w") as f:
            f.write(rev)
        with open(os.path.join(folder, "snapshots", rev, "f.bin"), "wb") as f:
            f.write(b"not in a repo")
        rc, out, err = run_wfsctl(["pin", "--ref", "main", FIX.m("backup--old")])
        self.assertEqual(rc, 1, out + err)
        self.assertIn("backup--old: not weight data", err)
        rep = wfstest.ctl_request(SOCK, {"op": "status"}, timeout=60)
        self.assertEqual([r for r in rep.get("ref_pins", []) if r.get("repo") == "backup--old"],
                         [], "a refused ref pin was kept: %s" % rep.get("ref_pins"))
        # the mount root names no repo (the command named once)
        for cmd in ("pin", "unpin"):
            rc, out, err = run_wfsctl([cmd, "--ref", "main", FIX.mnt])
            self.assertEqual((rc, err), (1, "wfsctl: %s: --ref needs a ref name and one repo "
                                         "(a PATH in it; the mount root is none) [EINVAL]\n" % cmd),
                             out)


if __name__ == "__main__":
    wfstest.main()
