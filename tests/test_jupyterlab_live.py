"""A live JupyterLab, as a reader uses it: open notebook 01, run every cell, see the charts and the controls.

Starts ``jupyter lab`` from this environment on 127.0.0.1 and drives it with headless Chromium (Playwright,
Debian's ``/usr/bin/chromium``). Checks that the offline renderer draws in JupyterLab (an svg inside each
chart container), that the explore cell's ipywidgets sliders appear, that moving one redraws its chart with
the live kernel, and that nothing is fetched from another host.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "notebooks/01_static_batching.ipynb"
TOKEN = "batchlab-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    port = _free_port()
    work = tmp_path_factory.mktemp("lab")
    shutil.copytree(ROOT / "notebooks", work / "notebooks")  # the test never writes into the repository
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(work / "config"), JUPYTER_RUNTIME_DIR=str(work / "runtime"))
    cmd = [str(Path(sys.executable).with_name("jupyter")), "lab", "--no-browser", "--ip=127.0.0.1",
           f"--port={port}", f"--IdentityProvider.token={TOKEN}", "--allow-root", f"--ServerApp.root_dir={work}",
           "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    log = open(work / "lab.log", "w")  # noqa: SIM115 - the server outlives this function; closed with the process
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail(f"jupyter lab did not start; see {work / 'lab.log'}")
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(30)


def test_notebook_runs_live_with_charts_and_controls(lab, browser):
    # The session's Chromium (conftest ``browser``): a second ``sync_playwright()`` in the same process fails
    # with "Sync API inside the asyncio loop" once a book test has started the first.
    outside = []
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:

        def guard(route):
            if urlparse(route.request.url).hostname not in ("127.0.0.1", None, ""):
                outside.append(route.request.url)
                return route.abort()
            return route.continue_()

        page.route("**/*", guard)
        page.goto(f"{lab}/lab/tree/{NOTEBOOK}?token={TOKEN}")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
        page.wait_for_selector("text=Python 3 (ipykernel) | Idle", timeout=120_000)  # the kernel is up
        page.locator("#jp-menu-panel >> text=Run").first.click()
        page.get_by_text("Run All Cells", exact=True).first.click()
        charts = page.locator(".jp-OutputArea-output div[id^=batchlab-chart-]")
        sliders = page.locator(".jp-OutputArea-output .widget-slider")
        deadline = time.time() + 180
        while time.time() < deadline and not (sliders.count() >= 1 and
                                              page.locator(".jp-OutputArea-output div[id^=batchlab-chart-] svg")
                                              .count() >= charts.count() >= 2):
            time.sleep(1)
        assert charts.count() >= 2, "the notebook's charts did not render in JupyterLab"
        for i in range(charts.count()):
            assert charts.nth(i).locator("svg").count() >= 1, f"chart {i} drew nothing in JupyterLab"
        assert sliders.count() >= 1, "the explore cell's ipywidgets controls did not appear"
        # Move the explore cell's first slider: the live kernel reruns the sweep and redraws the chart.
        last = charts.nth(charts.count() - 1)
        before = last.locator("svg").first.inner_html()
        handle = sliders.first.locator(".noUi-handle, .ui-slider-handle").first
        handle.focus()
        for _ in range(5):
            page.keyboard.press("ArrowRight")
        deadline = time.time() + 120
        after = before
        while time.time() < deadline and after == before:
            time.sleep(1)
            current = page.locator(".jp-OutputArea-output div[id^=batchlab-chart-]")
            after = current.nth(current.count() - 1).locator("svg").first.inner_html()
        page.screenshot(path=str(ROOT / "_build" / "jupyterlab_01.png") if (ROOT / "_build").is_dir() else None)
    finally:
        page.close()
    assert after != before, "moving the explore slider did not redraw the chart"
    assert not outside, f"JupyterLab page asked other hosts for: {outside[:5]}"
