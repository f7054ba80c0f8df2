#!/usr/bin/env python3
"""The control socket: who may change state (SO_PEERCRED: root or the mount's
owner; the socket itself is mode 0666), and robustness against bad requests
(malformed JSON, non-objects, unknown ops, oversized and empty lines, paths
leaving the mount, absolute paths, links the walks do not follow): every
one gets {"ok": false, ...} and the daemon keeps answering; a stopped daemon
makes wfsctl give up after --timeout.  What the replies say is
test_ctlreplies.py's; the socket's limits (connections, idle and slow
clients) are test_ctllimits.py's."""

import json
import os
import stat
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


class Permissions(unittest.TestCase):
    def test_socket_mode(self):
        st = os.stat(SOCK)
        self.assertTrue(stat.S_ISSOCK(st.st_mode), SOCK)
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o666, "socket mode %o" % stat.S_IMODE(st.st_mode))
        self.assertEqual(os.path.dirname(SOCK), os.path.realpath(FIX.local))

    def assert_eperm(self, cmd, rc, out, err):
        self.assertIsNotNone(rc, "wfsctl %s as uid %d did not finish" % (cmd, NOBODY))
        self.assertNotEqual(rc, 0, "wfsctl %s as uid %d exited 0\nstdout: %s\nstderr: %s"
                            % (cmd, NOBODY, out, err))
        text = out + err
        self.assertTrue("EPERM" in text or "not permitted" in text.lower() or "only root" in text.lower(),
                        "wfsctl %s as uid %d does not report a permission error:\nstdout: %s\nstderr: %s"
                        % (cmd, NOBODY, out, err))

    def test_nobody_cannot_promote_or_evict(self):
        e = a_shard()
        p = FIX.m(e["path"])
        self.assertEqual(state_of(p), "nas")
        data0 = wfstest.store_files(FIX.local)
        for cmd in (["promote", "--wait", p], ["promote", p], ["evict", p], ["evict", "--force", p],
                    ["pin", p], ["unpin", p], ["verify", p]):
            rc, out, err = run_wfsctl(cmd, uid=NOBODY, timeout=30)
            self.assert_eperm(" ".join(cmd[:-1]), rc, out, err)
        rc, out, err = run_wfsctl(["--json", "promote", p], uid=NOBODY, timeout=30)
        self.assert_eperm("--json promote", rc, out, err)
        rep = wfstest.parse_json_out(out)
        self.assertIsNotNone(rep, "--json promote as nobody printed no JSON reply:\n%s%s" % (out, err))
        self.assertEqual((rep.get("ok"), rep.get("errno")), (False, "EPERM"), rep)
        self.assertEqual(state_of(p), "nas", "a promote by uid %d changed the state" % NOBODY)
        self.assertEqual(wfstest.store_files(FIX.local), data0, "data/ changed")

    def test_nobody_raw_socket(self):
        p = a_shard()["path"]
        for req in ({"op": "promote", "paths": [p]}, {"op": "evict", "paths": [p], "force": True},
                    {"op": "pin", "paths": [p]}, {"op": "unpin", "paths": [p]},
                    {"op": "verify", "paths": [p], "full": True}):
            rep, _ = wfstest.as_uid(wfstest.ctl_request, SOCK, req)
            self.assertIsNotNone(rep, "no reply to %s from uid %d" % (req, NOBODY))
            self.assertEqual((rep.get("ok"), rep.get("errno")), (False, "EPERM"), "%s -> %s" % (req, rep))
        rep, _ = wfstest.as_uid(wfstest.ctl_request, SOCK, {"op": "status"})
        self.assertTrue(rep and rep.get("ok"), "status as uid %d: %s" % (NOBODY, rep))
        self.assertEqual(state_of(FIX.m(p)), "nas")

    def test_nobody_status_works(self):
        rc, out, err = run_wfsctl(["status", FIX.mnt], uid=NOBODY, timeout=30)
        self.assertEqual(rc, 0, "wfsctl status as uid %d exited %s\nstdout: %s\nstderr: %s"
                         % (NOBODY, rc, out, err))
        self.assertIn("models--acme--standard", out)
        rep = ctl_json(self, ["status", FIX.mnt], uid=NOBODY)
        self.assertIn("models--acme--standard", [r.get("repo") for r in rep.get("repos", [])])
        # from a path inside the mount, too (wfsctl finds the socket from there)
        rep = ctl_json(self, ["status", FIX.m("models--acme--standard")], uid=NOBODY)
        self.assertEqual([r.get("repo") for r in rep.get("repos", [])], ["models--acme--standard"])

    def test_nobody_dry_run_part_reads_nothing(self):
        """promote --dry-run --part reads the file's own safetensors header,
        as root: from another user it is refused (EPERM) before the file is
        opened, so neither a 0600 file's first bytes nor its tensor names
        reach the reply.  root may, and does see them."""
        import struct
        repo = "models--peek--secret"
        hdr = json.dumps({"secret_tensor_name": {"dtype": "U8", "shape": [4],
                                                 "data_offsets": [0, 4]}}).encode()
        valid = struct.pack("<Q", len(hdr)) + hdr + b"\x01\x02\x03\x04"
        junk = b"hunter2-topsecret-not-a-header" * 4
        rev = wfstest.make_hf_repo(FIX.hub, repo, {"valid.safetensors": valid,
                                                   "junk.safetensors": junk},
                                   real=("valid.safetensors", "junk.safetensors"))
        leaks = ("secret_tensor_name", "hunter2", "topsecret",
                 str(struct.unpack("<Q", junk[:8])[0]), "hun")
        for name in ("valid.safetensors", "junk.safetensors"):
            rel = "%s/snapshots/%s/%s" % (repo, rev, name)
            os.chmod(FIX.n(rel), 0o600)  # on the NAS only root may read it
            for part in ("1/2", "2/2"):
                cmd = ["promote", "--dry-run", "--part", part, FIX.m(rel)]
                rc, out, err = run_wfsctl(cmd, uid=NOBODY, timeout=30)
                self.assert_eperm(" ".join(cmd[:-1]), rc, out, err)
                self.assertIn("wfsctl: promote: only root or the mount's owner (uid 0) may do "
                              "this with \"part\"", err)
                rc, out, err = run_wfsctl(["--json"] + cmd, uid=NOBODY, timeout=30)
                self.assert_eperm("--json " + " ".join(cmd[:-1]), rc, out, err)
                for leak in leaks:
                    self.assertNotIn(leak, out + err, "%s as uid %d told of %s's bytes"
                                     % (" ".join(cmd[:-1]), NOBODY, name))
            rep, _ = wfstest.as_uid(wfstest.ctl_request, SOCK, {
                "op": "promote", "paths": [rel], "dry_run": True, "part": [1, 2]})
            self.assertEqual((rep.get("ok"), rep.get("errno")), (False, "EPERM"), rep)
            self.assertFalse(any(leak in json.dumps(rep) for leak in leaks), rep)
            # a dry run of ranges reads no byte of the file: still open to all
            rep, _ = wfstest.as_uid(wfstest.ctl_request, SOCK, {
                "op": "promote", "paths": [rel], "dry_run": True, "ranges": [[0, 4]]})
            self.assertTrue(rep and rep.get("ok"), rep)
            self.assertFalse(any(leak in json.dumps(rep) for leak in leaks), rep)
        # the owner may: the header is read
        rel = "%s/snapshots/%s/valid.safetensors" % (repo, rev)
        rep = ctl_json(self, ["promote", "--dry-run", "--part", "1/1", FIX.m(rel)])
        self.assertEqual(rep.get("ranges"), [[0, len(valid)]], rep)
        self.assertEqual(state_of(FIX.m(rel)), "nas")

    def test_root_may(self):
        # the same request that nobody was refused works for root
        p = FIX.m(a_shard()["path"])
        ctl_check(self, ["promote", "--wait", p])
        self.assertEqual(state_of(p), "local")
        ctl_check(self, ["evict", p])
        self.assertEqual(state_of(p), "nas")

    def test_evict_of_pins_with_nothing_local(self):
        """wfsctl pin does not promote: an evict of pinned blobs still on
        the NAS has nothing to keep, so it names none 'not evicted: pinned
        (evict --force to drop it)' and exits 0 -- --force would not
        change them either.  A pinned local copy is still kept."""
        repo = FIX.m("models--acme--packs")
        ctl_check(self, ["pin", repo])
        self.addCleanup(lambda: ctl_check(self, ["unpin", repo]))
        rc, out, err = run_wfsctl(["evict", repo])
        self.assertEqual((rc, out, err), (0, "evicted 0 blobs\n", ""))
        p = FIX.m(a_shard()["path"])
        ctl_check(self, ["promote", "--wait", "--pin", p])
        self.addCleanup(lambda: ctl_check(self, ["evict", "--force", p]))
        rc, out, err = run_wfsctl(["evict", p])
        self.assertEqual(rc, 1, out + err)
        self.assertIn("not evicted: pinned (evict --force to drop it)", err)
        self.assertEqual(state_of(p), "local")


