"""stfile.py - safetensors files for the integration tests (standard library
only, no numpy).

write_safetensors() writes a file as the real writers lay it out: the 8-byte
header length, the JSON header padded with spaces, the tensors back to back.
part_ranges() says which bytes part K of N of a file is, by the rule of
core/safetensors.h -- the header, and for every tensor the rows
[floor((K-1)*R/N), floor(K*R/N)) of its first dimension (a scalar whole in
every part) -- reimplemented here independently of the C code, so that the
daemon's `wfsctl promote --part K/N` can be checked against it.

    python3 test/integration/stfile.py      # runs the self-check below
"""

import json
import os
import random
import struct
import sys
import tempfile

MAX_HEADER = 100_000_000  # the format's limit, as core/safetensors.h
DTYPE_SIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}
INT_MAX = 2**63 - 1  # jansson's integers are int64: larger ones are not JSON to the C code
CHUNK = 16 << 20


def _nbytes(dtype, shape):
    """Bytes of a tensor of @dtype (of the table) and @shape."""
    if dtype not in DTYPE_SIZE:
        raise ValueError(f"dtype {dtype!r} is not in the table: give the bytes")
    count = 1
    for d in shape:
        count *= d
    return count * DTYPE_SIZE[dtype]


def _pseudo_random(f, seed, n):
    """Write @n deterministic pseudo-random bytes (by @seed) to @f, a chunk at a time."""
    rng = random.Random(seed)
    while n > 0:
        step = min(n, CHUNK)
        f.write(rng.randbytes(step))
        n -= step


def write_safetensors(path, tensors, metadata=None, pad_to=None):
    """Write a safetensors file at @path.

    @tensors: a list of (name, dtype, shape, data), laid out back to back in
    that order; data is bytes, or None for deterministic pseudo-random bytes
    of the size dtype and shape call for (a dtype of DTYPE_SIZE only).
    @metadata: a dict of str -> str, written as "__metadata__".
    @pad_to: the header JSON is padded with spaces so that the data starts at
    a multiple of it; default 8, as the real writers do (8 + the header
    length a multiple of 8).

    Returns {"data_start": ..., "size": ..., "tensors": {name: (offset, length)}},
    offsets absolute in the file.
    """
    header, layout, offset = {}, {}, 0
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    for name, dtype, shape, data in tensors:
        if name in header:
            raise ValueError(f"tensor {name!r} twice")
        n = _nbytes(dtype, shape) if data is None else len(data)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        layout[name] = (offset, n)
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    align = pad_to or 8
    text += b" " * ((-(8 + len(text))) % align)
    data_start = 8 + len(text)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, dtype, shape, data in tensors:
            if data is None:
                _pseudo_random(f, f"{name}/{dtype}/{list(shape)}", layout[name][1])
            else:
                f.write(data)
    return {"data_start": data_start, "size": data_start + offset,
            "tensors": {k: (data_start + o, n) for k, (o, n) in layout.items()}}


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("the header has a duplicate key")
    return dict(pairs)


def _uint(v, what):
    # bool is an int in Python, not in JSON; 4.0 is no integer
    if type(v) is not int or v < 0 or v > INT_MAX:
        raise ValueError(f"{what}: {v!r} is not an integer >= 0")
    return v


