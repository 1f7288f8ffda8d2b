#!/usr/bin/env python3
# Decodes a grid's valid_ce.png (etude/run/grid_plot.hpp) and checks its size and that the first
# RUNS run colours appear (and the next one does not): with PIL where it is importable, else with
# zlib, reading IHDR and IDAT and undoing PNG's row filters by hand (also when
# ETUDE_CHECK_PLOT_BY_HAND is set, so that path is tested too).
#   check_grid_plot.py FILE RUNS [WIDTH HEIGHT]
import os
import struct
import sys
import zlib

# grid_plot_colour(i) for i < 10 (Tableau's ten)
COLOURS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
           (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207)]


def decode_by_hand(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    at, idat, width = 8, b"", None
    while at < len(data):
        n, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + n]
        if kind == b"IHDR":
            width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert (depth, colour_type, interlace) == (8, 2, 0), (depth, colour_type, interlace)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        at += 12 + n
    raw, stride, rows, prev = zlib.decompress(idat), width * 3, [], bytearray(width * 3)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - 3] if i >= 3 else 0
            b, c = prev[i], prev[i - 3] if i >= 3 else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    pixels = set()
    for r in rows:
        pixels.update(struct.iter_unpack("BBB", r))
    return width, height, pixels


def main():
    path, runs = sys.argv[1], int(sys.argv[2])
    want = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (800, 500)
    try:
        if os.environ.get("ETUDE_CHECK_PLOT_BY_HAND"):
            raise ImportError("asked to decode by hand")
        from PIL import Image
        im = Image.open(path).convert("RGB")
        size, pixels, how = im.size, set(struct.iter_unpack("BBB", im.tobytes())), "PIL"
    except ImportError:
        w, h, pixels = decode_by_hand(open(path, "rb").read())
        size, how = (w, h), "zlib"
    assert size == want, f"{path}: {size}, want {want}"
    missing = [i for i in range(runs) if COLOURS[i] not in pixels]
    assert not missing, f"{path}: the colours of runs {missing} do not appear"
    assert runs >= len(COLOURS) or COLOURS[runs] not in pixels, f"{path}: run {runs}'s colour appears"
    print(f"{path}: {size[0]}x{size[1]}, the {runs} runs' colours present (decoded with {how})")


main()
