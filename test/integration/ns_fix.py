"""test_namespace.py's fixture, shared with the test classes kept in
files of their own (ns_readdir.py): the hub mounted once per run of the
module, and the checks' base class."""

import hashlib
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402

FIX = wfstest.HubFixture(options=("allow_other", "auto_promote=off"))


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def snapshot_parts(path):
    """(repo, depth) for <repo>/snapshots/<rev>/<d1>/.../<name>, else None;
    depth = number of directories between <rev> and the name."""
    parts = path.split("/")
    if "snapshots" not in parts[1:]:
        return None
    i = parts.index("snapshots", 1)
    if len(parts) < i + 3:
        return None
    return "/".join(parts[:i]), len(parts) - i - 3


class Base(unittest.TestCase):
    maxDiff = 4000

    def assertNone(self, bad, what):
        """bad: list of strings describing each offending entry."""
        if bad:
            shown = "\n  ".join(bad[:25])
            more = "" if len(bad) <= 25 else "\n  ... and %d more" % (len(bad) - 25)
            self.fail("%s: %d entries wrong:\n  %s%s" % (what, len(bad), shown, more))
