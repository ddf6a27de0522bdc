"""Latency model fits against the published data they come from, and transfer times."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.conductor.latency import TransferModel
from kvstore.conductor.profiles import (
    DISTSERVE_JSON,
    PROFILES,
    data_dir,
    fit_reports,
    load_profile,
    profile_name,
)
from kvstore.errors import BadRequestError, NotFoundError
from kvstore.types import Tier


def test_splitwise_fit_error_is_small() -> None:
    report = load_profile("llama2-70b/a100-tp4").latency.fit_report()
    assert report.points == 105
    # measured: prefill mean 12.6% (max 43%), decode mean 2.2% (max 7.3%)
    assert report.prefill_mean_rel_err < 0.15 and report.prefill_max_rel_err < 0.5
    assert report.decode_mean_rel_err < 0.03 and report.decode_max_rel_err < 0.08


def test_fitted_model_shape() -> None:
    lat = load_profile().latency
    assert 0.10 < lat.prefill_s(512, 0) < 0.20  # the CSV says 127 ms at batch 1
    assert lat.prefill_s(4096, 0) > 7 * lat.prefill_s(512, 0)
    assert lat.prefill_s(512, 8192) > lat.prefill_s(512, 0)  # attention over cached context
    assert lat.prefill_s(0, 100) == 0.0 and lat.decode_step_s(0, 0) == 0.0
    assert 0.040 < lat.decode_step_s(1, 576) < 0.050  # the CSV says 44 ms


def test_distserve_coefficients_used_directly() -> None:
    lat = load_profile("opt-13b/a100-tp1").latency
    a, b, c = 18.10254647486372, 0.1019122572698738, 7.122264314252114e-06
    assert lat.prefill_s(1000, 0) == pytest.approx((a + 1 + b * 1000 + c * 1e6) / 1e3)
    small = 19.934702624895458 + 0.0006269356524350583 * 5000 + 0.03850697740828398 * 10
    assert lat.decode_step_s(10, 5000) == pytest.approx(small / 1e3)
    large = 7.1661889468253595 + 0.0005798000403396046 * 50000 + 0.15831096191764046 * 100
    assert lat.decode_step_s(100, 50000) == pytest.approx(large / 1e3)
    with pytest.raises(NotFoundError, match="not fitted"):
        lat.fit_report()


def test_every_profile_loads() -> None:
    for name in PROFILES:
        assert load_profile(name).transfer.kv_bytes_per_token > 0
    assert load_profile().transfer.kv_bytes_per_token == 327_680  # Llama2-70B, fp16, GQA
    with pytest.raises(BadRequestError, match=r"valid: .*llama2-70b/a100-tp4"):
        load_profile("gpt-5")


def test_profiles_cover_the_published_hardware_and_size_the_kv() -> None:
    # Splitwise's rows: Llama2-70B on A100, H100 and power-capped H100 at TP 2/4/8
    h, cap = load_profile("llama2-70b/h100-tp8"), load_profile("llama2-70b/h100pcap-tp8")
    assert (h.hardware, cap.hardware, h.tensor_parallel) == ("h100-80gb", "h100-80gb-pcap", 8)
    # the power cap slows prefill, not decode (Splitwise's finding, in its measured rows)
    assert cap.latency.prefill_s(2000, 0) > 1.2 * h.latency.prefill_s(2000, 0)
    assert cap.latency.decode_step_s(32, 64_000) == pytest.approx(
        h.latency.decode_step_s(32, 64_000), rel=0.05
    )
    # KV tokens: (8 x 80 GB - 140 GB of weights) x 0.9 / 327,680 bytes per token
    assert h.kv_capacity_tokens == int((640e9 - 140e9) * 0.9 / 327_680)
    opt = load_profile("opt-13b/a100-tp2")
    assert (opt.max_context_tokens, h.max_context_tokens) == (2048, None)
    assert profile_name("llama2-70b", "h100pcap", 4) == "llama2-70b/h100pcap-tp4"
    with pytest.raises(NotFoundError, match=r"available: llama2-70b/a100-tp2, .*h100pcap-tp8"):
        profile_name("llama2-70b", "b200", 8)  # a hardware the data does not have


def test_missing_data_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSTORE_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(NotFoundError, match="set KVSTORE_DATA_DIR"):
        data_dir()
    with pytest.raises(NotFoundError, match="is missing"):
        load_profile("opt-13b/a100-tp1", tmp_path)
    (tmp_path / "distserve").mkdir()
    (tmp_path / DISTSERVE_JSON).write_text("{}")
    with pytest.raises(NotFoundError, match="no DistServe profile for facebook/opt-13b TP1"):
        load_profile("opt-13b/a100-tp1", tmp_path)


def test_transfer_model_times() -> None:
    tr = TransferModel(1000, (1e12, 1e9, 1e8), network_bytes_per_s=5e8, overhead_s=0.001)
    assert tr.load_s({}, remote=False) == 0.0
    assert tr.load_s({Tier.DRAM: 1000, Tier.SSD: 100}, remote=False) == pytest.approx(
        0.001 + 1e6 / 1e9 + 1e5 / 1e8
    )
    # remote: HBM and DRAM capped by the network, SSD slower than the network
    assert tr.load_s({Tier.HBM: 1000, Tier.SSD: 100}, remote=True) == pytest.approx(
        0.001 + 1e6 / 5e8 + 1e5 / 1e8
    )
    with pytest.raises(BadRequestError):
        TransferModel(0)


def test_fit_reports_cover_every_profile() -> None:
    reports = fit_reports()
    assert sorted(reports) == sorted(PROFILES)
    assert reports["opt-13b/a100-tp1"] is None
    fitted = reports["llama2-70b/h100-tp4"]
    assert fitted is not None and fitted.points == 105 and fitted.prefill_mean_rel_err < 0.15
