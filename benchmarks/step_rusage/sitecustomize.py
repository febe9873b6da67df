"""Per-step wall, CPU and page-fault figures of one `lexgraph` process, printed to stderr as `RUS` lines.

Put this folder first on PYTHONPATH: Python imports `sitecustomize` at start-up, and this one wraps Dagster's
step iterator once it is imported, so every step of every in-process run reports its own figures (`@` is the
time since T_START, a shell `date +%s.%N` taken before the process was launched; without it, since start-up):

    s=$(date +%s.%N); T_START=$s PYTHONPATH=benchmarks/step_rusage:. \\
        .venv/bin/python -m orchestration.cli --home HOME ingest INBOX --quiet 2>&1 | grep RUS

Used for docs/BENCHMARKS.md "Round 4" (where each add's time went, and old against new code per step).
"""
import atexit
import builtins
import os
import resource
import sys
import time


def _snapshot():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), usage.ru_utime, usage.ru_stime, usage.ru_minflt


_STARTED = _snapshot()
_ORIGIN = _STARTED[0] - (time.time() - float(os.environ.get("T_START", time.time())))


def _report(name, before):
    now = _snapshot()
    sys.stderr.write(f"RUS @{now[0] - _ORIGIN:6.2f} {name:28s} wall {now[0] - before[0]:6.2f} "
                     f"user {now[1] - before[1]:6.2f} sys {now[2] - before[2]:6.2f} faults {now[3] - before[3]:9d}\n")


atexit.register(lambda: _report("TOTAL(process)", _STARTED))


def _wrap(module) -> None:
    step_events = module.dagster_event_sequence_for_step

    def timed(step_context, *args, **kwargs):
        before = _snapshot()
        try:
            yield from step_events(step_context, *args, **kwargs)
        finally:
            _report(step_context.step.key, before)

    module.dagster_event_sequence_for_step = timed


_import = builtins.__import__
_wrapped = []


def _watching_import(name, *args, **kwargs):
    module = _import(name, *args, **kwargs)
    plan = sys.modules.get("dagster._core.execution.plan.execute_plan")
    if not _wrapped and plan is not None and hasattr(plan, "dagster_event_sequence_for_step"):
        _wrapped.append(True)
        _wrap(plan)
        builtins.__import__ = _import  # wrapped once: stop watching
    return module


builtins.__import__ = _watching_import
