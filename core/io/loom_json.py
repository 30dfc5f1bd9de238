"""Loom's JSON wire format (spec §2–§3): read both schemas, write the persistence schema.

Reading is strict where Loom is lenient: every problem raises one :class:`LoomFormatError` that
names the JSON path of the culprit (or, for a file that cannot be read or is not JSON at all,
the file, and what it is instead), and nothing is returned until the whole network is built.
docs/compat.md lists each deliberate difference from Loom.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
import reprlib
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..enums import ACTIVATIONS, COMBINE_MODES, DTYPES, LAYER_TYPES, SOFTMAX_TYPES, lookup
from ..errors import LoomFormatError
from ..layers import Layer, LayerConfig, layer_class
from ..layers.base import CONFIG_FIELDS
from ..machine import physical_memory_bytes
from ..network import VolumetricNetwork
from ..weights import WeightStore, uniform_weights
from .atomic import replacing

MAX_FILE_BYTES = 256 * 1024 * 1024
MAX_NESTING = 64
# Layer objects in one network, nested ones included: one forward pass visits each in Python
# (tens of microseconds apiece), so more would not run in a usable time. Every grid cell holds one.
MAX_LAYERS = 1 << 16
MAX_CELLS = MAX_LAYERS
# JSON values a file may hold (counted as its commas and opening brackets before parsing): a
# parsed value costs up to ~100 bytes of Python objects, and a network at MAX_LAYERS with Loom's
# ~50 keys per layer stays under it.
MAX_JSON_VALUES = 1 << 22
MAX_INT = (1 << 31) - 1
# Weights of one network, and never more than the machine can work with (see max_parameters):
# reading a network at this cap stays under 1 GB, on its costliest path too (1-bit native weights
# unpacked and dequantized, ~10 bytes a weight: 0.73 GB peak RSS for `loomlab net info` of one
# 8192x8192 binary Dense layer).
MAX_PARAMETERS = 1 << 26
# What one weight may cost while a network is worked on: its float32 master, its widest native
# copy (float64 and int64 morphs take 8 bytes) and a float32 compute copy.
BYTES_PER_PARAMETER = 16
FLOAT32_MAX = float(np.finfo(np.float32).max)

_INT_FIELDS = ("z", "y", "x", "l", "input_height", "input_width", "input_depth", "output_height",
               "output_width", "output_depth", "input_channels", "filters", "kernel_size", "stride",
               "padding", "output_padding", "num_heads", "num_kv_heads", "head_dim", "query_dim",
               "d_model", "seq_length", "vocab_size", "embedding_dim", "num_clusters",
               "softmax_rows", "softmax_cols", "tile_size", "target_z", "target_y", "target_x",
               "target_l")
_FLOAT_FIELDS = ("rope_freq_base", "kmeans_temperature", "temperature", "entmax_alpha", "scale")
_BOOL_FIELDS = ("gumbel_noise", "use_tiling", "is_disabled", "native", "is_remote_link")
_STR_FIELDS = ("type", "activation", "dtype", "output_mode", "combine_mode", "weights")
# Keys of the persistence schema in the order Loom's serializer writes them (spec §2.6), then
# the in-memory fields we also persist so that our own round trip keeps them (docs/compat.md).
_WRITE_ORDER = (
    "z", "y", "x", "l", "type", "activation", "dtype", "input_height", "input_width", "input_depth",
    "output_height", "output_width", "output_depth", "input_channels", "filters", "kernel_size",
    "stride", "padding", "output_padding", "num_heads", "num_kv_heads", "head_dim", "query_dim",
    "d_model", "seq_length", "rope_freq_base", "vocab_size", "embedding_dim", "num_clusters",
    "kmeans_temperature", "output_mode", "softmax_type", "temperature", "softmax_rows",
    "softmax_cols", "entmax_alpha", "gumbel_noise", "weights", "native", "scale",
    "parallel_branches", "combine_mode", "sequential_layers", "use_tiling", "tile_size",
    "is_disabled", "mask", "hierarchy_levels", "is_remote_link", "target_z", "target_y",
    "target_x", "target_l",
)
_ALWAYS_WRITTEN = {"z", "y", "x", "l", "type", "activation", "dtype", "softmax_type"}


# ----------------------------------------------------------------------------------------
# reading
# ----------------------------------------------------------------------------------------
def load_json(source: str | os.PathLike | bytes, *, schema: str = "auto",
                 seed: int | None = None, backend: str = "numpy") -> VolumetricNetwork:
    """Read a network in Loom's JSON format.

    ``source`` is a path, or the JSON text itself (a string starting with ``{``, or bytes).
    ``schema``: ``"persistence"`` (weights in the file), ``"build"`` (architecture only; weights
    drawn uniformly from [-0.1, 0.1) with ``seed``) or ``"auto"`` (persistence when any layer
    carries ``weights``). Raises :class:`LoomFormatError` naming the JSON path of any problem.
    """
    if schema not in ("auto", "persistence", "build"):
        raise LoomFormatError("$", f"unknown schema {schema!r}")
    data, origin = _read_source(source)
    doc = parse_json(data, origin)
    del data  # the file's bytes are not kept while the network is built from them
    if schema == "auto":
        schema = "persistence" if _has_weights(doc) else "build"
    return read_network(doc, schema=schema, seed=seed, backend=backend)


def read_network(doc, *, schema: str = "persistence", seed: int | None = None, backend: str = "numpy",
                 blobs: dict[str, bytes | np.ndarray] | None = None) -> VolumetricNetwork:
    """Build a network from a parsed JSON object.

    ``blobs`` (our checkpoint) supplies every weighted layer's native blob by layer path
    (``layers[3].parallel_branches[0]``) instead of the layer's ``weights`` field; every blob
    must be used exactly once.
    """
    reader = _Reader(schema, np.random.default_rng(seed), backend, blobs)
    net = reader.network(doc)
    if reader.blobs:
        raise LoomFormatError("$", f"weights for no layer: {sorted(reader.blobs)[:5]}")
    return net


def _read_source(source) -> tuple[bytes, str]:
    """The bytes of ``source`` and what errors about them as a whole name: the file, or ``$``."""
    if isinstance(source, bytes | bytearray):
        data, origin = bytes(source), "$"
    elif isinstance(source, str) and source.lstrip().startswith("{"):
        data, origin = source.encode("utf-8"), "$"
    else:
        path = Path(source)
        origin = str(path)
        try:
            size = regular_file_size(path)
            if size > MAX_FILE_BYTES:
                raise LoomFormatError(origin, f"{size} bytes; the limit for a network is {MAX_FILE_BYTES}")
            with open(path, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
        except OSError as e:
            raise LoomFormatError(origin, f"cannot read: {e.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise LoomFormatError(origin, f"network text is over {MAX_FILE_BYTES} bytes")
    return data, origin


def regular_file_size(path: Path) -> int:
    """The size of the regular file ``path``; anything else (a FIFO would block the read, a device
    read without end) is refused by name before it is opened. Raises OSError as ``stat`` does."""
    info = path.stat()
    if not stat.S_ISREG(info.st_mode):
        raise LoomFormatError(str(path), "not a regular file, so not a network file")
    return info.st_size


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def foreign_format(head: bytes, reading: str = "json") -> str | None:
    """What a file starting with ``head`` (16 bytes are enough) is when it is recognisably not
    the network format being read (``reading``: ``"json"`` or ``"checkpoint"``), said so that the
    user knows what to do with it; None otherwise."""
    if head.startswith(b"GGUF"):
        return "a GGUF language model, not a Loom network: use `loomlab models info` (or chat, generate)"
    if head.startswith(b"\x93NUMPY"):
        return "a numpy array (.npy), not a Loom network: pass it to `loomlab net run --input`"
    # safetensors: an 8-byte little-endian header length (under 4 GiB: high bytes zero), then JSON
    if reading == "json" and len(head) >= 10 and head[4:8] == bytes(4) and head[8:10] == b'{"':
        return "a safetensors file, not Loom JSON (a Loom Lab checkpoint must be named .loom)"
    if reading == "checkpoint" and head.lstrip().startswith(b"{"):
        return "Loom JSON text, not a checkpoint (a .loom file is safetensors): name it .json"
    return None


def parse_json(data: bytes, origin: str = "$") -> Any:
    """The parsed JSON of ``data``; a problem with it as a whole raises naming ``origin``.

    The values are counted before parsing (:data:`MAX_JSON_VALUES`): Python objects for
    millions of tiny values would take gigabytes, from a file well under the size limit.
    """
    what = foreign_format(data[:16])
    if what is not None:
        raise LoomFormatError(origin, what)
    values = data.count(b",") + data.count(b"{") + data.count(b"[")
    if values > MAX_JSON_VALUES:
        raise LoomFormatError(origin, f"over {MAX_JSON_VALUES:,} JSON values ({values:,} commas and "
                                      f"brackets); a network holds at most {MAX_LAYERS:,} layers")
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as e:
        raise LoomFormatError(origin, f"not UTF-8 text (byte {e.start}), so not Loom JSON") from None
    except json.JSONDecodeError as e:
        raise LoomFormatError(origin, f"invalid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:
        raise LoomFormatError(origin, f"invalid JSON: {e}") from None
    except RecursionError:
        raise LoomFormatError(origin, "invalid JSON: nested too deeply") from None


def _has_weights(doc) -> bool:
    layers = _folded(doc).get("layers") if isinstance(doc, dict) else None
    stack = list(layers) if isinstance(layers, list) else []  # not a list: read_network says so
    while stack:
        obj = stack.pop()
        if isinstance(obj, dict):
            obj = _folded(obj)
            if obj.get("weights") not in (None, ""):
                return True
            for key in ("parallel_branches", "sequential_layers"):
                kids = obj.get(key)
                if isinstance(kids, list):
                    stack.extend(kids)
    return False


def _folded(obj: dict) -> dict:
    """``obj`` keyed in lower case, as Go's decoder matches keys: the exact (lower-case) spelling
    first, else the first key equal to it ignoring case. Made once per object, so reading a layer
    costs time linear in its keys."""
    out: dict = {}
    for k, v in obj.items():
        low = k.lower()
        if low == k or low not in out:
            out[low] = v
    return out


def brief(v) -> str:
    """A short ``repr`` of ``v`` for an error message: a huge value is cut, never printed whole."""
    return reprlib.repr(v)


def max_parameters() -> int:
    """The most weights one network may have here: :data:`MAX_PARAMETERS`, or fewer on a
    machine whose memory holds fewer at :data:`BYTES_PER_PARAMETER` each."""
    return min(MAX_PARAMETERS, physical_memory_bytes() // BYTES_PER_PARAMETER)


class _Reader:
    def __init__(self, schema: str, rng: np.random.Generator, backend: str,
                 blobs: dict[str, bytes] | None):
        self.build = schema == "build"
        self.blobs = None if blobs is None else dict(blobs)
        self.rng = rng
        self.backend = backend
        self.layers = 0  # layer objects read so far, nested ones included
        self.parameters = 0
        self.max_parameters = max_parameters()

    def network(self, doc) -> VolumetricNetwork:
        doc = self.fields(doc, "$")
        dims = []
        for key in ("depth", "rows", "cols", "layers_per_cell"):
            v = self.int_field(doc, key, f"$.{key}")
            if v < 1:
                raise LoomFormatError(f"$.{key}", f"must be >= 1, got {v}")
            dims.append(v)
        if math.prod(dims) > MAX_CELLS:
            raise LoomFormatError("$", f"grid of {math.prod(dims):,} cells exceeds {MAX_CELLS:,}")
        layers = doc.get("layers")
        if not isinstance(layers, list):
            raise LoomFormatError("$.layers", "missing or not an array")
        net = VolumetricNetwork(*dims, backend=self.backend)
        placed: dict[int, str] = {}
        for i, obj in enumerate(layers):
            path = f"$.layers[{i}]"
            obj = self.fields(obj, path)
            layer = self.layer(obj, path, depth=1)
            coord = tuple(self.int_field(obj, k, f"{path}.{k}") for k in ("z", "y", "x", "l"))
            for c, n, k in zip(coord, dims, "zyxl", strict=True):
                if not 0 <= c < n:
                    raise LoomFormatError(f"{path}.{k}", f"coordinate {c} is outside 0..{n - 1}")
            idx = net.index(coord)
            if idx in placed:
                raise LoomFormatError(path, f"cell {coord} is already described by {placed[idx]}")
            placed[idx] = path
            net[coord] = layer
        for idx, layer in enumerate(net.cells):
            if layer is None:
                raise LoomFormatError("$.layers", f"grid cell {net.coord(idx)} is not described")
        return net

    @staticmethod
    def fields(obj, path: str) -> dict:
        """A JSON object's fields keyed as :func:`_folded` keys them."""
        if not isinstance(obj, dict):
            raise LoomFormatError(path, f"expected an object, got {type(obj).__name__}")
        return _folded(obj)

    # ----- one layer ------------------------------------------------------------------
    def layer(self, obj: dict, path: str, depth: int) -> Layer:
        """The layer of the folded object ``obj`` (:meth:`fields`), its children built first."""
        if depth > MAX_NESTING:
            raise LoomFormatError(path, f"layers nested deeper than {MAX_NESTING}")
        self.layers += 1
        if self.layers > MAX_LAYERS:
            raise LoomFormatError(path, f"a network holds at most {MAX_LAYERS:,} layers, nested ones "
                                        "included")
        cfg = self.config(obj, path)
        cls = layer_class(cfg.type)
        if cls is None:
            raise LoomFormatError(f"{path}.type", f"layer type {cfg.type!r} is not supported yet")
        children, children_key = [], None
        for key in ("parallel_branches", "sequential_layers"):
            kids = obj.get(key)
            if kids is None:
                continue
            if not isinstance(kids, list):
                raise LoomFormatError(f"{path}.{key}", "expected an array of layer objects")
            for j, kid in enumerate(kids):
                kid_path = f"{path}.{key}[{j}]"
                children.append(self.layer(self.fields(kid, kid_path), kid_path, depth + 1))
            children_key = children_key or (key if kids else None)
        layer = cls(cfg, None, children)
        if children_key is not None:
            layer.children_key = children_key  # written back under the key it came from
        if cfg.is_remote_link and obj.get("weights") is None:
            return layer  # a bare link (NEAT's): it runs its target, so its own sizes are unused
        layer.check(path)
        if cls.weighted:
            layer.weights = self.weights(obj, cfg, cls.param_count(cfg), path)
        elif obj.get("weights"):
            raise LoomFormatError(f"{path}.weights", f"{cfg.type} has no weights")
        return layer

    def config(self, obj: dict, path: str) -> LayerConfig:
        cfg = LayerConfig.defaults()
        type_text = obj.get("type")
        if type_text is None:
            raise LoomFormatError(f"{path}.type", "missing")
        cfg.type = self.enum(type_text, LAYER_TYPES, f"{path}.type", "layer type")
        if (act := obj.get("activation")) is not None:
            cfg.activation = self.enum(act, ACTIVATIONS, f"{path}.activation", "activation")
        if (dt := obj.get("dtype")) is not None:
            cfg.dtype = self.enum(dt, DTYPES, f"{path}.dtype", "dtype")
        for key in _INT_FIELDS:
            if key in ("z", "y", "x", "l"):
                continue
            if obj.get(key) is not None:
                v = self.int_field(obj, key, f"{path}.{key}")
                if v < 0:
                    raise LoomFormatError(f"{path}.{key}", f"must be >= 0, got {v}")
                setattr(cfg, key, v)
        cfg.seq_length = max(cfg.seq_length, 1)  # Loom: <= 0 means 1
        for key in _FLOAT_FIELDS:
            if key != "scale" and obj.get(key) is not None:
                setattr(cfg, key, self.float_field(obj, key, f"{path}.{key}"))
        for key in _BOOL_FIELDS:
            if key != "native" and (v := obj.get(key)) is not None:
                if not isinstance(v, bool):
                    raise LoomFormatError(f"{path}.{key}", f"expected true/false, got {brief(v)}")
                setattr(cfg, key, v)
        if (mode := obj.get("output_mode")) is not None:
            cfg.output_mode = self.string(mode, f"{path}.output_mode")
        if (mode := obj.get("combine_mode")) is not None:
            if mode not in COMBINE_MODES:
                raise LoomFormatError(f"{path}.combine_mode", f"unknown combine mode {brief(mode)}; "
                                                              f"expected one of {list(COMBINE_MODES)}")
            cfg.combine_mode = mode
        if (st := obj.get("softmax_type")) is not None:
            cfg.softmax_type = self.softmax_type(st, f"{path}.softmax_type")
        if (mask := obj.get("mask")) is not None:
            if not isinstance(mask, list) or not all(isinstance(m, bool) for m in mask):
                raise LoomFormatError(f"{path}.mask", "expected an array of true/false")
            cfg.mask = mask
        if (levels := obj.get("hierarchy_levels")) is not None:
            if not isinstance(levels, list) or not all(_is_int(v) and v > 0 for v in levels):
                raise LoomFormatError(f"{path}.hierarchy_levels", "expected an array of positive integers")
            cfg.hierarchy_levels = levels
        if self.build and cfg.type in ("CNN2", "CNN3"):
            # build schema only: width (and depth for CNN3) default to the height
            cfg.input_width = cfg.input_width or cfg.input_height
            cfg.output_width = cfg.output_width or cfg.output_height
            if cfg.type == "CNN3":
                cfg.input_depth = cfg.input_depth or cfg.input_height
                cfg.output_depth = cfg.output_depth or cfg.output_height
        return cfg

    def weights(self, obj: dict, cfg: LayerConfig, n: int, path: str) -> WeightStore:
        scale = self.scale_field(obj, f"{path}.scale")
        self.parameters += n  # counted before anything is allocated or decoded
        if self.parameters > self.max_parameters:
            raise LoomFormatError(path, f"network needs over {self.max_parameters:,} parameters, the most "
                                        f"loaded on this machine")
        if self.blobs is not None:
            blob = self.blobs.pop(path.removeprefix("$."), None)
            if blob is None:
                raise LoomFormatError(f"{path}.weights", f"no weights tensor for this {cfg.type} layer")
            return self.store(blob, True, cfg, n, scale, path)
        blob_text = obj.get("weights")
        if blob_text in (None, ""):
            if not self.build:
                raise LoomFormatError(f"{path}.weights", f"{cfg.type} layer has no weights")
            return WeightStore(uniform_weights(n, self.rng, 0.1), 1.0)
        blob_text = self.string(blob_text, f"{path}.weights")
        try:
            blob = base64.b64decode(blob_text, validate=True)
        except (binascii.Error, ValueError):
            raise LoomFormatError(f"{path}.weights", "not valid base64") from None
        native = obj.get("native")
        if native is not None and not isinstance(native, bool):
            raise LoomFormatError(f"{path}.native", f"expected true/false, got {brief(native)}")
        return self.store(blob, bool(native), cfg, n, scale, path)

    @staticmethod
    def store(blob: bytes | np.ndarray, native: bool, cfg: LayerConfig, n: int, scale: float,
              path: str) -> WeightStore:
        """A weight store from one blob: native in the layer's dtype, or a float32 master."""
        if native and cfg.dtype != "float32":
            return _native_store(blob, cfg.dtype, n, scale, f"{path}.weights")
        if len(blob) != 4 * n:
            raise LoomFormatError(f"{path}.weights", f"{cfg.type} needs {n} float32 weights "
                                                     f"({4 * n} bytes), blob has {len(blob)} bytes")
        master = np.frombuffer(blob, "<f4")
        if not master.flags.writeable:  # bytes from base64; a checkpoint's own array is reused
            master = master.copy()
        if cfg.dtype != "float32":  # native:false — a float32 master quantized on load (spec §2.4)
            return _quantized_store(master, cfg.dtype, scale)
        return WeightStore(master, scale)

    # ----- scalar fields --------------------------------------------------------------
    @staticmethod
    def int_field(obj: dict, key: str, path: str) -> int:
        v = obj.get(key)
        if v is None:
            return 0
        if not _is_int(v):
            raise LoomFormatError(path, f"expected an integer, got {brief(v)}")
        if abs(v) > MAX_INT:
            raise LoomFormatError(path, f"{brief(v)} is out of range")
        return v

    @staticmethod
    def float_field(obj: dict, key: str, path: str) -> float:
        v = obj.get(key)
        f = _finite(v)
        if f is None:
            raise LoomFormatError(path, f"expected a finite number, got {brief(v)}")
        return f

    def scale_field(self, obj: dict, path: str) -> float:
        """The layer's ``scale`` (0 when absent): Loom keeps it as a float32, so it must fit one."""
        if obj.get("scale") is None:
            return 0.0
        scale = self.float_field(obj, "scale", path)
        if abs(scale) > FLOAT32_MAX:
            raise LoomFormatError(path, f"{brief(scale)} is out of float32 range")
        return scale

    @staticmethod
    def string(v, path: str) -> str:
        if not isinstance(v, str):
            raise LoomFormatError(path, f"expected a string, got {brief(v)}")
        return v

    def enum(self, text, table, path: str, what: str) -> str:
        entry = lookup(table, self.string(text, path))
        if entry is None:
            known = sorted({e.name for e in table.values()})
            raise LoomFormatError(path, f"unknown {what} {brief(text)}; expected one of {known}")
        return entry.name

    @staticmethod
    def softmax_type(v, path: str) -> str:
        if _is_int(v) and 0 <= v < len(SOFTMAX_TYPES):
            return SOFTMAX_TYPES[v]
        if isinstance(v, str) and v in SOFTMAX_TYPES:
            return v
        raise LoomFormatError(path, f"unknown softmax type {brief(v)}; "
                                    f"expected 0..9 or one of {list(SOFTMAX_TYPES)}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _finite(v) -> float | None:
    """``v`` as a finite float; None for anything else, an integer too large for a float included."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _native_store(blob: bytes, dtype: str, n: int, scale: float, path: str) -> WeightStore:
    """A store rebuilt from a native blob of a non-float32 dtype (spec §2.4, §3.1)."""
    from .. import dtypes

    expected = dtypes.packed_nbytes(n, dtype)
    if len(blob) != expected:
        raise LoomFormatError(path, f"{n} {dtype} weights need {expected} bytes, blob has {len(blob)}")
    native = dtypes.unpack(blob, dtype)[:n]
    # Loom rebuilds the master treating a zero scale as 1 for the signed-int family
    master = dtypes.dequantize(native, dtype, scale if scale != 0 else 1.0)
    store = WeightStore(master, scale)
    store.native[dtype] = native
    return store


def _quantized_store(master: np.ndarray, dtype: str, scale: float) -> WeightStore:
    """``native:false``: the float32 master quantized with the file's scale (spec §2.4).

    A scale of exactly 1 asks for auto-scaling; a missing scale (0) quantizes everything to 0.
    """
    store = WeightStore(master, scale)
    store.morph(dtype)
    return store


# ----------------------------------------------------------------------------------------
# writing
# ----------------------------------------------------------------------------------------
def network_to_dict(net: VolumetricNetwork, blobs: dict[str, bytes | memoryview] | None = None) -> dict:
    """The persistence-schema object Loom's SerializeNetwork would write (spec §2.6).

    With ``blobs`` (our checkpoint), weight blobs go there by layer path instead of into the
    layers' base64 ``weights`` fields.
    """
    layers = []
    for i, layer in enumerate(net.cells):
        if layer is None:
            raise LoomFormatError(f"$.layers[{i}]", f"grid cell {net.coord(i)} holds no layer")
        layers.append(_layer_to_dict(layer, net.coord(i), f"layers[{i}]", blobs))
    return {"id": "network", "depth": net.depth, "rows": net.rows, "cols": net.cols,
            "layers_per_cell": net.layers_per_cell, "layers": layers}


def _layer_to_dict(layer: Layer, coord, path: str, blobs: dict[str, bytes | memoryview] | None) -> dict:
    cfg = layer.cfg
    values: dict[str, Any] = {k: getattr(cfg, k) for k in CONFIG_FIELDS}
    values.update(zip(("z", "y", "x", "l"), coord, strict=True))
    if layer.weights is not None:
        blob, scale = _weights_blob(layer)
        values.update(native=True, scale=scale)
        if blobs is None:
            values["weights"] = base64.b64encode(blob).decode("ascii")
        else:
            blobs[path] = blob
    group = layer.children_key
    values[group] = [_layer_to_dict(c, (0, 0, 0, 0), f"{path}.{group}[{j}]", blobs)
                     for j, c in enumerate(layer.children)]
    out = {}
    for key in _WRITE_ORDER:
        v = values.get(key)
        if key in _ALWAYS_WRITTEN or (v not in (None, "", 0, False, []) and v is not None):
            out[key] = v
    return out


def _weights_blob(layer: Layer) -> tuple[bytes | memoryview, float]:
    from .. import dtypes

    store, dtype = layer.weights, layer.cfg.dtype
    # as Loom, serialising quantizes now if needed (may set the scale); float32 is the master
    native = store.master if dtype == "float32" else store.morph(dtype)
    return dtypes.wire(native, dtype), store.scale  # a view, where it can be: large layers are not copied


def dumps(net: VolumetricNetwork) -> str:
    """Pretty-printed persistence JSON with Go's formatting (2-space indent, shortest floats)."""
    return "".join(_go_json(network_to_dict(net), "")) + "\n"


def save_json(net: VolumetricNetwork, path: str | os.PathLike) -> None:
    """:func:`dumps` written a piece at a time: a large layer's text is never joined into the
    whole file's text in memory."""
    with replacing(path) as f:
        for piece in _go_json(network_to_dict(net), ""):
            f.write(piece.encode("utf-8"))
        f.write(b"\n")


def _go_json(v, indent: str) -> Iterator[str]:
    """The pieces of ``v``'s JSON text in Go's layout (``encoding/json.MarshalIndent``)."""
    inner = indent + "  "
    if isinstance(v, dict | list) and not v:
        yield "{}" if isinstance(v, dict) else "[]"
    elif isinstance(v, dict | list):
        yield "{\n" if isinstance(v, dict) else "[\n"
        items = v.items() if isinstance(v, dict) else ((None, x) for x in v)
        for i, (k, x) in enumerate(items):
            yield (",\n" if i else "") + inner + ("" if k is None else f"{json.dumps(k)}: ")
            yield from _go_json(x, inner)
        yield "\n" + indent + ("}" if isinstance(v, dict) else "]")
    elif isinstance(v, str) and v.isascii() and v.isprintable() and '"' not in v and "\\" not in v:
        yield from ('"', v, '"')  # what json.dumps writes, without copying a base64 blob's text
    elif isinstance(v, bool) or v is None or isinstance(v, str | int):
        yield json.dumps(v)
    else:
        yield _go_float(v)


def _go_float(v: float) -> str:
    """Go's encoding/json float text: shortest repr, integers without '.0', 'e-7' not 'e-07'."""
    f = float(v)
    if f.is_integer() and abs(f) < 1e21:
        return str(int(f))
    # float32 values (scale) print in their own shortest form: 0.00496063, not 0.004960630182...
    s = str(np.float32(f)) if float(np.float32(f)) == f else repr(f)
    if "e" in s:
        mantissa, exponent = s.split("e")
        s = f"{mantissa}e{int(exponent):+d}"
    return s
