"""Chapter 04 (the step-time roofline): the knee's closed forms, the grid's shape and monotonicity, and the
chart (one panel per GPU, a context slider over the grid's index, knees drawn where CostModel.knee says)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from spec_helpers import axis_titles, marks, walk

import batchlab as bl
from batchlab.chapters import step_time_roofline as chapter

CONTEXTS = [0, 512, 1024, 4096, 16384]
CHART_CONTEXTS = [0, 512, 1024, 2048, 4096, 8192, 16384]


@pytest.fixture(scope="module")
def grid(cost8b):
    batches = np.unique(np.round(np.logspace(0, 11, 34, base=2)))
    return chapter.step_time_grid(cost8b, batches, CONTEXTS)


@pytest.fixture(scope="module")
def frames(cost8b):
    return chapter.step_time_grid(cost8b, [1, 4, 16, 64, 256, 1024, 2048], CHART_CONTEXTS)


def test_kv_knee_closed_form(cost8b):
    # W / (l k): the streamed weights (every parameter but the embedding table, 2 bytes each) over 1024 tokens
    # x 131,072 bytes.
    assert cost8b.kv_knee(1024) == pytest.approx((8_030_261_248 - 128_256 * 4096) * 2 / (1024 * 131_072))
    assert cost8b.kv_knee(0) == math.inf
    assert cost8b.kv_knee(512) == pytest.approx(2 * cost8b.kv_knee(1024))
    with pytest.raises(ValueError, match="context"):
        cost8b.kv_knee(-1)


def test_step_at_the_kv_knee_is_twice_the_floor(cost8b):
    ideal = cost8b.ideal()
    for ctx in (1024, 4096, 16384):
        b = ideal.kv_knee(ctx)
        # KV bytes equal the weight bytes, plus the one new token written per sequence.
        assert ideal.decode_step_time(b, ctx) / ideal.decode_step_time(1, 0) == pytest.approx(2, rel=2e-3)


def test_grid_shape_and_knees_match_the_cost_model(cost8b, grid):
    curves, knees = grid
    assert set(curves["hardware"]) == {"h100-sxm", "h200"} and set(curves["cost"]) == {"roofline", "calibrated"}
    assert len(knees) == 2 * 2 * len(CONTEXTS)
    assert len(curves) == len(knees) * curves["batch"].nunique()
    assert (curves.groupby("context")["context_index"].nunique() == 1).all()
    assert curves.drop_duplicates("context").sort_values("context")["context_index"].tolist() == list(range(5))
    for r in knees.itertuples():
        cm = cost8b.replace(hardware=bl.get_hardware(r.hardware))
        cm = cm.ideal() if r.cost == "roofline" else cm
        assert r.knee == cm.knee(r.context)
        assert r.b_kv == cm.kv_knee(r.context)
        assert r.step_time_s == pytest.approx(cm.decode_step_time(r.knee, r.context))
    h100 = knees[(knees["hardware"] == "h100-sxm") & (knees["cost"] == "roofline")].set_index("context")["knee"]
    assert h100[0] == pytest.approx(295.3, abs=0.05) and h100[1024] == pytest.approx(111.83, abs=0.01)
    h200 = knees[(knees["hardware"] == "h200") & (knees["cost"] == "roofline")].set_index("context")["knee"]
    assert h200[0] == pytest.approx(989.4e12 * 2 / (2 * 4.8e12)) and h200[4096] == h100[4096]


def test_step_time_rises_with_batch_and_context_and_calibrated_is_slower(grid):
    curves, _ = grid
    for _, g in curves.groupby(["hardware", "cost", "context"]):
        assert (np.diff(g.sort_values("batch")["step_time_s"]) >= 0).all()
    wide = curves.pivot_table(index=["hardware", "cost", "batch"], columns="context", values="step_time_s")
    assert (np.diff(wide.to_numpy(), axis=1) > 0).all()
    both = curves.pivot_table(index=["hardware", "context", "batch"], columns="cost", values="step_time_s")
    assert (both["calibrated"] > both["roofline"]).all()
    faster = curves.pivot_table(index=["cost", "context", "batch"], columns="hardware", values="step_time_s")
    assert (faster["h200"] < faster["h100-sxm"]).all()  # same F, more bandwidth


def test_kv_fits_follows_the_pool(cost8b, grid):
    curves, _ = grid
    pool = cost8b.kv_pool_blocks() - 1
    h100 = curves[(curves["hardware"] == "h100-sxm") & (curves["cost"] == "roofline")]
    expect = h100["batch"] * np.ceil((h100["context"] + 1) / 16) <= pool
    assert (h100["kv_fits"] == expect).all()
    assert h100[h100["context"] == 0]["kv_fits"].all() and not h100[h100["context"] == 16384]["kv_fits"].all()
    h200 = curves[(curves["hardware"] == "h200") & (curves["cost"] == "roofline")]
    assert h200["kv_fits"].sum() > h100["kv_fits"].sum()  # more HBM, more room beside the weights


def test_knee_table(cost8b):
    big = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-70b"), dtype="fp8")
    table = chapter.knee_table({"8b": cost8b, "70b": big}, CONTEXTS)
    assert list(table.columns) == ["model", "context", "b_kv", "knee_h100-sxm", "knee_h200"]
    assert len(table) == 2 * len(CONTEXTS)
    for hw in ("h100-sxm", "h200"):
        ridge = table.loc[table["context"] == 0, f"knee_{hw}"]
        assert np.allclose(ridge, ridge.iloc[0], rtol=1e-3)  # the ridge does not depend on the model
        assert (table[f"knee_{hw}"] <= table["b_kv"]).all()
        assert (table.groupby("model")[f"knee_{hw}"].apply(lambda k: (np.diff(k) <= 0).all())).all()
    k70 = table[table["model"] == "70b"].set_index("context")
    assert k70.loc[512, "knee_h100-sxm"] == pytest.approx(295.36, abs=0.05)  # B_kv 420 > ridge
    assert k70.loc[4096, "b_kv"] == pytest.approx(70_553_706_496 / (4096 * 327_680))


def test_step_time_roofline_chart(frames):
    spec = chapter.step_time_roofline_chart(*frames).to_dict()
    assert "title" not in spec and len(spec["hconcat"]) == 2
    (param,) = spec["params"]
    assert param["name"] == "context_step"
    # the reader picks a context in tokens; the parameter keeps the index the filters compare
    assert param["bind"] == {"input": "radio", "options": [float(i) for i in range(len(CHART_CONTEXTS))],
                             "labels": [f"{c:,}" for c in CHART_CONTEXTS], "name": "context per sequence (tokens)"}
    assert param["bind"]["labels"][-1] == "16,384" and param["value"] == 0.0
    assert marks(spec) == {"line", "rule", "point", "text"}
    filters = [f for f in walk(spec, "filter") if isinstance(f, str)]
    assert sum("context_index" in f and "context_step" in f for f in filters) == 2 * 6  # six layers a panel
    for panel in spec["hconcat"]:
        line = panel["layer"][0]["encoding"]
        assert line["x"]["scale"]["type"] == "log" and line["y"]["scale"]["type"] == "log"
        assert line["x"]["field"] == "batch" and line["y"]["field"] == "step_time_ms"
        assert line["color"]["field"] == "cost"
        assert {lyr["encoding"]["x"]["field"] for lyr in panel["layer"][2:5]} == {"knee"}
    titles = set(axis_titles(spec))
    assert titles == {"batch size (sequences)", "step time (ms)"} and all(t == t.lower() for t in titles)


def test_drawn_knees_are_the_cost_models(frames):
    curves, knees = frames
    spec = chapter.step_time_roofline_chart(curves, knees).to_dict()
    rows = [r for d in spec["datasets"].values() for r in d if "knee" in r]
    assert len(rows) == len(knees)
    drawn = {(r["hardware"], r["cost"], r["context"]): r["knee"] for r in rows}
    for r in knees.itertuples():
        assert drawn[r.hardware, r.cost, r.context] == r.knee
    ms = [r["step_time_ms"] for d in spec["datasets"].values() for r in d if "batch" in r]
    assert np.allclose(sorted(ms), sorted(curves["step_time_s"] * 1e3))


def test_uneven_grid_gets_its_contexts_and_one_context_nothing_to_choose(frames):
    curves, knees = frames
    some = knees["context"].isin([0, 1024, 16384])
    spec = chapter.step_time_roofline_chart(curves[curves["context"].isin([0, 1024, 16384])], knees[some]).to_dict()
    bind = spec["params"][0]["bind"]  # indices 0, 2, 6 are not evenly spaced: one button each
    assert bind["options"] == [0.0, 2.0, 6.0] and bind["labels"] == ["0", "1,024", "16,384"]
    one = curves[(curves["hardware"] == "h200") & (curves["context"] == 4096)]
    spec = chapter.step_time_roofline_chart(
        one, knees[(knees["hardware"] == "h200") & (knees["context"] == 4096)]).to_dict()
    assert len(spec["hconcat"]) == 1 and "bind" not in spec["params"][0]  # a live explore cell's single context
    assert spec["params"][0]["value"] == 4.0


def test_knee_display_names_gpus_and_marks_no_cache(cost8b):
    table = chapter.knee_table({"8B": cost8b}, [0, 1024])
    shown = chapter.knee_display(table)
    assert list(shown.data.columns) == ["model", "context (tokens)", "KV limit (sequences)",
                                        "knee on H100 SXM (sequences)", "knee on H200 (sequences)"]
    html = shown.to_html()
    assert "none" in html and "inf" not in html and "111.8" in html and "1,024" in html
    assert chapter.gpu_name("h200") == "H200" and chapter.gpu_name("b200") == "b200"
