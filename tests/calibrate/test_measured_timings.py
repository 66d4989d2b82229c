"""The compact table of measured timings (data/measured_timings.csv.gz) and the raw public files it comes from.

Tests marked ``needs_data`` read the raw files (``$BATCHLAB_MEASURED_DIR``, else ../shared/data/measured) and
skip without them; the others read only the committed table.
"""
import gzip
import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import batchlab as bl
from batchlab import calibrate

ROOT = Path(__file__).resolve().parents[2]
ROWS = {"vidur_gemm": 21924, "vidur_elementwise": 26100, "gemm_kernels_fp8": 112, "decode_attn": 755,
        "prefill_attn": 30, "llmservingsim": 30720, "allreduce": 2982}
UNITS = {"vidur_gemm": "ms", "vidur_elementwise": "ms", "gemm_kernels_fp8": "us", "decode_attn": "us",
         "prefill_attn": "us", "llmservingsim": "ns", "allreduce": "ms"}
LAYERS = ["act_fn", "attn", "down_proj", "embedding", "final_layernorm", "gate_proj", "input_layernorm", "k_proj",
          "lm_head", "o_proj", "post_layernorm", "q_proj", "rope", "up_proj", "v_proj"]


@pytest.fixture(scope="module")
def table():
    return calibrate.measured_timings()


def _script():
    path = ROOT / "scripts" / "make_measured_timings.py"
    spec = importlib.util.spec_from_file_location("make_measured_timings", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _costs():
    after = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))
    return after.replace(**calibrate.START), after


# -- the committed table, alone ----------------------------------------------------------------------

def test_layout(table):
    assert list(table.columns) == list(calibrate.COLUMNS)
    assert {k: str(v) for k, v in table.dtypes.items()} == {
        k: {"str": "str", "float64": "float64"}.get(v, v) for k, v in calibrate.COLUMNS.items()}
    assert table.groupby("set", sort=False).size().to_dict() == ROWS
    assert len(table) == 82623
    assert table.groupby("set")["unit"].unique().map(list).to_dict() == {k: [v] for k, v in UNITS.items()}
    assert table.groupby("set")["source"].unique().map(list).to_dict() == {
        k: [calibrate.readers.SOURCES[k]] for k in ROWS}
    assert table["measured"].notna().all() and (table["measured"] > 0).all()
    assert calibrate.TIMINGS_FILE == ROOT / "data" / "measured_timings.csv.gz"


def test_known_rows(table):
    """A row of every set, as its source file has it (values read off the raw files)."""
    def one(**where):
        rows = table
        for k, v in where.items():
            rows = rows[rows[k] == v]
        assert len(rows) == 1, where
        return rows.iloc[0]

    row = one(set="vidur_gemm", model="Qwen-72B", op="attn_pre_proj", source_row=0)
    assert (row["measured"], row["tokens"], row["tp"], row["d_model"], row["heads"], row["kv_heads"],
            row["head_dim"], row["d_ff"], row["vocab"], row["gated"]) == (2.5675, 4096, 1, 8192, 64, 64, 128, 24576,
                                                                         152064, True)
    assert one(set="vidur_gemm", model="Qwen-72B", op="attn_pre_proj", source_row=1)["measured"] == 2.6085000000000003
    assert one(set="gemm_kernels_fp8", m=8, k=2048, n=6144)["measured"] == 8.988
    row = one(set="decode_attn", heads=32, kv_heads=8, head_dim=128, tp=1, source_row=0)
    assert (row["batch"], row["kv_len"], row["measured"]) == (1, 1024, 39.718)
    assert one(set="prefill_attn", heads=32, kv_heads=8, head_dim=128, tokens=1024)["measured"] == 38.098
    row = one(set="llmservingsim", op="embedding", tokens=1)
    assert (row["measured"], row["tp"], row["kv_len"], row["model"]) == (2915.0, 1, 0, "Llama-3.1-8B")
    row = one(set="allreduce", source_row=0)
    assert (row["workers"], row["size_bytes"], row["measured"]) == (8, 2048, 0.037)


def test_phi2_has_no_elementwise_rows(table):
    models = table.groupby("set")["model"].unique().map(set)
    assert "phi-2" in models["vidur_gemm"] and "phi-2" not in models["vidur_elementwise"]
    assert len(models["vidur_gemm"]) == 6 and len(models["vidur_elementwise"]) == 5


def test_file_is_deterministic_gzip():
    raw = calibrate.TIMINGS_FILE.read_bytes()
    assert raw[:2] == b"\x1f\x8b" and raw[4:8] == b"\0\0\0\0"  # gzip, header time zero
    with gzip.open(calibrate.TIMINGS_FILE, "rt") as fh:
        assert fh.readline().rstrip("\n").split(",") == list(calibrate.COLUMNS)