class Stopped(unittest.TestCase):
    def test_stopped_daemon_times_out(self):
        """A daemon that is stopped (SIGSTOP) makes wfsctl give up after
        --timeout with exit 3, naming the mount or the socket and saying the
        daemon is stopped -- found from the mount (its xattr is asked of the
        daemon too) or through --socket -- instead of hanging for ever."""
        import time
        pids = FIX.mount.pids
        self.assertTrue(pids)
        with wfstest.daemon_stopped(pids):
            t0 = time.monotonic()
            rc, out, err = run_wfsctl(["--timeout", "2", "status", FIX.mnt], timeout=60)
            self.assertEqual(rc, 3, "status of a stopped daemon's mount: %s%s" % (out, err))
            self.assertLess(time.monotonic() - t0, 30)
            self.assertIn("wfsctl: the daemon of the wfs mount at %s did not answer within 2 s"
                          % FIX.mnt, err)
            rc, out, err = run_wfsctl(["--timeout", "2", "--socket", SOCK, "status"], timeout=60)
            self.assertEqual(rc, 3, "status through the socket of a stopped daemon: %s%s"
                             % (out, err))
            self.assertIn("wfsctl: status: the wfs daemon at %s did not answer within 2 s: "
                          "it is stopped (pid " % SOCK, err)
            self.assertIn(int(err.split("stopped (pid ")[1].split(":")[0]), pids, err)
        ctl_json(self, ["status", FIX.mnt])


