"""The end-to-end calibration runs (data/e2e_runs.csv) and their replay (batchlab.validate, issue 11 item 4).

Tests that read the raw files of ../shared/data/e2e are marked ``needs_data`` (see ``tests/rawdata.py``); the
rest read the committed table only.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import batchlab as bl
from batchlab import validate
from batchlab.validate import raw, streams
from rawdata import raw_folder

ROOT = Path(__file__).resolve().parent.parent
GENERAL_7B = "20260217-231439-llama-2-7b-tp1-general"  # two stages: 8 then 20 req/s, 600 s each
ROLEPLAY_7B = "20260217-162547-llama-2-7b-tp1-roleplay/stage_0"
SMALL_CLOSED = "2026_04_06_llama_3_1_70b_h200_sxm_vllm_fp8_agg_1024x1024_c4_tp2_ep1_913"  # an InferenceX row
UNRECORDED_CLOSED = "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_vllm_agg_1024x128_c8_tp2_epnone_1"  # client not recorded


def e2e_dir() -> Path:
    return raw_folder(raw.E2E_ENV, "e2e", "the raw end-to-end runs")


@pytest.fixture(scope="module")
def runs() -> pd.DataFrame:
    return validate.calibration_runs()


@pytest.fixture(scope="module")
def general(runs):
    """The two-stage Llama-2-7B run: its stage rows, its stream and the simulation of that stream."""
    rows = runs[runs["experiment"] == GENERAL_7B]
    requests, stages = validate.build_requests(rows.iloc[0])
    result, _ = validate.simulate_run(rows.iloc[0])
    return rows, requests, stages, result


# -- the table ------------------------------------------------------------------------------------

@pytest.mark.needs_data
def test_committed_table_is_what_the_script_writes():
    spec = importlib.util.spec_from_file_location("make_e2e", ROOT / "scripts" / "make_e2e_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    pd.testing.assert_frame_equal(mod.build_table(e2e_dir()), raw.read_runs(raw.RUNS_FILE))
    pd.testing.assert_frame_equal(validate.calibration_runs(e2e_dir()), validate.calibration_runs())


@pytest.mark.needs_data
def test_table_holds_the_raw_numbers(runs):
    folder = e2e_dir()
    metrics = pd.read_csv(folder / "inference_sim_training" / "metrics.csv")
    stages = metrics[metrics["scope"].str.startswith("stage_")]
    aic = pd.read_csv(folder / raw.AIC_FILE)
    assert (runs["set"] == "inference-perf").sum() == len(stages) == 16
    assert (runs["set"] == "aiconfigurator").sum() == len(aic) == 193
    table = runs.set_index("run_id")
    for _, m in stages.iterrows():
        row = table.loc[f"{m['experiment']}/{m['scope']}"]
        assert row["ttft_ms"] == pytest.approx(m["ttft_s_mean"] * 1e3, rel=1e-12)
        assert row["e2e_ms"] == pytest.approx(m["e2e_s_mean"] * 1e3, rel=1e-12)
        assert row["n_requests"] == m["requests_sent"]
        assert row["source"].endswith(m["source_file"])
    for _, a in aic.iterrows():
        row = table.loc[a["id"]]
        assert (row["ttft_ms"], row["tpot_ms"]) == (a["silicon_ttft_ms"], a["silicon_tpot_ms"])
        assert (row["isl"], row["osl"], row["concurrency"], row["tp"]) == (a["isl"], a["osl"], a["batch_size"],
                                                                          a["tp_size"])
        # InferenceX's export names a dated file and the model: "source_file=2026-04-06.csv; model=...".
        inferencex = a["silicon_data_source"].startswith("source_file=2026-04-06.csv; model=Llama-3.1-70B;")
        assert (row["client"] == raw.INFERENCEX) == inferencex


def test_table_layout(runs):
    assert runs["run_id"].is_unique
    assert set(runs["set"]) == {"inference-perf", "aiconfigurator"}
    assert set(runs["hardware"]) == {"h100-sxm", "h200"} and set(runs["dtype"]) == {"bf16", "fp8"}
    assert (runs["gpu_memory_utilization"] == 0.9).all()
    assert (runs[["ttft_ms", "tpot_ms", "e2e_ms"]] > 0).all().all()
    closed = runs[runs["set"] == "aiconfigurator"]
    imx = closed["client"] == raw.INFERENCEX
    assert set(closed.loc[imx, "model"]) == {"llama-3.1-70b"} and imx.sum() == 90
    assert (closed.loc[imx, "n_requests"] == 10 * closed.loc[imx, "concurrency"]).all()
    assert (closed.loc[imx, "max_num_seqs"] == closed.loc[imx, "concurrency"]).all()
    assert (closed.loc[imx, "max_num_batched_tokens"] == 8192).all() and (closed.loc[imx, "range_ratio"] == 0.8).all()
    other = closed[~imx]
    assert (other["n_requests"] == np.maximum(8 * other["concurrency"], 200)).all()
    assert other["max_num_seqs"].isna().all() and other["range_ratio"].isna().all() and (other["client"] == "").all()
    assert closed["e2e_ms"].to_numpy() == pytest.approx(
        (closed["ttft_ms"] + closed["tpot_ms"] * (closed["osl"] - 1)).to_numpy())
    assert (closed.loc[closed["model_id"].str.endswith("-FP8"), "dtype"] == "fp8").all()
    opened = runs[runs["set"] == "inference-perf"]
    assert (opened["n_requests"] == (opened["rate_req_s"] * opened["duration_s"]).astype(int)).all()
    assert opened["tpot_ms"].to_numpy() == pytest.approx(
        ((opened["e2e_ms"] - opened["ttft_ms"]) / (opened["output_len"] - 1)).to_numpy())
    assert opened["licence"].str.startswith("none").all() and opened["source"].str.contains("@ed5c1d26").all()


def test_every_ok_run_is_representable(runs):
    ok = runs[runs["status"] == "ok"]
    assert ok["representable"].all() and (ok["reason"] == "").all()
    overloaded = runs[runs["status"] == "overloaded"]
    assert len(overloaded) == 3
    assert (~overloaded["representable"]).all() and (overloaded["reason"] == "overloaded").all()


def test_unrepresentable_runs_name_their_reason(runs):
    row = runs.iloc[0].copy()
    assert validate.unrepresentable_reason(row) == ""
    moe = row.copy()
    moe["model_id"], moe["model"] = "mistralai/Mixtral-8x7B-v0.1", ""
    assert validate.unrepresentable_reason(moe).startswith("MoE")
    offload = row.copy()
    offload["cpu_offload_gb"] = 20
    assert validate.unrepresentable_reason(offload).startswith("CPU offload")
    unknown = row.copy()
    unknown["model"] = "llama-9-1t"
    assert "no batchlab preset" in validate.unrepresentable_reason(unknown)
    assert any("Mixtral" in note for note in validate.NOT_IN_DATA)


def test_unknown_run_id_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown run id 'no-such-run'"):
        validate.replay_run("no-such-run")
    with pytest.raises(ValueError, match="unknown run id"):
        validate.build_requests("no-such-run")


# -- open-loop streams ------------------------------------------------------------------------------

def test_open_loop_counts_and_send_gaps(general):
    rows, requests, stages, _ = general
    assert len(rows) == 2
    for k, (_, row) in enumerate(rows.iterrows()):
        t = requests.arrival_s[stages == k]
        assert t.size == int(row["rate_req_s"] * row["duration_s"]) == row["n_requests"]
        gaps = np.diff(t)
        assert gaps.mean() == pytest.approx(1 / row["rate_req_s"], rel=0.01)
        assert t[-1] - t[0] <= row["duration_s"]
        assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.1)  # exponential gaps, not evenly spaced
    assert requests.arrival_s[stages == 1][0] - requests.arrival_s[stages == 0][-1] > streams.DRAIN_S


def test_open_loop_prompts_cycle_through_100_distinct(general):
    rows, requests, _, _ = general
    row = rows.iloc[0]
    prompts = [tuple(ids) for ids in requests.prefix_blocks]
    assert len(set(prompts[:100])) == 100 and len(set(prompts)) == 100
    assert all(prompts[i] == prompts[i + 100] for i in range(len(prompts) - 100))
    assert (requests.prompt_tokens[100:] == requests.prompt_tokens[:-100]).all()
    assert requests.prompt_tokens.mean() == pytest.approx(row["prompt_tokens_mean"], rel=0.02)
    assert requests.prompt_tokens.min() >= row["prompt_tokens_min"]
    assert requests.prompt_tokens.max() <= row["prompt_tokens_max"]
    assert (requests.output_tokens == row["output_len"]).all()


def test_prefix_ids_share_exactly_the_system_prompt(general):
    rows, requests, _, _ = general
    row = rows.iloc[0]
    shared_blocks = streams.system_prompt_tokens(row) // streams.BLOCK_TOKENS
    assert (row["system_prompt_len"] + 1) // 16 <= shared_blocks <= 1.1 * (row["system_prompt_len"] + 1) / 16
    distinct = {tuple(ids): n for ids, n in zip(requests.prefix_blocks, requests.prompt_tokens)}
    groups: dict[int, list[tuple]] = {}
    for ids, n in distinct.items():
        assert len(ids) == math.ceil(n / 16)  # one id per block of the prompt
        groups.setdefault(ids[0], []).append(ids)
    assert sorted(len(g) for g in groups.values()) == [row["prompts_per_group"]] * row["num_groups"]
    for members in groups.values():
        for a in members:
            for b in members:
                if a != b:
                    common = next(j for j in range(min(len(a), len(b))) if a[j] != b[j])
                    assert common == shared_blocks
    per_group = [{i for ids in members for i in ids} for members in groups.values()]
    assert all(not (x & y) for k, x in enumerate(per_group) for y in per_group[k + 1:])  # groups share no id


def test_stages_drain_and_the_cache_stays_warm(general):
    _, _, stages, result = general
    r = result.requests
    assert not r["rejected"].any()
    assert r["finish_s"][stages == 0].max() < r["arrival_s"][stages == 1].min()
    first_of_stage_1 = np.flatnonzero(stages == 1)[0]
    assert r["cached_tokens"].iloc[first_of_stage_1] > 0
    one = validate.replay_run(f"{GENERAL_7B}/stage_0")
    assert one["drained"] and not one["overloaded"]


# -- closed-loop streams ----------------------------------------------------------------------------

def _in_flight_at_most(result, n, c):
    r = result.requests
    events = np.concatenate([np.stack([r["sent_s"], np.ones(n)], 1), np.stack([r["finish_s"], -np.ones(n)], 1)])
    events = events[np.lexsort((events[:, 1], events[:, 0]))]  # a finish before a send at the same instant
    return np.cumsum(events[:, 1]).max() == c


def test_closed_loop_stream_and_concurrency(runs):
    """InferenceX: 10 x concurrency requests, lengths uniform in [int(0.8 x label), label]; not recorded:
    max(8 x concurrency, 200) requests of exactly isl and osl tokens. Both keep ``concurrency`` in flight."""
    row = runs.set_index("run_id").loc[SMALL_CLOSED]
    requests, stages = validate.build_requests(SMALL_CLOSED)
    n, c, isl, osl = (int(row[k]) for k in ("n_requests", "concurrency", "isl", "osl"))
    assert len(requests) == n == 10 * c and (stages == 0).all()
    assert (requests.arrival_s == 0).all() and requests.prefix_blocks is None
    for tokens, label in ((requests.prompt_tokens, isl), (requests.output_tokens, osl)):
        assert tokens.min() >= int(0.8 * label) and tokens.max() <= label and np.unique(tokens).size > n // 4
    big = streams.random_lengths(1000, 0.8, 20000, np.random.default_rng(0))
    assert (big.min(), big.max()) == (800, 1000) and big.mean() == pytest.approx(900, abs=2)
    assert _in_flight_at_most(validate.simulate_run(SMALL_CLOSED)[0], n, c)
    row = runs.set_index("run_id").loc[UNRECORDED_CLOSED]
    requests, stages = validate.build_requests(UNRECORDED_CLOSED)
    n, c = int(row["n_requests"]), int(row["concurrency"])
    assert len(requests) == n == max(8 * c, 200) and (stages == 0).all()
    assert (requests.arrival_s == 0).all() and requests.prefix_blocks is None
    assert (requests.prompt_tokens == row["isl"]).all() and (requests.output_tokens == row["osl"]).all()
    assert _in_flight_at_most(validate.simulate_run(UNRECORDED_CLOSED)[0], n, c)


def test_knobs_and_cost(runs):
    table = runs.set_index("run_id")
    k = validate.knobs_for(ROLEPLAY_7B)
    assert k["num_kv_blocks"] == 7463 and k["policy"] == "chunked"
    assert (k["max_num_seqs"], k["max_num_batched_tokens"], k["max_model_len"]) == (128, 2048, 4096)
    run_id = table.index[table["model"].eq("codellama-34b")][0]
    cost = validate.cost_for(run_id)
    assert (cost.tp, cost.dtype, cost.kv_dtype) == (2, "bf16", "bf16")
    assert validate.knobs_for(run_id)["num_kv_blocks"] == cost.kv_pool_blocks(0.9, 16, 2048, 128)
    closed = validate.knobs_for(SMALL_CLOSED, async_scheduling=False)  # InferenceX's recorded serve flags
    assert (closed["max_num_seqs"], closed["max_num_batched_tokens"]) == (4, 8192)
    assert closed["max_concurrency"] == 4 and closed["async_scheduling"] is False
    assert closed["enable_prefix_caching"] is False
    unrecorded = validate.knobs_for(UNRECORDED_CLOSED)
    defaults = bl.vllm_defaults(bl.get_hardware("h100-sxm"))
    assert unrecorded["max_num_seqs"] == defaults["max_num_seqs"]
    assert unrecorded["max_num_batched_tokens"] == defaults["max_num_batched_tokens"]
    assert unrecorded["max_concurrency"] == 8 and "enable_prefix_caching" not in unrecorded
    assert validate.cost_for(SMALL_CLOSED).dtype == "fp8"
    with pytest.raises(ValueError, match="cost is for"):
        validate.replay_run(SMALL_CLOSED, cost=cost)
    # An unpublished pool follows the cost model the replay uses: an FP8 KV cache holds twice the tokens.
    fp8_kv = validate.knobs_with(SMALL_CLOSED, validate.cost_for(SMALL_CLOSED, kv_dtype="fp8"))
    assert fp8_kv["num_kv_blocks"] > 1.9 * validate.knobs_for(SMALL_CLOSED)["num_kv_blocks"]
    result, _ = validate.simulate_run(SMALL_CLOSED, cost=lambda run: validate.cost_for(run, kv_dtype="fp8"))
    assert result.knobs["num_kv_blocks"] == fp8_kv["num_kv_blocks"]


# -- replay ---------------------------------------------------------------------------------------

def test_replay_predicts_finite_positive_means():
    for run_id in (ROLEPLAY_7B, SMALL_CLOSED):
        out = validate.replay_run(run_id)
        for metric in validate.METRICS:
            assert math.isfinite(out[f"predicted_{metric}_ms"]) and out[f"predicted_{metric}_ms"] > 0
            assert out[f"measured_{metric}_ms"] > 0
        assert out["run_id"] == run_id and out["representable"]


def test_replay_is_deterministic():
    a, b = validate.replay_run(ROLEPLAY_7B, seed=3), validate.replay_run(ROLEPLAY_7B, seed=3)
    assert a == b
    c = validate.replay_run(ROLEPLAY_7B, seed=4)
    assert c["predicted_ttft_ms"] != a["predicted_ttft_ms"]  # the seed draws the send times
    r1, s1 = validate.build_requests(ROLEPLAY_7B, seed=3)
    r2, s2 = validate.build_requests(ROLEPLAY_7B, seed=3)
    assert (r1.arrival_s == r2.arrival_s).all() and (r1.prefix_ids == r2.prefix_ids).all() and (s1 == s2).all()


def test_overloaded_runs_are_recognised(runs):
    overloaded = runs[runs["status"] == "overloaded"]
    for run_id in overloaded["run_id"]:
        out = validate.replay_run(run_id)
        assert out["overloaded"], run_id
        assert out["completion_rate_req_s"] < out["offered_rate_req_s"] or out["ttft_growth_s"] > 1.0
    assert not validate.replay_run(ROLEPLAY_7B)["overloaded"]


def test_replay_all_and_error_summary(runs):
    subset = runs[runs["run_id"].isin([ROLEPLAY_7B, SMALL_CLOSED])]
    table = validate.replay_all(subset)
    assert list(table["run_id"]) == [ROLEPLAY_7B] * 3 + [SMALL_CLOSED] * 3
    assert list(table["metric"]) == list(validate.METRICS) * 2
    assert table["rel_error"].to_numpy() == pytest.approx((table["predicted_ms"] / table["measured_ms"] - 1).to_numpy())
    one = validate.replay_run(SMALL_CLOSED)
    assert table.loc[table["run_id"] == SMALL_CLOSED, "predicted_ms"].tolist() == [
        one[f"predicted_{m}_ms"] for m in validate.METRICS]
    fake = pd.DataFrame({"run_id": ["a", "b", "c", "d"], "set": ["s"] * 4, "metric": ["ttft"] * 4,
                         "status": ["ok", "ok", "ok", "overloaded"], "representable": [True, True, False, False],
                         "rel_error": [-0.1, 0.3, 5.0, 9.0]})
    summary = validate.error_summary(fake).set_index(["set", "metric"])
    assert summary.loc[("s", "ttft"), "runs"] == 2
    assert summary.loc[("s", "ttft"), "median_abs_error"] == pytest.approx(0.2)
    assert summary.loc[("s", "ttft"), "worst_abs_error"] == pytest.approx(0.3)
    assert summary.loc[("s", "ttft"), "worst_run_id"] == "b"
    assert summary.loc[("all", "ttft"), "runs"] == 2


def test_closed_loop_clients_burst_then_keep_their_own_phase(runs):
    """The first wave is one burst at 0; each client's second request goes out at its own phase, after the first
    wave has finished (so no idle wait counts), and the phases spread over one cycle."""
    row = runs.set_index("run_id").loc[UNRECORDED_CLOSED]
    c = int(row["concurrency"])
    first_wave, cycle = 30.0, 8.0
    requests, _ = validate.build_requests(UNRECORDED_CLOSED, seed=3, first_wave_s=first_wave, cycle_s=cycle)
    arrival = requests.arrival_s
    assert (arrival[:c] == 0).all()
    second = arrival[c:2 * c]
    assert (np.diff(second) >= 0).all() and (second >= first_wave).all() and (second < first_wave + cycle).all()
    assert np.ptp(second) > cycle / 4  # spread, not a second burst
    assert (arrival[2 * c:] == second[-1]).all()
    with pytest.raises(ValueError, match="cycle_s"):
        validate.build_requests(UNRECORDED_CLOSED, cycle_s=-1.0)
    replay_module = importlib.import_module("batchlab.validate.replay")
    first_wave_s, cycle_s = replay_module.client_timing(row, validate.cost_for(row))
    assert replay_module.client_timing(runs.set_index("run_id").loc[SMALL_CLOSED], validate.cost_for(SMALL_CLOSED)) \
        == (0.0, 0.0)  # InferenceX: the varied lengths spread the clients
    result, _ = validate.simulate_run(UNRECORDED_CLOSED)
    r = result.requests
    assert r["finish_s"].iloc[:c].max() < first_wave_s  # the margin holds: the first wave is done by then
    assert (r["sent_s"].iloc[c:2 * c].to_numpy() >= first_wave_s).all() and cycle_s > 0


def test_ablation_switches_each_mechanism_off(runs):
    """Each mechanism off changes the predictions the way its physics says, on a small set of runs."""
    from batchlab.validate import ablation

    row = runs.set_index("run_id").loc[SMALL_CLOSED]
    full = validate.cost_for(row)
    assert ablation.cost_without(row, "serving terms").request_latency_s == 0 < full.request_latency_s
    bf16 = runs.set_index("run_id").loc[ROLEPLAY_7B]  # BF16: without the correction the embedding table streams too
    old = ablation.cost_without(bf16, "LM-head correction")  # every parameter streamed and multiplied per token
    assert old.model.body_params == old.model.params and old.lm_head_bytes == 0
    assert old.decode_step_time(4, 1000) > validate.cost_for(bf16).decode_step_time(4, 1000)
    subset = runs[runs["run_id"].isin([SMALL_CLOSED, ROLEPLAY_7B])]
    table = ablation.ablations(subset)
    assert list(dict.fromkeys(table["mechanism"])) == list(ablation.MECHANISMS)
    med = table.set_index(["mechanism", "metric"])["median_error"]
    assert med[("serving terms", "ttft")] < med[("none", "ttft")]  # no request latency, no API server
    caching = validate.replay_all(runs[runs["run_id"] == ROLEPLAY_7B], enable_prefix_caching=False)
    with_cache = validate.replay_all(runs[runs["run_id"] == ROLEPLAY_7B])
    ttft = lambda t: t.loc[t["metric"] == "ttft", "predicted_ms"].iloc[0]  # noqa: E731
    assert ttft(caching) > ttft(with_cache)  # the roleplay prompts are cached after their first use


def test_closed_loop_later_requests_go_out_the_moment_a_client_frees(runs):
    """After the second wave (InferenceX: the first) no client waits for anything but its own answer: every later
    request is sent at the finish of an earlier one (the phases are spread over less than any request's cycle, so
    none gates another)."""
    largest = runs[runs["set"] == "aiconfigurator"].sort_values("concurrency")["run_id"].iloc[-1]
    for run_id in (SMALL_CLOSED, UNRECORDED_CLOSED, largest):
        row = runs.set_index("run_id").loc[run_id]
        c = int(row["concurrency"])
        result, _ = validate.simulate_run(run_id)
        r = result.requests
        finishes = np.sort(r["finish_s"].to_numpy())
        later = r["sent_s"].to_numpy()[(1 if row["client"] == raw.INFERENCEX else 2) * c:]
        nearest = finishes[np.clip(np.searchsorted(finishes, later), 0, finishes.size - 1)]
        assert np.allclose(later, nearest, rtol=0, atol=1e-9), run_id
