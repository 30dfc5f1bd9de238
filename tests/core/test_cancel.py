"""The one cancel adapter every cancellable engine call uses (train, tween_train, TextModel)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from loomlab.core import LoomConfigError, VolumetricNetwork, make_layer
from loomlab.core.cancel import as_cancel_check
from loomlab.core.targetprop import tween_train
from loomlab.core.train import TrainConfig, train


class ProcessEvent:
    """Stands for multiprocessing.Event: not a threading.Event, but it has is_set()."""

    def __init__(self):
        self.flag = False

    def set(self) -> None:
        self.flag = True

    def is_set(self) -> bool:
        return self.flag


def test_none_never_stops_and_events_or_callables_are_followed():
    assert as_cancel_check(None)() is False
    for event in (threading.Event(), ProcessEvent()):
        check = as_cancel_check(event)
        assert check() is False
        event.set()
        assert check() is True
    answers = iter([False, True])
    check = as_cancel_check(lambda: next(answers))
    assert [check(), check()] == [False, True]


@pytest.mark.parametrize("bad", [True, "stop", 1])
def test_anything_else_is_refused_with_a_typed_error(bad):
    with pytest.raises(LoomConfigError, match=f"got {type(bad).__name__}"):
        as_cancel_check(bad)


def dense_net() -> VolumetricNetwork:
    net = VolumetricNetwork(1, 1, 1, 1)
    net[0, 0, 0, 0] = make_layer("Dense", input_height=2, output_height=2, activation="Tanh",
                                 weights=[0.5, -0.25, 0.75, 0.1])
    return net


@pytest.mark.parametrize("loop", [train, tween_train])
def test_training_loops_refuse_a_bad_cancel_before_changing_any_weight(loop):
    net = dense_net()
    before = net.cells[0].weights.master.copy()
    x = np.array([[1, 2], [-1, 0.5]], np.float32)
    with pytest.raises(LoomConfigError, match="cancel must be"):
        loop(net, [(x, x * 0.1)], cancel=True)
    np.testing.assert_array_equal(net.cells[0].weights.master, before)


def test_a_process_style_event_stops_training_before_the_first_batch():
    stop = ProcessEvent()
    stop.set()
    x = np.array([[1, 2], [-1, 0.5]], np.float32)
    history = train(dense_net(), [(x, x)], TrainConfig(epochs=3), cancel=stop)
    assert history.cancelled and len(history) == 0
