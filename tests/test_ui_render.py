"""The Prefect UI shows our runs: a reaper run rendered in headless Chromium from a real
``prefect server start`` shows its state, and its ``reaper-report`` artifact's page
names the run that made it."""

from __future__ import annotations

import uuid

import pytest

from tests.tools.render_ui import find_chromium, visible_text

pytestmark = pytest.mark.skipif(find_chromium() is None, reason="no Chromium on PATH")


def test_visible_text_drops_markup_and_scripts():
    html = "<html><script>var x='Failed'</script><body><b>Run</b>\n  <i>Completed</i></body></html>"
    assert visible_text(html) == "Run Completed"


@pytest.mark.slow
def test_flow_run_page_shows_state_and_artifact(prefect_api, runpod_home, tmp_path):
    from prefect.client.orchestration import get_client

    from prefect_runpod.flows.reaper import reaper
    from tests.tools.render_ui import render_flow_run

    state = reaper(provider="local", name_prefix=f"ui{uuid.uuid4().hex[:6]}", return_state=True)
    run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
    pages = render_flow_run(prefect_api.ui_url, str(run_id), tmp_path, ["reaper-report"])

    run_page = pages["flow-run"].text()
    assert "Oops" not in run_page, run_page[:500]
    assert run.name in run_page and "runpod-reaper" in run_page
    assert "Completed" in run_page
    artifact_page = pages["artifact-reaper-report"].text()
    # The artifact's own page: its key and its description (which names the pod prefix).
    assert "reaper-report" in artifact_page and "Reaper pass over local pods" in artifact_page
    for page in pages.values():
        assert page.screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
