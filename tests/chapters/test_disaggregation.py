"""Chapter 11 (one engine or two kinds): the configurations, goodput read from a rate grid (interpolated where the
SLO attainment crosses 90%), the winners table, the grid on an executor equal to the grid run here, the KV
transfer table, the routing table (both printing durations by the book's rule), the chart's spec (workload and SLO
radio buttons, the SLO labelled in ms, every tooltip titled in words), the facts other pages quote, and the page's
cluster snippet (public API only; run against a stand-in executor)."""
from __future__ import annotations

import ast
import inspect
import json
import re
import sys
import types
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from spec_helpers import marks, walk

import batchlab as bl
from batchlab import viz
from batchlab.chapters import disaggregation as chapter
from batchlab.chapters import facts, prefix_caching


@pytest.fixture(scope="module")
def cost():
    return bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))


SMALL_RATES = {"short chat": [5.0, 40.0], "code": [2.0, 20.0]}


@pytest.fixture(scope="module")
def small_grid(cost):
    return chapter.goodput_grid(cost, SMALL_RATES, n_gpus=2, duration_s=10.0)


def test_configs_cover_every_split():
    c = chapter.configs(4)
    assert [k for k in c if not k.startswith("colocated")] == ["1P + 3D", "2P + 2D", "3P + 1D"]
    assert c[chapter.WHOLE]["knobs"]["enable_chunked_prefill"] is False
    assert c[chapter.CHUNKED_DEFAULT]["knobs"] == {}  # vLLM's defaults
    assert c[chapter.CHUNKED_SMALL]["knobs"]["max_num_batched_tokens"] == chapter.SMALL_BUDGET
    assert all(v["n_prefill"] == 0 for k, v in c.items() if k.startswith("colocated"))


def test_workload_keeps_the_preset_lengths_with_poisson_arrivals():
    r = chapter.workload("code", 400, 5.0, seed=1)
    assert len(r) == 400 and np.all(np.diff(r.arrival_s) >= 0)
    assert abs(len(r) / r.arrival_s[-1] / 5.0 - 1) < 0.2
    lengths = bl.preset("azure-code-2023", 400, rate_req_s=1.0, seed=1)
    assert np.array_equal(r.prompt_tokens, lengths.prompt_tokens)


def test_attainment_counts_both_bounds(cost):
    reqs = chapter.workload("short chat", 300, 10.0)
    res = chapter.run(cost, reqs, chapter.configs(2)["1P + 1D"], 2)
    df = res.fleet.requests
    assert chapter.attainment(res, 1e9, 1e9) == 1.0
    assert chapter.attainment(res, 1e-9, 1e9) == 0.0
    tpot = df["tpot_s"].fillna(0).to_numpy()
    bound = float(np.median(tpot[tpot > 0]))
    assert chapter.attainment(res, 1e9, bound * 1e3) == pytest.approx(np.mean(tpot <= bound))


def test_goodput_interpolates_the_crossing():
    grid = pd.DataFrame({"workload": "w", "config": "c", "rate_req_s": [1.0, 2.0, 4.0, 8.0],
                         "attained_0": [1.0, 0.95, 0.85, 0.2], "attained_1": [0.5, 1.0, 1.0, 1.0],
                         "attained_2": [1.0, 1.0, 1.0, 0.9]})
    t = chapter.goodput_table(grid, n_gpus=2).set_index("slo")
    # Crossing 0.9 halfway between 0.95 (at 2) and 0.85 (at 4), in log rate: sqrt(8).
    assert t.loc[0, "goodput_req_s"] == pytest.approx(np.sqrt(8.0))
    assert t.loc[0, "goodput_per_gpu"] == pytest.approx(np.sqrt(8.0) / 2)
    assert t.loc[1, "goodput_req_s"] == 0.0  # the lowest rate already misses it
    assert t.loc[2, "goodput_req_s"] == 8.0 and t.loc[2, "capped"]


