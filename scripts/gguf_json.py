"""The text form of the small GGUF files the tests use (tests/data/gguf/*.gguf.json and
tests/data/tokenizer/tiny-*.gguf.json): what a file holds, as JSON, from which
tests/gguf_writer.hpp writes the same bytes back at test time. The repository keeps only text
under tests/data; the scripts write their GGUF files with gguf-py's GGUFWriter into a temporary
directory and commit this form of them.

  {"file": NAME, "sha256": of the file's bytes, "version": 2 or 3, "alignment": N,
   "kv": [{"key": K, "type": T, "value": V}, ...],              in file order
   "tensors": [{"name": S, "type": "Q8_0", "type_id": 8, "dims": [ne0, ...], "data": [HEX, ...]}, ...]}

T is a GGUF value type (uint8 int8 uint16 int16 uint32 int32 float32 bool string uint64 int64
float64) or array[T] (nested: array[array[int32]]; the arrays inside an array share their element
type). Numbers are JSON numbers (a float32 as the double it equals, so it reads back exactly),
strings (keys, values, tensor names) the string itself when the bytes are UTF-8, else
{"hex": ...}. A tensor's data is its bytes as hex, in lines of 32 bytes.

The layout is the one GGUFWriter makes and the C++ writer repeats: header, metadata, tensor
infos, zeros up to the alignment, then each tensor's bytes padded with zeros to the alignment,
offsets in that order. spec_of() refuses a file laid out otherwise, and checks that to_gguf()
gives its bytes back.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

VALUE_TYPES = ["uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array",
               "uint64", "int64", "float64"]
SCALAR_FORMATS = {"uint8": "<B", "int8": "<b", "uint16": "<H", "int16": "<h", "uint32": "<I", "int32": "<i",
                  "float32": "<f", "bool": "<B", "uint64": "<Q", "int64": "<q", "float64": "<d"}
DATA_LINE = 32  # bytes of tensor data per line of hex


def pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def text(b: bytes):
    """Bytes in JSON: the string when they are UTF-8, else {"hex": ...}."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": b.hex()}


def raw(v) -> bytes:
    return bytes.fromhex(v["hex"]) if isinstance(v, dict) else v.encode("utf-8")


