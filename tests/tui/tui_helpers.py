"""Shared helpers for the TUI tests: build an app over a log and wait for its diagnosis."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
ROOT = Path(__file__).resolve().parents[2]


def make_app(paths, catalog, **kwargs):
    from vllm_doctor.diagnosis.saved import Options
    from vllm_doctor.tui.app import TriageApp

    options = kwargs.pop("options", None) or Options(live=False)
    return TriageApp([str(p) for p in paths], catalog, options, **kwargs)


async def settle(app, pilot, timeout: float = 20.0, final: bool = True) -> None:
    """Wait until the app has a (final) diagnosis and its log is indexed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = (app.final if final else app.diagnosis is not None or app.error)
        if done and (app.index is None or app.index.done):
            await pilot.pause()
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the app never finished diagnosing")


async def until(pilot, condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            await pilot.pause()
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")