@pytest.mark.parametrize("pool_kind", [ThreadPoolExecutor, ProcessPoolExecutor])
def test_grid_on_an_executor_equals_the_grid_here(cost, small_grid, pool_kind):
    with pool_kind(2) as pool:  # a process pool pickles every cell's arguments, as Dask does
        elsewhere = chapter.goodput_grid(cost, SMALL_RATES, n_gpus=2, duration_s=10.0, executor=pool)
    pd.testing.assert_frame_equal(small_grid, elsewhere)
    assert len(small_grid) == sum(len(r) for r in SMALL_RATES.values()) * len(chapter.configs(2))
    for k in range(len(chapter.SLOS)):
        assert small_grid[f"attained_{k}"].between(0, 1).all()
    # A looser SLO is met by at least as many requests.
    assert (small_grid["attained_2"] >= small_grid["attained_0"]).all()


def test_winners_and_chart(small_grid):
    table = chapter.goodput_table(small_grid, n_gpus=2)
    win = chapter.winners(table)
    assert len(win) == len(SMALL_RATES) * len(chapter.SLOS)
    for _, row in win.iterrows():
        cell = table[(table["workload"] == row["workload"]) & (table["slo"] == row["slo"])]
        assert max(row["best_split"], row["best_colocated"]) == cell["goodput_per_gpu"].max()
        ratio = row["best_split"] / row["best_colocated"] if row["best_colocated"] > 0 else np.inf
        expected = "split" if ratio > 1.05 else "colocated" if ratio < 1 / 1.05 else "tie"
        assert row["kind"] == expected or (row["best_split"] == row["best_colocated"] == 0 and row["kind"] == "tie")
        if row["kind"] != "tie":
            assert cell.set_index("config").loc[row["winner"], "goodput_per_gpu"] == cell["goodput_per_gpu"].max()
    shown = chapter.winners_display(win).data
    assert list(shown.columns) == ["workload", "SLO (90% of requests)", "wins", "configuration",
                                   "best colocated (req/s per GPU)", "best split (req/s per GPU)"]
    for (_, row), (_, out) in zip(win.iterrows(), shown.iterrows()):  # a tie names no winner; a split says which
        assert out["configuration"] == ("either (within 5%)" if row["kind"] == "tie" else row["winner"])
        assert out["best split (req/s per GPU)"] == f"{row['best_split']:.2f} ({row['best_split_config']})"
    spec = chapter.goodput_chart(table, slo=1).to_dict()
    binds = {p["name"]: p["bind"] for p in spec["params"]}
    assert binds["workload_pick"]["input"] == "radio" and binds["workload_pick"]["options"] == list(SMALL_RATES)
    assert binds["slo_index"]["input"] == "radio"
    assert binds["slo_index"]["labels"] == [chapter.slo_label(t, p) for t, p in chapter.SLOS]
    assert all(" ms" in label for label in binds["slo_index"]["labels"])
    assert {p["name"]: p["value"] for p in spec["params"]}["slo_index"] == 1.0
    assert "bar" in marks(spec)
    tips = [t for ts in walk({k: v for k, v in spec.items() if k != "datasets"}, "tooltip") for t in ts]
    assert {t["field"] for t in tips} == {"config", "slo_label", "goodput_per_gpu", "goodput_req_s"}
    titles = {t["field"]: t["title"] for t in tips}
    assert titles["goodput_per_gpu"] == "goodput per GPU (req/s)" and titles["config"] == "configuration"
    assert titles["goodput_req_s"] == "goodput, all 4 GPUs (req/s)"
    # Per GPU and for the fleet to the hundredth, as the table below the chart prints goodputs ("8.61").
    assert {t["field"]: t.get("format") for t in tips if t["field"].startswith("goodput")} == {
        "goodput_per_gpu": ".2f", "goodput_req_s": ".2f"}
    assert all("_" not in t["title"] for t in tips)
    assert spec["encoding"]["y"]["axis"]["labelLimit"] >= 200  # configuration names are not cut
    with pytest.raises(ValueError, match="workload_name must be one of"):
        chapter.goodput_chart(table, workload_name="chat")
    filters = [f for f in walk(spec, "filter") if isinstance(f, str)]
    assert any("workload_pick" in f and "slo_index" in f for f in filters)
    # Every field a filter reads is a column of the chart's data (else the chart draws nothing).
    columns = {k for rows in spec["datasets"].values() for row in rows for k in row}
    read = {m for f in filters for m in re.findall(r"datum\['(\w+)'\]|datum\.(\w+)", f) for m in m if m}
    assert read and read <= columns, read - columns


