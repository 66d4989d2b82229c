"""Chapter 10 (prefix caching): the offline copy of Mooncake's trace, the analytic hit rate of the synthetic
workloads against the simulator, the hit rate growing with the pool, the reuse gaps, the readings of a sweep
(half the bound, the TTFT factor, where the budget stops mattering), the facts, and the charts' specs (a pool
slider labelled in GiB and workload buttons; the budget on the x axis; every tooltip titled in words)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rawdata import raw_folder
from spec_helpers import axis_titles, marks, walk

import batchlab as bl
from batchlab import viz
from batchlab.chapters import facts
from batchlab.chapters import prefix_caching as chapter


@pytest.fixture(scope="module")
def cost():
    """Llama-3.1-8B on one H100 SXM: the chapter's engine (a 131,072-token context for Mooncake's prompts)."""
    return bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3.1-8b"))


# -- the Mooncake trace, offline ------------------------------------------------------------------------------
@given(st.lists(st.integers(0, 10**9), max_size=40))
@settings(max_examples=200, deadline=None)
def test_runs_encode_and_decode_any_ids(ids):
    assert chapter.decode_runs(chapter.encode_runs(ids)) == ids


def test_runs_are_compact():
    assert chapter.encode_runs([0, 14, 15, 16, 17]) == "0 14-17"
    assert chapter.encode_runs([5, 4, 3]) == "5 4 3" and chapter.encode_runs([]) == ""
    assert chapter.decode_runs("0 14-17 3") == [0, 14, 15, 16, 17, 3]


def test_mooncake_requests_read_offline():
    r = chapter.mooncake_requests()
    assert len(r) == 12_031 and r.prefix_block_tokens == 512
    assert r.arrival_s[0] == 0 and (np.diff(r.arrival_s) >= 0).all()
    assert (len(r) - 1) / r.arrival_s[-1] == pytest.approx(3.40, abs=0.005)  # 3.40 req/s, as recorded
    assert r.prefix_blocks[0].tolist() == list(range(14)) and r.prompt_tokens[0] == 6758
    # Every request's ids cover its prompt in 512-token blocks (the last one partial).
    n_ids = np.diff(r.prefix_offsets)
    assert (n_ids == -(-r.prompt_tokens // 512)).all()
    slow = chapter.mooncake_requests(speedup=0.2, limit=100)
    assert len(slow) == 100 and slow.arrival_s[-1] == pytest.approx(r.arrival_s[99] / 0.2)


@pytest.mark.needs_data
def test_mooncake_table_is_the_raw_trace_and_what_the_script_writes(tmp_path, monkeypatch):
    import importlib.util

    from batchlab.datasets import ENV_VAR
    traces = raw_folder(ENV_VAR, "traces", "raw traces")
    monkeypatch.setenv(ENV_VAR, str(traces))
    raw, ours = bl.replay("mooncake-conversation"), chapter.mooncake_requests()
    for field in ("arrival_s", "prompt_tokens", "output_tokens", "prefix_ids", "prefix_offsets"):
        assert np.array_equal(getattr(raw, field), getattr(ours, field)), field
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("make_mooncake_prefix", root / "scripts" / "make_mooncake_prefix.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "table.csv.gz"
    script.main(["--data-dir", str(traces), "--out", str(out)])
    assert out.read_bytes() == (root / "data" / chapter.MOONCAKE_FILE).read_bytes()


# -- the analytic hit rate ------------------------------------------------------------------------------------
def shared_prefix_hit_rate(n_requests, n_groups, prompts_per_group, system, question, block=16):
    """Closed form for bl.shared_prefix with a pool that never evicts and each prompt computed before the next.

    The first round sends each of the D = G m distinct prompts once: a group's first prompt finds nothing, its
    other m - 1 find the system prompt's full blocks. Every later request repeats a prompt and finds all of it
    but its last token, in whole blocks. (Independent of the shuffled order.)
    """
    prompt = system + question
    whole = (prompt - 1) // block * block
    shared = min(system // block * block, whole)
    distinct = n_groups * prompts_per_group
    assert n_requests >= distinct
    hits = (distinct - n_groups) * shared + (n_requests - distinct) * whole
    return hits / (n_requests * prompt)


@pytest.mark.parametrize("system, question", [(100, 40), (512, 64), (4096, 256), (15, 300)])
def test_shared_prefix_hit_rate_is_the_closed_form(cost, system, question):
    kw = dict(n_groups=3, prompts_per_group=4, system_prompt_tokens=system, question_tokens=question)
    reqs = bl.shared_prefix(40, **kw, output_tokens=4, rate_req_s=1.0, seed=3)  # each done before the next
    expected = shared_prefix_hit_rate(40, 3, 4, system, question)
    assert chapter.cached_bound(reqs) == pytest.approx(expected, abs=1e-12)
    assert chapter.cached_bound(reqs, answers_cached=True) == pytest.approx(expected, abs=1e-12)
    s = chapter.run_summary(reqs, cost, num_kv_blocks=chapter.pool_blocks(cost, 32))
    assert s["prefix_cache_hit_rate"] == pytest.approx(expected, abs=1e-12)
    off = chapter.run_summary(reqs, cost, num_kv_blocks=chapter.pool_blocks(cost, 32), enable_prefix_caching=False)
    assert off["prefix_cache_hit_rate"] == 0


def multi_turn_bounds(turns, system, user, output, n_conversations, block=16):
    """Closed forms for bl.multi_turn (shared system prompt, lengths multiples of the block): (prompt blocks
    cached, answer blocks cached too). Turn k's prompt is S + k (U + O) + U; it finds the previous turn's prompt
    (or prompt and answer) whole; a first turn finds the system prompt once some conversation has sent it."""
    prompts = [system + k * (user + output) + user for k in range(turns)]
    prompt_only = answers = (n_conversations - 1) * system
    for k in range(1, turns):
        prompt_only += n_conversations * min(prompts[k - 1], prompts[k] - 1) // block * block
        answers += n_conversations * min(prompts[k - 1] + output, prompts[k] - 1) // block * block
    total = n_conversations * sum(prompts)
    return prompt_only / total, answers / total


def test_multi_turn_bound_is_the_closed_form_and_bounds_the_replay(cost):
    reqs = bl.multi_turn(5, 4, 64, 32, 48, rate_req_s=0.05, turn_gap_s=20.0, seed=1)
    prompt_only, answers = multi_turn_bounds(4, 64, 32, 48, 5)
    assert chapter.cached_bound(reqs) == pytest.approx(prompt_only, abs=1e-12)
    assert chapter.cached_bound(reqs, answers_cached=True) == pytest.approx(answers, abs=1e-12)
    hit = chapter.run_summary(reqs, cost, num_kv_blocks=chapter.pool_blocks(cost, 32))["prefix_cache_hit_rate"]
    assert prompt_only - 1e-12 <= hit <= answers + 1e-12


def test_hit_rate_grows_with_the_pool_on_the_trace(cost):
    trace = {"Mooncake conversations": chapter.mooncake_requests(speedup=0.2, limit=1500)}
    sweep = chapter.pool_sweep(cost, trace, [16, 64, 256, 1024], caching=(True,))
    hit = sweep.sort_values("pool_gib")["prefix_cache_hit_rate"].to_numpy()
    assert (np.diff(hit) >= 0).all() and hit[-1] > 2 * hit[0]
    assert hit[-1] <= chapter.cached_bound(trace["Mooncake conversations"]) + 1e-12
    assert sweep["pool_gib"].tolist() == [16, 64, 256, 1024] and (sweep["completed"] == 1500).all()


def test_pool_blocks_and_the_default_pool(cost):
    assert chapter.pool_blocks(cost, 16) == 16 * 2**30 // (16 * 128 * 1024) + 1  # 128 KiB per token, a null block
    sweep = chapter.pool_sweep(cost, {"w": bl.shared_prefix(20, 2, 2, 64, 16, 4, seed=0)}, [None])
    assert sweep["default_pool"].all() and (sweep["num_kv_blocks"] == cost.kv_pool_blocks()).all()
    assert sweep["caching"].tolist() == [True, False]


def test_reuse_gaps_name_the_request_continued():
    reqs = bl.Requests([0.0, 1.0, 5.0], [48, 20, 64], [4, 6, 4], [[1, 2, 3], [9, 10], [1, 2, 3, 7]], 16)
    gaps = chapter.reuse_gaps(reqs)
    assert len(gaps) == 1  # request 2 continues request 0 (ids 1, 2, 3), past request 1
    assert gaps.iloc[0].tolist() == [5.0, 20 + 6, 48]


# -- charts ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_sweep(cost):
    workloads = {"shared system prompts": bl.shared_prefix(200, 4, 4, 512, 64, 8, rate_req_s=8.0, seed=0),
                 "multi-turn chats": bl.multi_turn(20, 3, 256, 64, 32, rate_req_s=1.0, seed=0)}
    return chapter.pool_sweep(cost, workloads, [16, 32, 64, None])


def tooltip_fields(spec) -> list[dict]:
    """Every tooltip field of a spec (layers and concats)."""
    found = []
    for tips in walk({k: v for k, v in spec.items() if k != "datasets"}, "tooltip"):
        for t in tips if isinstance(tips, list) else [tips]:
            found.append(t if isinstance(t, dict) else {"field": t})
    return found


def assert_tooltips_in_words(spec):
    tips = tooltip_fields(spec)
    assert tips
    for t in tips:
        assert isinstance(t.get("title"), str) and t["title"].strip(), t
        bare = [w for w in t["title"].replace("max_num_batched_tokens", "").split() if "_" in w]
        assert not bare, t  # no code names but vLLM's knob
        if t["field"].endswith(("_ms", "_s", "_gib", "_tokens")):
            assert "(" in t["title"], t  # the unit


def test_pool_chart_spec(small_sweep):
    spec = chapter.pool_chart(small_sweep, 55.8, pool_gib=32).to_dict()
    assert len(spec["hconcat"]) == 2 and spec["resolve"]["scale"]["color"] == "independent"
    binds = {p["name"]: p["bind"] for p in spec["params"]}
    assert binds["workload_pick"]["input"] == "radio"
    assert binds["workload_pick"]["options"] == ["shared system prompts", "multi-turn chats"]
    # The pool is a slider, one stop per pool in ascending size, vLLM's own among them, its value in words.
    stops = chapter.pool_stops(small_sweep)
    n = stops["pool_step"].nunique()
    assert binds["pool_step"]["input"] == "range"
    assert (binds["pool_step"]["min"], binds["pool_step"]["max"], binds["pool_step"]["step"]) == (0, n - 1, 1)
    labels = viz._slider_labels(spec)["pool_step"]["labels"]
    grid = [chapter._pool_label(round(g)) for g in sorted(small_sweep.loc[~small_sweep["default_pool"], "pool_gib"])]
    assert [t for t in labels if not t.startswith("vLLM's pool")] == list(dict.fromkeys(grid))
    if small_sweep["default_pool"].any():
        own = small_sweep.loc[small_sweep["default_pool"], "pool_gib"].iloc[0]
        assert f"vLLM's pool, {own:.1f} GiB" in labels
    start = {p["name"]: p["value"] for p in spec["params"]}
    assert labels[int(start["pool_step"])] == "32 GiB" and start["workload_pick"] == "shared system prompts"
    assert {"line", "point", "rule", "text", "bar"} <= marks(spec)
    assert {"prefix-cache hit rate", "time to first token", "KV pool (log scale)"} <= set(axis_titles(spec))
    filters = [f for f in walk(spec, "filter") if isinstance(f, str)]
    assert any("workload_pick" in f and "pool_step" in f for f in filters)
    assert_tooltips_in_words(spec)
    # The bars read their TTFT by the book's rule, and so do the ticks of their axis (in ms, "1.5 s" above 1 s).
    assert any(c.get("as") == "ttft_text" for c in walk(spec, "transform") for c in c if isinstance(c, dict))
    bar_axis = next(e["y"]["axis"] for e in walk(spec, "encoding") if e.get("y", {}).get("field") == "ttft_ms")
    assert "' ms'" in bar_axis["labelExpr"] and "' s'" in bar_axis["labelExpr"]
    assert bar_axis["minExtent"] == bar_axis["maxExtent"]  # the panel does not move when the ticks widen
    with pytest.raises(ValueError, match="workload must be one of"):
        chapter.pool_chart(small_sweep, 55.8, workload="chats")


def test_pool_chart_opens_on_vllms_pool(small_sweep):
    if not small_sweep["default_pool"].any():
        pytest.skip("the small sweep has no run on vLLM's pool")
    spec = chapter.pool_chart(small_sweep, 55.8).to_dict()
    start = {p["name"]: p["value"] for p in spec["params"]}
    assert viz._slider_labels(spec)["pool_step"]["labels"][int(start["pool_step"])].startswith("vLLM's pool, ")


def test_gain_and_other_tables(small_sweep):
    styled = chapter.gain_table(small_sweep[small_sweep["default_pool"]])
    shown = styled.data
    assert shown.columns.tolist() == ["workload", "prefix caching", "hit rate", "median TTFT", "p99 TTFT",
                                      "GPU busy"]
    # The TTFTs stay numbers (ms) in the data and read by the book's duration rule, the unit in each cell.
    assert shown["p99 TTFT"].dtype.kind == "f"
    html = styled.to_html()
    for ms in shown["median TTFT"].tolist() + shown["p99 TTFT"].tolist():
        assert viz.format_duration(ms).replace(" ", "\u00a0") in html
    assert shown["prefix caching"].tolist() == ["off", "on"] * 2  # each workload off, then on
    assert shown["workload"].tolist() == ["shared system prompts"] * 2 + ["multi-turn chats"] * 2
    assert (shown["hit rate"].to_numpy()[::2] == 0).all()  # off finds nothing
    shown = chapter.preemption_table(small_sweep, "multi-turn chats", [16, 32]).data
    assert shown["KV pool (GiB)"].tolist() == [16, 16, 32, 32] and "tokens recomputed" in shown
    assert "p99 TTFT" in shown and chapter.duration_cell(1101.5) == "1.10\u00a0s"
    assert "throughput (req/s)" in chapter.throughput_table(small_sweep[small_sweep["default_pool"]]).data
    table = chapter.workload_table({"w": bl.shared_prefix(40, 2, 2, 64, 16, 4, rate_req_s=2.0, seed=0)})
    assert table.loc[0, "n_requests"] == 40 and table.loc[0, "prompt_tokens"] == 80
    assert table.loc[0, "bound"] == pytest.approx(shared_prefix_hit_rate(40, 2, 2, 64, 16))


def test_budget_chart_spec_puts_the_budget_on_the_axis():
    rows = [(True, b, 22.0, 55.0) for b in (2048, 4096, 8192)] + [(True, 512, 15.0, 65.0)]
    rows += [(False, b, 10.0 * b / 256, 600.0 + 256e3 / b) for b in (512, 2048, 4096, 8192)]
    points = pd.DataFrame(rows, columns=["caching", "max_num_batched_tokens", "p99_itl_ms", "p99_ttft_ms"])
    points["prefix_cache_hit_rate"] = np.where(points["caching"], 0.8, 0.0)
    spec = chapter.budget_chart(points).to_dict()
    assert len(spec["hconcat"]) == 2 and "text" not in marks(spec)  # no label can overlap another
    assert all(p["mark"]["point"] is True for p in spec["hconcat"])
    xs = [p["encoding"]["x"] for p in spec["hconcat"]]
    assert all(x["field"] == "max_num_batched_tokens" and x["scale"]["type"] == "log" for x in xs)
    assert all(x["axis"]["values"] == [512, 2048, 4096, 8192] and x["axis"]["format"] == "," for x in xs)
    assert {p["encoding"]["y"]["field"] for p in spec["hconcat"]} == {"p99_itl_ms", "p99_ttft_ms"}
    assert {p["encoding"]["y"]["scale"]["type"] for p in spec["hconcat"]} == {"log"}
    assert {"p99 time to first token (ms, log scale)", "p99 inter-token latency (ms, log scale)"} <= set(
        axis_titles(spec))
    assert_tooltips_in_words(spec)
    # The tooltips read each latency by the book's duration rule ("1.10 s", not "1,102 ms").
    tips = {t["field"]: t for t in tooltip_fields(spec)}
    assert {"p99_itl_text", "p99_ttft_text"} <= set(tips) and not {"p99_itl_ms", "p99_ttft_ms"} & set(tips)
    calc = {c["as"]: c["calculate"] for c in walk(spec, "transform") for c in c if "calculate" in c}
    assert calc["p99_ttft_text"] == viz.duration_text("p99_ttft_ms")
    assert calc["p99_itl_text"] == viz.duration_text("p99_itl_ms")
    # Every point lies above a labelled tick: the lowest tick is at or below the lowest value, inside the domain.
    for p in spec["hconcat"]:
        y = p["encoding"]["y"]
        values = points[y["field"]]
        (lo, hi), ticks = y["scale"]["domain"], y["axis"]["values"]
        assert lo < min(ticks) <= values.min() and values.max() < hi and max(ticks) <= hi
    ttft = next(p["encoding"]["y"] for p in spec["hconcat"] if p["encoding"]["y"]["field"] == "p99_ttft_ms")
    assert ttft["axis"]["values"][0] == 50  # the caching-on line, 55-65 ms, sits above "50"


def test_log_axis_labels_the_whole_range():
    domain, ticks = chapter.log_axis([63.9, 72.9, 84.8, 600.5, 1101.5])
    assert ticks == [50, 100, 200, 300, 500, 1000] and domain[0] < 50 and domain[1] > 1101.5
    assert chapter.log_axis([10.18, 163.3])[1] == [10, 20, 30, 50, 100]  # a tick at the lowest value's own decade
    assert chapter.log_axis([0.064, 0.3])[1] == [0.05, 0.1, 0.2, 0.3]
    assert chapter.log_axis([9.9, 11.0])[1] == [5, 10]  # the tick below may be half a decade down
    with pytest.raises(ValueError, match="above 0"):
        chapter.log_axis([0.0, np.nan])


def test_same_requests_compares_every_field():
    a = bl.shared_prefix(40, 2, 2, 64, 16, 4, rate_req_s=2.0, seed=0)
    assert chapter.same_requests(a, bl.shared_prefix(40, 2, 2, 64, 16, 4, rate_req_s=2.0, seed=0))
    assert not chapter.same_requests(a, bl.shared_prefix(40, 2, 2, 64, 16, 4, rate_req_s=2.0, seed=1))  # arrivals
    assert not chapter.same_requests(a, bl.shared_prefix(40, 2, 2, 64, 16, 5, rate_req_s=2.0, seed=0))  # outputs
    assert not chapter.same_requests(a, bl.Requests(a.arrival_s, a.prompt_tokens, a.output_tokens))  # no prefix ids


# -- readings of a sweep, and the facts --------------------------------------------------------------------------
def test_half_bound_pool_and_ttft_factor(small_sweep):
    grid = pd.DataFrame({"workload": "w", "caching": [True, True, True, False], "default_pool": False,
                         "pool_gib": [32.0, 16.0, 64.0, 16.0], "prefix_cache_hit_rate": [0.2, 0.1, 0.4, 0.0]})
    assert chapter.hit_curve(grid, "w").tolist() == [0.1, 0.2, 0.4]  # caching on, sorted by pool
    assert chapter.half_bound_pool(grid, "w", 0.4) == 32  # reached exactly at 32 GiB
    assert chapter.half_bound_pool(grid, "w", 0.39) == 32 and chapter.half_bound_pool(grid, "w", 0.41) == 64
    assert chapter.half_bound_pool(grid, "w", 0.2) == 16
    assert np.isnan(chapter.half_bound_pool(grid, "w", 0.81))
    at = chapter.at_default_pool(small_sweep)
    f = chapter.ttft_factor(small_sweep, "multi-turn chats", "p99_ttft_ms")
    assert f == at.loc[("multi-turn chats", False), "p99_ttft_ms"] / at.loc[("multi-turn chats", True), "p99_ttft_ms"]
    assert f > 1  # the cache lowers the chats' TTFT
    with pytest.raises(ValueError, match="vLLM's own pool"):
        chapter.at_default_pool(small_sweep[~small_sweep["default_pool"]])
    with pytest.raises(ValueError, match="no run with caching on"):
        chapter.hit_curve(small_sweep, "nothing")


def test_flat_budget_is_where_the_runs_stop_changing():
    def runs(itl):
        return pd.DataFrame({"caching": True, "max_num_batched_tokens": [256, 512, 1024, 2048],
                             "p99_itl_ms": itl, "p99_ttft_ms": 50.0})
    assert chapter.flat_budget(runs([10.0, 20.0, 22.0, 22.0])) == 1024
    assert chapter.flat_budget(runs([22.0, 20.0, 22.0, 22.0])) == 1024  # equal again later is not flat
    assert chapter.flat_budget(runs([22.0] * 4)) == 256
    assert chapter.flat_budget(runs([10.0, 20.0, 21.0, 22.0])) == 2048
    with pytest.raises(ValueError, match="caching=False"):
        chapter.flat_budget(runs([1.0] * 4), caching=False)


def test_pool_blocks_refuses_an_empty_pool(cost):
    with pytest.raises(ValueError, match="pool_gib"):
        chapter.pool_blocks(cost, 0)


def test_facts_are_the_chapter_runs():
    """The facts read the chapter's own runs: the half-bound pool is the first grid pool at half the bound."""
    sweep = chapter.chapter_sweep()
    bound = facts.value("prefix_moon_bound")
    curve = chapter.hit_curve(sweep, chapter.MOONCAKE)
    half = facts.value("prefix_moon_half_pool_gib")
    assert curve[half] >= bound / 2 > curve[curve.index < half].max()
    assert facts.value("prefix_moon_half_ratio") == pytest.approx(half / facts.value("prefix_pool_gib"))
    assert facts.value("prefix_moon_hit") < bound  # vLLM's pool finds a fraction of what recurs
    assert facts.value("prefix_sp_ttft_factor") > 2 and facts.value("prefix_sp_throughput_factor") > 2
    assert facts.value("prefix_chat_flat_budget") in chapter.MAX_NUM_BATCHED_TOKENS
    assert facts.get("prefix_moon_hit").chapter == "prefix_caching"
