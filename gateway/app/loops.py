"""The event loop ``gateway run`` serves on (config ``event_loop``): uvloop where it is installed
(libuv's loop in C: sockets, timers and wake-ups from the turn threads cost less CPU than asyncio's
selector loop), asyncio's own loop otherwise or when chosen.

Measured (``python -m bench.side_by_side --a GATEWAY__EVENT_LOOP=asyncio``: both gateways at once,
alternating rounds, on one 2-core machine; bench/README.md, fourteenth round): 200 new chats at
once, CPU per turn 7.1 -> 6.6 ms and the loop's thread 2.74 -> 2.41 ms (lower in 7 of 8 rounds);
one new chat at a time, 7.6 -> 7.4 ms and 4.06 -> 3.74 ms, update -> model request 4.9 -> 4.7 ms
(lower in 6 of 6). The rest of the loop's time is Python (aiohttp's handlers, the admit) and the
socket writes themselves.

Only the main loop changes: the agent's bridge thread (browser, MCP) keeps asyncio's loop, which
Playwright's subprocess pipes are tested on.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from gateway.core.errors import ConfigError

EventLoopChoice = Literal["auto", "uvloop", "asyncio"]
T = TypeVar("T")


def loop_factory(choice: EventLoopChoice) -> tuple[str, Callable[[], asyncio.AbstractEventLoop]]:
    """``(name, factory)`` for ``choice``: ``"auto"`` is uvloop when it can be imported (it is a
    dependency everywhere but Windows, where libuv's loop is not built), else asyncio's default loop.

    Raises:
        ConfigError: ``"uvloop"`` was chosen and uvloop cannot be imported.
    """
    if choice != "asyncio":
        try:
            uvloop = importlib.import_module("uvloop")
        except ImportError as exc:
            if choice == "uvloop":
                raise ConfigError(f"event_loop = \"uvloop\" but uvloop cannot be imported ({exc}); "
                                  "install it (pip install uvloop) or set event_loop = \"auto\"") from exc
        else:
            return f"uvloop {uvloop.__version__}", uvloop.new_event_loop
    return "asyncio", asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T], choice: EventLoopChoice) -> T:
    """Runs ``main`` to completion on a new loop of ``choice`` (``asyncio.run`` with a loop
    factory: the loop's async generators and default executor are shut down after, then closed).

    Raises:
        ConfigError: as ``loop_factory``; what ``main`` raises goes on.
    """
    try:
        _, factory = loop_factory(choice)
    except ConfigError:
        main.close()  # never started: no "coroutine was never awaited" warning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """``"uvloop"`` or ``"asyncio"``: the implementation of the running loop (for the start-up
    log line). Raises ``RuntimeError`` outside a running loop."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
