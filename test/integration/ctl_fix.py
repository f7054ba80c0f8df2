"""ctl_fix.py - what test_control.py and test_ctlreplies.py share: their
hub (FIX; each module's setUpModule starts its daemon with
wfstest.setup_with_ctl) and a_shard(), a shard of models--acme--standard."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402

FIX = wfstest.HubFixture(options=("allow_other", "auto_promote=off"), scale_mib=4, many=0, mount=False)


def a_shard():
    return FIX.snapshot_entry("models--acme--standard", "model-00002-of-00002.safetensors")
