"""Weight storage of one layer (spec §4): the float32 master, native versions per dtype, the scale.

A layer's parameters live in one flat float32 *master* vector laid out as Loom lays them out
(spec §3.5), plus ``scale`` (one float32 shared by all of the layer's parameters) and a cache of
*native* versions (the quantized values of each dtype the layer was morphed to). The forward pass
multiplies with the dequantized native version of the layer's dtype (spec §4.5).

Layers read their parameters through :meth:`WeightStore.values`, which hands out a cached copy
on the requested array module and dtype; any change of the master bumps ``version`` and drops
those copies and the native versions, as Loom clears its caches on a gradient update.

Training on a device keeps the master there: an optimizer updates :meth:`WeightStore.master_on`
in place, and from then on that device copy is the truth. ``master`` stays the host float32
vector everything else reads (morphing, saving, DNA, the GUI): reading it after a device update
copies the device master back first (:meth:`WeightStore.copy_master_to_host`, the one
device-to-host path of weights).
"""

from __future__ import annotations

import numpy as np

from . import dtypes, edits
from .backend import array_module, to_host
from .errors import LoomConfigError


def error_sums(reference: np.ndarray, values: np.ndarray) -> tuple[float, float, float, float]:
    """``(||r||², ||v||², ||v - r||², r·v)`` in float64: what :func:`error_from_sums` needs, summed
    part by part when a layer's weights are compared a matrix at a time."""
    from .stats_kernel import error_sums as sums  # compiled on first use: core imports quickly

    r = np.ascontiguousarray(reference, dtype=np.float32).ravel()
    v = np.ascontiguousarray(values, dtype=np.float32).ravel()
    return sums(r, v)


def error_from_sums(rr: float, vv: float, dd: float, rv: float) -> tuple[float, float]:
    """``(||v - r|| / ||r||, cosine)`` from :func:`error_sums` (an error of 1 when only ``r`` is
    zero, a cosine of 1 when both are)."""
    norm_r, norm_v = np.sqrt(rr), np.sqrt(vv)
    rel = float(np.sqrt(dd) / norm_r) if norm_r else float(norm_v != 0)
    if norm_r and norm_v:
        return rel, float(rv / (norm_r * norm_v))
    return rel, 1.0 if norm_r == norm_v else 0.0


def uniform_weights(n: int, rng: np.random.Generator, init_scale: float) -> np.ndarray:
    """``n`` float32 weights uniform in ``[-init_scale, init_scale)`` (Loom's build-schema
    initialisation): the values of drawing all ``n`` in float64 at once and rounding, drawn a
    chunk at a time so that no float64 vector of the whole layer is ever made."""
    out = np.empty(n, np.float32)
    for part in dtypes.chunks(n):
        out[part] = (rng.random(part.stop - part.start) * 2 - 1) * init_scale
    return out


# Upper ends of the unsigned types after training (spec §4.8), in units of the scale.
_UNSIGNED_MAX = {"uint8": 255, "uint4": 15, "uint2": 3, "uint16": 65535,
                 "uint32": 2 ** 20, "uint64": 2 ** 20}