def _read_header(path):
    """(header dict, data start, file size) of the file at @path, checked as the C code does."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if size < 8:
            raise ValueError("too short")
        (hlen,) = struct.unpack("<Q", f.read(8))
        if hlen > MAX_HEADER:
            raise OverflowError(f"a header of {hlen} bytes")
        if hlen > size - 8:
            raise ValueError("header length past the end of the file")
        text = f.read(hlen)
    def refuse(c):
        raise ValueError(f"{c} is not JSON")
    header = json.loads(text.decode("utf-8"), object_pairs_hook=_no_duplicates,
                        parse_constant=refuse)
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    return header, 8 + hlen, size


def _tensor(name, entry, room):
    """(begin, end, rows or None for a scalar) of one entry, checked."""
    if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str):
        raise ValueError(f"tensor {name!r}: not an object with a dtype string")
    shape, offs = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not isinstance(offs, list) or len(offs) != 2:
        raise ValueError(f"tensor {name!r}: shape or data_offsets")
    shape = [_uint(d, f"tensor {name!r} shape") for d in shape]
    begin, end = (_uint(o, f"tensor {name!r} data_offsets") for o in offs)
    if begin > end or end > room:
        raise ValueError(f"tensor {name!r}: data_offsets [{begin}, {end}) out of [0, {room}]")
    count = 1
    for d in shape:
        count *= d
    nbytes, dtype = end - begin, entry["dtype"]
    if dtype in DTYPE_SIZE:
        if count * DTYPE_SIZE[dtype] != nbytes:
            raise ValueError(f"tensor {name!r}: {count} {dtype} elements, {nbytes} bytes")
    elif shape and ((count == 0 and nbytes) or (shape[0] and nbytes % shape[0])):
        raise ValueError(f"tensor {name!r}: {nbytes} bytes are not {shape[0]} whole rows")
    return begin, end, (shape[0] if shape else None)


def merge(ranges):
    """Sorted, overlapping and adjacent ranges merged, empty ones dropped: [(off, len)]."""
    out = []
    for off, n in sorted(r for r in ranges if r[1] > 0):
        if out and off <= out[-1][0] + out[-1][1]:
            last = out[-1]
            out[-1] = (last[0], max(last[1], off + n - last[0]))
        else:
            out.append((off, n))
    return out


def part_ranges(path, k, n):
    """The bytes part @k (1-based) of @n of the safetensors file at @path is,
    merged: [(offset, length)].  Raises ValueError for a file the C code
    refuses (OverflowError for a header over MAX_HEADER)."""
    if not 1 <= k <= n:
        raise ValueError(f"part {k} of {n}")
    header, ds, size = _read_header(path)
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise ValueError("__metadata__ is not an object of strings")
            continue
        tensors.append((*_tensor(name, entry, size - ds), name))
    last_end, last = 0, None
    for begin, end, _, name in sorted(tensors, key=lambda t: (t[0], t[1], t[3])):
        if begin < end and last is not None and begin < last_end:
            raise ValueError(f"tensor {name!r} overlaps tensor {last!r}")
        if begin < end:
            last_end, last = end, name
    ranges = [(0, ds)]
    for begin, end, rows, _ in tensors:
        if rows is None:
            ranges.append((ds + begin, end - begin))
        elif rows and end > begin:
            row = (end - begin) // rows
            r0, r1 = (k - 1) * rows // n, k * rows // n
            ranges.append((ds + begin + r0 * row, (r1 - r0) * row))
    return merge(ranges)


def _self_check():
    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "m.safetensors")
        # the small case of test/unit/test_safetensors.c, laid out the same
        lay = write_safetensors(p, [("a", "F32", [3, 2], None), ("b", "BF16", [5], None),
                                    ("s", "F64", [], None), ("z", "F16", [0, 4], None),
                                    ("u", "F4", [2, 3], bytes(6))], metadata={"format": "pt"})
        ds = lay["data_start"]
        assert ds % 8 == 0 and lay["size"] == os.path.getsize(p) == ds + 48, lay
        assert lay["tensors"]["u"] == (ds + 42, 6), lay
        assert part_ranges(p, 1, 1) == [(0, ds + 48)]
        assert part_ranges(p, 1, 2) == [(0, ds + 8), (ds + 24, 4), (ds + 34, 11)]
        assert part_ranges(p, 2, 2) == [(0, ds), (ds + 8, 16), (ds + 28, 14), (ds + 45, 3)]
        assert part_ranges(p, 7, 7) == [(0, ds), (ds + 16, 8), (ds + 32, 10), (ds + 45, 3)]
        with open(p, "rb") as f:
            a = f.read()[ds:ds + 24]
        write_safetensors(p + "2", [("a", "F32", [3, 2], None)])
        with open(p + "2", "rb") as f:
            assert f.read()[-24:] == a, "the same tensor, the same bytes"
        # every part of several N: the union is the whole, the rest of each
        # tensor in exactly one part
        lay = write_safetensors(p, [("e", "F16", [7, 3], None), ("w", "BF16", [5, 4, 3], None),
                                    ("c", "F32", [], None), ("n", "I8", [100], None)],
                                pad_to=4096)
        assert lay["data_start"] % 4096 == 0, lay
        whole = part_ranges(p, 1, 1)
        assert whole == [(0, lay["size"])], whole
        for n in (1, 2, 3, 4, 7):
            hits = bytearray(lay["size"])
            for k in range(1, n + 1):
                for off, ln in part_ranges(p, k, n):
                    for b in range(off, off + ln):
                        hits[b] += 1
            c_off, c_len = lay["tensors"]["c"]
            for b, h in enumerate(hits):
                shared = b < lay["data_start"] or c_off <= b < c_off + c_len
                assert h == (n if shared else 1), (n, b, h)
        # refusals
        bad = json.dumps({"x": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                          "y": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}).encode()
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(bad)) + bad + bytes(6))
        for call in (lambda: part_ranges(p, 1, 1), lambda: part_ranges(p, 0, 1)):
            try:
                call()
            except ValueError:
                continue
            raise AssertionError("accepted")
    print("stfile: ok")


if __name__ == "__main__":
    _self_check()
    sys.exit(0)
