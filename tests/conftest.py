import os
import sys

import pytest
from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))

settings.register_profile("batchlab", deadline=None, print_blob=True)
settings.load_profile("batchlab")


@pytest.fixture(scope="session")
def h100():
    import batchlab as bl
    return bl.get_hardware("h100-sxm")


@pytest.fixture(scope="session")
def cost8b(h100):
    """Llama-3-8B, BF16, one H100 SXM, the calibrated defaults: the book's reference configuration."""
    import batchlab as bl
    return bl.CostModel(h100, bl.get_model("llama-3-8b"))


@pytest.fixture(scope="session")
def engine8b(h100):
    """``cost8b`` without the serving terms: the engine sees each request when it arrives and a step is GPU time
    only, so hand-worked scheduling cases can be stated in whole steps."""
    import batchlab as bl
    from batchlab.cost import SERVING_FIELDS
    return bl.CostModel(h100, bl.get_model("llama-3-8b"), **dict.fromkeys(SERVING_FIELDS, 0.0))


@pytest.fixture(scope="session")
def cost70b_fp8(h100):
    """Llama-3-70B with FP8 weights on one H100 SXM: the article's large model (chapters 05, 14)."""
    import batchlab as bl
    return bl.CostModel(h100, bl.get_model("llama-3-70b"), dtype="fp8")


@pytest.fixture(scope="session")
def measured():
    """The raw measured H100 timings folder ($BATCHLAB_MEASURED_DIR, else ../shared/data/measured).

    Only tests that read the raw public files need it (mark them ``needs_data``); they skip without it. The
    calibration itself reads the compact table in data/ and needs no folder.
    """
    from batchlab import calibrate
    try:
        return calibrate.measured_dir()
    except FileNotFoundError:
        pytest.skip(f"raw measured timings not found: set {calibrate.MEASURED_ENV} to ../shared/data/measured")


def pytest_terminal_summary(terminalreporter):
    """What the property tests' examples exercised (strategies.outcome): the share of examples that admitted a
    request, rejected every request, split a prompt over iterations, or preempted, per test."""
    try:
        from strategies import KINDS, OUTCOMES
    except ImportError:
        return
    if not OUTCOMES:
        return
    terminalreporter.section("property-test examples: what they exercised")
    for test, counts in sorted(OUTCOMES.items()):
        n = counts["examples"]
        shares = ", ".join(f"{kind} {counts[kind] / n:.0%}" for kind in KINDS[1:])
        terminalreporter.write_line(f"{test}: {n} examples; {shares}")


@pytest.fixture(scope="session")
def site():
    """The built book served on 127.0.0.1 (needs ``make book``)."""
    import bookpage

    if not (bookpage.HTML / "index.html").exists():
        pytest.fail(f"{bookpage.HTML} has no built book: run `make book` first")
    url, stop = bookpage.serve()
    yield url
    stop()


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium, headless, driven by Playwright."""
    import bookpage
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=bookpage.CHROMIUM, headless=True, args=bookpage.CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(site, browser, request):
    """The page named by the test module's ``PAGE`` (``"notebooks/NN_slug"``), opened in a 1280 px window."""
    import bookpage

    v = bookpage.Visit(browser, f"{site}/{request.module.PAGE}.html")
    yield v
    v.close()
