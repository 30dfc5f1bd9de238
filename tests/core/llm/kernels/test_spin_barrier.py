"""The spinning barrier of core/llm/kernels/spin_barrier.py: its counters' layout, that threads meeting at
it see each other's writes (the oracle: what the other thread wrote before the meeting), and that
an abandoned region makes every meeting return False."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import get_thread_id, njit, prange

from loomlab.core.llm.kernels.spin_barrier import PAD, abort, counters, meet

ROUNDS = 2000


@njit(parallel=True)
def _exchange(flags, board, seen, rounds):
    """Two threads, ``rounds`` times: each writes its round's value, meets, reads the other's,
    meets again (so neither writes the next round's value before the other has read this one)."""
    for tid in prange(2):
        if get_thread_id() != tid:  # both iterations on one thread would wait for each other
            abort(flags, 2)
        else:
            for r in range(rounds):
                board[tid * 8] = 10 * r + tid  # each value on its own cache line too
                if not meet(flags, tid, 2, 2 * r + 1):
                    break
                seen[tid, r] = board[(1 - tid) * 8]
                if not meet(flags, tid, 2, 2 * r + 2):
                    break


@njit
def _meet(flags, tid, threads, epoch):
    return meet(flags, tid, threads, epoch)


@njit
def _abort(flags, threads):
    abort(flags, threads)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                    reason="needs a numba thread team of 2 (one core here)")
def test_two_threads_meeting_see_each_others_writes():
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        flags = counters(2)
        board = np.full(16, -1, np.int64)
        seen = np.full((2, ROUNDS), -1, np.int64)
        _exchange(flags, board, seen, ROUNDS)
    finally:
        numba.set_num_threads(before)
    assert flags[2 * PAD] == 0, "the region was abandoned (a thread ran the other's iteration or waited ~1 s)"
    rounds = 10 * np.arange(ROUNDS)
    assert np.array_equal(seen[0], rounds + 1)  # thread 0 read thread 1's value of the same round
    assert np.array_equal(seen[1], rounds)
    assert flags[0] == flags[PAD] == 2 * ROUNDS  # each counter holds its thread's last meeting


def test_counters_are_one_cache_line_per_thread_and_the_abort_flag():
    flags = counters(3)
    assert flags.dtype == np.int64 and flags.shape == (4 * PAD,) and not flags.any()
    assert PAD * flags.itemsize == 64  # one x86 cache line per counter
    flags[1 * PAD] = flags[2 * PAD] = 5  # the others already at meeting 5
    assert _meet(flags, 0, 3, 5)
    assert flags[0] == 5 and np.count_nonzero(flags) == 3  # only its own counter written
    _abort(flags, 3)
    assert flags[3 * PAD] == 1 and np.count_nonzero(flags) == 4


def test_abort_makes_meet_return_false():
    flags = counters(2)
    flags[PAD] = 1  # the other thread has arrived: the meeting would succeed
    _abort(flags, 2)
    assert not _meet(flags, 0, 2, 1)  # but the region was abandoned
    flags = counters(2)
    _abort(flags, 2)
    assert not _meet(flags, 0, 2, 1)  # and a thread waiting for one that never comes gets out at once


def test_a_wait_for_a_thread_that_never_comes_gives_up():
    """No abort raised: the waiting thread gives up after its spin limit (about a second) and
    raises the flag itself, so the others get out too."""
    flags = counters(2)
    assert not _meet(flags, 0, 2, 1)
    assert flags[2 * PAD] == 1 and flags[0] == 1
