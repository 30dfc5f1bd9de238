"""The workbench's backend setting: which array backend it computes on, chosen in the View menu and
shown in the status bar with the device's memory.

:class:`BackendChoice` is the setting (a name and the backend it resolves to); :class:`BackendMenu`
and :class:`BackendStatus` show it, and the menu writes it back.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QActionGroup
from PySide6.QtWidgets import QLabel, QMenu, QWidget

from loomlab.core.backend import NUMPY, Backend, device_memory, get_backend
from loomlab.core.errors import LoomConfigError

#: The workbench's choices, with their menu texts.
CHOICES = {"numpy": "NumPy (CPU)", "cupy": "CuPy (NVIDIA GPU)", "auto": "Auto (the GPU where usable)"}


class BackendChoice(QObject):
    """The backend the workbench loads models and networks on: ``name`` ("numpy", "cupy",
    "auto") and ``backend``, what it resolved to. A name this machine cannot run (no CuPy, no
    device) is refused with the engine's message, and the choice stays as it was."""

    changed = Signal(str)  # the name now chosen
    refused = Signal(str)  # why a name could not be chosen

    def __init__(self, resolve: Callable[[str], Backend] = get_backend, parent: QObject | None = None):
        super().__init__(parent)
        self._resolve = resolve
        self._name, self._backend = "numpy", NUMPY

    @property
    def name(self) -> str:
        return self._name

    @property
    def backend(self) -> Backend:
        return self._backend

    def set_name(self, name: str) -> bool:
        """Choose ``name``; False (and :attr:`refused`) when it is unknown or cannot run here."""
        if name == self._name:
            return True
        try:
            if name not in CHOICES:
                raise LoomConfigError(f"unknown backend {name!r}; choose from {', '.join(CHOICES)}")
            backend = self._resolve(name)
        except LoomConfigError as e:
            self.refused.emit(str(e))
            return False
        self._name, self._backend = name, backend
        self.changed.emit(name)
        return True

    def describe(self) -> str:
        """``backend: cupy``, or for auto the one it picked: ``backend: numpy (auto)``."""
        picked = self._backend.name
        return f"backend: {picked}" + (" (auto)" if self._name == "auto" else "")


class BackendMenu(QMenu):
    """View > Backend: one checkable entry per choice; choosing one sets the :class:`BackendChoice`,
    and a refused choice leaves the check on the backend still in use."""

    def __init__(self, choice: BackendChoice, parent: QWidget | None = None):
        super().__init__("&Backend", parent)
        self.choice = choice
        group = QActionGroup(self)
        self.choice_actions: dict[str, QAction] = {}
        for name, text in CHOICES.items():
            action = QAction(text, self, checkable=True)
            action.triggered.connect(lambda _=False, n=name: choice.set_name(n))
            group.addAction(action)
            self.addAction(action)
            self.choice_actions[name] = action
        choice.changed.connect(self._show)
        choice.refused.connect(lambda _message: self._show(choice.name))
        self._show(choice.name)

    def _show(self, name: str) -> None:
        self.choice_actions[name].setChecked(True)  # setChecked does not trigger: no echo


class BackendStatus(QLabel):
    """The status bar's ``backend: NAME``, followed on a GPU by its memory (used, peak, free);
    :meth:`refresh` reads the memory again (the window's timer calls it)."""

    def __init__(self, choice: BackendChoice, parent: QWidget | None = None):
        super().__init__(parent)
        self.choice = choice
        choice.changed.connect(lambda _name: self.refresh())
        self.refresh()

    def refresh(self) -> None:
        memory = device_memory(self.choice.backend)
        text = self.choice.describe()
        self.setText(text if memory is None else f"{text} · {memory.describe()}")
