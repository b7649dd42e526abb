#!/usr/bin/env python3
"""Checks that a PNG screenshot is not blank and shows given colours.

    png_check.py FILE [--min-colors N] [--color RRGGBB:MIN_PIXELS]...

Decodes the PNG with the standard library only (zlib; 8-bit RGB or RGBA,
non-interlaced, as Chromium writes them), then requires at least N distinct
colours and, for each --color, at least MIN_PIXELS pixels within 12 of it on
every channel. Exit 0 when every check holds; 1 with a reason otherwise.
"""
import argparse
import struct
import sys
import zlib


def decode(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, width = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or ctype not in (2, 6) or interlace:
                raise ValueError("unsupported PNG: depth %d colour type %d" % (depth, ctype))
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pr = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pr) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("png")
    ap.add_argument("--min-colors", type=int, default=8)
    ap.add_argument("--color", action="append", default=[])
    a = ap.parse_args()
    width, height, bpp, rows = decode(a.png)
    counts = {}
    for line in rows:
        for x in range(0, width * bpp, bpp):
            px = line[x:x + 3]
            counts[px] = counts.get(px, 0) + 1
    if len(counts) < a.min_colors:
        print("png_check: %s has %d distinct colours (< %d): blank?" % (a.png, len(counts), a.min_colors))
        return 1
    for spec in a.color:
        hexcol, need = spec.split(":")
        want = bytes.fromhex(hexcol)
        n = sum(c for px, c in counts.items() if all(abs(px[i] - want[i]) <= 12 for i in range(3)))
        if n < int(need):
            print("png_check: %s has %d pixels of #%s (< %s)" % (a.png, n, hexcol, need))
            return 1
    print("png_check: %s %dx%d, %d colours: ok" % (a.png, width, height, len(counts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
