"""core.edits: every change a compiled step depends on moves the edit count, and reads do not.

Oracle: the count before and after each operation (it must move for a change, stay for a read),
and the list operations' results against a plain list's.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from loomlab.core import edits
from loomlab.core.layers.base import LayerConfig, make_layer
from loomlab.core.weights import WeightStore


def moved(action) -> bool:
    before = edits.last
    action()
    return edits.last != before


@pytest.mark.parametrize("op", [
    lambda a: a.append(9), lambda a: a.extend([7, 8]), lambda a: a.insert(0, 5), lambda a: a.remove(2),
    lambda a: a.pop(), lambda a: a.pop(0), lambda a: a.clear(), lambda a: a.sort(), lambda a: a.reverse(),
    lambda a: a.__setitem__(0, 4), lambda a: a.__setitem__(slice(0, 2), [6]), lambda a: a.__delitem__(1),
    lambda a: a.__iadd__([1]), lambda a: a.__imul__(2),
])
def test_every_change_of_an_edited_list_is_an_edit_with_a_lists_result(op):
    edited, plain = edits.EditedList([3, 2, 1]), [3, 2, 1]
    assert moved(lambda: op(edited))
    op(plain)
    assert edited == plain and isinstance(edited, list)


def test_reading_an_edited_list_is_no_edit():
    a = edits.EditedList([1, 2, 3])
    assert not moved(lambda: (a[0], a[1:], len(a), list(a), 2 in a, a.index(2), a == [1, 2, 3]))
    assert json.dumps(a) == "[1, 2, 3]" and copy.deepcopy(a) == [1, 2, 3]


def test_a_layers_children_are_an_edited_list_however_they_are_set():
    seq = make_layer("Sequential", children=[make_layer("Residual")])
    assert type(seq.children) is edits.EditedList
    assert moved(lambda: seq.children.append(make_layer("Residual")))
    assert moved(lambda: setattr(seq, "children", [make_layer("Residual")]))
    assert type(seq.children) is edits.EditedList and len(seq.children) == 1


def test_layer_config_and_weight_changes_are_edits_and_reads_are_not():
    layer = make_layer("Dense", input_height=3, output_height=2)
    assert moved(lambda: setattr(layer.cfg, "is_disabled", True))
    assert moved(lambda: setattr(layer.cfg, "dtype", "float16"))
    assert moved(lambda: setattr(layer, "cfg", LayerConfig(type="Dense", input_height=3, output_height=2)))
    store = layer.weights
    assert moved(lambda: setattr(store, "version", store.version + 1))

    def add_in_place():
        store.master += 1.0  # the setter runs with the same array: an edit
    assert moved(add_in_place)
    assert moved(lambda: setattr(layer, "weights", WeightStore(np.zeros(8, np.float32))))
    assert not moved(lambda: (layer.cfg.dtype, layer.cfg.is_disabled, layer.weights.master.sum(),
                              layer.children))
