"""Shared helpers for the wfs integration tests (python3 stdlib only).

The tests mount the real filesystem with the real daemon and use real system
calls.  Locations:
  WFS_BIN    the daemon       (default: <repo>/build/fs/wfs)
  WFS_MKHUB  fixture generator (default: <repo>/test/mkhub)
  WFSCTL_BIN the control tool  (default: <repo>/build/tools/wfsctl)
When mounting is impossible (no /dev/fuse, not root, a binary missing) the
module is skipped with the reason -- except under CI=true, where it fails.

The helpers live in wt_base.py (binaries, mounts, processes), wt_hub.py (the
hub fixture and mount, other uids), wt_ctl.py (wfsctl, the control socket,
the store's files) and wt_ops.py (passthrough counters, repos made by hand,
operations); a test imports this module and finds them all here.
"""

import sys
import time
import unittest

from wt_base import *  # noqa: F401,F403
from wt_hub import *  # noqa: F401,F403
from wt_ctl import *  # noqa: F401,F403
from wt_ops import *  # noqa: F401,F403


class _TimedResult(unittest.TextTestResult):
    """Each case's line ends with its time: the suite must stay quick, and
    this says which case to look at."""

    def startTest(self, test):
        self._t0 = time.monotonic()
        super().startTest(test)

    def addSuccess(self, test):
        if self.showAll:
            self.stream.write("(%.1f s) " % (time.monotonic() - self._t0))
        super().addSuccess(test)


def main():
    """unittest.main; under CI=true a skipped case fails the module: a skip
    exits 0, meson counts the module passed, and the case was never run."""
    prog = unittest.main(verbosity=2, exit=False,
                         testRunner=unittest.TextTestRunner(resultclass=_TimedResult,
                                                            verbosity=2))
    res = prog.result
    if in_ci() and res.skipped:
        print("CI=true: %d case(s) skipped, which CI counts as failed:" % len(res.skipped))
        for case, why in res.skipped:
            print("  %s: %s" % (case.id(), why))
        sys.exit(1)
    sys.exit(not res.wasSuccessful())