class LinkPaths(unittest.TestCase):
    """A PATH that is a link the walks do not follow (dangling, looping,
    leading out, to a directory) once found "0 blobs" and exited 0 -- a
    `promote --wait` of it reported success with nothing copied."""

    WANT = {"ENOENT": ("ENOENT", "dangling link"), "ELOOP": ("ELOOP", "loops"),
            "escape": ("EXDEV", "outside NAS_HUB"), "dir": ("EISDIR", "link to a directory")}

    def test_unfollowed_link_is_refused_naming_why(self):
        links = [e for e in FIX.of("link") if e.get("follow") in self.WANT]
        self.assertEqual({e["follow"] for e in links}, set(self.WANT), "fixture links")
        for e in links:
            errno_name, why = self.WANT[e["follow"]]
            for cmd in (["promote"], ["promote", "--dry-run"], ["evict"], ["pin"], ["unpin"],
                        ["verify"], ["promote", "--dry-run", "--range", "0:1"]):
                args = ["--json"] + cmd + [FIX.m(e["path"])]
                rc, out, err = run_wfsctl(args)
                self.assertEqual(rc, 1, "wfsctl %s: exit %s\n%s%s" % (" ".join(args), rc, out, err))
                rep = json.loads(out)
                self.assertEqual(rep.get("errno"), errno_name, "wfsctl %s: %s" % (" ".join(args), rep))
                self.assertIn(e["path"] + ": ", rep["error"])
                self.assertIn(why, rep["error"])
                self.assertIn(e["target"], rep["error"])

    def test_link_to_a_directory_of_another_root(self):
        """A link into an -o root= directory is shown as on the NAS (its
        absolute text leaves the mount): refused, without the advice to
        end the PATH with '/', which would leave the mount."""
        import shutil
        base = wfstest.make_base("wfs-foreign-")
        self.addCleanup(shutil.rmtree, base, True)
        hub, other, mnt = (os.path.join(base, n) for n in ("hub", "other", "mnt"))
        for d in (hub, other, mnt, os.path.join(other, "d")):
            os.mkdir(d)
        with open(os.path.join(other, "d", "f.bin"), "wb") as f:
            f.write(b"f" * 100)
        rev = wfstest.make_hf_repo(hub, "models--x--y", {"a.bin": b"a" * 100})
        rel = "models--x--y/snapshots/%s/outdir" % rev
        os.symlink(os.path.join(other, "d"), os.path.join(hub, rel))
        m = wfstest.ForegroundMount(hub, os.path.join(base, "local"), mnt,
                                    ["auto_promote=off", "root=" + other]).start()
        self.addCleanup(m.cleanup)
        self.addCleanup(m.stop)
        rc, out, err = run_wfsctl(["--json", "promote", "--dry-run", os.path.join(mnt, rel)])
        self.assertEqual(rc, 1, out + err)
        rep = json.loads(out)
        self.assertEqual(rep.get("errno"), "EISDIR", rep)
        self.assertIn(rel + ": a link to a directory of another root", rep["error"])
        self.assertNotIn("end the PATH", rep["error"])

    def test_trailing_slash_follows_a_link_to_a_directory(self):
        """`packs-latest/` (a shell completes a link to a directory so) is
        the directory it leads to, as for the kernel; `file/` is still the
        file (test_wfsctl's "dot segments")."""
        link = next(e for e in FIX.of("link") if e.get("follow") == "dir")
        target = os.path.join(os.path.dirname(link["path"]), link["target"])
        want = ctl_json(self, ["promote", "--dry-run", FIX.m(target)])
        self.assertTrue(want["blobs"], "the directory %s holds no blob" % target)
        for suffix in ("/", "/."):
            got = ctl_json(self, ["promote", "--dry-run", FIX.m(link["path"]) + suffix])
            self.assertEqual(sorted(b["key"] for b in got["blobs"]),
                             sorted(b["key"] for b in want["blobs"]), "through %s%s" % (link["path"], suffix))
            # with --socket and no mount in sight (a container's socket
            # alone), the PATH as given: the daemon follows the link (the
            # "/" was dropped, and its advice to add one could not be taken)
            got = ctl_json(self, ["--socket", SOCK, "promote", "--dry-run", link["path"] + suffix])
            self.assertEqual(sorted(b["key"] for b in got["blobs"]),
                             sorted(b["key"] for b in want["blobs"]),
                             "--socket, %s%s" % (link["path"], suffix))
        f = a_shard()
        got = ctl_json(self, ["promote", "--dry-run", FIX.m(f["path"]) + "/"])
        self.assertEqual([b["id"] for b in got["blobs"]], [f["blob_id"]], f["path"] + "/")


