"""wfs bench: the figures, by name.  Every figure is a function m_<name>(ctx)
registered in MEASUREMENTS below; it adds rows with ctx.pair_row() (ratio
figures: one value per side and pair, the median ratio and its spread),
ctx.row() (single figures) or ctx.alt() (comparison filesystems, columns of
a row).

  frame.py      goals, read primitives, Ctx, abba() (the pairs), the mount
  reads.py      NAS-served reads, the walk, page cache, overlayfs / bindfs
  promotion.py  promote, revision, local copies, partial files
  once.py       start-up, daemon memory (fixtures of their own)

Python standard library only.
"""

from common import Skip
from frame import GOALS, MIN_BLOCKS, Ctx, mount_main, unmount_all, verdict
from once import m_memory, m_startup
from promotion import m_local, m_many, m_part, m_promote, m_revision
from reads import m_compare, m_mmap, m_noise, m_pagecache, m_rand, m_seq, m_walk


class Measurement:
    """once: rig-independent (its own fixture in the work dir), run once a
    run, not on each rig; others use the rig's fixture and mount."""
    def __init__(self, name, fn, default=True, once=False):
        self.name, self.fn, self.default, self.once = name, fn, default, once


MEASUREMENTS = [
    Measurement("seq", m_seq),
    Measurement("mmap", m_mmap),
    Measurement("rand", m_rand),
    Measurement("walk", m_walk),
    Measurement("pagecache", m_pagecache),
    Measurement("compare", m_compare),
    Measurement("promote", m_promote),
    Measurement("revision", m_revision),
    Measurement("many", m_many),
    Measurement("local", m_local),
    Measurement("part", m_part),
    Measurement("noise", m_noise),
    Measurement("startup", m_startup, once=True),
    Measurement("memory", m_memory, once=True),
]

# what bench.py takes from here
__all__ = ["GOALS", "MEASUREMENTS", "MIN_BLOCKS", "Ctx", "Skip", "mount_main", "unmount_all",
           "verdict"]