def test_goodput_grid_refuses_unknown_workloads(cost):
    with pytest.raises(ValueError, match="unknown workloads"):
        chapter.goodput_grid(cost, {"chat": [1.0]}, n_gpus=2)
    with pytest.raises(ValueError, match="at least one rate"):
        chapter.goodput_grid(cost, {"code": []}, n_gpus=2)


def test_transfer_table_is_bytes_over_bandwidth(cost):
    t = chapter.transfer_table(cost, (1000, 4000)).set_index("prompt_tokens")
    hw, k = cost.hardware, cost.model.kv_bytes_per_token("bf16")
    assert t.loc[4000, "kv_mib"] == pytest.approx(4000 * k / 2**20)
    nvlink_s = hw.interconnect_latency_s + 4000 * k / hw.interconnect_bytes_per_s
    assert t.loc[4000, "nvlink_ms"] == pytest.approx(nvlink_s * 1e3)
    assert t.loc[1000, "network_ms"] == pytest.approx((hw.network_latency_s + 1000 * k / hw.network_bytes_per_s) * 1e3)
    assert (t["prefill_ms"].diff().dropna() > 0).all()


def test_routing_table(cost):
    reqs = bl.shared_prefix(300, 4, 4, 1500, 50, 20, rate_req_s=20.0, seed=2)
    t = chapter.routing_table(cost, {"shared": reqs}, 3).set_index("router")
    assert (t["workload"] == "shared").all()
    assert list(t.index) == ["round robin", "least outstanding", "prefix aware"]
    assert t.loc["round robin", "imbalance"] == pytest.approx(1.0)
    assert t.loc["prefix aware", "prefix_cache_hit_rate"] > t.loc["round robin", "prefix_cache_hit_rate"]


def test_facts_are_the_chapter_runs():
    """The facts read the page's grid and routing runs (cached on disk: one run for the chapter and its readers)."""
    win = chapter.chapter_winners()
    counts = [facts.value(f"disagg_{k}_cells") for k in ("colocated", "split", "tie")]
    assert sum(counts) == facts.value("disagg_cells") == len(chapter.WORKLOADS) * len(chapter.SLOS) == len(win)
    assert facts.value("disagg_code_tight_split") in chapter.configs(chapter.N_GPUS)
    assert facts.value("disagg_code_tight_gain") == pytest.approx(
        win.loc[("code", 0), "best_split"] / win.loc[("code", 0), "best_colocated"])
    assert facts.value("disagg_tight_slo") == chapter.slo_label(*chapter.SLOS[0]) == "TTFT 250 ms, TPOT 10 ms"
    r = chapter.chapter_routing()
    assert facts.value("disagg_router_sp_ttft_factor") > 1
    assert r.loc[("shared system prompts", "prefix aware"), "prefix_cache_hit_rate"] > r.loc[
        ("shared system prompts", "round robin"), "prefix_cache_hit_rate"]


def test_tables_print_durations_by_the_book_rule(cost):
    """The routing and transfer tables keep their latencies as numbers (ms) and print them as the prose glues them
    (``viz.format_duration``: "7.78 s", "532 ms"), the unit in the cell."""
    routing = pd.DataFrame({"workload": "w", "router": ["round robin", "prefix aware"],
                            "prefix_cache_hit_rate": [0.05, 0.08], "median_ttft_ms": [531.58, 25.754],
                            "p99_ttft_ms": [7783.02, 167.1], "p99_tpot_ms": [208.76, 12.43], "imbalance": [1.0, 1.05]})
    styled = chapter.routing_display(routing)
    assert list(styled.data.columns) == ["workload", "router", "prefix-cache hit rate", "median TTFT", "p99 TTFT",
                                         "p99 TPOT", "busiest replica / mean (requests)"]
    assert styled.data["p99 TTFT"].dtype.kind == "f"  # numbers underneath
    html = styled.to_html()
    for text in ("532\u00a0ms", "25.8\u00a0ms", "7.78\u00a0s", "167\u00a0ms", "209\u00a0ms", "12.4\u00a0ms"):
        assert text in html, text
    assert "7,783" not in html
    transfers = chapter.transfer_display(chapter.transfer_table(cost, (256, 8192)), network_gbit_s=400)
    assert list(transfers.data.columns)[2:] == ["prefill alone", "over NVLink", "over 400 Gb/s"]
    html = transfers.to_html()
    for ms in chapter.transfer_table(cost, (256, 8192))[["nvlink_ms", "network_ms", "prefill_ms"]].to_numpy().ravel():
        assert viz.format_duration(ms).replace(" ", "\u00a0") in html


