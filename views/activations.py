"""The activations choice, one control for every panel that loads or runs a language model:
``int8`` (8-bit activations, as llama.cpp computes; fast) or ``float32`` (the exact path, as
transformers computes). The words are the CLI's (``--activations int8|float32``), so one
vocabulary runs through the command line and the panels.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QWidget

from loomlab.core.llm.generate.textmodel import ACTIVATION_MODES, DEFAULT_ACTIVATIONS

#: What each mode means, shown on its item; the item's text is the word itself, so the box is
#: narrow enough for a docked column.
HINTS = {
    "int8": "int8: fast, as llama.cpp computes. Weights in GGUF block formats multiply 8-bit "
            "activations with integer dot products, within llama.cpp's numerics of the exact result.",
    "float32": "float32: exact, as transformers computes; activations stay 32-bit floats.",
}
TOOLTIP = ("Activations: int8 (fast, as llama.cpp) or float32 (exact, as transformers), as the CLI's "
           "--activations. Float weights take the float kernels either way.")


class ActivationsBox(QComboBox):
    """A combo box over the engine's activation modes. :attr:`mode` is the word shown;
    :attr:`mode_chosen` is emitted when the user picks another, never when code sets it (so a
    panel showing its model's mode does not write it back)."""

    mode_chosen = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        for mode in ACTIVATION_MODES:
            self.addItem(mode)
            self.setItemData(self.count() - 1, HINTS[mode], Qt.ItemDataRole.ToolTipRole)
        self.setToolTip(TOOLTIP)
        self.set_mode(DEFAULT_ACTIVATIONS)
        self.activated.connect(lambda index: self.mode_chosen.emit(self.itemText(index)))

    @property
    def mode(self) -> str:
        """The mode shown: ``"int8"`` or ``"float32"``."""
        return self.currentText()

    def set_mode(self, mode: str) -> None:
        """Show ``mode`` (one of the engine's modes) without emitting :attr:`mode_chosen`."""
        index = self.findText(mode)
        if index < 0:
            raise ValueError(f"activations must be one of {ACTIVATION_MODES}, got {mode!r}")
        self.setCurrentIndex(index)