class _Cursor:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, fmt: str):
        (v,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return v

    def string(self) -> bytes:
        n = self.take("<Q")
        s = self.data[self.at:self.at + n]
        assert len(s) == n, "truncated string"
        self.at += n
        return s


def _value(c: _Cursor, type_id: int):
    """(type name, JSON value) of the value at the cursor."""
    name = VALUE_TYPES[type_id]
    if name == "string":
        return name, text(c.string())
    if name == "array":
        element = c.take("<I")
        items = [_value(c, element) for _ in range(c.take("<Q"))]
        if VALUE_TYPES[element] != "array":
            return f"array[{VALUE_TYPES[element]}]", [v for _, v in items]
        inner = {t for t, _ in items}
        assert len(inner) == 1, f"arrays of arrays of different types ({sorted(inner)}) have no text form here"
        return f"array[{inner.pop()}]", [v for _, v in items]
    v = c.take(SCALAR_FORMATS[name])
    if name == "bool":
        assert v in (0, 1), f"bool byte {v}"
        return name, bool(v)
    return name, v


def _pack(type_name: str, v) -> bytes:
    """The bytes of a value of type_name (without its type id)."""
    if type_name == "string":
        b = raw(v)
        return struct.pack("<Q", len(b)) + b
    if type_name.startswith("array["):
        element = type_name[6:-1]
        out = struct.pack("<IQ", VALUE_TYPES.index("array" if element.startswith("array[") else element), len(v))
        return out + b"".join(_pack(element, x) for x in v)
    return struct.pack(SCALAR_FORMATS[type_name], v)


def to_gguf(spec: dict) -> bytes:
    """The bytes of the file a spec describes (what tests/gguf_writer.hpp writes)."""
    a = spec["alignment"]
    out = bytearray(b"GGUF" + struct.pack("<IQQ", spec["version"], len(spec["tensors"]), len(spec["kv"])))
    for kv in spec["kv"]:
        t = kv["type"]
        out += _pack("string", kv["key"]) + struct.pack("<I", VALUE_TYPES.index("array" if t.startswith("array[") else t))
        out += _pack(t, kv["value"])
    data, offset = bytearray(), 0
    for t in spec["tensors"]:
        out += _pack("string", t["name"]) + struct.pack("<I", len(t["dims"]))
        out += b"".join(struct.pack("<Q", d) for d in t["dims"]) + struct.pack("<IQ", t["type_id"], offset)
        b = bytes.fromhex("".join(t["data"]))
        data += b + bytes(pad(len(b), a) - len(b))
        offset += pad(len(b), a)
    out += bytes(pad(len(out), a) - len(out))
    return bytes(out + data)


def spec_of(path: Path) -> dict:
    """The text form of a GGUF file (little-endian, version 2 or 3, laid out as GGUFWriter does)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    data = Path(path).read_bytes()
    c = _Cursor(data)
    assert data[:4] == b"GGUF", f"{path}: not a GGUF file"
    c.at = 4
    version, n_tensors, n_kv = c.take("<I"), c.take("<Q"), c.take("<Q")
    assert version in (2, 3), f"{path}: version {version}"
    kvs = []
    for _ in range(n_kv):
        key = text(c.string())
        type_name, value = _value(c, c.take("<I"))
        kvs.append({"key": key, "type": type_name, "value": value})
    alignment = next((kv["value"] for kv in kvs if kv["key"] == "general.alignment"), 32)
    infos = []
    for _ in range(n_tensors):
        name = text(c.string())
        dims = [c.take("<Q") for _ in range(c.take("<I"))]
        infos.append((name, dims, c.take("<I"), c.take("<Q")))
    data_offset = pad(c.at, alignment)
    tensors = []
    for name, dims, type_id, offset in infos:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
        elements = 1
        for d in dims:
            elements *= d
        b = data[data_offset + offset:data_offset + offset + elements // block * block_bytes]
        h = b.hex()
        tensors.append({"name": name, "type": GGMLQuantizationType(type_id).name, "type_id": type_id, "dims": dims,
                        "data": [h[i:i + 2 * DATA_LINE] for i in range(0, len(h), 2 * DATA_LINE)]})
    spec = {"file": Path(path).name, "sha256": hashlib.sha256(data).hexdigest(), "version": version,
            "alignment": alignment, "kv": kvs, "tensors": tensors}
    assert to_gguf(spec) == data, f"{path}: not laid out as GGUFWriter lays out files (its text form would differ)"
    return spec


def dump(spec: dict) -> str:
    """The JSON text: one line per metadata key and per tensor; long arrays and tensor data one
    item per line."""
    j = lambda v: json.dumps(v, ensure_ascii=False, allow_nan=False)  # noqa: E731

    def kv_line(kv: dict) -> str:
        head = f'  {{"key": {j(kv["key"])}, "type": {j(kv["type"])}, "value": '
        v = kv["value"]
        if isinstance(v, list) and len(v) > 16:  # strings one a line, numbers 16 a line
            per = 16 if all(isinstance(x, (int, float)) for x in v) else 1
            lines = [", ".join(j(x) for x in v[i:i + per]) for i in range(0, len(v), per)]
            return head + "[\n" + ",\n".join(f"   {x}" for x in lines) + "\n  ]}"
        return head + j(v) + "}"

    def tensor_line(t: dict) -> str:
        head = f'  {{"name": {j(t["name"])}, "type": {j(t["type"])}, "type_id": {t["type_id"]}, "dims": {j(t["dims"])}, "data": '
        return head + "[\n" + ",\n".join(f'   "{x}"' for x in t["data"]) + "\n  ]}"

    rows = [f" {j(k)}: {j(spec[k])}" for k in ("file", "sha256", "version", "alignment")]
    rows.append(' "kv": [\n' + ",\n".join(kv_line(kv) for kv in spec["kv"]) + "\n ]")
    rows.append(' "tensors": [' + ("\n" + ",\n".join(tensor_line(t) for t in spec["tensors"]) + "\n ]" if spec["tensors"] else "]"))
    return "{\n" + ",\n".join(rows) + "\n}\n"


def write_text_form(gguf_path: Path, out_path: Path) -> dict:
    """Writes the text form of gguf_path to out_path; returns it."""
    spec = spec_of(gguf_path)
    text_form = dump(spec)
    assert json.loads(text_form) == spec
    out_path.write_text(text_form, encoding="utf-8")
    return spec
