"""Loom's 21 numeric weight formats: auto-scale, quantize, dequantize and the wire packing.

Spec §1.3 (names), §3.1/§3.4 (bytes inside ``weights``), §4.1 (auto-scale), §4.2 (quantization),
§4.3 (dequantization) and §4.4 (Loom's own truncating small-float converters).

A format maps the float32 master to *native* values, one element per weight, stored the way Loom
keeps them in memory: float64, uint16 bit patterns (float16/bfloat16), uint8 codes (fp8/fp4), the
integer of the type, and one byte per weight for every integer type of 8 bits or less (int8 for
the signed ones, uint8 for the unsigned). Packing to sub-byte widths happens only on the wire.

Each format is one class, registered in :data:`FORMATS` by declaring its ``name``; it implements
``encode`` / ``decode`` only. Argument checks, the float32 division by ``scale`` and the packing
live once in :class:`NumericFormat`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import ml_dtypes
import numpy as np

from .enums import DTYPE_BITS, DTYPES, dtype_nbytes, lookup
from .errors import LoomConfigError

FORMATS: dict[str, NumericFormat] = {}
# Elements converted at a time: the float64 temporaries of rounding stay in the CPU's caches
# however large the layer (half a MB each; a whole 2^28-weight layer at once took over 6 GB).
CHUNK = 1 << 16


def chunks(n: int) -> Iterator[slice]:
    """Slices covering ``range(n)``, :data:`CHUNK` elements each (the last one shorter)."""
    return (slice(start, min(start + CHUNK, n)) for start in range(0, n, CHUNK))


def go_round(x: np.ndarray) -> np.ndarray:
    """Go's ``math.Round`` (half away from zero) of float32 values, as float64.

    Adding 0.5 in float64 is exact for every float32 input; in float32 it would round
    0.49999997 up to 1.
    """
    x = np.asarray(x, np.float64)
    return np.copysign(np.floor(np.abs(x) + 0.5), x)


def _go_to_int(r: np.ndarray, native: np.dtype) -> np.ndarray:
    """Go's float64 -> integer conversion as compiled for amd64.

    Go converts to types of 32 bits or less through int32 (uint32 through int64) with
    CVTTSD2SI, whose result for NaN, +-Inf and out-of-range values is 0x80..0; the target then
    keeps the low bits. So int8 wraps (130 -> -126) and NaN / Inf (scale 0) become 0 (spec V4).
    """
    via = 32 if native.itemsize < 4 or native == np.int32 else 64
    lo = -(2.0 ** (via - 1))
    in_range = (r >= lo) & (r < -lo)  # False for NaN
    return np.where(in_range, r, lo).astype(np.int64).astype(native)


def _truncating_encode(x: np.ndarray, exp_bits: int, mant_bits: int, saturate: bool) -> np.ndarray:
    """Loom's float32 -> small float by exponent rebias and mantissa truncation (spec §4.4).

    No rounding and no subnormals: a rebiased exponent <= 0 gives a signed zero, one at the top
    gives Inf (or, with ``saturate``, the largest code). NaN counts as overflow.
    """
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.int64)
    bias = (1 << (exp_bits - 1)) - 1
    top = (1 << exp_bits) - 1
    exp = ((bits >> 23) & 0xFF) - 127 + bias
    finite = (exp << mant_bits) | ((bits & 0x7FFFFF) >> (23 - mant_bits))
    overflow = (1 << (exp_bits + mant_bits)) - 1 if saturate else top << mant_bits
    magnitude = np.where(exp <= 0, 0, np.where(exp >= top, overflow, finite))
    return ((bits >> 31) << (exp_bits + mant_bits)) | magnitude


def _fp8_decode_table(exp_bits: int, mant_bits: int, zero_exp_factor: float,
                      ieee_top: bool) -> np.ndarray:
    """Value of each of the 256 codes under Loom's fp8 decoder (spec §4.4).

    Loom's decoders are not the OCP/IEEE ones that ml_dtypes implements: e4m3 has no NaN (code
    0x7F is 480, ml_dtypes' e4m3fn says NaN / max 448) and both treat exponent 0 as a normal
    number (e4m3 with an extra factor ``zero_exp_factor``), not as a subnormal.
    """
    codes = np.arange(256)
    bias = (1 << (exp_bits - 1)) - 1
    top = (1 << exp_bits) - 1
    exp = (codes >> mant_bits) & top
    mant = codes & ((1 << mant_bits) - 1)
    value = np.ldexp(1.0 + mant / (1 << mant_bits), exp - bias)
    value = np.where(exp == 0, value * zero_exp_factor, value)
    value = np.where((exp == 0) & (mant == 0), 0.0, value)
    if ieee_top:
        value = np.where(exp == top, np.where(mant == 0, np.inf, np.nan), value)
    return np.where(codes >> 7, -value, value).astype(np.float32)


class NumericFormat:
    """One of Loom's weight formats. Subclasses declare ``name`` and ``native`` to register."""

    name: ClassVar[str]
    native: ClassVar[np.dtype]
    bits: ClassVar[int]  # storage width on the wire, from enums.DTYPE_BITS
    auto_div: ClassVar[int] = 127  # auto-scale = maxAbs / auto_div (spec §4.1)
    scaled: ClassVar[bool] = True  # False: encode sees the raw master, not master / scale

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            cls.native = np.dtype(cls.native)
            cls.bits = DTYPE_BITS[cls.name]
            FORMATS[cls.name] = cls()

    # --- what a format implements -------------------------------------------------------
    def encode(self, x: np.ndarray) -> np.ndarray:
        """Native values of ``x`` (float32: master / scale, or the master if not ``scaled``)."""
        raise NotImplementedError

    def decode(self, q: np.ndarray, scale: np.float32) -> np.ndarray:
        """float32 weights of native values ``q``; default ``f32(float32(q) * scale)``."""
        return q.astype(np.float32) * scale

    def choose_scale(self, w: np.ndarray) -> float:
        """Auto-scale of a non-empty flat master: ``f32(maxAbs / auto_div)``, 1.0 if all zero."""
        max_abs = np.float32(0)
        for part in chunks(w.size):
            a = np.abs(w[part])
            # Loom's `if a > maxAbs` loop never picks NaN; an all-NaN master counts as all zero.
            max_abs = max(max_abs, a.max(initial=np.float32(0), where=~np.isnan(a)))
        return 1.0 if max_abs == 0 else float(max_abs / np.float32(self.auto_div))

    # --- shared machinery ---------------------------------------------------------------
    def auto_scale(self, master: np.ndarray) -> float:
        w = np.asarray(master, np.float32).reshape(-1)
        return 1.0 if w.size == 0 else self.choose_scale(w)

    def quantize(self, master: np.ndarray, scale: float) -> np.ndarray:
        w = np.asarray(master, np.float32)
        flat = w.reshape(-1)
        out = np.empty(flat.size, self.native)
        # Scale 0 (a missing JSON key) divides to +-Inf / NaN, which every encoder handles.
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for part in chunks(flat.size):
                x = flat[part]
                out[part] = self.encode(x / np.float32(scale) if self.scaled else x)
        return out.reshape(w.shape)

    def dequantize(self, native: np.ndarray, scale: float) -> np.ndarray:
        q = self._as_native(native)
        flat = q.reshape(-1)
        out = np.empty(flat.size, np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            for part in chunks(flat.size):
                out[part] = self.decode(flat[part], np.float32(scale))
        return out.reshape(q.shape)

    def pack(self, native: np.ndarray) -> bytes:
        blob = self.wire(native)
        return blob if isinstance(blob, bytes) else blob.tobytes()

    def wire(self, native: np.ndarray) -> bytes | memoryview:
        """:meth:`pack`'s bytes, as a view of the native values themselves where their memory is
        the wire layout (8 bits or more, little-endian): saving a large layer does not copy it."""
        q = self._as_native(native).ravel()
        if self.bits >= 8:
            return memoryview(q.astype(self.native.newbyteorder("<"), copy=False)).cast("B")
        per_byte, shifts = self._field_shifts()
        fields = self.to_fields(q)
        fields = np.concatenate([fields, np.zeros(-fields.size % per_byte, np.uint8)])
        return np.bitwise_or.reduce(fields.reshape(-1, per_byte) << shifts, axis=1).tobytes()

    def unpack(self, blob: bytes) -> np.ndarray:
        if self.bits >= 8:
            size = self.bits // 8
            if len(blob) % size:
                raise ValueError(f"{self.name} blob of {len(blob)} bytes is not a whole number "
                                 f"of {size}-byte elements")
            return np.frombuffer(blob, self.native.newbyteorder("<")).astype(self.native)
        _, shifts = self._field_shifts()
        raw = np.frombuffer(blob, np.uint8)
        fields = (raw[:, None] >> shifts) & np.uint8((1 << self.bits) - 1)
        return self.from_fields(fields.ravel())

    def to_fields(self, q: np.ndarray) -> np.ndarray:
        """Sub-byte wire field of each native value: its low bits (spec §3.4)."""
        return q.astype(np.uint8) & np.uint8((1 << self.bits) - 1)

    def from_fields(self, fields: np.ndarray) -> np.ndarray:
        """Native values of sub-byte fields; signed types sign-extend (``10`` -> -2)."""
        if self.native.kind == "u":
            return fields.astype(self.native)
        half = 1 << (self.bits - 1)
        signed = fields.astype(np.int8)
        return np.where(signed >= half, signed - 2 * half, signed).astype(self.native)

    def _field_shifts(self) -> tuple[int, np.ndarray]:
        # Element j of a byte sits at shift 8 - bits*(j+1): the first element in the high bits.
        per_byte = 8 // self.bits
        return per_byte, (8 - self.bits * np.arange(1, per_byte + 1)).astype(np.uint8)

    def _as_native(self, native: np.ndarray) -> np.ndarray:
        arr = np.asarray(native)
        if arr.dtype.kind not in "fiub" or (arr.dtype.kind == "f") != (self.native.kind == "f"):
            raise TypeError(f"{self.name} native values are {self.native}, got {arr.dtype}")
        return arr.astype(self.native, copy=False)


# --- floats ---------------------------------------------------------------------------------

class Float64(NumericFormat):
    name, native, scaled = "float64", np.float64, False

    def encode(self, x: np.ndarray) -> np.ndarray:
        return x.astype(np.float64)

    def decode(self, q: np.ndarray, scale: np.float32) -> np.ndarray:
        return q.astype(np.float32)


class Float32(NumericFormat):
    name, native, scaled = "float32", np.float32, False

    def encode(self, x: np.ndarray) -> np.ndarray:
        return x.copy()

    def decode(self, q: np.ndarray, scale: np.float32) -> np.ndarray:
        return q.copy()

    def choose_scale(self, w: np.ndarray) -> float:
        return 1.0  # morphing to float32 leaves the scale alone (spec §4.1 step 1)


class Float16(NumericFormat):
    name, native, scaled = "float16", np.uint16, False

    def encode(self, x: np.ndarray) -> np.ndarray:
        # Loom truncates (0.3 -> 0x34cc); numpy / ml_dtypes would round to nearest (0x34cd).
        return _truncating_encode(x, 5, 10, saturate=False).astype(np.uint16)

    def decode(self, q: np.ndarray, scale: np.float32) -> np.ndarray:
        return q.view(np.float16).astype(np.float32)  # Loom decodes standard IEEE half


class BFloat16(NumericFormat):
    name, native, scaled = "bfloat16", np.uint16, False

    def encode(self, x: np.ndarray) -> np.ndarray:
        # Loom keeps the upper 16 bits (truncation); ml_dtypes' cast would round to nearest.
        return (np.ascontiguousarray(x).view(np.uint32) >> 16).astype(np.uint16)

    def decode(self, q: np.ndarray, scale: np.float32) -> np.ndarray:
        return q.view(ml_dtypes.bfloat16).astype(np.float32)  # exact: code << 16


class FP8E4M3(NumericFormat):
    name, native = "fp8e4m3", np.uint8
    table = _fp8_decode_table(4, 3, zero_exp_factor=0.125, ieee_top=False)

    def encode(self, x: np.ndarray) -> np.ndarray:
        return _truncating_encode(x, 4, 3, saturate=True).astype(np.uint8)

    def decode(self, q: np.ndarray, scale: np.float32) -> np.ndarray:
        return self.table[q] * scale


class FP8E5M2(NumericFormat):
    name, native = "fp8e5m2", np.uint8
    table = _fp8_decode_table(5, 2, zero_exp_factor=1.0, ieee_top=True)

    def encode(self, x: np.ndarray) -> np.ndarray:
        return _truncating_encode(x, 5, 2, saturate=False).astype(np.uint8)

    def decode(self, q: np.ndarray, scale: np.float32) -> np.ndarray:
        return self.table[q] * scale


# Loom's non-standard fp4 table (spec §4.2), not OCP e2m1: ml_dtypes' float4_e2m1fn differs.
FP4_VALUES = np.array([0, 0.75, 1, 1.5, 2, 3, np.inf, np.nan,
                       -0.0, -0.75, -1, -1.5, -2, -3, -np.inf, np.nan], np.float32)
FP4_SEARCH = (0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13)


class FP4(NumericFormat):
    name, native, auto_div = "fp4", np.uint8, 3

    def encode(self, x: np.ndarray) -> np.ndarray:
        # Loom's search: first code with a strictly smaller float32 distance wins, so ties go to
        # the earlier code (0.375 -> 0, and -0 is never chosen); NaN / Inf stay at code 0.
        best = np.zeros(x.shape, np.uint8)
        best_dist = np.full(x.shape, np.inf, np.float32)
        for code in FP4_SEARCH:
            dist = np.abs(x - FP4_VALUES[code])
            closer = dist < best_dist
            best[closer] = code
            best_dist = np.where(closer, dist, best_dist)
        return best

    def decode(self, q: np.ndarray, scale: np.float32) -> np.ndarray:
        return FP4_VALUES[q & 0xF] * (scale if scale != 0 else np.float32(1))


# --- integers -------------------------------------------------------------------------------

class IntegerFormat(NumericFormat):
    """``GoRound(x)``, optionally mirrored (abs) and clamped, converted like Go on amd64."""

    clamp: ClassVar[tuple[int, int] | None] = None
    mirror: ClassVar[bool] = False  # uint16/32/64 store abs(GoRound(x)): negatives mirrored

    def encode(self, x: np.ndarray) -> np.ndarray:
        r = go_round(x)
        if self.mirror:
            r = np.abs(r)
        if self.clamp is not None:
            r = np.clip(r, *self.clamp)  # NaN passes through and converts to 0
        return _go_to_int(r, self.native)


class Int64(IntegerFormat):
    name, native = "int64", np.int64


class Int32(IntegerFormat):
    name, native = "int32", np.int32


class Int16(IntegerFormat):
    name, native = "int16", np.int16


class Int8(IntegerFormat):
    name, native = "int8", np.int8  # no clamp: wraps (0.3 / 0.002 = 150 -> -106)


class UInt64(IntegerFormat):
    name, native, mirror = "uint64", np.uint64, True


class UInt32(IntegerFormat):
    name, native, mirror = "uint32", np.uint32, True


class UInt16(IntegerFormat):
    name, native, mirror = "uint16", np.uint16, True


class UInt8(IntegerFormat):
    name, native, clamp = "uint8", np.uint8, (0, 255)


class Int4(IntegerFormat):
    name, native, clamp, auto_div = "int4", np.int8, (-8, 7), 7


class UInt4(IntegerFormat):
    name, native, clamp, auto_div = "uint4", np.uint8, (0, 15), 7


class Int2(IntegerFormat):
    name, native, clamp, auto_div = "int2", np.int8, (-2, 1), 1


class UInt2(IntegerFormat):
    name, native, clamp, auto_div = "uint2", np.uint8, (0, 3), 1


class Ternary(IntegerFormat):
    name, native, clamp, auto_div = "ternary", np.int8, (-1, 1), 1


class Binary(NumericFormat):
    name, native, scaled = "binary", np.int8, False

    def encode(self, x: np.ndarray) -> np.ndarray:
        return np.where(x >= 0, 1, -1).astype(np.int8)  # sign of the master; NaN -> -1

    def choose_scale(self, w: np.ndarray) -> float:
        # mean |w|: Go's sequential float64 sum (cumsum, not numpy's pairwise sum), / n in float32;
        # each chunk's cumsum starts from the sum so far, so the additions are Go's, in order
        total = 0.0
        for part in chunks(w.size):
            a = np.abs(w[part]).astype(np.float64)
            a[0] += total
            total = np.cumsum(a)[-1]
        mean = np.float32(total) / np.float32(w.size)
        return 1.0 if mean == 0 else float(mean)

    def to_fields(self, q: np.ndarray) -> np.ndarray:
        return (q > 0).astype(np.uint8)

    def from_fields(self, fields: np.ndarray) -> np.ndarray:
        return np.where(fields == 1, 1, -1).astype(np.int8)  # padding bits decode to -1


# --- public API -----------------------------------------------------------------------------

def get_format(dtype: str) -> NumericFormat:
    """The format of a dtype spelling (any of Loom's aliases, case-insensitive)."""
    entry = lookup(DTYPES, dtype)
    if entry is None:
        raise LoomConfigError(f"unknown dtype {dtype!r}; expected one of {sorted(FORMATS)}")
    return FORMATS[entry.name]


def auto_scale(master: np.ndarray, dtype: str) -> float:
    """The scale Loom's morph sets when the layer's scale is still 1.0 (spec §4.1 step 3).

    1.0 for float32 (morphing to it leaves the scale alone) and for an empty master.
    """
    return get_format(dtype).auto_scale(master)


def quantize(master: np.ndarray, dtype: str, scale: float) -> np.ndarray:
    """Native values of the float32 ``master`` in ``dtype`` (spec §4.2), shape preserved."""
    return get_format(dtype).quantize(master, scale)


def dequantize(native: np.ndarray, dtype: str, scale: float) -> np.ndarray:
    """float32 weights the forward pass uses (spec §4.3); ``scale`` is taken as given."""
    return get_format(dtype).dequantize(native, scale)


def pack(native: np.ndarray, dtype: str) -> bytes:
    """Wire bytes of native values (spec §3.1), flattened in C order."""
    return get_format(dtype).pack(native)


def wire(native: np.ndarray, dtype: str) -> bytes | memoryview:
    """:func:`pack`'s bytes without a copy where the native values' memory is already them."""
    return get_format(dtype).wire(native)


def unpack(blob: bytes, dtype: str) -> np.ndarray:
    """Native values of wire bytes (spec §3.1); sub-byte types decode every field of every byte,
    so the result may end with padding elements (0, or -1 for binary).

    Raises ValueError when ``blob`` is not a whole number of elements of a byte-aligned type.
    """
    return get_format(dtype).unpack(blob)


def packed_nbytes(n: int, dtype: str) -> int:
    """Wire size of ``n`` weights of ``dtype``."""
    return dtype_nbytes(get_format(dtype).name, n)
