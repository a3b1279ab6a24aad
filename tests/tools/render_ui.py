"""Render Prefect UI pages in headless Chromium: a screenshot and the DOM after scripts ran.

For a flow run it renders the run page (``/runs/flow-run/<id>``: its state, timeline,
logs) and, for each artifact key, the artifact's page (``/artifacts/key/<key>``: its
latest version and the run that made it)::

    python -m tests.tools.render_ui FLOW_RUN_ID --out ui/ \\
        [--ui-url http://127.0.0.1:4200] [--artifact-key finetune-costs ...]

The UI asks the server for its API address (``/ui-settings``). A server on a port other
than 4200 must be started with ``PREFECT_UI_API_URL=http://127.0.0.1:<port>/api`` (or
``PREFECT_SERVER_API_PORT``), or the page only says "Oops. Something went wrong."

Needs a Chromium: Debian's ``chromium`` package (``apt-get install -y chromium``),
``chromium-browser`` or ``google-chrome``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "RenderedPage",
    "find_chromium",
    "main",
    "render_flow_run",
    "render_page",
    "visible_text",
]

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@dataclass
class RenderedPage:
    """One rendered page.

    Attributes:
        url: the page rendered.
        screenshot: the PNG (1400×900 px).
        dom: the serialised DOM after the page's scripts ran (HTML).
    """

    url: str
    screenshot: Path
    dom: Path

    def text(self) -> str:
        """The DOM's visible text, tags removed and whitespace collapsed."""
        return visible_text(self.dom.read_text(encoding="utf-8", errors="replace"))


def find_chromium() -> str | None:
    """The path of a Chromium/Chrome executable on PATH, or None."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def visible_text(html: str) -> str:
    """The text of an HTML document: scripts and styles dropped, tags removed,
    whitespace collapsed (enough to check what a page shows)."""
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S | re.I)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip()


def render_page(
    url: str,
    screenshot: Path,
    dom: Path,
    *,
    chromium: str | None = None,
    budget_ms: int = 10_000,
    timeout_seconds: float = 120.0,
) -> RenderedPage:
    """Load ``url`` in headless Chromium; write a screenshot and the rendered DOM.

    Args:
        url: the page.
        screenshot / dom: where the PNG and the HTML go.
        chromium: the browser executable (default: ``find_chromium()``).
        budget_ms: Chromium's virtual-time budget: how long scripts may run, in ms.
        timeout_seconds: wall-clock deadline for the browser process.

    Raises:
        FileNotFoundError: no Chromium found.
        RuntimeError: the browser failed or wrote no screenshot (its stderr's end).
        subprocess.TimeoutExpired: past ``timeout_seconds``.
    """
    browser = chromium or find_chromium()
    if browser is None:
        raise FileNotFoundError(
            f"no Chromium on PATH (looked for {', '.join(CHROMIUM_NAMES)}); "
            "install one: apt-get install -y chromium"
        )
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    dom.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1400,900",
            f"--virtual-time-budget={budget_ms}",
            f"--screenshot={screenshot}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        timeout=timeout_seconds,
    )
    if proc.returncode != 0 or not screenshot.is_file():
        raise RuntimeError(
            f"chromium could not render {url} (exit {proc.returncode}): "
            f"{proc.stderr.decode(errors='replace')[-1500:]}"
        )
    dom.write_bytes(proc.stdout)
    return RenderedPage(url=url, screenshot=screenshot, dom=dom)


def render_flow_run(
    ui_url: str,
    flow_run_id: str,
    out_dir: Path,
    artifact_keys: list[str] | tuple[str, ...] = (),
    *,
    chromium: str | None = None,
    budget_ms: int = 10_000,
) -> dict[str, RenderedPage]:
    """Render a flow run's page and its artifacts' pages into ``out_dir``.

    Args:
        ui_url: the UI's base address (``http://127.0.0.1:4200``).
        flow_run_id: the run.
        out_dir: gets ``flow-run.png``/``.html`` and ``artifact-<key>.png``/``.html``.
        artifact_keys: artifact keys whose pages to render.
        chromium / budget_ms: see ``render_page``.

    Returns:
        ``{"flow-run": page, "artifact-<key>": page, …}``.

    Raises:
        FileNotFoundError / RuntimeError: see ``render_page``.
    """
    base = ui_url.rstrip("/")
    targets = {"flow-run": f"{base}/runs/flow-run/{flow_run_id}"}
    targets.update({f"artifact-{k}": f"{base}/artifacts/key/{k}" for k in artifact_keys})
    return {
        name: render_page(
            url,
            out_dir / f"{name}.png",
            out_dir / f"{name}.html",
            chromium=chromium,
            budget_ms=budget_ms,
        )
        for name, url in targets.items()
    }


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring). Prints one line per page written."""
    parser = argparse.ArgumentParser(prog="python -m tests.tools.render_ui")
    parser.add_argument("flow_run_id")
    parser.add_argument("--out", type=Path, default=Path("ui-render"))
    parser.add_argument("--ui-url", default="http://127.0.0.1:4200")
    parser.add_argument("--artifact-key", action="append", default=[])
    parser.add_argument("--budget-ms", type=int, default=10_000)
    args = parser.parse_args(argv)
    pages = render_flow_run(
        args.ui_url, args.flow_run_id, args.out, args.artifact_key, budget_ms=args.budget_ms
    )
    for name, page in pages.items():
        print(f"{name}: {page.screenshot} {page.dom} ({page.url})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
