"""Chapter 12 (cheat sheet): the sheet is built from measured numbers, one row per symptom, each with the knob,
its effect, a number and the chapters that back it."""
from __future__ import annotations

import re

import pytest

from batchlab.chapters import cheat_sheet as chapter


@pytest.fixture(scope="module")
def measured():
    return chapter.measure()


def test_sheet_rows_are_symptom_knob_effect_number_chapter(measured):
    sheet = chapter.cheat_sheet(measured)
    assert sheet.columns.tolist() == ["symptom", "knob", "effect", "number", "chapter"]
    assert len(sheet) == 10 and sheet["symptom"].is_unique
    assert sheet.notna().all().all() and (sheet.map(len) > 0).all().all()
    assert all(re.fullmatch(r"\d\d(, \d\d)*", c) for c in sheet["chapter"])
    assert all(re.search(r"\d", n) for n in sheet["number"])  # every row quotes a measurement


def test_sheet_quotes_the_measured_numbers(measured):
    sheet = chapter.cheat_sheet(measured).set_index("chapter")
    m = measured
    assert f"{m['seats']} sequences" in sheet.loc["08", "number"].iloc[0]
    assert f"{m['knees'][1024]:.0f} sequences at 1,024 tokens" in sheet.loc["04", "number"]
    trade = m["trade"]
    assert f"{trade['itl_max_s'].iloc[-1] * 1e3:,.0f} ms at 8,192 tokens" in sheet.loc["05, 06", "number"]
    # The closed forms and invariants behind the rows (chapters 04, 05, 08 and 14 check them in full).
    assert abs(m["ridge"] - 295.3) < 0.05 and 125 < m["prefill_ms"] < 135 and 596 < m["gap_big_ms"] < 597
    assert m["vs"]["best_p99_itl_ms"] < m["vs"]["default_p99_itl_ms"]
    assert m["over"].steps["running"].max() < m["defaults"]["max_num_seqs"]
    assert m["spike"]["itl_max_s"] == trade["itl_max_s"].iloc[-1]  # one scene, one gap


def test_styled_keeps_every_cell(measured):
    sheet = chapter.cheat_sheet(measured)
    html = chapter.styled(sheet).to_html()
    assert html.count("<tr") == len(sheet) + 1  # a header and one row per symptom
    assert all(s.split(";")[0].split(":")[0] in html for s in sheet["symptom"])
