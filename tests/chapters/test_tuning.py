"""Chapter 09 (tuning for your traffic): the tuning grid's layout and invariants (one pick and one default per
workload, SLO and load, the pick's goodput within 1 % of the largest and at least the default's, its p99 / bound
within 1 % of the smallest among those, and of those full ties the one nearest vLLM's default, then the smaller
cap; refused pairs without numbers), the picks against the grid, the headroom against simulation, goodput and
p99 read as two tests, the example trace read back by the loaders, the tables' headers, the pick marked where it
is the default (and read as a tie where its gain is within rounding of 1), and the goodput map's spec (three
radio rows labelled in words and ms, a heatmap on the two knobs in tokens and sequences, the pick, default and
refused marks, the readout filtered by all three controls)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from spec_helpers import marks, titles, walk

import batchlab as bl
from batchlab.chapters import tuning as chapter
from batchlab.tune import at_rate

SLOS = ["ttft:500 tpot:50", "ttft:200 tpot:25"]
SLO_NAMES = {s: chapter.slo_label(bl.parse_goodput(s)) for s in SLOS}
WORKLOADS = {"azure-conv-2023": "Azure conversation"}
LOADS = {1.0: "the trace's rate", 4.0: "4 × the trace's rate"}


@pytest.fixture(scope="module")
def tuned(cost8b):
    return chapter.tuning_grid(cost8b, list(WORKLOADS), SLOS, list(LOADS), 200, seed=1)


def test_slo_label_reads_in_ms():
    assert SLO_NAMES == {"ttft:500 tpot:50": "TTFT 500 ms, TPOT 50 ms", "ttft:200 tpot:25": "TTFT 200 ms, TPOT 25 ms"}
    assert chapter.slo_label(bl.SLO(e2el_ms=1500)) == "E2EL 1,500 ms"


def test_tuning_grid_layout_and_invariants(tuned):
    grid, picks = tuned
    assert list(grid.columns) == chapter.GRID_COLUMNS and list(picks.columns) == chapter.PICK_COLUMNS
    assert len(grid) == 64 * 2 * 2 and len(picks) == 4
    for (_, spec, load), g in grid.groupby(["workload", "slo", "load"]):
        assert g["best"].sum() == 1 and g["vllm_default"].sum() == 1
        assert g.loc[g["vllm_default"], ["max_num_seqs", "max_num_batched_tokens"]].values.tolist() == [[1024, 8192]]
        best = g[g["best"]].iloc[0]
        top, dflt = g["request_goodput"].max(), g.loc[g["vllm_default"], "request_goodput"].item()
        assert best["request_goodput"] >= max(0.99 * top, dflt) and best["share_of_top"] >= 0.99
        candidates = g[~g["vllm_refuses"] & (g["request_goodput"] >= max(0.99 * top, dflt))]
        least = candidates["slo_load"].min()
        assert least <= best["slo_load"] <= least * 1.01  # the most headroom among the ties, to within 1 %
        full_ties = candidates[candidates["slo_load"] <= least * 1.01]  # loads within 1 %: full ties
        assert best.name in full_ties.index
        distance = (np.abs(np.log2(full_ties["max_num_seqs"] / 1024))
                    + np.abs(np.log2(full_ties["max_num_batched_tokens"] / 8192)))
        best_distance = abs(np.log2(best["max_num_seqs"] / 1024)) + abs(np.log2(best["max_num_batched_tokens"] / 8192))
        assert best_distance == distance.min()  # then the pair nearest vLLM's default
        nearer = full_ties[(distance < best_distance)
                           | ((distance == best_distance) & (full_ties["max_num_seqs"] < best["max_num_seqs"]))]
        assert nearer.empty  # and, equally near, the smaller cap
        if full_ties["vllm_default"].any():  # the traffic cannot tell the default from the pick: the default
            assert best["vllm_default"]
        refused = g[g["vllm_refuses"]]
        assert refused[["max_num_seqs", "max_num_batched_tokens"]].values.tolist() == [[1024, 512]]
        assert refused["share_of_top"].isna().all() and refused["p99_ttft_ms"].isna().all()
        assert refused["slo_load"].isna().all()
        assert g.loc[~g["vllm_refuses"], "share_of_top"].between(0, 1).all()
        pick = picks[(picks["slo"] == spec) & (picks["load"] == load)].iloc[0]
        assert pick["best_goodput"] == best["request_goodput"] >= pick["default_goodput"]
        assert pick["best_slo_load"] == best["slo_load"] and pick["top_goodput"] == top
        assert pick["gain"] == pytest.approx(pick["best_goodput"] / pick["default_goodput"])
        assert pick["best_goodput"] <= pick["offered_req_s"] * (1 + 1e-12)  # goodput never beats throughput
    trace_rate = bl.trace_stats("azure-conv-2023")["rate_req_per_s"]
    assert sorted(picks["rate_req_s"].unique()) == pytest.approx([trace_rate, 4 * trace_rate])
    heavy = grid[(grid["load"] == 4.0) & ~grid["vllm_refuses"]]
    light = grid[(grid["load"] == 1.0) & ~grid["vllm_refuses"]]
    assert heavy["p99_ttft_ms"].median() > light["p99_ttft_ms"].median()  # more load, longer queues


def test_tuning_grid_matches_a_direct_simulation(cost8b, tuned):
    grid, _ = tuned
    row = grid[(grid["slo"] == SLOS[1]) & (grid["load"] == 1.0) & (grid["max_num_seqs"] == 16)
               & (grid["max_num_batched_tokens"] == 2048)].iloc[0]
    stream = bl.preset("azure-conv-2023", 200, rate_req_s=row["rate_req_s"], seed=1)
    res = bl.simulate(stream, "chunked", cost8b, max_num_seqs=16, max_num_batched_tokens=2048)
    s = res.summary(slo=bl.parse_goodput(SLOS[1]))
    assert row["request_goodput"] == s["request_goodput"] and row["slo_met"] == s["slo_met"]
    assert row["p99_ttft_ms"] == s["p99_ttft_ms"]
    assert row["slo_load"] == pytest.approx(max(s["p99_ttft_ms"] / 200, s["p99_tpot_ms"] / 25), rel=1e-12)


def test_headroom_brackets_by_simulation(cost8b, tuned):
    _, picks = tuned
    rates = chapter.headroom(cost8b, picks.iloc[:1], 200, seed=1)
    row = rates.iloc[0]
    assert row["default_max_rate_req_s"] > 0 and row["best_max_rate_req_s"] > 0
    assert row["rate_ratio"] == pytest.approx(row["best_max_rate_req_s"] / row["default_max_rate_req_s"])
    stream = bl.preset("azure-conv-2023", 200, rate_req_s=row["rate_req_s"], seed=1)
    slo = bl.parse_goodput(row["slo"])
    ok = bl.simulate(at_rate(stream, row["default_max_rate_req_s"]), "chunked", cost8b, record_tokens=False)
    assert slo.met_by(ok.summary())


def test_slo_readings_tell_goodput_from_p99(cost8b):
    # bounds no request can miss, and bounds every request misses
    stream = bl.preset("azure-conv-2023", 300, seed=3)
    res = bl.simulate(stream, "chunked", cost8b, record_tokens=False)
    r = chapter.slo_readings(res, ["ttft:100000 tpot:100000", "ttft:1 tpot:1"])
    assert r["slo"].tolist() == ["ttft:100000 tpot:100000", "ttft:1 tpot:1"]
    assert r["missed"].tolist() == [0, res.summary()["completed"]]
    assert r["request_goodput"].iloc[0] == pytest.approx(r["request_throughput"].iloc[0])
    assert r["slo_met"].tolist() == [True, False]
    html = chapter.slo_readings_table(r, {s: s for s in r["slo"]}).to_html()
    for header in ("goodput (req/s)", "requests missing a bound", "p99 TTFT (ms)", "p99s within the SLO"):
        assert header in html


def test_example_trace_reads_back(tmp_path):
    from batchlab.loaders import load_workload
    stream = bl.preset("azure-code-2023", 50, seed=2)
    path = tmp_path / "my_trace.csv"
    chapter.write_example_trace(path, stream)
    back = load_workload(path).requests
    np.testing.assert_allclose(back.arrival_s, stream.arrival_s - stream.arrival_s[0])
    assert back.prompt_tokens.tolist() == stream.prompt_tokens.tolist()
    assert back.output_tokens.tolist() == stream.output_tokens.tolist()


def test_tables_have_units_in_their_headers(cost8b, tuned):
    _, picks = tuned
    html = chapter.picks_table(picks, SLO_NAMES, WORKLOADS).to_html()
    assert "best: goodput (req/s)" in html and "×" in html and "TTFT 500 ms, TPOT 50 ms" in html
    assert "best: p99 / bound" in html and "vLLM default: p99 / bound" in html
    rates = picks.iloc[:1].assign(best_max_rate_req_s=0.0, default_max_rate_req_s=12.34, rate_ratio=np.nan)
    html = chapter.headroom_table(rates, SLO_NAMES, WORKLOADS).to_html()
    assert "none holds" in html and "12.3" in html and "largest rate (req/s)" in html
    assert "best / default (largest rate)" in html and "–" in html
    rates = rates.assign(best_max_rate_req_s=13.0, rate_ratio=13.0 / 12.34)
    assert "105%" in chapter.headroom_table(rates, SLO_NAMES, WORKLOADS).to_html()


def test_pick_that_is_the_default_is_marked(tuned):
    _, picks = tuned
    same = picks.assign(best_max_num_seqs=1024, best_max_num_batched_tokens=8192)
    moved = picks.assign(best_max_num_seqs=64, best_max_num_batched_tokens=2048)
    assert chapter.is_default_pick(same).all() and not chapter.is_default_pick(moved).any()
    assert "1,024 / 8,192 (vLLM default)" in chapter.picks_table(same, SLO_NAMES, WORKLOADS).to_html()
    assert "(vLLM default)" not in chapter.picks_table(moved, SLO_NAMES, WORKLOADS).to_html()
    labels = chapter._map_readout(same, list(WORKLOADS), SLOS, list(LOADS))["label"]
    assert labels.str.startswith("pick: 1,024 sequences, 8,192 tokens").all()
    assert labels.str.contains("\nthe pick is the vLLM default itself").all()
    labels = chapter._map_readout(moved, list(WORKLOADS), SLOS, list(LOADS))["label"]
    assert labels.str.startswith("pick: 64 sequences, 2,048 tokens").all()
    assert labels.str.contains("\nvLLM default: ").all() and not labels.str.contains("itself").any()
    assert not chapter.is_tie(same).any()  # the default itself is not a tie with another pair


def test_pick_that_ties_the_default_to_rounding_reads_as_a_tie(tuned):
    _, picks = tuned
    tie = picks.assign(best_max_num_seqs=1024, best_max_num_batched_tokens=16384, gain=1 + 2.4e-6)
    apart = tie.assign(gain=1 + 2 * chapter.TIE_TOL)
    assert chapter.is_tie(tie).all() and not chapter.is_tie(apart).any()
    labels = chapter._map_readout(tie, list(WORKLOADS), SLOS, list(LOADS))["label"]
    assert labels.str.contains("; a tie, pick ×1.000002; ").all() and not labels.str.contains("itself").any()
    assert labels.str.count("p99/bound").eq(2).all()  # both runs read: they are not the same pair
    labels = chapter._map_readout(apart, list(WORKLOADS), SLOS, list(LOADS))["label"]
    assert labels.str.contains("; pick ×1.00; ").all() and not labels.str.contains("tie").any()


def test_goodput_map_chart_spec(tuned):
    grid, picks = tuned
    spec = chapter.goodput_map_chart(grid, picks, WORKLOADS, SLO_NAMES, LOADS).to_dict()
    params = {p["name"]: p for p in walk(spec, "params") for p in p if "bind" in p}
    assert set(params) == {"slo_i", "load_i"}  # one workload: no control for it
    assert params["slo_i"]["bind"]["input"] == "radio"
    assert params["slo_i"]["bind"]["labels"] == ["TTFT 500 ms, TPOT 50 ms", "TTFT 200 ms, TPOT 25 ms"]
    assert params["load_i"]["bind"]["labels"] == ["the trace's rate", "4 × the trace's rate"]
    assert {"rect", "point", "text"} <= marks(spec)
    assert {"max_num_batched_tokens (tokens)", "max_num_seqs (sequences)"} <= set(titles(spec))
    filters = [f for f in walk(spec, "filter") if isinstance(f, str)]
    assert any("workload_i" in f and "slo_i" in f and "load_i" in f for f in filters)  # the readout and the cells
    colors = [c for c in walk(spec, "color") if isinstance(c, dict) and c.get("field") == "share_of_top"]
    assert colors and colors[0]["scale"]["domain"] == [0, 1]
    shapes = [s for s in walk(spec, "shape") if isinstance(s, dict) and s.get("field") == "kind"]
    assert shapes[0]["scale"]["domain"] == list(chapter.MAP_KINDS)
    cells = next(ds for ds in spec["datasets"].values() if "kind" in ds[0])
    assert len(cells) == 64 * 4
    kinds = [d["kind"] for d in cells]
    assert kinds.count("tuner's pick") == 4 and kinds.count("refused by vLLM") == 4  # one per selection
    assert kinds.count("vLLM default") == 4 - sum(d["kind"] == "tuner's pick" and d["max_num_seqs"] == 1024
                                                  and d["max_num_batched_tokens"] == 8192 for d in cells)
    readout = [d for ds in spec["datasets"].values() for d in ds if "label" in d]
    assert len(readout) == 4 and all("vLLM default" in d["label"] and "\n" in d["label"] for d in readout)
    at_default = chapter.is_default_pick(picks).sum()  # their second line says so instead of repeating the run
    itself = [d["label"].count("p99/bound") == 1 and "vLLM default itself" in d["label"] for d in readout]
    assert sum(itself) == at_default
    assert sum(d["label"].count("p99/bound") == 2 for d in readout) == 4 - at_default
    assert any(t.get("field") == "slo_load" for t in walk(spec, "tooltip") for t in t if isinstance(t, dict))


def test_goodput_map_chart_with_three_workloads_has_three_radio_rows(tuned):
    grid, picks = tuned
    both = pd.concat([grid, grid.assign(workload="b")], ignore_index=True)
    spec = chapter.goodput_map_chart(both, pd.concat([picks, picks.assign(workload="b")]),
                                     {"azure-conv-2023": "conversation", "b": "copy"}, SLO_NAMES, LOADS).to_dict()
    params = [p["name"] for p in walk(spec, "params") for p in p if "bind" in p]
    assert sorted(params) == ["load_i", "slo_i", "workload_i"]
