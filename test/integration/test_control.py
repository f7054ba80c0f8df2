#!/usr/bin/env python3
"""The control socket: who may change state (SO_PEERCRED: root or the mount's
owner; the socket itself is mode 0666), and robustness against bad requests
(malformed JSON, non-objects, unknown ops, oversized and empty lines, paths
leaving the mount, absolute paths): every one gets {"ok": false, ...} and the
daemon keeps answering."""

import json
import os
import stat
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from wfstest import ctl_check, ctl_json, run_wfsctl, state_of, NOBODY  # noqa: E402

FIX = wfstest.HubFixture(options=("allow_other", "auto_promote=off"), scale_mib=4, many=0, mount=False)
SOCK = None


def setUpModule():
    global SOCK
    wfstest.require_mount_capability()
    wfstest.require_wfsctl()
    FIX.setup()
    try:
        FIX.mount = wfstest.Mount(FIX.hub, FIX.local, FIX.mnt, FIX.options).start()
        SOCK = wfstest.wait_ctl(FIX.mnt)
    except BaseException:
        FIX.teardown(raise_problems=False)
        raise


def tearDownModule():
    FIX.teardown()


def a_shard():
    with open(FIX.n("models--acme--standard/refs/main")) as f:
        rev = f.read().strip()
    return FIX.by_path["models--acme--standard/snapshots/%s/model-00002-of-00002.safetensors" % rev]


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

    def test_root_may(self):
        # the same request that nobody was refused works for root
        p = FIX.m(a_shard()["path"])
        ctl_check(self, ["promote", "--wait", p])
        self.assertEqual(state_of(p), "local")
        ctl_check(self, ["evict", p])
        self.assertEqual(state_of(p), "nas")


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
        for p in ("..", "../", "../outside/secret.bin", "models--acme--standard/../../outside",
                  "models--acme--standard/snapshots/../../../gen"):
            for req in ({"op": "promote", "paths": [p]}, {"op": "promote", "paths": [p], "dry_run": True},
                        {"op": "status", "path": p}, {"op": "evict", "paths": [p]},
                        {"op": "verify", "paths": [p]}):
                rep = self.expect_error((json.dumps(req) + "\n").encode(), "request %s" % req)
                self.assertNotIn("secret", json.dumps(rep).lower().replace(p.lower(), ""))

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

    def test_still_serving_files(self):
        e = a_shard()
        self.assertEqual(wfstest.sha256_file(FIX.m(e["path"])), (e["sha256"], e["size"]))
        self.assert_alive("all of the above")


if __name__ == "__main__":
    wfstest.main()
