"""The facts layer: every fact registered once with a real scene and chapter, the disk cache keyed by arguments
and source, and the book-wide rule (check_pages) failing on each planted disagreement."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from batchlab.chapters import CHAPTERS, facts, scenes


def test_every_fact_names_a_scene_a_chapter_and_a_value():
    reg = facts.registry()
    assert len(reg) >= 40
    for name, f in reg.items():
        assert f.name == name and f.scene in scenes.SCENES and f.chapter in CHAPTERS, name
        assert f.text and not f.text.endswith("."), name  # one sentence, glued mid-prose
        v = facts.value(name)
        assert isinstance(v, (bool, int, float, str)), name
        if f.fmt == facts.RATE:
            assert isinstance(v, float) and f.unit == "req/s", name
        elif f.fmt:
            format(v, f.fmt)  # the page's format applies


def test_rendered_is_the_format_with_the_unit():
    assert facts.rendered("ridge") == f"{facts.value('ridge'):.1f} sequences"
    assert facts.rendered("mfu400_8") == f"{facts.value('mfu400_8'):.0%}"  # a share carries no unit


def test_unknown_fact_is_a_value_error_naming_the_known_ones():
    with pytest.raises(ValueError, match="no fact 'capacity'.*capacity_req_s"):
        facts.get("capacity")


def test_fact_registration_checks_its_name_and_chapter():
    with pytest.raises(ValueError, match="lowercase"):
        facts.fact("Capacity", scene="conv", chapter="two_knobs", text="x")
    with pytest.raises(ValueError, match="chapter 'twoknobs'"):
        facts.fact("x_y", scene="conv", chapter="twoknobs", text="x")


def test_glue_glues_each_fact_under_its_name():
    seen = {}
    out = facts.glue(lambda name, value, display: seen.update({name: (value, display)}), "ridge", "capacity_req_s")
    assert out == {"ridge": facts.value("ridge"), "capacity_req_s": facts.value("capacity_req_s")}
    assert seen["ridge"] == (facts.value("ridge"), False) and type(seen["ridge"][0]) is float


def test_scene_facts_agree_with_their_definitions():
    """A few facts against what they say they are, computed here the long way."""
    c = scenes.scene("llama8").cost()
    assert abs(facts.value("ridge") - c.hardware.flops_bf16 / c.hardware.hbm_bytes_per_s) < 1e-9  # b_w = 2
    assert facts.value("knee_1024") == c.ideal().knee(1024)
    assert facts.value("fixed_step_sync_ms") == pytest.approx((c.overhead_s + c.cpu_step_s) * 1e3)
    assert facts.value("fixed_step_async_ms") < facts.value("fixed_step_sync_ms")
    rates = [facts.value(f"rate_{k}_req_s") for k in ("light", "moderate", "near", "over")]
    assert rates == sorted(rates) and rates[2] == round(0.95 * facts.value("capacity_req_s"), 1)


# -- the disk cache ------------------------------------------------------------------------------------------------
def test_memo_caches_by_argument_and_returns_copies(tmp_path, monkeypatch):
    monkeypatch.setenv(facts.CACHE_ENV, str(tmp_path))
    calls = []

    @facts.memo
    def experiment(n, scale=1.0, executor=None):
        calls.append(n)
        return {"values": np.arange(n) * scale}

    a = experiment(3)
    a["values"][0] = 99  # the caller's copy
    b = experiment(3)
    assert calls == [3] and b["values"].tolist() == [0, 1, 2]
    experiment(3, scale=2.0)
    assert calls == [3, 3]  # another argument, another run
    files = sorted(tmp_path.glob("*.pkl"))
    assert len(files) == 2 and pickle.loads(files[0].read_bytes())["values"].size == 3
    facts._MEMORY.clear()  # a new process: read from disk, not rerun
    assert experiment(3)["values"].tolist() == [0, 1, 2] and calls == [3, 3]
    assert experiment(3, executor=object()) and calls == [3, 3, 3]  # an executor bypasses the cache


def test_memo_key_follows_the_source(tmp_path, monkeypatch):
    monkeypatch.setenv(facts.CACHE_ENV, str(tmp_path))
    calls = []

    @facts.memo
    def experiment(n):
        calls.append(n)
        return n

    experiment(1)
    facts._MEMORY.clear()
    monkeypatch.setattr(facts, "source_hash", lambda: "an edited package")
    experiment(1)
    assert calls == [1, 1]


def test_cache_can_be_turned_off(monkeypatch):
    monkeypatch.setenv(facts.CACHE_ENV, "off")
    assert facts.cache_dir() is None


# -- the book-wide rule ----------------------------------------------------------------------------------------------
FACTS = {"capacity_req_s": 20.841738829593623, "spike_decoders": 115, "verdict_gap": "does not hold (the number)"}
RENDER = {"capacity_req_s": "20.8", "spike_decoders": "115", "verdict_gap": "does not hold (the number)"}


def test_pages_that_agree_pass():
    glued = {"a": {"capacity_req_s": "20.841738829593623", "n_requests": "3000"},
             "b": {"capacity_req_s": "20.841738829593623", "n_requests": "1000", "spike_decoders": "115"}}
    md = {"a": "capacity {glue:text}`capacity_req_s:.1f` req/s", "b": "$20.8$ and `20.8` are not prose"}
    assert facts.check_pages(glued, md, FACTS, RENDER) == []


def test_a_fact_glued_with_another_value_fails():
    glued = {"a": {"capacity_req_s": "20.841738829593623"}, "b": {"capacity_req_s": "20.4"}}
    problems = facts.check_pages(glued, {}, FACTS, RENDER)
    assert problems == ["b: glues fact capacity_req_s = 20.4, but the fact is 20.841738829593623"]


def test_a_fact_recomputed_under_a_local_name_fails():
    problems = facts.check_pages({"a": {"capacity": "20.841738829593623", "cap_int": "115"}}, {}, FACTS, RENDER)
    assert problems == ["a: glues capacity = 20.841738829593623, the value of fact capacity_req_s: glue the fact"]
    # integers repeat by chance, so only the non-integer fact is matched; strings that long are matched too
    problems = facts.check_pages({"a": {"mine": "'does not hold (the number)'"}}, {}, FACTS, RENDER)
    assert problems and "fact verdict_gap" in problems[0]


def test_a_facts_printed_twin_in_another_format_fails():
    texts = {"capacity_req_s": "20.8"}
    ok = {"a": {"capacity_req_s_text": "'20.8'"}}
    assert facts.check_pages(ok, {}, FACTS, RENDER, texts) == []
    problems = facts.check_pages({"a": {"capacity_req_s_text": "'20.84'"}}, {}, FACTS, RENDER, texts)
    assert problems == ["a: glues capacity_req_s_text = '20.84', but fact capacity_req_s prints as '20.8'"]


def test_a_rate_fact_prints_by_the_rate_rule():
    from batchlab import viz

    name = "tuning_itl_default_max_rate_req_s"
    assert facts.get(name).fmt == facts.RATE
    assert facts.formatted(name) == viz.format_rate(facts.value(name))
    assert facts.rendered(name) == viz.format_rate(facts.value(name)) + " req/s"


def test_a_fact_typed_by_hand_fails():
    problems = facts.check_pages({}, {"intro": "one H100 serves 20.8 req/s of it"}, FACTS, RENDER)
    assert problems == ["intro: types '20.8', the value of fact capacity_req_s, by hand: glue it"]
    assert facts.check_pages({}, {"intro": "120.8 or 20.85 are other numbers"}, FACTS, RENDER) == []
