#!/usr/bin/env python3
"""The reference side of etude's safetensors tests: PyPI's `safetensors` (with numpy).

  safetensors_ref.py probe             exit 0 if safetensors and numpy import, 3 if not
  safetensors_ref.py write-valid DIR   files the reference writes (save_file / serialize_file) and
                                       DIR/expected.json describing every tensor's bytes
  safetensors_ref.py check DIR         reads DIR/expected.json (written by etude's test) and checks
                                       every file it names with the reference reader
  safetensors_ref.py write-malformed DIR
                                       deliberately broken files and DIR/malformed.json: file,
                                       problem, a phrase etude's message must contain, and whether
                                       the reference itself refuses the file

Exit status: 0 success, 1 a check failed (the reason is printed), 3 safetensors is not importable.
"""
import json
import os
import struct
import sys

try:
    import numpy as np
    import safetensors
    import safetensors.numpy as stnp
except ImportError as exc:  # the C++ test turns this into a skip with a warning
    if len(sys.argv) > 1:
        print(f"safetensors_ref.py: cannot import safetensors/numpy: {exc}; "
              f"install them with: {sys.executable} -m pip install safetensors numpy")
        sys.exit(3)
    raise

# numpy's name -> the safetensors dtype it is stored as
NP_DTYPES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16", "float16": "F16",
    "int32": "I32", "uint32": "U32", "float32": "F32", "complex64": "C64", "float64": "F64",
    "int64": "I64", "uint64": "U64",
}
# dtypes numpy cannot hold, written from raw bytes: safetensors dtype -> (serializer name, size)
RAW_DTYPES = {"BF16": ("bfloat16", 2), "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1)}


def pattern(n, size, seed):
    """n*size deterministic bytes."""
    return bytes(((i * 131 + seed * 29 + 7) * 2654435761 >> 13) & 0xFF for i in range(n * size))


def array_of(np_name, shape, seed):
    dt = np.dtype(np_name)
    n = int(np.prod(shape, dtype=np.int64))
    if np_name == "bool":
        return (np.frombuffer(pattern(n, 1, seed), dtype=np.uint8) & 1).astype(bool).reshape(shape)
    if np_name.startswith(("float", "complex")):
        # finite, exactly representable values, so no NaN payload question arises
        vals = (np.arange(n, dtype=np.float64) * 0.375 - seed * 1.25).astype(dt)
        return vals.reshape(shape)
    return np.frombuffer(pattern(n, dt.itemsize, seed), dtype=dt).reshape(shape).copy()


def serialize_raw(tensors, path, metadata):
    """tensors: name -> (safetensors dtype, shape, bytes); through the reference serializer."""
    keep = []
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.6
        specs = {}
        for name, (dt, shape, data) in tensors.items():
            buf = np.frombuffer(bytearray(data) or bytearray(1), dtype=np.uint8)
            keep.append(buf)
            specs[name] = safetensors.TensorSpec(dtype=RAW_DTYPES[dt][0], shape=list(shape),
                                                 data_ptr=buf.ctypes.data, data_len=len(data))
        safetensors.serialize_file(specs, path, metadata=metadata)
    else:
        specs = {name: {"dtype": RAW_DTYPES[dt][0], "shape": list(shape), "data": data}
                 for name, (dt, shape, data) in tensors.items()}
        safetensors.serialize_file(specs, path, metadata=metadata)


def describe(path, metadata):
    """What the C++ side must find in a file: read back through the reference's own deserializer."""
    with open(path, "rb") as f:
        content = f.read()
    tensors = []
    for name, info in safetensors.deserialize(content):
        tensors.append({"name": name, "dtype": info["dtype"], "shape": list(info["shape"]),
                        "hex": bytes(info["data"]).hex()})
    return {"file": os.path.basename(path), "metadata": metadata or {}, "tensors": tensors}


def write_valid(d):
    files = []

    # every dtype numpy has, in several shapes, with one metadata key (format pt, as etude writes)
    t = {}
    for i, np_name in enumerate(NP_DTYPES):
        t[f"{np_name}.matrix"] = array_of(np_name, (3, 5), i)
        t[f"{np_name}.vector"] = array_of(np_name, (7,), i + 50)
    p = os.path.join(d, "all_dtypes.safetensors")
    stnp.save_file(t, p, metadata={"format": "pt"})
    files.append(describe(p, {"format": "pt"}))

    # the dtypes numpy lacks, from raw bytes through the reference serializer
    raw = {}
    for i, (dt, (_, size)) in enumerate(RAW_DTYPES.items()):
        raw[f"raw.{dt}.a"] = (dt, (2, 3), pattern(6, size, 100 + i))
        raw[f"raw.{dt}.scalar"] = (dt, (), pattern(1, size, 200 + i))
        raw[f"raw.{dt}.empty"] = (dt, (0, 4), b"")
    p = os.path.join(d, "raw_dtypes.safetensors")
    serialize_raw(raw, p, {"format": "pt"})
    files.append(describe(p, {"format": "pt"}))

    # edge cases: scalars, zeros in the shape, rank 4, a 1-element tensor
    edge = {
        "scalar.f32": np.array(3.5, dtype=np.float32),
        "scalar.i64": np.array(-7, dtype=np.int64),
        "scalar.bool": np.array(True),
        "empty.0": np.zeros((0,), dtype=np.float32),
        "empty.2x0x3": np.zeros((2, 0, 3), dtype=np.float64),
        "empty.0x0": np.zeros((0, 0), dtype=np.int8),
        "empty.u16": np.zeros((5, 0), dtype=np.uint16),
        "one": np.ones((1, 1, 1, 1), dtype=np.float16),
        "rank4": array_of("float32", (2, 3, 1, 2), 9),
    }
    p = os.path.join(d, "edge.safetensors")
    stnp.save_file(edge, p, metadata={"format": "pt"})
    files.append(describe(p, {"format": "pt"}))

    # no tensors at all, and no metadata (the reference writes "{}" and padding)
    p = os.path.join(d, "nothing.safetensors")
    stnp.save_file({}, p)
    files.append(describe(p, None))

    # metadata with several entries, non-ASCII text and escapes, and a name needing escapes
    meta = {"format": "pt", "producer": "safetensors_ref.py", "note": "caf\u00e9 \"quoted\" \\ tab\t",
            "empty": ""}
    p = os.path.join(d, "metadata.safetensors")
    stnp.save_file({"w\u00e9ird \"name\"": np.arange(4, dtype=np.int32)}, p, metadata=meta)
    files.append(describe(p, meta))

    # many tensors of mixed dtypes and sizes
    many = {}
    names = list(NP_DTYPES)
    for i in range(300):
        many[f"layers.{i}.w"] = array_of(names[i % len(names)], ((i % 5), (i % 3) + 1), i)
    p = os.path.join(d, "many.safetensors")
    stnp.save_file(many, p, metadata={"format": "pt"})
    files.append(describe(p, {"format": "pt"}))

    # every binary16 bit pattern beside numpy's float32 value of it
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    p = os.path.join(d, "f16_table.safetensors")
    stnp.save_file({"h": bits.view(np.float16), "f": bits.view(np.float16).astype(np.float32)}, p,
                   metadata={"format": "pt"})
    files.append(describe(p, {"format": "pt"}))

    with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"safetensors_version": safetensors.__version__, "files": files}, f)
    return 0


