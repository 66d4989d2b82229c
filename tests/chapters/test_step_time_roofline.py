"""Chapter 4 (the step-time roofline): the knee's and the compute crossover's closed forms, the grids, and the
chart (one panel per GPU, sliders over batch and context, a readout, knees drawn where CostModel.knee says)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from spec_helpers import axis_titles, marks, walk

import batchlab as bl
from batchlab import viz
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
    assert list(table.columns) == ["model", "context", "b_kv", "knee_h100-sxm", "knee_h200", "crossover_h100-sxm",
                                   "crossover_h200"]
    assert len(table) == 2 * len(CONTEXTS)
    for hw in ("h100-sxm", "h200"):
        ridge = table.loc[table["context"] == 0, f"knee_{hw}"]
        assert np.allclose(ridge, ridge.iloc[0], rtol=1e-3)  # the ridge does not depend on the model
        assert (table[f"knee_{hw}"] <= table["b_kv"]).all()
        assert (table.groupby("model")[f"knee_{hw}"].apply(lambda k: (np.diff(k) <= 0).all())).all()
    k70 = table[table["model"] == "70b"].set_index("context")
    assert k70.loc[512, "knee_h100-sxm"] == pytest.approx(295.36, abs=0.05)  # B_kv 420 > ridge
    assert k70.loc[4096, "b_kv"] == pytest.approx(70_553_706_496 / (4096 * 327_680))


def test_batch_and_context_grids():
    batches = chapter.batch_grid(2048, per_octave=6)
    assert batches[0] == 1 and batches[-1] == 2048 and (np.diff(batches) > 0).all()
    assert set(range(1, 12)) <= set(batches.tolist())  # one sequence at a time at small batches ...
    ratio = batches[1:] / batches[:-1]
    assert ratio[batches[:-1] >= 16].max() < 1.2  # ... and about a sixth of a doubling (x 1.12) at a time from 16 on
    assert chapter.batch_grid(100)[-1] == 100
    contexts = chapter.context_grid(16384)
    assert contexts.tolist()[:8] == [0, 64, 96, 128, 192, 256, 384, 512] and contexts[-1] == 16384
    assert {512, 1024, 2048, 4096, 16384} <= set(contexts.tolist())  # the contexts of the knee facts
    with pytest.raises(ValueError, match="per_octave"):
        chapter.batch_grid(2048, per_octave=0)
    with pytest.raises(ValueError, match="first"):
        chapter.context_grid(16, first=64)


def test_grid_numbers_the_batches_for_the_slider(cost8b):
    curves, _ = chapter.step_time_grid(cost8b, [16, 1, 4, 4], [0, 1024])
    one = curves[(curves["hardware"] == "h100-sxm") & (curves["cost"] == "roofline") & (curves["context"] == 0)]
    assert one["batch"].tolist() == [1, 4, 16] and one["batch_index"].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="batches"):
        chapter.step_time_grid(cost8b, [0, 4], [0])
    with pytest.raises(ValueError, match="contexts"):
        chapter.step_time_grid(cost8b, [1, 4], [-1])


def _params(spec):
    return {p["name"]: p for p in spec["params"]}


def test_step_time_roofline_chart(frames):
    curves, knees = frames
    spec = chapter.step_time_roofline_chart(curves, knees, batch=60, context=1024).to_dict()
    assert "title" not in spec and len(spec["hconcat"]) == 2
    params = _params(spec)
    assert set(params) == {"batch_step", "context_step"}
    # the reader moves sliders in sequences and tokens; the parameters keep the indices the filters compare
    ctx = params["context_step"]
    assert ctx["bind"] == {"input": "range", "min": 0.0, "max": float(len(CHART_CONTEXTS) - 1), "step": 1.0,
                           "name": "context per sequence (tokens)"}
    assert ctx["value"] == float(CHART_CONTEXTS.index(1024))
    b = params["batch_step"]
    assert b["bind"]["input"] == "range" and b["bind"]["name"] == "batch size (sequences)"
    assert b["value"] == 3.0  # 64 of [1, 4, 16, 64, 256, 1024, 2048] is the nearest to 60
    labels = viz._slider_labels(spec)  # what each slider shows beside itself, in sequences and tokens
    assert labels["context_step"]["labels"] == [f"{c:,}" for c in CHART_CONTEXTS]
    assert labels["batch_step"]["labels"] == ["1", "4", "16", "64", "256", "1,024", "2,048"]
    assert marks(spec) == {"line", "rule", "point", "text"}
    filters = [f for f in walk(spec, "filter") if isinstance(f, str)]
    assert sum("context_index" in f and "context_step" in f for f in filters) >= 2 * 4
    assert sum("batch_index" in f and "batch_step" in f for f in filters) >= 2 * 2  # the readout and the rings
    for column in spec["hconcat"]:
        readout, panel = column["vconcat"]
        line = panel["layer"][0]["encoding"]
        assert line["x"]["scale"]["type"] == "log" and line["y"]["scale"]["type"] == "log"
        assert line["x"]["field"] == "batch" and line["y"]["field"] == "step_time_ms"
        assert line["color"]["field"] == "cost"
        texts = [lyr["transform"] for lyr in readout["layer"] if "transform" in lyr]
        calcs = [t["calculate"] for tr in texts for t in tr if "calculate" in t]
        assert any(viz.duration_text("step_time_ms") in c for c in calcs)  # the book's one duration rule
    titles = set(axis_titles(spec))
    assert titles == {"batch size (sequences)", "step time (ms)"} and all(t == t.lower() for t in titles)


def test_every_tooltip_is_titled_in_words(frames):
    spec = chapter.step_time_roofline_chart(*frames).to_dict()
    tips = [t for v in walk({k: v for k, v in spec.items() if k != "datasets"}, "tooltip") for t in v]
    assert tips and all(t.get("title") and "_" not in t["title"] for t in tips)
    assert {t["title"] for t in tips} >= {"batch size (sequences)", "context per sequence (tokens)",
                                          "step time", "knee (sequences)", "GPU", "cost model"}
    step = [t for t in tips if t["title"].startswith("step time")]  # a duration: its unit in the value
    assert step and all(t["field"] == "step_time" and t["type"] == "nominal" for t in step)


def test_drawn_knees_are_the_cost_models(frames):
    curves, knees = frames
    spec = chapter.step_time_roofline_chart(curves, knees).to_dict()
    rows = [r for d in spec["datasets"].values() for r in d if "knee" in r]
    assert len(rows) == len(knees)
    drawn = {(r["hardware"], r["cost"], r["context"]): r["knee"] for r in rows}
    for r in knees.itertuples():
        assert drawn[r.hardware, r.cost, r.context] == r.knee
    ms = [r["step_time_ms"] for d in spec["datasets"].values() for r in d if "batch" in r]
    assert np.allclose(sorted(ms), sorted(curves["step_time_s"] * 1e3), rtol=1e-6, atol=1e-4)


def _mark(layer) -> str:
    mark = layer.get("mark")
    return mark["type"] if isinstance(mark, dict) else mark


def test_readout_names_each_knee_and_the_plot_has_no_text(frames):
    """The knees are read out above each panel, one per cost model in its colour, at the chosen context; inside
    the plot only rules, lines and points (no label for a rule to cross)."""
    curves, knees = frames
    spec = chapter.step_time_roofline_chart(curves, knees).to_dict()
    for column in spec["hconcat"]:
        readout, panel = column["vconcat"]
        assert "text" not in {_mark(layer) for layer in panel["layer"]}
        knee_lines = [layer for layer in readout["layer"] if any(
            "calculate" in t and "datum.knee" in t["calculate"] for t in layer.get("transform", []))]
        assert len(knee_lines) == 2
        for layer, cost in zip(knee_lines, ("roofline", "calibrated")):
            filters = [t["filter"] for t in layer["transform"] if "filter" in t]
            assert any("context_step" in f for f in filters) and f"datum.cost == '{cost}'" in filters
            assert layer["mark"]["color"] == chapter.COST_COLORS[cost]
        where = next(t["calculate"] for layer in readout["layer"] for t in layer.get("transform", [])
                     if "calculate" in t and "'step at '" in t["calculate"])
        assert "', no cache'" in where  # context 0 reads "no cache", not "× 0 tokens"
        note = [layer for layer in readout["layer"] if layer.get("encoding", {}).get("text", {}).get("value")]
        assert [n["encoding"]["text"]["value"] for n in note] == ["their KV cache would not fit vLLM's KV pool"]


def test_uneven_grid_gets_its_contexts_and_one_context_nothing_to_choose(frames):
    curves, knees = frames
    some = knees["context"].isin([0, 1024, 16384])
    spec = chapter.step_time_roofline_chart(curves[curves["context"].isin([0, 1024, 16384])], knees[some]).to_dict()
    bind = _params(spec)["context_step"]["bind"]  # indices 0, 2, 6 are not evenly spaced: one button each
    assert bind["options"] == [0.0, 2.0, 6.0] and bind["labels"] == ["0", "1,024", "16,384"]
    one = curves[(curves["hardware"] == "h200") & (curves["context"] == 4096)]
    spec = chapter.step_time_roofline_chart(
        one, knees[(knees["hardware"] == "h200") & (knees["context"] == 4096)]).to_dict()
    params = _params(spec)
    assert len(spec["hconcat"]) == 1 and "bind" not in params["context_step"]  # a live explore cell's one context
    assert params["context_step"]["value"] == 4.0 and params["batch_step"]["bind"]["input"] == "range"


def test_knee_table_crossover_moves_right_and_vanishes(cost8b):
    table = chapter.knee_table({"8B": cost8b}, [0, 128, 256, 384, 512])
    for hw in ("h100-sxm", "h200"):
        cross, knee = table[f"crossover_{hw}"].to_numpy(), table[f"knee_{hw}"].to_numpy()
        assert cross[0] == pytest.approx(knee[0])  # no cache: both are the ridge
        assert (np.diff(knee) <= 0).all()  # the knee falls with context ...
        finite = cross[np.isfinite(cross)]
        assert (np.diff(finite) > 0).all()  # ... the crossover rises
    h100 = table.set_index("context")["crossover_h100-sxm"]
    ridge = cost8b.ideal().knee(0)
    w, k = cost8b.streamed_weight_bytes, cost8b.kv_bytes_per_token
    assert h100[128] == pytest.approx(ridge / (1 - 128 * k * ridge / w))  # 2 P B / F = (W + B l k) / BW
    assert np.isfinite(h100[384]) and np.isinf(h100[512])  # gone past W / (k ridge), about 388 tokens
    h200 = table.set_index("context")["crossover_h200"]
    assert np.isfinite(h200[512])  # the H200's lower ridge keeps it a little longer


def test_knee_display_names_gpus_and_marks_no_cache(cost8b):
    table = chapter.knee_table({"8B": cost8b}, [0, 1024])
    shown = chapter.knee_display(table)
    assert list(shown.data.columns) == ["model", "context (tokens)", "KV limit (sequences)",
                                        "knee on H100 SXM / H200 (sequences)",
                                        "compute crossover on H100 SXM / H200 (sequences)"]
    html = shown.to_html()
    assert "none" in html and "inf" not in html and "111.8" in html and "1,024" in html
    rows = shown.data.set_index("context (tokens)")  # the two GPUs side by side, in the header's order
    assert rows.loc[0, "knee on H100 SXM / H200 (sequences)"] == "295.3 / 206.1"
    assert rows.loc[1024, "compute crossover on H100 SXM / H200 (sequences)"] == "none / none"
    assert chapter.gpu_name("h200") == "H200" and chapter.gpu_name("b200") == "b200"