# -- the page's cluster snippet: public API only, every name resolving --------------------------------------------
NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "11_disaggregation.ipynb"


def _cluster_snippet() -> str:
    """The python block of the page's "Running the grid on a cluster" section (markdown, not executed there)."""
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    text = next("".join(c["source"]) for c in cells
                if c["cell_type"] == "markdown" and "## Running the grid on a cluster" in "".join(c["source"]))
    section = text.split("## Running the grid on a cluster", 1)[1]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


class _Recorder:
    """An executor that records each submission (checking its arguments bind to the function) and runs nothing."""

    def __init__(self):
        self.calls = []

    def submit(self, fn, *args, **kwargs):
        inspect.signature(fn).bind(*args, **kwargs)  # a wrong or misspelt parameter fails here
        self.calls.append((fn, args, kwargs))
        future = Future()
        future.set_result(types.SimpleNamespace(summary=dict))
        return future


def test_cluster_snippet_teaches_public_api_that_runs(monkeypatch):
    source = _cluster_snippet()
    tree = ast.parse(source)
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "bl"}
    assert used and used <= set(bl.__all__), used - set(bl.__all__)  # public names only
    assert "chapter" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    distributed = pytest.importorskip("dask.distributed")
    assert callable(distributed.Client.get_executor)
    # Run it with a stand-in client: every name must resolve, every call must bind.
    recorder = _Recorder()
    fake = types.ModuleType("dask.distributed")
    fake.Client = lambda *a, **k: types.SimpleNamespace(get_executor=lambda: recorder)
    monkeypatch.setitem(sys.modules, "dask.distributed", fake)
    namespace: dict = {}
    exec(compile(tree, "snippet", "exec"), namespace)  # noqa: S102 - the page's own code
    assert len(recorder.calls) == len(namespace["summaries"]) == 40 * 8
    # Its stream is the chapter's code workload; one call of each kind really runs, on 300 of its requests.
    rate = 34.0
    assert prefix_caching.same_requests(namespace["code_at"](rate), chapter.workload("code", 4080, rate, 0))
    seen = {}
    for fn, args, kwargs in recorder.calls:
        seen.setdefault(fn, (args, kwargs))
    assert set(seen) == {bl.simulate_fleet, bl.simulate_disaggregated}
    for fn, (args, kwargs) in seen.items():
        res = fn(args[0].head(300), *args[1:], **kwargs)
        assert res.n_gpus == 8 and res.summary()["completed"] == 300


def test_fleet_runs_go_to_a_process_pool_and_back(cost):
    """What the snippet relies on: a fleet call ships to another process and its FleetResult comes back whole."""
    reqs = chapter.workload("code", 300, 10.0, seed=3)
    with ProcessPoolExecutor(1) as pool:
        there = pool.submit(bl.simulate_disaggregated, reqs, cost, n_prefill=1, n_decode=1).result()
    here = bl.simulate_disaggregated(reqs, cost, n_prefill=1, n_decode=1)
    assert there.summary() == here.summary()
    pd.testing.assert_frame_equal(there.fleet.requests, here.fleet.requests)


def test_slo_labels_read_bounds_in_seconds_from_a_second():
    """The SLO radio buttons and the winners table name bounds as a reader reads them: seconds from 1,000 ms."""
    assert [chapter.slo_label(*slo) for slo in chapter.SLOS] == [
        "TTFT 250 ms, TPOT 10 ms", "TTFT 1 s, TPOT 20 ms", "TTFT 5 s, TPOT 50 ms"]
    assert chapter.slo_label(1500.0, 12.5) == "TTFT 1.5 s, TPOT 12.5 ms"
