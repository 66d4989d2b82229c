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


def _row(fact: str):
    """The one row that quotes ``fact``."""
    (row,) = [r for r in chapter.ROWS if fact in chapter.fact_names([r])]
    return row


def test_rows_are_symptom_knob_effect_number_setting_where(sheet):
    assert sheet.columns.tolist() == chapter.COLUMNS and len(sheet) == len(chapter.ROWS)
    assert sheet["symptom"].is_unique and (sheet.map(len) > 0).all().all()
    assert all(re.search(r"\d", n) for n in sheet["number"])  # every row quotes a measurement
    assert not any("{" in n for n in sheet["number"])  # every placeholder was filled


def test_every_number_is_a_fact_printed_as_its_chapter_prints_it():
    names = chapter.fact_names()
    assert len(names) >= 30 and set(names) <= set(facts.registry())
    row = _row("knobs_pick_p99_itl_ms")  # the long-stall row
    shown = chapter.cheat_sheet([row], html_links=False)["number"].iloc[0]
    for name in ("knobs_pick_p99_itl_ms", "knobs_default_p99_itl_ms", "rate_near_req_s"):
        assert facts.rendered(name) in shown, name
    bare = chapter.cheat_sheet([_row("over_peak_running")], html_links=False)["number"].iloc[0]
    f = facts.get("over_peak_running")
    assert f"at most {format(facts.value('over_peak_running'), f.fmt)} of" in bare  # {fact:bare}: no unit


def test_each_row_names_the_scenes_of_its_facts():
    row = _row("spike_gap_ms")  # the long-prompt row
    setting = chapter.cheat_sheet([row])["setting"].iloc[0]
    assert setting == scenes.scene("spike").short


def test_each_row_quotes_one_setting(sheet):
    """One scene's facts per row, and the cell names it: a row never sets one scene's number beside another's
    (the cost model of the row's own model and GPU aside, whose numbers hold in that scene too)."""
    assert all(len(chapter.row_settings(row)) == 1 for row in chapter.ROWS), [
        (row.symptom, chapter.row_settings(row)) for row in chapter.ROWS if len(chapter.row_settings(row)) != 1]
    assert not sheet["setting"].str.contains(";").any()
    kv = chapter.cheat_sheet([_row("kv_pool_tokens")])["setting"].iloc[0]  # conv and llama8: one model, one GPU
    assert kv == scenes.scene("conv").short
    padding = chapter.cheat_sheet([_row("pad_cv1")])["setting"].iloc[0]
    assert padding == scenes.scene("padding").short  # the padding scene's row is labelled as such
    assert chapter.fact_names([_row("pad_cv1")]) == ["pad_cv1", "half_empty_cv1"]
    mixed = chapter.Row("s", "k", "e", "{orca_capacity_req_s} and {pad_cv1}", (("static_batching", "x"),))
    assert len(chapter.row_settings(mixed)) == 2  # what the test above would catch


def test_links_go_to_labels_of_existing_chapters(sheet):
    for row in chapter.ROWS:
        for slug, label in row.where:
            assert slug in CHAPTERS and re.fullmatch(r"[a-z0-9-]+", label), (slug, label)
    hrefs = re.findall(r'href="([^"]+)"', " ".join(sheet["where"]))
    texts = [re.findall(r">([^<]+)</a>", w) for w in sheet["where"]]
    assert all(len(set(t)) == len(t) for t in texts), texts  # never "chapter 9, chapter 9"
    two = chapter.cheat_sheet([_row("tuning_usual_gain_max")])["where"].iloc[0]  # two charts of chapter 9
    assert re.findall(r">([^<]+)</a>", two) == ["chapter 9", "its headroom table"]  # a table named as one
    three = chapter.cheat_sheet([chapter.Row("s", "k", "e", "{ridge}", (("tuning", "tuning-map"),
                                                                       ("tuning", "tuning-x")))])["where"].iloc[0]
    assert re.findall(r">([^<]+)</a>", three) == ["chapter 9", "a second chart"]
    assert hrefs and all(re.fullmatch(r"\d\d_[a-z_]+\.html#[a-z0-9-]+", h) for h in hrefs)


def test_styled_keeps_every_cell_and_link(sheet):
    html = chapter.styled(sheet).to_html()
    assert html.count("<tr") == len(sheet) + 1  # a header and one row per piece of advice
    assert html.count("<a href=") == sum(len(r.where) for r in chapter.ROWS)
    assert html.count("<th ") - html.count('class="blank') >= 4 and "how much (measured), and in which setting" in html
    for setting in sheet["setting"]:  # each row's setting sits under its number, in the same cell
        assert f"<em>setting:</em> {setting.replace(chr(39), '&#x27;')}</small>" in html, setting


def test_roofline_rules_are_the_cost_models(cost8b):
    table = chapter.roofline_rules(cost8b)
    assert table["knee (sequences)"].tolist() == [round(cost8b.ideal().knee(c), 1) for c in (0, 1024, 4096)]
