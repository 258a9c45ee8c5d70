"""`mystique validate numerics`: exit codes and results.csv."""

from __future__ import annotations

import pytest

from mystique.cli import main
from mystique.results import read_csv


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("MYSTIQUE_QUIET", "1")
    from mystique import progress

    monkeypatch.setattr(progress, "_ENABLED", False)


def test_cli_passes_on_healthy_cpu(tmp_path):
    out = tmp_path / "ok"
    rc = main(["validate", "numerics", "-o", str(out), "--group", "conversions", "--group", "accumulation",
               "--seed", "4"])
    assert rc == 0
    df = read_csv(out / "results.csv")
    assert len(df) > 10 and set(df["status"]) == {"pass"} and set(df["suite"]) == {"numerics"}


def test_cli_exits_1_when_a_check_fails(tmp_path):
    out = tmp_path / "bad"
    rc = main(["validate", "numerics", "-o", str(out), "--group", "conversions",
               "--inject", "mystique.validators.numerics.testing:round_toward_zero"])
    assert rc == 1
    df = read_csv(out / "results.csv")
    assert (df["status"] == "fail").any()
    assert set(df["device"]) == {"cpu+mystique.validators.numerics.testing:round_toward_zero"}


def test_cli_bad_usage_exits_2_without_output(tmp_path, capsys):
    out = tmp_path / "x"
    assert main(["validate", "numerics", "-o", str(out), "--dtypes", "int8", "--group", "accumulation"]) == 2
    assert "mystique: error:" in capsys.readouterr().err
    assert not out.exists()
    assert main(["validate", "numerics", "-o", str(out), "--ops", "nope", "--group", "op_sweep"]) == 2
