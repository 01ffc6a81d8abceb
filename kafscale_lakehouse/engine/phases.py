"""Wall time of the phases of a run (planning, the Spark job, the commit, ...), for whoever listens.

The engine wraps each phase in `timed_phase(name)`; a benchmark or a report subscribes with `phase_listener(...)`
instead of patching engine functions by name. Without listeners a phase costs two `perf_counter` calls.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

log = logging.getLogger(__name__)

PhaseListener = Callable[[str, float], None]
_P = ParamSpec("_P")
_R = TypeVar("_R")

_listeners: list[PhaseListener] = []
_lock = threading.Lock()


@contextmanager
def timed_phase(name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        seconds = time.perf_counter() - started
        log.debug("phase %s took %.3f s", name, seconds)
        with _lock:
            listeners = list(_listeners)
        for listener in listeners:
            listener(name, seconds)


@contextmanager
def phase_listener(listener: PhaseListener) -> Iterator[None]:
    """Calls `listener(phase, seconds)` after every phase that ends while the block runs (in any thread)."""
    with _lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)


def timed(name: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorator: every call of the function is the phase `name`."""

    def decorate(function: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(function)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with timed_phase(name):
                return function(*args, **kwargs)

        return wrapper

    return decorate
