"""Chapter 11 (one engine or two kinds): the configurations, goodput read from a rate grid (interpolated where the
SLO attainment crosses 90%), the winners table, the grid on an executor equal to the grid run here, the KV
transfer table, the routing table, the chart's spec (workload and SLO radio buttons, the SLO labelled in ms, every
tooltip titled in words) and the facts other pages quote."""
from __future__ import annotations

import re
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest
from spec_helpers import marks, walk

import batchlab as bl
from batchlab.chapters import disaggregation as chapter
from batchlab.chapters import facts


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
