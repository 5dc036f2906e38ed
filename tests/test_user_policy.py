"""A user's own policy on the command line: ``--policy FILE.py:NAME`` or ``MODULE:NAME``."""

import json
from pathlib import Path

import pytest

from mooncake_gym.baselines import make_policy
from mooncake_gym.cli import main
from mooncake_gym.model.workload import synthetic_trace
from mooncake_gym.sim import routing
from mooncake_gym.sim.policy import load_policy

EXAMPLE = str(Path(__file__).resolve().parents[1] / "docs" / "examples" / "my_router.py")


def test_the_example_router_runs_as_a_function_of_the_view(capsys):
    assert main(["replay", "--preset", "lecture", "--policy", f"{EXAMPLE}:shortest_ttft", "--rate", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    trace = synthetic_trace(0, rate=2)
    direct = routing.simulate(trace, load_policy(f"{EXAMPLE}:shortest_ttft"))
    assert doc["results"][f"{EXAMPLE}:shortest_ttft"]["mean_ttft_s"] == direct.metrics["mean_ttft_s"]
    # Algorithm 1 without its balancing threshold: never worse on mean TTFT than pure load balancing here
    load = routing.simulate(trace, make_policy("routing", "load"))
    assert direct.metrics["mean_ttft_s"] <= load.metrics["mean_ttft_s"]


def test_a_class_is_instantiated_and_a_module_path_works():
    policy = load_policy("mooncake_gym.baselines.routing:KVCentric")
    assert type(policy.policy).__name__ == "KVCentric" and policy.name == policy.policy.name
    assert policy.threshold == policy.policy.threshold  # the policy's own attributes show through
    assert load_policy("mooncake_gym.baselines.routing:KVCentric") is not policy  # a fresh one each time


@pytest.mark.parametrize("source, spec, match", [
    (None, "{dir}/none.py:f", r"no file"),
    ("def g(view):\n    return 0\n", "{file}:f", r"has no 'f'"),
    ("raise RuntimeError('boom')\n", "{file}:f", r"importing .* failed: RuntimeError: boom"),
    ("f = 3\n", "{file}:f", r"f is not callable"),
    ("def f(view):\n    return 0\n", "{file}:", r"expected MODULE:NAME or FILE.py:NAME"),
    (None, "no_such_module_xyz:f", r"importing no_such_module_xyz failed: ModuleNotFoundError"),
])
def test_bad_policies_are_one_line_errors(tmp_path, source, spec, match):
    file = tmp_path / "p.py"
    if source is not None:
        file.write_text(source)
    spec = spec.format(dir=tmp_path, file=file)
    with pytest.raises(ValueError, match=match):
        load_policy(spec)


def test_the_command_line_names_a_bad_policy_before_any_work(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("import nonexistent_package_xyz\n")
    assert main(["overload", "--policy", f"{bad}:f"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ModuleNotFoundError" in err
    with pytest.raises(SystemExit) as e:  # argparse's usage error, one line
        main(["replay", "--policy", "kvcentric_typo"])
    assert e.value.code == 2 and "FILE.py:NAME" in capsys.readouterr().err


@pytest.mark.parametrize("source, match", [
    ("def f(view):\n    return 1 / 0\n", r"the policy raised ZeroDivisionError: division by zero"),
    ("class f:\n    def __call__(self, view):\n        return 0\n    def reset(self, rng):\n"
     "        raise KeyError('state')\n", r"reset raised KeyError: 'state'"),
])
def test_a_policy_that_raises_ends_the_command_with_one_line(tmp_path, capsys, source, match):
    file = tmp_path / "p.py"
    file.write_text(source)
    assert main(["replay", "--policy", f"{file}:f", "--rate", "2", "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("mooncake-gym replay: error: policy ")
    assert __import__("re").search(match, err)
    assert main(["replay", "--policy", "os:getcwd", "--rate", "2"]) == 2  # a callable of the wrong shape
    assert "the policy raised TypeError" in capsys.readouterr().err


def test_a_users_policy_takes_no_knobs():
    with pytest.raises(ValueError, match="takes no knobs"):
        make_policy("routing", f"{EXAMPLE}:shortest_ttft", threshold=2)
