"""The course lab (``docs/lab/``, ``mooncake_gym/course/lab.py``): the notebooks and solutions execute, the
checks pass the solutions and fail wrong answers without printing the expected value, and the
grading script scores a submission next to the baselines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mooncake_gym.course import lab
from mooncake_gym.course.sandbox import landlock_abi

LAB = Path(__file__).resolve().parents[1] / "docs" / "lab"
NOTEBOOKS = sorted(LAB.glob("[0-9][0-9]_*.py"))
SOLUTIONS = sorted((LAB / "solutions").glob("[0-9][0-9]_*.py"))


def run_script(path: Path, cwd: Path, quick: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "LAB_OUT": str(cwd / "lab_output"), "MPLBACKEND": "Agg"}
    if quick:
        env["LAB_QUICK"] = "1"
    return subprocess.run([sys.executable, str(path)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_lab_has_its_four_notebooks():
    assert [p.stem for p in NOTEBOOKS] == ["01_lecture_demos", "02_your_own_policies", "03_train_an_agent",
                                          "04_reading_results"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_with_quick_settings(notebook, tmp_path):
    done = run_script(notebook, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    # the starting code of the policy exercises runs through the checks, which fail on it
    for name in re.findall(r'^lab\.check\("([a-z0-9-]+)"', notebook.read_text(), re.M):
        assert f"FAIL {name}:" in done.stdout
    if notebook.stem == "03_train_an_agent":
        assert (tmp_path / "lab_output" / "lab_router_seed1.zip").exists()
        # saved with its card, so `lab grade --agent` loads it without unpickling (docs/lab/README.md)
        from mooncake_gym.agents import load_agent
        load_agent(tmp_path / "lab_output" / "lab_router_seed1.zip")
        assert (tmp_path / "lab_output" / "learning_curve.png").exists()


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_solutions_pass_their_checks(solution, tmp_path):
    done = run_script(solution, tmp_path, quick=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "FAIL" not in done.stdout and done.stdout.count("PASS") >= 2


def test_every_exercise_is_asked_in_its_notebook_and_solved():
    asked = {}
    for notebook in NOTEBOOKS:
        for name in re.findall(r'lab\.check\("([a-z0-9-]+)"', notebook.read_text()):
            asked[name] = notebook.stem
    assert asked == {name: ex.notebook for name, ex in lab.EXERCISES.items()}
    solved = set()
    for solution in (LAB / "solutions").iterdir():
        solved |= set(re.findall(r'check\("([a-z0-9-]+)"', solution.read_text()))
        solved |= set(re.findall(r"`([a-z0-9-]+)` has no code to write", solution.read_text()))
    assert solved == set(lab.EXERCISES)


def test_a_wrong_number_fails_with_a_hint_and_without_the_answer(capsys):
    from mooncake_gym.model.costmodel import get_model

    expected = get_model("llama2-70b").kv_bytes_per_token
    assert lab.check("kv-bytes-per-token", expected * 8) is False  # bits, not bytes
    out = capsys.readouterr().out
    assert out.startswith("FAIL kv-bytes-per-token:") and "hint:" in out
    assert str(expected) not in out and f"{expected:,}" not in out
    assert lab.check("kv-bytes-per-token", expected) is True
    assert capsys.readouterr().out.startswith("PASS kv-bytes-per-token:")


@pytest.mark.parametrize("answer,message", [("a lot", "expected a number"), (True, "expected a number"),
                                            (float("nan"), "expected a finite number")])
def test_a_wrong_type_is_a_failure_that_says_what_was_expected(answer, message, capsys):
    assert lab.check("dram-speedup", answer) is False
    assert message in capsys.readouterr().out


def test_a_policy_that_raises_fails_naming_the_error(capsys):
    def broken(view):
        raise KeyError("oops")

    assert lab.check("best-instance", broken) is False
    out = capsys.readouterr().out
    assert "raised KeyError" in out and "at request 0" in out
    assert lab.check("best-instance", lambda view: 99) is False
    assert "expected an instance index in 0..7, got 99" in capsys.readouterr().out
    assert lab.check("router", 3) is False
    assert "expected a function" in capsys.readouterr().out


def test_an_unknown_exercise_is_an_error_listing_the_names():
    with pytest.raises(ValueError, match="exercise: unknown name 'kv-bytes'.*kv-bytes-per-token"):
        lab.check("kv-bytes", 1)


def test_the_policy_checks_compare_with_the_baselines_at_check_time(capsys):
    from mooncake_gym.baselines import make_policy

    # the targets are the baselines themselves: cache passes `router`; load does not
    assert lab.check("router", make_policy("routing", "cache")) is True
    assert lab.check("router", make_policy("routing", "load")) is False
    assert lab.check("admission", make_policy("admission", "early")) is True  # early meets its own figures
    assert lab.check("admission", make_policy("admission", "baseline")) is False
    capsys.readouterr()


# -- grading ------------------------------------------------------------------------------------------
SUBMISSION = '''
from mooncake_gym.baselines import make_policy

route = make_policy("routing", "kvcentric")  # a policy object: grading resets its random tie-breaks per episode


def first(view):
    return 0
'''


def test_grade_runs_a_submission_next_to_the_baselines(tmp_path, capsys):
    path = tmp_path / "submission.py"
    path.write_text(SUBMISSION)
    code = lab.main(["grade", "--env", "routing", "--policy", f"{path}:route", "--seeds", "5,6",
                     "--env-kwarg", "episode_requests=200", "--name", "student"])
    assert code == 0
    out = capsys.readouterr().out
    for name in ("random", "load", "cache", "kvcentric", "student"):
        assert re.search(rf"^{name}\s.*n/a$", out, re.M)  # another workload than the rubric's: no score
    assert "episode_requests=200; 2 hidden seeds" in out
    assert "no score: the rubric's thresholds were measured on the default workload" in out
    # what confined the child's file system, as the sandbox found the kernel
    abi = landlock_abi()
    assert out.splitlines()[-1] == ("student ran in the sandbox; its file system confined by: " +
                                    (f"landlock ABI {abi}" if abi >= 1 else "none (no Landlock here: it could read "
                                                                            "what the grader's user can read)"))
    policy = lab.load_policy(f"{path}:route")
    setting, scores = lab.grade("routing", [5, 6], policy=policy, env_kwargs={"episode_requests": 200})
    # the submission is Algorithm 1, reseeded like the baseline: the same episodes, the same numbers
    assert scores["submission"] == scores["kvcentric"]
    assert scores["submission"]["score"] is None


def test_the_rubric_scores_linearly_between_its_fixed_thresholds():
    routing, admission = lab.RUBRIC["routing"], lab.RUBRIC["admission"]
    assert routing.score(routing.full) == 100.0 and routing.score(routing.zero) == 0.0
    assert routing.score((routing.full + routing.zero) / 2) == pytest.approx(50.0)
    assert routing.score(0.01) == 100.0 and routing.score(60.0) == 0.0  # better than full, worse than zero
    assert admission.score(1541.0) == 100.0 and admission.score(0.0) == 0.0
    assert admission.score(770.5) == 50.0 and admission.score(1600.0) == 100.0


def test_the_rubric_is_what_its_command_measures():
    routing = lab.measure_rubric("routing", ("random", "kvcentric"))
    assert routing == {"random": lab.RUBRIC["routing"].zero, "kvcentric": lab.RUBRIC["routing"].full}
    admission = lab.measure_rubric("admission")
    assert admission["baseline"] == lab.RUBRIC["admission"].full == max(admission.values())


def test_random_scores_zero_on_the_rubric_seeds_whatever_the_other_rows():
    from mooncake_gym.baselines import make_policy

    seeds = lab.RUBRIC_SEEDS
    _, alone = lab.grade("routing", seeds, policy=make_policy("routing", "random"), baselines=())
    assert set(alone) == {"submission"} and alone["submission"]["score"] == 0.0
    assert alone["submission"]["mean_ttft_s"] == lab.RUBRIC["routing"].zero
    _, beside = lab.grade("routing", seeds, policy=make_policy("routing", "random"), baselines=("kvcentric",))
    assert beside["submission"] == alone["submission"] and beside["kvcentric"]["score"] == 100.0
    _, nothing = lab.grade("admission", seeds[:2], policy=lambda view: False, baselines=())
    assert nothing["submission"]["goodput"] == 0.0 and nothing["submission"]["score"] == 0.0


def test_grade_an_admission_agent(tmp_path, capsys):
    import torch
    from stable_baselines3 import PPO

    import gymnasium as gym

    torch.set_num_threads(1)
    model = PPO("MlpPolicy", gym.make("mooncake_gym/OverloadAdmission-v0"), n_steps=64, batch_size=64, seed=0,
                device="cpu")
    model.save(tmp_path / "agent.zip")
    argv = ["grade", "--env", "admission", "--agent", str(tmp_path / "agent.zip"), "--seeds", "3",
            "--env-kwarg", "episode_requests=100", "--json"]
    with pytest.raises(SystemExit) as refused:  # a zip without its card is not unpickled unless asked
        lab.main(argv)
    assert refused.value.code == 2 and "--unsafe-pickle" in capsys.readouterr().err
    assert lab.main([*argv, "--unsafe-pickle"]) == 0
    import json

    captured = capsys.readouterr()
    assert "was unpickled (--unsafe-pickle)" in captured.err
    doc = json.loads(captured.out)
    assert doc["seeds"] == [3] and set(doc["scores"]) == {"baseline", "early", "predict", "predict_dist",
                                                           "submission"}


@pytest.mark.parametrize("argv,message", [
    (["--policy", "nowhere.py:f", "--seeds", "1"], "--policy: no file nowhere.py"),
    (["--policy", "no_such_module_xyz:f", "--seeds", "1"], "--policy: cannot import 'no_such_module_xyz'"),
    (["--policy", "justaname", "--seeds", "1"], "--policy: expected module:function"),
    (["--policy", "mooncake_gym.course.lab:check", "--seeds", "1,x"], "--seeds: expected comma-separated integers"),
    (["--policy", "mooncake_gym.course.lab:check", "--seeds", "1", "--env-kwarg", "rate"], "--env-kwarg: expected key=value"),
])
def test_grade_errors_name_the_argument(argv, message, capsys):
    """Usage errors end the grader with exit code 2 before any work; a submission that imports but
    fails (no such function, an error, a limit) is graded instead (tests/test_sandbox.py)."""
    with pytest.raises(SystemExit) as e:
        lab.main(["grade", "--env", "routing", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_list_names_every_exercise(capsys):
    assert lab.main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in lab.EXERCISES)


def test_notebooks_open_as_jupyter_notebooks():
    jupytext = pytest.importorskip("jupytext", reason="opening the notebooks in Jupyter needs jupytext")
    for notebook in NOTEBOOKS:
        nb = jupytext.read(notebook)
        kinds = {cell.cell_type for cell in nb.cells}
        assert kinds == {"markdown", "code"} and len(nb.cells) >= 8
        assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# Lab ")
