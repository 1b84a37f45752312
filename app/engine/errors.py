"""Why the engine did not compute a task: its own errors, which know nothing of HTTP or gRPC.

The engine raises these and only these (and sends them as they are to a front end, app/engine/remote.py); the web
layer words each as the client's error (``client_error``, app/web/responding.py: 429, 503 and their envelopes) and
gRPC as a status code, through the same responder.
"""

from __future__ import annotations

from typing import Any


class EngineError(Exception):
    """A task not computed, and why: ``message`` says it to the client; ``retry_after_s``, where trying again later
    may work, in how many seconds."""

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its class and attributes, whatever its constructor takes: the engine sends the error itself
        to a front end, which raises it as it is."""
        return (_unpickled, (type(self), self.message), self.__dict__)


def _unpickled(cls: type[EngineError], message: str) -> EngineError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    return error  # its attributes are set from the pickled state


class QueueFull(EngineError):
    """Admission refused the task: the texts held would pass the service's bound (app/engine/admission.py)."""


class EngineStopped(EngineError):
    """The engine is not running, or is shutting down: its queue closed, its process gone."""


class DeadlinePassed(EngineError):
    """The task's deadline passed before it was computed; it was dropped."""


class ComputeFailed(EngineError):
    """The model raised while computing the task (alone, after its pass was retried request by request)."""
