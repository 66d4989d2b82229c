"""Chapter 7's iteration picker in a real browser: moving its slider shows the chosen iteration's rows (which
requests have a prompt chunk in it, with their new and cached tokens, and how many decode rows) and its time
split, and each is the value the package computes for that iteration of the run (piggybacking.iteration_rows
and iteration_split), not a copy of the chart's data.

Needs the built book (``make book``, or ``scripts/build_pages.py notebooks/07_piggybacking`` with
``BATCHLAB_BOOK_HTML``) and Debian's Chromium; fixtures ``site`` and ``browser`` are in ``tests/conftest.py``.
"""
from __future__ import annotations

import numpy as np
import pytest
from bookpage import chart_texts, set_range

import batchlab as bl
from batchlab import viz
from batchlab.chapters import facts, scenes
from batchlab.chapters import piggybacking as chapter

pytestmark = pytest.mark.browser

PAGE = "notebooks/07_piggybacking"
LOAD = "rate_near_req_s"  # the page's run: the conv scene at 95 % of its capacity, chunked, a 2,048-token budget
MAX_NUM_BATCHED_TOKENS = 2048
SPLIT_KEYS = ("gemm_compute_s", "gemm_memory_s", "lm_head_compute_s", "lm_head_memory_s", "attn_compute_s",
              "attn_memory_s", "elementwise_s", "overhead_s", "cpu_step_s", "cpu_seq_s")


@pytest.fixture(scope="module")
def run():
    scene = scenes.scene("conv")
    cost = scene.cost()
    stream = scene.requests(facts.value(LOAD), fit_context=True)
    res = bl.simulate(stream, "chunked", cost, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, record_schedule=True)
    return cost, res



def _picker(v):
    for i in range(v.charts().count()):
        chart = v.chart(i)
        slider = chart.locator(".vega-bindings input[type=range][name=iteration]")
        if slider.count():
            return chart, slider
    raise AssertionError("no chart with the iteration slider")


def _step_of(label: str) -> int:
    return int(label.split(" ")[0].replace(",", ""))


def expected(cost, res, step: int) -> dict:
    """What the chart must show for iteration ``step``, from the package's own functions."""
    rows = chapter.iteration_rows(res, step)
    one = rows[rows["step"] == step]
    split = chapter.iteration_split(cost, one, asynchronous=res.knobs["async_scheduling"])
    chunks = one[one["kind"] == "prefill"]
    return {"duration_ms": viz.format_duration(res.steps["duration_s"].iloc[step], unit="s"),  # the book's rule
            "start": f"{res.steps['start_s'].iloc[step]:.2f} s", "decodes": int((one["kind"] == "decode").sum()),
            "new": int(chunks["new_tokens"].sum()),
            "chunks": {f"request {r:,}": f"{c:,} new + {p:,} cached"
                       for r, c, p in zip(chunks["request"], chunks["new_tokens"], chunks["cached_tokens"])},
            "split": {k: f"{split[k] * 1e3:.1f}" for k in SPLIT_KEYS if split[k] > 0}, "total_s": split["total_s"]}


def test_moving_the_iteration_picker_shows_that_iterations_rows_and_time_split(page, run):
    cost, res = run
    chart, slider = _picker(page)
    shown = slider.locator("xpath=following-sibling::*[1]")
    lo, hi = int(float(slider.get_attribute("min"))), int(float(slider.get_attribute("max")))
    set_range(slider, lo)
    page.page.wait_for_timeout(200)
    first = _step_of(shown.inner_text())
    kinds = set()
    for position in (hi, lo, (lo + hi) // 2, int(np.argmax(res.steps["prefill_tokens"].iloc[first:first + hi + 1]))):
        before = chart.locator("svg").first.inner_html()
        set_range(slider, position)
        step = first + position
        if position != lo or len(kinds):
            page.page.wait_for_function(
                "([id, old]) => document.querySelector('#' + id + ' svg').innerHTML !== old",
                arg=[chart.get_attribute("id"), before], timeout=10_000)
        label = shown.inner_text()
        assert _step_of(label) == step, (label, step)
        want, texts = expected(cost, res, step), chart_texts(chart)
        assert want["total_s"] == pytest.approx(res.steps["duration_s"].iloc[step], rel=1e-12)  # the engine's step
        assert f"iteration {step:,} at {want['start']}: {want['duration_ms']}" in texts, texts[:6]
        rows_line = next(t for t in texts if t.endswith(("decode", "decodes")))
        assert rows_line.endswith(f"{want['decodes']:,} decode" + ("" if want["decodes"] == 1 else "s"))
        if want["chunks"]:
            assert f"({want['new']:,} new tokens)" in rows_line
            for request, tokens in want["chunks"].items():  # each prompt chunk: its request and its tokens
                assert request in texts and tokens in texts, (request, tokens, texts)
            kinds.add("mixed" if want["decodes"] else "prefill")
        else:
            assert rows_line.startswith("no prompt chunk") and "no prompt chunk in this iteration" in texts
            kinds.add("decode")
        shown_requests = {t for t in texts if t.startswith("request ")}
        assert shown_requests == set(want["chunks"]), shown_requests  # no other iteration's rows
        bar_labels = [t for t in texts if t.replace(".", "", 1).isdigit()]
        for key, value in want["split"].items():  # the time split: each side of each operator, in ms
            assert value in bar_labels, (key, value, bar_labels)
    assert kinds == {"decode", "mixed"}  # the walk met both kinds of iteration
    assert not page.errors, page.errors
