"""Faults for the tests that run the service as processes (tests/app/test_processes.py), put on PYTHONPATH there.

Python imports ``sitecustomize`` at the start of every interpreter, so this reaches the engine that the supervisor
spawns. Where ``TEST_POISON_ID`` or ``TEST_SLOW_ID`` is set, the loaded model's embedding pass raises for a batch
that holds the first token id, and takes ``TEST_SLOW_S`` seconds more for one that holds the second: a request
that breaks the pass it shares, and a pass that holds the engine while others queue. Elsewhere it does nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

POISON_ID = int(os.environ.get("TEST_POISON_ID", "-1"))
SLOW_ID = int(os.environ.get("TEST_SLOW_ID", "-1"))
SLOW_S = float(os.environ.get("TEST_SLOW_S", "1.5"))
MODULE = "model.text_encoder"


def with_faults(module: ModuleType) -> None:
    real = module.TextEncoder.embed_encodings

    def embed_encodings(self: Any, encodings: Sequence[Any], specs: Sequence[Any]) -> Any:
        ids = {token for encoding in encodings for token in encoding.ids}
        if POISON_ID in ids:
            raise RuntimeError("a poisoned text")
        if SLOW_ID in ids:
            time.sleep(SLOW_S)
        return real(self, encodings, specs)

    module.TextEncoder.embed_encodings = embed_encodings


class Faults(importlib.abc.MetaPathFinder):
    """Patches the model's module once it is loaded (the front ends never load it)."""

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
