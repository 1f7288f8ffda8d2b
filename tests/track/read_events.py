#!/usr/bin/env python3
"""Reads a TensorBoard event file with the tensorboard package's own loaders and prints what it
found as JSON, for tests/track/tensorboard_parity.cpp.

  read_events.py FILE

Output: {"events": [{"wall_time", "step", "file_version", "values": [{"tag", "bits", "plugin"}]}],
         "scalars": {tag: [{"wall_time", "step", "bits"}]}}
"events" comes from EventFileLoader (which also migrates simple_value to a scalar tensor, as the
TensorBoard server does); "scalars" from EventAccumulator over the same file. Float values are
given as their float32 bit pattern in hex ("3f000000" is 0.5) so that comparisons are exact (NaN included).
Exit status 77: the tensorboard package cannot be imported (the caller skips).
"""
import json
import struct
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator, event_file_loader
    from tensorboard.util import tensor_util
except Exception as e:  # ImportError, or a broken install
    print("cannot import tensorboard (%s: %s); install it with: python3 -m pip install tensorboard"
          % (type(e).__name__, e), file=sys.stderr)
    sys.exit(77)


def bits(x):
    return "%08x" % struct.unpack("<I", struct.pack("<f", x))[0]


def main(path):
    events = []
    for ev in event_file_loader.EventFileLoader(path).Load():
        out = {"wall_time": ev.wall_time, "step": ev.step, "file_version": ev.file_version, "values": []}
        for v in ev.summary.value:
            if v.HasField("simple_value"):
                x = v.simple_value
            elif v.HasField("tensor"):
                arr = tensor_util.make_ndarray(v.tensor)
                if arr.size != 1 or arr.dtype.name != "float32":
                    raise SystemExit("tag %r: expected one float32, got %r" % (v.tag, arr))
                x = float(arr.reshape(()).item())
            else:
                raise SystemExit("tag %r: neither simple_value nor tensor" % v.tag)
            out["values"].append({"tag": v.tag, "bits": bits(x), "plugin": v.metadata.plugin_data.plugin_name})
        events.append(out)

    acc = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    scalars = {}
    for tag in acc.Tags()["scalars"]:
        scalars[tag] = [{"wall_time": s.wall_time, "step": s.step, "bits": bits(s.value)} for s in acc.Scalars(tag)]

    json.dump({"events": events, "scalars": scalars}, sys.stdout)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
