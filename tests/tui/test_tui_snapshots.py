"""SVG snapshots of the main screens (made with textual 8.2.8; regenerate with --snapshot-update)."""
import asyncio

from tui_helpers import DATA, make_app


async def _ready(pilot):
    app = pilot.app
    for _ in range(500):
        if app.final and app.index is not None and app.index.done:
            break
        await asyncio.sleep(0.02)
    await pilot.pause()


def test_fix_screen_80x24(snap_compare, catalog):
    assert snap_compare(make_app([DATA / "tp3-40heads.log"], catalog), terminal_size=(80, 24), run_before=_ready)


def test_cause_screen_wide(snap_compare, catalog):
    assert snap_compare(make_app([DATA / "tp3-40heads.log"], catalog), terminal_size=(140, 40),
                        press=["1"], run_before=_ready)


def test_log_screen_80x24(snap_compare, catalog):
    assert snap_compare(make_app([DATA / "tp3-40heads.log"], catalog), terminal_size=(80, 24),
                        press=["5", "end"], run_before=_ready)


def test_healthy_80x24(snap_compare, catalog):
    assert snap_compare(make_app([DATA / "healthy.log"], catalog), terminal_size=(80, 24), run_before=_ready)
