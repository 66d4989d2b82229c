"""Chapter 12 (cheat sheet): every row quotes the book's facts as their chapters print them, names its setting and
links to a chart at a label of its chapter."""
from __future__ import annotations

import re

import pytest

from batchlab.chapters import CHAPTERS, facts, scenes
from batchlab.chapters import cheat_sheet as chapter


@pytest.fixture(scope="module")
def sheet():
    return chapter.cheat_sheet()


def test_rows_are_symptom_knob_effect_number_setting_where(sheet):
    assert sheet.columns.tolist() == chapter.COLUMNS and len(sheet) == len(chapter.ROWS)
    assert sheet["symptom"].is_unique and (sheet.map(len) > 0).all().all()
    assert all(re.search(r"\d", n) for n in sheet["number"])  # every row quotes a measurement
    assert not any("{" in n for n in sheet["number"])  # every placeholder was filled


def test_every_number_is_a_fact_printed_as_its_chapter_prints_it():
    names = chapter.fact_names()
    assert len(names) >= 30 and set(names) <= set(facts.registry())
    row = chapter.ROWS[6]  # the long-stall row
    shown = chapter.cheat_sheet([row], html_links=False)["number"].iloc[0]
    for name in ("knobs_pick_p99_itl_ms", "knobs_default_p99_itl_ms", "rate_near_req_s"):
        assert facts.rendered(name) in shown, name
    bare = chapter.cheat_sheet([chapter.ROWS[7]], html_links=False)["number"].iloc[0]
    f = facts.get("over_peak_running")
    assert f"at most {format(facts.value('over_peak_running'), f.fmt)} of" in bare  # {fact:bare}: no unit


def test_each_row_names_the_scenes_of_its_facts():
    row = chapter.ROWS[3]  # the long-prompt row
    setting = chapter.cheat_sheet([row])["setting"].iloc[0]
    assert setting == scenes.scene("spike").short


def test_links_go_to_labels_of_existing_chapters(sheet):
    for row in chapter.ROWS:
        for slug, label in row.where:
            assert slug in CHAPTERS and re.fullmatch(r"[a-z0-9-]+", label), (slug, label)
    hrefs = re.findall(r'href="([^"]+)"', " ".join(sheet["where"]))
    assert hrefs and all(re.fullmatch(r"\d\d_[a-z_]+\.html#[a-z0-9-]+", h) for h in hrefs)


def test_styled_keeps_every_cell_and_link(sheet):
    html = chapter.styled(sheet).to_html()
    assert html.count("<tr") == len(sheet) + 1  # a header and one row per piece of advice
    assert html.count("<a href=") == sum(len(r.where) for r in chapter.ROWS)


def test_roofline_rules_are_the_cost_models(cost8b):
    table = chapter.roofline_rules(cost8b)
    assert table["knee (sequences)"].tolist() == [round(cost8b.ideal().knee(c), 1) for c in (0, 1024, 4096)]
