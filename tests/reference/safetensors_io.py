"""Minimal safetensors reader/writer on numpy (no `safetensors` package needed).

File layout (https://github.com/huggingface/safetensors):
  bytes [0, 8)        N, the header length, unsigned 64-bit little-endian
  bytes [8, 8 + N)    UTF-8 JSON: {name: {"dtype", "shape", "data_offsets": [begin, end]},
                                   "__metadata__": {str: str}}   (metadata optional)
  bytes [8 + N, ...)  the data section; each tensor's bytes are data[begin:end], row-major,
                      little-endian.
Only the dtypes the ctitan tests exchange are supported: F32, F64, I32, I64.
"""

import json
import struct

import numpy as np

# safetensors dtype tag <-> little-endian numpy dtype
DTYPES = {
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
}
_TAGS = {dt: tag for tag, dt in DTYPES.items()}

# Refuse absurd header lengths before allocating (the reference implementation uses 100 MB).
MAX_HEADER_BYTES = 100 * 1024 * 1024


class SafetensorsError(ValueError):
    """The file is missing, truncated or not a valid safetensors file of supported dtypes."""


def read(path):
    """Return (tensors, metadata): {name: numpy array (native byte order)}, {str: str}."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise SafetensorsError(f"{path}: {e.strerror}") from e
    if len(blob) < 8:
        raise SafetensorsError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > MAX_HEADER_BYTES or 8 + n > len(blob):
        raise SafetensorsError(f"{path}: header length {n} exceeds the file ({len(blob)} bytes)")
    try:
        header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not UTF-8 JSON: {e}") from e
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")

    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise SafetensorsError(f"{path}: __metadata__ must map strings to strings")

    data = memoryview(blob)[8 + n :]
    tensors = {}
    for name, info in header.items():
        where = f"{path}: tensor {name!r}"
        try:
            tag, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (TypeError, KeyError, ValueError) as e:
            raise SafetensorsError(f"{where}: malformed entry {info!r}") from e
        if tag not in DTYPES:
            raise SafetensorsError(f"{where}: unsupported dtype {tag!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise SafetensorsError(f"{where}: bad shape {shape!r}")
        dt = DTYPES[tag]
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if not (isinstance(begin, int) and isinstance(end, int)) or not (
            0 <= begin <= end <= len(data)
        ):
            raise SafetensorsError(f"{where}: data_offsets {[begin, end]} outside the data section")
        if end - begin != nbytes:
            raise SafetensorsError(
                f"{where}: {end - begin} data bytes but dtype {tag} x shape {shape} needs {nbytes}"
            )
        arr = np.frombuffer(data[begin:end], dtype=dt).reshape(shape)
        tensors[name] = arr.astype(dt.newbyteorder("="), copy=True)
    return tensors, metadata


def write(path, tensors, metadata=None):
    """Write {name: numpy array} (dtypes float32/float64/int32/int64) and {str: str} metadata."""
    header = {}
    chunks = []
    offset = 0
    for name, arr in tensors.items():
        arr = np.asarray(arr)
        le = arr.dtype.newbyteorder("<")
        if le not in _TAGS:
            raise SafetensorsError(f"tensor {name!r}: unsupported dtype {arr.dtype}")
        raw = np.ascontiguousarray(arr, dtype=le).tobytes()
        header[name] = {
            "dtype": _TAGS[le],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * (-len(hjson) % 8)  # pad so the data section starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for raw in chunks:
            f.write(raw)
