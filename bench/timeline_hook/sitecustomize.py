"""Loaded at interpreter start when ``bench.timeline.hook_env`` put this folder on ``PYTHONPATH``:
wraps ``bench.timeline.STEPS`` to record entry and exit times (see that module)."""

import os

if os.environ.get("BENCH_TIMELINE"):
    import atexit
    import functools
    import importlib
    import inspect
    import json
    import threading
    import time

    from bench.timeline import ENV, STEPS

    _marks: list[tuple[float, str]] = []
    _now = time.perf_counter

    def _wrap(module: str, qualname: str) -> None:
        owner = importlib.import_module(module)
        *path, name = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        fn = owner.__dict__[name]
        enter, leave = qualname + ">", qualname + "<"
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def marked(*args, **kwargs):
                _marks.append((_now(), enter))
                try:
                    return await fn(*args, **kwargs)
                finally:
                    _marks.append((_now(), leave))
        else:
            @functools.wraps(fn)
            def marked(*args, **kwargs):
                _marks.append((_now(), enter))
                try:
                    return fn(*args, **kwargs)
                finally:
                    _marks.append((_now(), leave))
        setattr(owner, name, marked)

    _dumping = threading.Lock()

    def _dump() -> None:
        """Writes the marks so far; a reader never sees a half-written file (the every-second
        dump and the one at exit take turns, and each replaces the file whole)."""
        path = os.environ[ENV]
        with _dumping:
            with open(path + ".part", "w") as out:
                json.dump(list(_marks), out)
            os.replace(path + ".part", path)

    def _every_second() -> None:
        while True:
            time.sleep(1.0)
            _dump()

    _extra = [tuple(step.split(":", 1)) for step in os.environ.get(ENV + "_EXTRA", "").split(",") if step]
    for _module, _qualname in (*STEPS, *_extra):
        _wrap(_module, _qualname)
    atexit.register(_dump)
    threading.Thread(target=_every_second, name="bench-timeline", daemon=True).start()