def test_compact_table_ignores_the_environment(monkeypatch, table):
    monkeypatch.setenv(calibrate.MEASURED_ENV, "/nonexistent/measured")
    calibrate.readers._table.cache_clear()
    try:
        pd.testing.assert_frame_equal(calibrate.measured_timings(), table, check_exact=True)
    finally:
        calibrate.readers._table.cache_clear()
    with pytest.raises(FileNotFoundError, match=calibrate.MEASURED_ENV):
        calibrate.measured_dir()


def test_llmservingsim_layers(table):
    layers = calibrate.llmservingsim_layers()
    assert list(layers.columns) == LAYERS and layers.index.name == "tokens"
    assert layers.index.tolist() == list(range(1, 2049))
    assert layers.loc[1, "embedding"] == 2915e-9
    rows = table[(table["set"] == "llmservingsim") & (table["op"] == "lm_head") & (table["tokens"] == 2048)]
    assert layers.loc[2048, "lm_head"] == rows["measured"].item() * 1e-9


def test_llmservingsim_forward_s():
    layers = calibrate.llmservingsim_layers()
    forward = calibrate.llmservingsim_forward_s()
    once = ["embedding", "final_layernorm", "lm_head"]
    per_layer = [c for c in LAYERS if c not in once]
    for t in (1, 777, 2048):
        want = sum(layers.loc[t, c] for c in once) + 32 * sum(layers.loc[t, c] for c in per_layer)
        assert forward.loc[t] == pytest.approx(want, rel=1e-12)
    assert forward.index.equals(layers.index)
    assert 0.1e-3 < forward.loc[1] < forward.loc[2048] < 1.0  # seconds: a whole 8B forward pass


def test_missing_measurements_say_what_to_set(tmp_path):
    with pytest.raises(FileNotFoundError, match=calibrate.MEASURED_ENV):
        calibrate.measured_dir(tmp_path)


def test_measured_dir_reads_the_variable(monkeypatch, tmp_path):
    (tmp_path / "vidur_h100").mkdir()
    monkeypatch.setenv(calibrate.MEASURED_ENV, str(tmp_path))
    assert calibrate.measured_dir() == tmp_path.resolve()


# -- against the raw public files -------------------------------------------------------------------

@pytest.mark.needs_data
def test_committed_table_is_what_the_script_writes(measured, tmp_path):
    out = tmp_path / calibrate.TIMINGS_FILE.name
    _script().main(["--measured-dir", str(measured), "--out", str(out)])
    with gzip.open(out, "rb") as built, gzip.open(calibrate.TIMINGS_FILE, "rb") as committed:
        assert built.read() == committed.read(), \
            "data/measured_timings.csv.gz is stale: run .venv/bin/python scripts/make_measured_timings.py"


@pytest.mark.needs_data
def test_raw_and_compact_tables_are_equal(measured, table):
    raw = calibrate.measured_timings(measured)
    pd.testing.assert_frame_equal(raw, table, check_exact=True)
    assert np.array_equal(raw["measured"].to_numpy().view(np.int64), table["measured"].to_numpy().view(np.int64))


@pytest.mark.needs_data
def test_load_all_from_raw_and_compact_are_equal(measured):
    before, after = _costs()
    floors, own = calibrate.shipped_floors(), calibrate.shipped_own_kernels()
    for args in ((before,), (after, floors, own)):
        compact = calibrate.load_all(*args[:1], None, *args[1:])
        raw = calibrate.load_all(*args[:1], measured, *args[1:])
        assert len(compact) == 41316
        pd.testing.assert_frame_equal(raw, compact, check_exact=True)
    pd.testing.assert_frame_equal(calibrate.llmservingsim_layers(measured), calibrate.llmservingsim_layers(),
                                  check_exact=True)
    pd.testing.assert_series_equal(calibrate.llmservingsim_forward_s(measured), calibrate.llmservingsim_forward_s(),
                                   check_exact=True)


@pytest.mark.needs_data
def test_fit_from_raw_files_reproduces_the_shipped_files(measured):
    cal = calibrate.fit(measured)
    expected = pd.concat([calibrate.parameter_table(cal), calibrate.serving_table(calibrate.shipped_serving_terms())])
    assert expected.to_csv(index=False) == (calibrate.DATA_DIR / "calibration.csv").read_text()
    assert cal.errors.round(4).to_csv(index=False) == (calibrate.DATA_DIR / "calibration_errors.csv").read_text()
    compact = calibrate.fit()
    assert cal[:8] == compact[:8]  # every fitted float, bit for bit
    pd.testing.assert_frame_equal(cal.errors, compact.errors, check_exact=True)