def check(d):
    with open(os.path.join(d, "expected.json"), encoding="utf-8") as f:
        expected = json.load(f)
    failures = []
    for entry in expected["files"]:
        path = os.path.join(d, entry["file"])
        with open(path, "rb") as f:
            content = f.read()
        try:
            got = {name: info for name, info in safetensors.deserialize(content)}
        except Exception as exc:  # noqa: BLE001 - report whatever the reference raises
            failures.append(f"{entry['file']}: the reference refuses it: {exc}")
            continue
        want = {t["name"]: t for t in entry["tensors"]}
        if set(got) != set(want):
            failures.append(f"{entry['file']}: names differ: reference sees {sorted(got)}, expected {sorted(want)}")
            continue
        for name, t in want.items():
            info = got[name]
            if info["dtype"] != t["dtype"] or list(info["shape"]) != t["shape"] or bytes(info["data"]).hex() != t["hex"]:
                failures.append(f"{entry['file']}: tensor {name!r}: reference reads {info['dtype']} "
                                f"{list(info['shape'])}, expected {t['dtype']} {t['shape']} (or the bytes differ)")
        # metadata through the reference's lazy reader, and typed reads through numpy where it can
        with safetensors.safe_open(path, framework="np") as f:
            meta = f.metadata() or {}
            if meta != entry["metadata"]:
                failures.append(f"{entry['file']}: metadata {meta} != expected {entry['metadata']}")
            for name, t in want.items():
                if t["dtype"] in NP_DTYPES.values():
                    arr = f.get_tensor(name)
                    if list(arr.shape) != t["shape"] or arr.tobytes().hex() != t["hex"]:
                        failures.append(f"{entry['file']}: tensor {name!r}: numpy view differs")
        n = struct.unpack("<Q", content[:8])[0]
        if n % 8 != 0:
            failures.append(f"{entry['file']}: header size {n} is not a multiple of 8")
    for msg in failures:
        print(msg)
    return 1 if failures else 0


