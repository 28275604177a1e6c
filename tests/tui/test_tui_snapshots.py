"""SVG snapshots of the main screens (made with textual 8.2.8; regenerate with --snapshot-update)."""
import asyncio

from tui_helpers import DATA, make_app


async def _settled(pilot, times: int = 3, tries: int = 500) -> None:
    """Wait until the screen renders the same `times` checks in a row: a late layout pass, a highlight or a status
    line that lands after the state the test waited for would otherwise be photographed half-way (a loaded machine
    in a full run lays out late)."""
    same, last = 0, None
    for _ in range(tries):
        await pilot.pause()
        shot = pilot.app.export_screenshot()
        same = same + 1 if shot == last else 0
        if same >= times:
            return
        last = shot
        await asyncio.sleep(0.02)
    raise AssertionError("the screen never settled")


async def _ready(pilot):
    """The diagnosis final and the log indexed (a loaded machine takes longer: wait, then fail loudly rather than
    photograph a screen still filling in)."""
    app = pilot.app
    for _ in range(3000):
        if app.final and app.index is not None and app.index.done:
            break
        await asyncio.sleep(0.02)
    assert app.final and app.index is not None and app.index.done, "the app never finished diagnosing"
    await _settled(pilot)


async def _log_at_end(pilot):
    """The log tab shown and scrolled to its end, waited for (the snapshot's own key presses do not wait for the
    scroll to land)."""
    from vllm_doctor.tui.logview import LogView

    await _ready(pilot)
    await pilot.press("5", "end")
    at_end = 0
    for i in range(1500):
        await pilot.pause()
        views = pilot.app.query(LogView)
        view = views.first() if views else None
        if view is not None and view.max_scroll_y > 0 and view.scroll_y >= view.max_scroll_y:
            at_end += 1
            if at_end >= 3:          # still there after the layout settled (a loaded machine lays out late)
                break
        else:
            at_end = 0
            if view is not None and view.max_scroll_y > 0 and i % 25 == 24:
                await pilot.press("end")     # the view grew after the first `end` landed: go to the new end
        await asyncio.sleep(0.02)
    await _settled(pilot)


def test_fix_screen_80x24(snap_compare, catalog):
    assert snap_compare(make_app([DATA / "tp3-40heads.log"], catalog), terminal_size=(80, 24), run_before=_ready)


def test_cause_screen_wide(snap_compare, catalog):
    assert snap_compare(make_app([DATA / "tp3-40heads.log"], catalog), terminal_size=(140, 40),
                        press=["1"], run_before=_ready)


def test_log_screen_80x24(snap_compare, catalog):
    assert snap_compare(make_app([DATA / "tp3-40heads.log"], catalog), terminal_size=(80, 24),
                        run_before=_log_at_end)


def test_healthy_80x24(snap_compare, catalog):
    assert snap_compare(make_app([DATA / "healthy.log"], catalog), terminal_size=(80, 24), run_before=_ready)