class WeightStore:
    """Float32 master weights, their scale, native versions and cached compute copies."""

    # The master on a device, where an optimizer updates it (None: the host master is the only one),
    # and whether the host master is behind it. Class defaults, so a subclass that builds its
    # master otherwise (the language models' MatrixStore) starts without one.
    _device = None
    _host_stale = False

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        edits.bump()  # a compiled step built from these weights looks again (core.edits)

    def __init__(self, master, scale: float = 1.0):
        self.master = master
        self.scale = float(np.float32(scale))
        self.version = 0
        self.native: dict[str, np.ndarray] = {}
        self._compute: dict[tuple, tuple[int, object]] = {}

    def __len__(self) -> int:
        return self._master.size

    # ----- where the master lives ------------------------------------------------------------
    @property
    def master(self) -> np.ndarray:
        """The float32 master on the host; after an update on a device, copied back first."""
        if self._host_stale:
            self.copy_master_to_host()
        return self._master

    @master.setter
    def master(self, value) -> None:
        master = np.ascontiguousarray(value, dtype=np.float32)
        self._master = master if master.ndim == 1 else master.reshape(-1)  # ``master += v`` keeps it
        self._device, self._host_stale = None, False  # a new host master: a device copy is old

    def copy_master_to_host(self) -> None:
        """Copy the device master into the host one: a device-to-host transfer of the layer's
        weights, made only when something reads ``master`` after a device update."""
        self._master[...] = to_host(self._device)
        self._host_stale = False

    def master_on(self, xp):
        """The float32 master as an array of ``xp``, for an optimizer to update in place.

        numpy: the host master itself (a device copy, if any, is brought home and dropped).
        Another namespace: a copy on its device, uploaded on first use and kept there; it is the
        truth from now on, so the host master is marked behind it.
        """
        if xp is np:
            self._use_host_master()
            return self._master
        if self._device is None or array_module(self._device) is not xp:
            # astype copies: asarray may share the host buffer (array_api_strict) or lack copy= (CuPy)
            self._device = xp.astype(xp.asarray(self.master), xp.float32, copy=True)
        self._host_stale = True
        return self._device

    @property
    def on_device(self) -> bool:
        """Whether the master is kept on a device (see :meth:`master_on`)."""
        return self._device is not None

    # ----- morphing (spec §4.1) ----------------------------------------------------------
    def morph(self, dtype: str) -> np.ndarray | None:
        """Make (or reuse) the native version for ``dtype``; returns it (None for float32).

        Loom's rules: float32 is the master itself; a cached version is never re-quantized;
        the scale is chosen automatically only while it is exactly 1.0 (the first morph).
        """
        dtype = dtypes.get_format(dtype).name
        if dtype == "float32":
            return None
        if dtype not in self.native:
            if self.scale == 1.0 and self.master.size:
                self.scale = dtypes.auto_scale(self.master, dtype)
            self.native[dtype] = dtypes.quantize(self.master, dtype, self.scale)
            self._compute.clear()
        return self.native[dtype]

    def dequantized(self, dtype: str) -> np.ndarray:
        """The float32 weights the forward pass uses for a layer of ``dtype`` (spec §4.3)."""
        native = self.morph(dtype)
        if native is None:
            return self.master
        out = dtypes.dequantize(native, dtype, self._forward_scale(dtype))
        return out[: self.master.size]

    def _forward_scale(self, dtype: str) -> float:
        # welvet 0.80.0 multiplies native int8 (and fp4) by 1 when the stored scale is 0 (§0.3, §4.3)
        return 1.0 if self.scale == 0 and dtype in ("int8", "fp4") else self.scale

    def nbytes(self, dtype: str) -> int:
        return dtypes.packed_nbytes(self.master.size, dtype)

    def targets(self) -> tuple[str, ...]:
        """What the layer can morph to (:meth:`morph_to`): here Loom's dtypes."""
        return tuple(dtypes.FORMATS)

    def refusal(self, target: str) -> str:
        """Why the weights cannot morph to ``target`` ("" when they can): here, a name that is
        none of Loom's dtypes (any of their spellings)."""
        try:
            dtypes.get_format(target)
        except LoomConfigError as e:
            return str(e)
        return ""

    def morph_to(self, target: str) -> str:
        """Morph to ``target`` (one of :meth:`targets`); returns the dtype the layer then has."""
        self.morph(target)
        return dtypes.get_format(target).name

    def error(self, layer_dtype: str) -> tuple[float, float]:
        """How far the weights forward reads are from the master: ``(||w - master|| / ||master||,
        cosine)`` (0 and 1 for float32, which is the master)."""
        if layer_dtype == "float32":
            return 0.0, 1.0
        native, scale, master = self.morph(layer_dtype), self._forward_scale(layer_dtype), self.master
        sums = np.zeros(4)
        for part in dtypes.chunks(master.size):  # no float32 copy of the whole layer
            sums += error_sums(master[part], dtypes.dequantize(native[part], layer_dtype, scale))
        return error_from_sums(*sums)

    # ----- access for computation --------------------------------------------------------
    def values(self, xp, dtype, layer_dtype: str = "float32") -> object:
        """The parameters as the forward pass uses them, on ``xp`` in ``dtype``."""
        key = (xp.__name__, np.dtype(dtype).str, layer_dtype)
        hit = self._compute.get(key)
        if hit is not None and hit[0] == self.version:
            return hit[1]
        if layer_dtype == "float32" and self._device is not None and array_module(self._device) is xp:
            arr = xp.astype(self._device, getattr(xp, np.dtype(dtype).name), copy=False)  # stays there
        else:
            arr = xp.asarray(self.dequantized(layer_dtype).astype(dtype, copy=False))
        self._compute[key] = (self.version, arr)
        return arr

    def tensor_sizes(self) -> dict[int, int]:
        """``{identity: elements}`` of the tensors held: here one of its own. A store whose
        tensors another layer shares (a tied LM head) names them, so shared ones count once."""
        return {id(self): len(self)}

    # ----- what views show ---------------------------------------------------------------
    def encodings(self, layer_dtype: str) -> dict[str, str]:
        """How each named part of the weights is stored as the forward pass reads it: here one
        flat vector in the layer's dtype (a morph changes it)."""
        return {"weights": layer_dtype}

    def encoding(self, layer_dtype: str) -> str:
        """The layer's encoding in one word, as tables show it: here its dtype."""
        return layer_dtype

    def block_encodings(self, layer_dtype: str) -> dict[str, str] | None:
        """Each matrix's GGUF block encoding as forward reads it, or None when it reads a Loom
        dtype: always here (a language model's store, which reads a file's blocks, says more)."""
        return None

    def stored(self, layer_dtype: str) -> dict[tuple, tuple[str, int]]:
        """``{identity: (encoding, bytes)}`` of what forward reads; identities let a network count
        tensors two layers share (a tied LM head) once."""
        return {(id(self), layer_dtype): (layer_dtype, self.nbytes(layer_dtype))}

    def sample(self, limit: int, rng: np.random.Generator) -> np.ndarray:
        """Up to ``limit`` master weights (all of them when there are fewer), float32, in layout
        order, drawn without replacement by ``rng``."""
        if len(self) <= limit:
            return self.master.copy()
        return self.master[np.sort(rng.choice(len(self), limit, replace=False))]

    # ----- updates -----------------------------------------------------------------------
    def touch(self) -> None:
        """Record that the host master changed in place: drop native versions, compute copies
        and the device master (the next device update uploads the host one again)."""
        self._use_host_master()
        self._changed()

    def _changed(self) -> None:
        self.version += 1
        self._compute.clear()
        self.native.clear()

    def _use_host_master(self) -> None:
        """Make the host master the only one; a device update is copied home first."""
        if self._host_stale:
            self.copy_master_to_host()
        self._device = None

    def after_update(self, dtype: str) -> None:
        """After an optimizer updated the master (on the host, or in place on
        :meth:`master_on`'s device): drop what was derived from it. For a non-float32 layer, Loom's
        step (spec §4.8): clamp the master of unsigned types to ``[0, scale*max]`` and re-morph
        with the existing scale; quantizing is host code, so such a layer's master comes home."""
        # marked again after the update: a reader between master_on and now saw it half done
        self._host_stale = self._device is not None
        self._changed()
        if dtype == "float32":
            return
        self._use_host_master()
        top = _UNSIGNED_MAX.get(dtype)
        if top is not None:
            np.clip(self.master, 0, np.float32(self.scale * top), out=self.master)
        self.native[dtype] = dtypes.quantize(self.master, dtype, self.scale)

    def copy(self) -> WeightStore:
        clone = WeightStore(self.master.copy(), self.scale)
        clone.native = {k: v.copy() for k, v in self.native.items()}
        return clone


class LoomShapedWeights(WeightStore):
    """The weights of a layer NEAT re-initialised as a CNN1 or ConvTransposed1D: Loom gives it
    F·C·k² weights (a 2-D kernel its 1-D layer cannot use), ours runs on F·C·k. ``master`` holds
    the first F·C·k of Loom's values, which the layer runs on, saves and splices; ``loom_rest``
    the others, so that a later mutation draws one perturbation per Loom weight, in Loom's order
    (spec §7.4). Copies (a clone, a splice's child) and checkpoints keep them; Loom JSON does not
    (docs/compat.md)."""

    def __init__(self, master, loom_rest, scale: float = 1.0):
        super().__init__(master, scale)
        self.loom_rest = np.ascontiguousarray(loom_rest, dtype=np.float32).reshape(-1)

    def copy(self) -> LoomShapedWeights:
        clone = LoomShapedWeights(self.master.copy(), self.loom_rest.copy(), self.scale)
        clone.native = {k: v.copy() for k, v in self.native.items()}
        return clone