def raw_file(path, header, data=b"", size=None):
    """A file from a header (str or bytes) and data, with the header size field overridable."""
    hb = header.encode("utf-8") if isinstance(header, str) else header
    n = len(hb) if size is None else size
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + hb + data)


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def write_malformed(d):
    cases = []

    def case(name, problem, expect, header=None, data=b"", size=None, blob=None):
        path = os.path.join(d, name + ".safetensors")
        if blob is not None:
            with open(path, "wb") as f:
                f.write(blob)
        else:
            raw_file(path, header if isinstance(header, (str, bytes)) else json.dumps(header), data, size)
        with open(path, "rb") as f:
            content = f.read()
        try:
            safetensors.deserialize(content)
            ref_rejects = False
        except Exception:  # noqa: BLE001
            ref_rejects = True
        cases.append({"file": os.path.basename(path), "problem": problem, "expect": expect,
                      "reference_rejects": ref_rejects})

    good = {"a": entry("F32", [2], 0, 8)}
    eight = bytes(range(8))
    case("too_short", "fewer than 8 bytes", "shorter than the 8-byte header size", blob=b"\x05\x00\x00")
    case("header_too_large", "header size over 100 MB", "over the limit", header=json.dumps(good), data=eight,
         size=100_000_001)
    case("header_past_end", "header size beyond the file", "only", header=json.dumps(good), data=eight, size=10_000)
    case("not_json", "header is not JSON", "invalid JSON", header="{\"a\": [1, 2", data=b"")
    case("not_object", "header is a JSON array", "does not start with '{'", header="[1, 2]   ")
    case("leading_space", "header starts with whitespace", "does not start with '{'", header=" " + json.dumps(good),
         data=eight)
    case("bad_utf8", "header string with invalid UTF-8", "invalid JSON",
         header=b'{"a\xff":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', data=eight)
    case("nul_padding", "header padded with NUL bytes", "NUL byte", header=json.dumps(good).encode() + b"\0\0\0",
         data=eight)
    case("duplicate_tensor", "the same name twice", "appears more than once",
         header='{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                '"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}', data=eight * 2)
    case("duplicate_metadata", "a metadata key twice", "appears more than once",
         header='{"__metadata__":{"k":"1","k":"2"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
         data=eight)
    case("overlap", "two tensors share bytes", "overlaps",
         header={"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, data=bytes(12))
    case("gap", "bytes between tensors", "gap",
         header={"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 12, 20)}, data=bytes(20))
    case("gap_at_start", "first tensor not at offset 0", "gap",
         header={"a": entry("F32", [2], 4, 12)}, data=bytes(12))
    case("trailing", "bytes after the last tensor", "trailing",
         header={"a": entry("F32", [2], 0, 8)}, data=bytes(9))
    case("past_end", "offsets beyond the data", "run past the end",
         header={"a": entry("F32", [4], 0, 16)}, data=bytes(8))
    case("wrong_size", "F32 [3] in 8 bytes", "needs 12",
         header={"a": entry("F32", [3], 0, 8)}, data=bytes(8))
    case("wrong_dtype_size", "I64 [2] in 8 bytes", "needs 16",
         header={"a": entry("I64", [2], 0, 8)}, data=bytes(8))
    case("reversed", "end before begin", "end before they begin",
         header={"a": entry("U8", [0], 8, 0)}, data=bytes(8))
    case("overflow", "shape product overflows", "overflows",
         header={"a": entry("F32", [2**40, 2**40], 0, 8)}, data=bytes(8))
    case("unknown_dtype", "dtype Q7", "not a safetensors dtype", header={"a": entry("Q7", [2], 0, 8)}, data=eight)
    case("negative_dim", "shape -1", "negative integer", header={"a": entry("F32", [-1], 0, 8)}, data=eight)
    case("float_dim", "shape 2.0", "non-integer or out-of-range number", header={"a": entry("F32", [2.0], 0, 8)}, data=eight)
    case("one_offset", "data_offsets [0]", "two non-negative integers",
         header={"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, data=eight)
    case("missing_field", "no shape", 'missing field "shape"',
         header={"a": {"dtype": "F32", "data_offsets": [0, 8]}}, data=eight)
    case("extra_field", "an unknown field", "unknown field",
         header={"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "stride": [1]}}, data=eight)
    case("entry_not_object", "tensor entry is a string", "must be an object", header={"a": "F32"}, data=b"")
    case("metadata_number", "non-string metadata value", "must be strings",
         header={"__metadata__": {"format": "pt", "step": 3}, "a": entry("F32", [2], 0, 8)}, data=eight)
    case("metadata_list", "metadata is a list", "\"__metadata__\" must be an object",
         header={"__metadata__": ["pt"], "a": entry("F32", [2], 0, 8)}, data=eight)

    with open(os.path.join(d, "malformed.json"), "w", encoding="utf-8") as f:
        json.dump({"safetensors_version": safetensors.__version__, "cases": cases}, f)
    return 0


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    cmd = argv[1]
    if cmd == "probe":
        print(f"safetensors {safetensors.__version__}, numpy {np.__version__}")
        return 0
    if len(argv) != 3:
        print(__doc__)
        return 2
    if cmd == "write-valid":
        return write_valid(argv[2])
    if cmd == "check":
        return check(argv[2])
    if cmd == "write-malformed":
        return write_malformed(argv[2])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
