#!/usr/bin/env python3
"""Writes the seeds of fuzz_inflate into tests/fuzz/corpus/fuzz_inflate/
(run once by hand, outputs committed; README.md).

fuzz_inflate input: 8 header bytes (the seed of the buffer sizes), then a
body as an upstream sends it with Content-Encoding: gzip.  Members come from
Python's zlib with every strategy and level that changes the block types,
and headers with each optional field of RFC 1952; then the bodies NGINX
meets when it goes wrong: several members, cut anywhere, a wrong CRC or
ISIZE, bytes after the last member, not gzip at all, a ratio bomb.
"""

import os
import struct
import sys
import zlib

corpus = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "corpus")

PAGE = (b"<!DOCTYPE html><html><head><title>Shop</title></head><body>"
        b"<h1>Shop</h1><esi:include src=\"/header\" onerror=\"continue\"/>"
        b"<ul>" + b"".join(b"<li>item %d</li>" % i for i in range(40)) +
        b"</ul><esi:remove><a href=\"/nojs\">x</a></esi:remove></body></html>\n")
NOISE = bytes((i * 7919 + (i >> 3) * 104729) & 0xFF for i in range(1500))


def deflate(data, level=6, strategy=zlib.Z_DEFAULT_STRATEGY):
    c = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS, 9, strategy)
    return c.compress(data) + c.flush()


def member(data, level=6, strategy=zlib.Z_DEFAULT_STRATEGY, flags=0,
           extra=b"", name=b"", comment=b""):
    """One gzip member, its header laid out by hand (RFC 1952, 2.3)."""
    header = struct.pack("<BBBBIBB", 0x1F, 0x8B, 8, flags, 0, 0, 3)
    if flags & 4:
        header += struct.pack("<H", len(extra)) + extra
    if flags & 8:
        header += name + b"\0"
    if flags & 16:
        header += comment + b"\0"
    if flags & 2:
        header += struct.pack("<H", zlib.crc32(header) & 0xFFFF)
    trailer = struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFFFFFF)
    return header + deflate(data, level, strategy) + trailer


page = member(PAGE)
SEEDS = {
    "page": page,
    "empty": member(b""),
    "one-byte": member(b"x"),
    "stored-blocks": member(PAGE, level=0),
    "fastest": member(PAGE, level=1),
    "best": member(PAGE + NOISE, level=9),
    "huffman-only": member(PAGE, strategy=zlib.Z_HUFFMAN_ONLY),
    "rle": member(PAGE, strategy=zlib.Z_RLE),
    "fixed-codes": member(PAGE, strategy=zlib.Z_FIXED),
    "noise": member(NOISE),
    "header-every-field": member(PAGE[:200], flags=2 | 4 | 8 | 16,
                                 extra=b"AB\x02\x00hi", name=b"page.html",
                                 comment=b"from upstream"),
    "header-name": member(PAGE[:100], flags=8, name=b"index.html"),
    "two-members": member(PAGE[:300]) + member(PAGE[300:]),
    "three-members-one-empty": member(b"a") + member(b"") + member(b"b"),
    "empty-then-page": member(b"") + page,
    "cut-in-header": page[:5],
    "cut-in-deflate": page[:len(page) // 2],
    "cut-in-trailer": page[:-3],
    "cut-in-second-member": page + member(PAGE)[:20],
    "cut-after-magic": page + b"\x1f\x8b",
    "bad-crc": page[:-8] + bytes([page[-8] ^ 1]) + page[-7:],
    "bad-isize": page[:-4] + struct.pack("<I", len(PAGE) + 1),
    "bad-header-crc": member(PAGE[:50], flags=2)[:-2] + b"\0\0",
    "bad-method": page[:2] + b"\x07" + page[3:],
    "reserved-flag": page[:3] + b"\x20" + page[4:],
    "bad-block-type": page[:10] + b"\x07" + page[11:],
    "trailing-garbage": page + b"garbage",
    "trailing-zeros": page + b"\0" * 16,
    "trailing-newline": page + b"\n",
    "not-gzip": PAGE[:200],
    "zlib-not-gzip": zlib.compress(PAGE),
    "raw-deflate": deflate(PAGE),
    "ratio-bomb": member(b"\0" * (1 << 20), level=9),
    "ratio-bomb-two-members": member(b"A" * 300000, level=9) * 2,
}

# The buffer sizes' seed: small buffers both ways, large ones, mixed.
HEADERS = [b"\x00\x01\x02\x03\x04\x05\x06\x07", b"\xff" * 8,
           b"\x2a\x00\x00\x00\x00\x00\x00\x01", b"\x9c\x1f\x55\xaa\x10\x00\x07\x00"]

os.makedirs(os.path.join(corpus, "fuzz_inflate"), exist_ok=True)
for i, (name, body) in enumerate(sorted(SEEDS.items())):
    with open(os.path.join(corpus, "fuzz_inflate", name), "wb") as f:
        f.write(HEADERS[i % len(HEADERS)] + body)
