"""Go's ``math/rand`` (the legacy source behind ``rand.New(rand.NewSource(seed))``), bit for bit.

Loom draws every random number of splicing and NEAT evolution from it (spec §7.1), so the same
seed gives the same children only with the same generator. The source is an additive lagged
Fibonacci generator over 64-bit words, ``x[n] = x[n-607] + x[n-273] (mod 2**64)``, whose 607-word
register is seeded through the Park-Miller step XOR the cooked table; ``Int63`` is the low 63
bits of each word. Written as that recurrence (not as Go's ring of ``tap``/``feed`` indices, which
computes the same sequence) so that 273 words at a time come from one vectorised addition: NEAT
perturbs every weight of a layer with its own draw.

The methods keep Go's names in snake_case and its exact algorithms (``Float64`` retries a 1.0,
``Int31n`` rejects above the largest multiple of ``n``), so a port reads like the original.
"""

from __future__ import annotations

import numpy as np

from ...errors import LoomConfigError
from ._go_cooked import RNG_COOKED

LEN, TAP = 607, 273  # the lags
LAG_GAP = LEN - TAP  # words between x[n-607] and x[n-273] in the history
MASK63 = (1 << 63) - 1
INT32_MAX = (1 << 31) - 1
SEED_ZERO = 89482311  # Go replaces a seed of 0 (mod 2**31-1) by this
_A = 48271  # the Park-Miller "minimal standard" multiplier Go seeds with
_TWO63 = float(1 << 63)


def _seed_powers() -> np.ndarray:
    """``48271**k mod (2**31 - 1)`` for k = 1 .. 20 + 3 * 607: Go's seeding takes that many
    Park-Miller steps, and the k-th step's value is the seed times the k-th power (mod 2**31-1)."""
    powers, p = np.empty(20 + 3 * LEN, np.int64), 1
    for k in range(powers.size):
        p = p * _A % INT32_MAX
        powers[k] = p
    return powers


_POWERS = _seed_powers()
_COOKED = np.array([c & 0xFFFF_FFFF_FFFF_FFFF for c in RNG_COOKED], dtype=np.uint64)
# Go's k-th draw adds register[607 - k] into register[334 - k] (indices walking down, mod 607), so
# as a sequence x[-606..0], oldest first, the history is the register read downwards from 333
_HISTORY_ORDER = np.array([(LAG_GAP - 1 - i) % LEN for i in range(LEN)])


class GoRand:
    """``rand.New(rand.NewSource(seed))``: the same numbers, in the same order, as Go gives."""

    def __init__(self, seed: int):
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
            raise LoomConfigError(f"a Go random seed is an integer, got {seed!r}")
        seed = int(seed)
        if not -(1 << 63) <= seed < 1 << 63:
            raise LoomConfigError(f"a Go random seed is an int64, got {seed}")
        seed %= INT32_MAX  # Python's modulo is already non-negative, as Go's adjusted one
        # Go's Seed: 20 Park-Miller steps thrown away, then per register word three steps x1, x2,
        # x3 giving x1 << 40 ^ x2 << 20 ^ x3 ^ cooked. All steps at once: the seed (< 2**31) times
        # each power (< 2**31) fits an int64. (A loop of 1,841 steps took 0.8 ms per generator,
        # and NEAT makes one per child.)
        steps = (np.int64(seed or SEED_ZERO) * _POWERS) % INT32_MAX
        x = steps[20:].reshape(LEN, 3).astype(np.uint64)
        register = (x[:, 0] << np.uint64(40)) ^ (x[:, 1] << np.uint64(20)) ^ x[:, 2] ^ _COOKED
        self._history = register[_HISTORY_ORDER]
        self._pending = np.empty(0, dtype=np.uint64)  # words made but not yet handed out

    # ----- state, for checkpoints ---------------------------------------------------------------
    def state(self) -> bytes:
        """The generator's whole state: :meth:`from_state` continues exactly where this is."""
        return np.concatenate([self._history, self._pending]).astype("<u8").tobytes()

    @classmethod
    def from_state(cls, data: bytes) -> GoRand:
        words = np.frombuffer(data, dtype="<u8") if len(data) % 8 == 0 else np.empty(0, "<u8")
        if words.size < LEN:
            raise LoomConfigError(f"not a Go random state ({len(data)} bytes)")
        out = cls.__new__(cls)
        out._history = words[:LEN].astype(np.uint64)
        out._pending = words[LEN:].astype(np.uint64)
        return out

    # ----- the source ------------------------------------------------------------------------
    def _next_block(self) -> None:
        h = self._history
        with np.errstate(over="ignore"):
            block = h[:TAP] + h[LAG_GAP:]  # x[n+j] = x[n+j-607] + x[n+j-273], j = 1..273
        self._history = np.concatenate([h[TAP:], block])
        self._pending = np.concatenate([self._pending, block])

    def _fill(self, n: int) -> None:
        while self._pending.size < n:
            self._next_block()

    def _words(self, n: int) -> np.ndarray:
        self._fill(n)
        out, self._pending = self._pending[:n], self._pending[n:]
        return out

    def int63(self) -> int:
        return int(self._words(1)[0]) & MASK63

    def int63_array(self, n: int) -> np.ndarray:
        """The next ``n`` values of ``Int63`` (int64)."""
        return (self._words(n) & np.uint64(MASK63)).astype(np.int64)

    # ----- Rand's methods ----------------------------------------------------------------------
    def int31(self) -> int:
        return self.int63() >> 32

    def int63n(self, n: int) -> int:
        return self._below(n, self.int63, MASK63)

    def int31n(self, n: int) -> int:
        return self._below(n, self.int31, INT32_MAX)

    @staticmethod
    def _below(n: int, draw, top: int) -> int:
        """Go's ``Int31n``/``Int63n``: a mask for a power of two, else draws above the largest
        multiple of ``n`` that fits are rejected, then the draw modulo ``n``."""
        if n <= 0:
            raise LoomConfigError(f"a bounded draw needs n > 0, got {n}")
        if n & (n - 1) == 0:
            return draw() & (n - 1)
        limit = top - (top + 1) % n
        v = draw()
        while v > limit:
            v = draw()
        return v % n

    def intn(self, n: int) -> int:
        if n <= 0:
            raise LoomConfigError(f"Intn needs n > 0, got {n}")
        return self.int31n(n) if n <= INT32_MAX else self.int63n(n)

    def float64(self) -> float:
        while True:
            f = self.int63() / _TWO63  # int -> float rounds to nearest even, as Go's conversion
            if f != 1.0:
                return f

    def float32(self) -> np.float32:
        while True:
            f = np.float32(self.float64())
            if f != np.float32(1.0):
                return f

    def float32_array(self, n: int) -> np.ndarray:
        """The next ``n`` values of ``Float32``, drawn as ``n`` calls would draw them."""
        out = np.empty(n, dtype=np.float32)
        done = 0
        while done < n:
            self._fill(n - done)
            words = self._pending[:n - done] & np.uint64(MASK63)
            f = (words.astype(np.float64) / _TWO63).astype(np.float32)
            bad = np.flatnonzero(f == np.float32(1.0))  # Go draws again: about 1 in 2**25
            take = f.size if bad.size == 0 else int(bad[0])
            out[done:done + take] = f[:take]
            self._words(take + (bad.size > 0))  # a rejected word is used up too
            done += take
        return out
