"""docs/calibration.md is the generator's output, its fit reproduces the package's constants, and the
split into fit and validation sets follows the stated rules."""

from pathlib import Path

import pytest

from mooncake_gym.analysis import calibration
from mooncake_gym.model import costmodel

DOC = Path(__file__).resolve().parents[1] / "docs" / "calibration.md"


@pytest.fixture(scope="module")
def points():
    if not calibration.SPLITWISE_CSV.is_file():
        pytest.skip(f"Splitwise's profile is not at {calibration.SPLITWISE_CSV} (it lives in shared/, outside the repo)")
    return calibration.all_points()


def test_the_page_is_the_generators_output_and_the_fit_is_the_packages(points, tmp_path):
    out = tmp_path / "calibration.md"
    assert calibration.main(["--out", str(out)]) == 0
    assert out.read_text() == DOC.read_text()
    # the page's refit (from FIT_START, on the fit set) gives the package's constants
    page = DOC.read_text()
    for name, value in calibration.current_parameters().items():
        row = next(line for line in page.splitlines() if line.startswith("| ") and f"`{name}`" in line.split("|")[1])
        assert [cell.strip() for cell in row.split("|")[2:4]] == [f"{value:.3g}"] * 2, name


def test_profile_points_and_exclusions(points):
    splitwise = [p for p in points if p.source == "Splitwise"]
    assert {p.gpu for p in splitwise} == {"A100", "H100"}  # the power-capped H100 rows are left out
    assert not [p for p in splitwise if p.n_gpus == 2 and p.batch == 64]  # the two failed TP2 batch-64 runs
    assert {p.model for p in splitwise} == {"llama2-70b", "bloom-176b"}
    one = [p for p in splitwise
           if (p.kind, p.model, p.gpu, p.n_gpus, p.tokens, p.batch) == ("prefill", "llama2-70b", "A100", 8, 8192, 1)]
    assert len(one) == 1 and one[0].measured_ms == pytest.approx(1549.8, abs=0.1)


def test_split_rules():
    P = calibration.Point
    assert calibration.split(P("decode", "llama2-70b", "A100", 4, 576, 1, 45.0, "Splitwise", "slow")) == "validation"
    assert calibration.split(P("decode", "llama2-70b", "A100", 8, 576, 1, 45.0, "Splitwise", "slow")) == "fit"
    assert calibration.split(P("prefill", "bloom-176b", "H100", 8, 512, 1, 76.0, "Splitwise", "slow")) == "validation"
    assert calibration.split(P("decode", "llama2-70b", "A100", 4, 3072, 16, 36.0, "lmdeploy")) == "fit"
    assert calibration.split(P("prefill", "llama2-70b", "A100", 4, 2048, 1, 377.0, "TRT-LLM v0.5")) == "validation"


def test_summary_is_median_and_worst_of_absolute_errors():
    rows = [{"kind": "decode", "split": "validation", "error": e} for e in (0.1, -0.3, 0.2)]
    assert calibration.summary(rows) == [{"kind": "decode", "split": "validation", "n": 3, "median": 0.2,
                                          "worst": 0.3}]


def test_model_figures_are_the_cost_models():
    p = calibration.Point("decode", "llama2-70b", "A100", 4, 3072, 16, 36.0, "lmdeploy")
    cost = costmodel.CostModel.realistic("llama2-70b", "A100", 4)
    assert calibration.model_ms(p) == pytest.approx(1e3 * cost.decode_step_s(16, 16 * 3072), rel=1e-12)
    ar = calibration.Point("all_reduce", "", "A100", 8, 2**20, 1, 0.03, "x", "")
    assert calibration.model_ms(ar) == 1e3 * costmodel.allreduce_s("A100", 8, 2**20)


def test_a_malformed_profile_names_the_file(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("model,hardware\nllama2-70b,a100-80gb\n")
    with pytest.raises(ValueError, match="splitwise: row 2"):
        calibration.read_splitwise(bad)
    with pytest.raises(SystemExit):
        calibration.main(["--splitwise", str(tmp_path / "missing.csv")])
