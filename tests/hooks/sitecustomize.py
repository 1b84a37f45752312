"""Faults for the tests that run the service as processes (tests/app/test_processes.py), put on PYTHONPATH there.

Python imports ``sitecustomize`` at the start of every interpreter, so this reaches the engine that the supervisor
spawns. Where ``TEST_POISON_ID`` or ``TEST_SLOW_ID`` is set, the embedding pass (model/runtime/tasks.py) raises for a
batch that holds the first token id: a request that breaks the pass it shares. A batch that holds the second creates the
file ``TEST_HELD`` and waits (30 s at most) until the file ``TEST_RELEASE`` exists: a pass that holds the engine
while the test queues what it likes. Elsewhere it does nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Any

POISON_ID = int(os.environ.get("TEST_POISON_ID", "-1"))
SLOW_ID = int(os.environ.get("TEST_SLOW_ID", "-1"))
HELD, RELEASE = Path(os.environ.get("TEST_HELD", "held")), Path(os.environ.get("TEST_RELEASE", "release"))
MODULE = "model.runtime.tasks"


def with_faults(module: ModuleType) -> None:
    real = module.embed_texts

    def embed_texts(model: Any, encodings: Sequence[Any], specs: Sequence[Any]) -> Any:
        ids = {token for encoding in encodings for token in encoding.ids}
        if POISON_ID in ids:
            raise RuntimeError("a poisoned text")
        if SLOW_ID in ids:
            HELD.touch()
            deadline = time.monotonic() + 30
            while not RELEASE.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return real(model, encodings, specs)

    module.embed_texts = embed_texts  # type: ignore[attr-defined]


class Faults(importlib.abc.MetaPathFinder):
    """Patches the tasks' module once it is loaded (the front ends never load it)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.loader is not None
        loader, run = spec.loader, spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            with_faults(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if POISON_ID >= 0 or SLOW_ID >= 0:
    sys.meta_path.insert(0, Faults())