class BadRequests(unittest.TestCase):
    def assert_alive(self, what):
        rep = wfstest.ctl_request(SOCK, {"op": "status"})
        self.assertTrue(rep and rep.get("ok"), "after %s the daemon no longer answers status: %s" % (what, rep))
        self.assertTrue(all(wfstest.pid_alive(p) for p in FIX.mount.pids), "daemon died after " + what)

    def expect_error(self, data, what):
        rep, raw, problem = wfstest.ctl_raw(SOCK, data)
        self.assertIsNotNone(rep, "%s: no JSON reply line (received %r, %s)" % (what, raw[:200], problem))
        self.assertIs(rep.get("ok"), False, "%s: %s" % (what, rep))
        self.assertTrue(isinstance(rep.get("error"), str) and rep["error"], "%s: no error message: %s" % (what, rep))
        self.assertTrue(isinstance(rep.get("errno"), str) and rep["errno"].startswith("E"),
                        "%s: no errno name: %s" % (what, rep))
        self.assert_alive(what)
        return rep

    def test_malformed_json(self):
        for data in (b'{"op": "status"\n', b'{op: status}\n', b"\x00\xff\xfe garbage\n",
                     b'{"op": "status", "op": "promote"}\n'):
            self.expect_error(data, "malformed %r" % data)

    def test_not_an_object(self):
        for data in (b'[{"op": "status"}]\n', b'"status"\n', b"42\n", b"null\n"):
            self.expect_error(data, "non-object %r" % data)

    def test_unknown_or_missing_op(self):
        for req in ({"op": "frobnicate"}, {"op": 7}, {"op": None}, {}, {"cmd": "status"},
                    {"op": "STATUS"}):
            self.expect_error((json.dumps(req) + "\n").encode(), "request %s" % req)

    def test_100k_line(self):
        line = b'{"op": "status", "pad": "' + b"x" * (100 * 1024) + b'"}\n'
        rep = self.expect_error(line, "a %d-byte request line" % len(line))
        line = b'{"op": "promote", "paths": ["' + b"a/" * (50 * 1024) + b'"]}\n'
        self.expect_error(line, "a %d-byte promote line" % len(line))
        self.assertIsNotNone(rep)

    def test_status_doctor_take_one_path(self):
        """A list, or a "path" that is no string, was answered for the
        whole mount as if none were given."""
        for req in ({"op": "status", "paths": ["models--x--y"]}, {"op": "status", "path": 5},
                    {"op": "doctor", "paths": ["models--x--y"]}, {"op": "doctor", "path": ["a"]}):
            rep = self.expect_error((json.dumps(req) + "\n").encode(), "request %s" % req)
            self.assertEqual(rep["errno"], "EINVAL", req)

    def test_empty_line(self):
        self.expect_error(b"\n", "an empty line")
        self.expect_error(b"   \n", "a blank line")

    def test_connect_and_close(self):
        # a client that says nothing, or half a line, and hangs up
        import socket
        for data in (b"", b'{"op": "sta'):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(SOCK)
            if data:
                s.sendall(data)
            s.close()
            self.assert_alive("a client sending %r and closing" % data)

    def test_paths_leaving_the_mount(self):
        deep = "models--acme--standard/snapshots/" + "../" * 12 + "etc/passwd"
        for p in ("..", "../", "../outside/secret.bin", "models--acme--standard/../../outside",
                  "models--acme--standard/snapshots/../../../gen", deep):
            # a list, one string in "paths" or "path", and the same in hex
            hexed = p.encode().hex()
            for req in ({"op": "promote", "paths": [p]}, {"op": "promote", "paths": [p], "dry_run": True},
                        {"op": "promote", "paths": p}, {"op": "promote", "paths": p, "dry_run": True},
                        {"op": "promote", "path": p, "dry_run": True},
                        {"op": "promote", "paths_hex": hexed, "dry_run": True},
                        {"op": "promote", "path_hex": hexed, "dry_run": True},
                        {"op": "promote", "paths": p, "dry_run": True, "ranges": [[0, 100000]]},
                        {"op": "status", "path": p}, {"op": "evict", "paths": [p]},
                        {"op": "evict", "paths": p}, {"op": "verify", "paths": p},
                        {"op": "verify", "paths": [p]}, {"op": "doctor", "path": p}):
                rep = self.expect_error((json.dumps(req) + "\n").encode(), "request %s" % req)
                self.assertEqual(rep["errno"], "EINVAL", "request %s: %s" % (req, rep))
                self.assertIn("not a path inside the mount", rep["error"])
                self.assertNotIn("secret", json.dumps(rep).lower().replace(p.lower(), ""))
        # any user may ask a dry run: none learns a size outside NAS_HUB
        rep, _ = wfstest.as_uid(wfstest.ctl_request, SOCK,
                                {"op": "promote", "paths": deep, "dry_run": True})
        self.assertEqual((rep.get("ok"), rep.get("errno")), (False, "EINVAL"), rep)
        self.assertNotIn("blobs", rep)
        # nor did a request made as root leave a blob of such a name
        status = json.dumps(wfstest.ctl_request(SOCK, {"op": "status"}))
        for name in ("passwd", "outside", "secret"):
            self.assertNotIn(name, status)

    def test_absolute_paths(self):
        data0 = wfstest.store_files(FIX.local)
        for p in ("/", "/etc/passwd", FIX.mnt, FIX.m("models--acme--standard"), FIX.hub,
                  FIX.n("models--acme--standard")):
            for req in ({"op": "promote", "paths": [p]}, {"op": "status", "path": p},
                        {"op": "pin", "paths": [p]}):
                self.expect_error((json.dumps(req) + "\n").encode(), "request %s" % req)
        self.assertEqual(wfstest.store_files(FIX.local), data0, "data/ changed")

    def test_bad_field_types(self):
        for req in ({"op": "promote", "paths": "models--acme--standard/x/../../.."},
                    {"op": "promote", "paths": 5}, {"op": "promote", "paths": [5]},
                    {"op": "promote", "paths": [None]}, {"op": "progress", "keys": "x"},
                    {"op": "promote", "paths": ["no-such-repo"]}):
            self.expect_error((json.dumps(req) + "\n").encode(), "request %s" % req)

    def test_bad_ranges_name_the_file(self):
        """A malformed "ranges" entry (or "part") of a promote is refused
        with EINVAL naming the file and the entry, as every other error of
        a request that names a path."""
        path = a_shard()["path"]
        for extra, want in (({"ranges": [[0, 10], [-1, 5]]}, "range 2 ([-1,5]): "),
                            ({"ranges": [[0, 10], [7]]}, "range 2 ([7]): "),
                            ({"ranges": [[0, "x"]]}, 'range 1 ([0,"x"]): '),
                            ({"ranges": "0:10"}, '"ranges" must be'),
                            ({"part": [3, 2]}, "--part K/N")):
            req = dict({"op": "promote", "paths": [path], "dry_run": True}, **extra)
            rep = self.expect_error((json.dumps(req) + "\n").encode(), "request %s" % req)
            self.assertEqual(rep["errno"], "EINVAL", rep)
            self.assertTrue(rep["error"].startswith(path + ": "), rep)
            self.assertIn(want, rep["error"])

    def test_missing_path_is_enoent_whatever_its_name(self):
        """A path that is not there is ENOENT naming it, for every op that
        takes paths -- also where weight data could not be (a mistyped repo
        name, refs/, the hub's top), which once said "not weight data";
        one that is there but is not weight data says so, with --range too
        (once a bare "Wrong medium type")."""
        std = "models--acme--standard"
        for p in ("no-such-repo", std + "/no-such-dir", std + "/refs/no-such-ref",
                  std + "/.no_exist/x"):
            for req in ({"op": "promote", "paths": [p]}, {"op": "promote", "paths": [p], "dry_run": True},
                        {"op": "evict", "paths": [p]}, {"op": "pin", "paths": [p]},
                        {"op": "unpin", "paths": [p]}, {"op": "verify", "paths": [p]},
                        {"op": "promote", "paths": [p], "ranges": [[0, 1]]}):
                rep = self.expect_error((json.dumps(req) + "\n").encode(), "request %s" % req)
                self.assertEqual(rep["errno"], "ENOENT", "request %s: %s" % (req, rep))
                self.assertTrue(rep["error"].startswith(p + ": "), rep)
        for req in ({"op": "promote", "paths": [std + "/refs/main"]},
                    {"op": "promote", "paths": [std + "/refs/main"], "ranges": [[0, 1]]},
                    {"op": "promote", "paths": [std + "/refs/main"], "ranges": [[0, 1]], "dry_run": True}):
            rep = self.expect_error((json.dumps(req) + "\n").encode(), "request %s" % req)
            self.assertEqual(rep["errno"], "EINVAL", rep)
            self.assertIn("not weight data", rep["error"])

    def test_still_serving_files(self):
        e = a_shard()
        self.assertEqual(wfstest.sha256_file(FIX.m(e["path"])), (e["sha256"], e["size"]))
        self.assert_alive("all of the above")


if __name__ == "__main__":
    wfstest.main()
