"""A student's policy in a child process (mooncake_gym.course.sandbox): every way a submission
can fail is a graded failure with its reason, and the grader goes on."""

import json
import re

import numpy as np
import pytest

from mooncake_gym.course import lab
from mooncake_gym.course.sandbox import Limits, SandboxedPolicy, SubmissionFailed, encode_view, landlock_abi
from mooncake_gym.sim.routing import RoutingSimulator
from mooncake_gym.model.workload import synthetic_trace


def _view():
    sim = RoutingSimulator(synthetic_trace(0, 4.0).head(20))
    return sim.reset()


def _policy(tmp_path, source: str, limits=Limits(episode_s=20, total_s=60, memory_mb=512)):
    path = tmp_path / "submission.py"
    path.write_text(source)
    return SandboxedPolicy(f"{path}:route", limits)


def test_a_sandboxed_policy_sees_the_view_and_calls_its_methods(tmp_path):
    view = _view()
    source = ("def route(view):\n"
              "    best = min(range(view.n_instances), key=lambda i: view.ttft_s(i))\n"
              "    print('noise on stdout does not reach the pipe')\n"
              "    return best, False\n")
    with _policy(tmp_path, source) as policy:
        assert policy(view) == (min(range(view.n_instances), key=lambda i: view.ttft_s(i)), False)
        policy.reset(np.random.default_rng(3))
        assert policy(view)[0] in range(view.n_instances)


def test_the_view_is_sent_whole_and_read_only(tmp_path):
    view = _view()
    encoded = encode_view(view)
    assert "simulator" not in encoded["fields"] and "ttft_s" in encoded["methods"]
    assert json.loads(json.dumps(encoded)) == encoded
    with _policy(tmp_path, "def route(view):\n    view.queue_s = ()\n    return 0\n") as policy:
        with pytest.raises(SubmissionFailed, match="the policy raised AttributeError: the view is read-only"):
            policy(view)


@pytest.mark.parametrize("source, reason", [
    ("raise ImportError('no module named torch2')\ndef route(view):\n    return 0\n",
     "importing the submission raised ImportError: no module named torch2"),
    ("def route(view:\n    return 0\n", "importing the submission raised SyntaxError"),
    ("def other(view):\n    return 0\n", "the submission has no function 'route'"),
    ("def route(view):\n    return 1 / 0\n", "the policy raised ZeroDivisionError: division by zero"),
    ("import sys\ndef route(view):\n    sys.exit(0)\n", r"the policy called sys.exit\(0\)"),
    ("import os\ndef route(view):\n    os._exit(3)\n", r"its process ended \(exit code 3"),
    ("def route(view):\n    while True:\n        pass\n", "ran past the time limit of 1 s per episode"),
    ("def route(view):\n    return [0] * (10 ** 9)\n", "the policy raised MemoryError"),
    ("def route(view):\n    return object()\n", "the policy answered object"),
    ("def route(view):\n    return view.ttft_s('x')\n", "arguments the view does not take"),
])
def test_every_failure_is_a_reason(tmp_path, source, reason):
    # a second per episode for the loop; the other failures get time to spare on a loaded machine
    limits = Limits(episode_s=1 if "while True" in source else 30, total_s=60, memory_mb=256)
    with pytest.raises(SubmissionFailed, match=reason):
        with _policy(tmp_path, source, limits) as policy:
            policy(_view())


def test_the_child_cannot_write_data_to_files(tmp_path):
    target = tmp_path / "stolen.txt"
    source = f"def route(view):\n    with open({str(target)!r}, 'w') as f:\n        f.write('data')\n    return 0\n"
    # PermissionError where Landlock confines the child, else OSError (EFBIG) from RLIMIT_FSIZE
    with pytest.raises(SubmissionFailed, match="the policy raised (PermissionError|OSError)"):
        with _policy(tmp_path, source) as policy:
            policy(_view())
    assert not target.exists() or target.read_text() == ""


def test_limits_are_checked():
    with pytest.raises(ValueError, match="episode_s: expected seconds"):
        Limits(episode_s=0)
    with pytest.raises(ValueError, match="memory_mb: expected an integer"):
        Limits(memory_mb=1.5)


@pytest.mark.parametrize("source, reason, started", [
    ("import sys\nsys.exit(0)\ndef route(view):\n    return 0\n", r"called sys.exit\(0\)", False),
    ("def route(view):\n    return 'instance 0'\n", "its answer is not an action", True),
])
def test_the_grader_reports_a_failing_submission_and_exits_0(tmp_path, capsys, source, reason, started):
    path = tmp_path / "bad.py"
    path.write_text(source)
    code = lab.main(["grade", "--env", "routing", "--policy", f"{path}:route", "--seeds", "5",
                     "--env-kwarg", "episode_requests=50", "--json", "--time-limit-episode", "5"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scores"]["submission"]["score"] == 0.0
    assert re.search(reason, doc["scores"]["submission"]["failure"])
    # what confined a child that got as far as acting (one that failed on import never said)
    abi = landlock_abi()
    assert doc["scores"]["submission"].get("confinement") == (
        (f"landlock ABI {abi}" if abi >= 1 else "none") if started else None)
    assert "kvcentric" in doc["scores"] and all(r["policy"] != "submission" for r in doc["rows"])


@pytest.mark.parametrize("seeds, message", [("1,1", "each seed once"), ("-1", r"seeds in \[0, 4294967295\]"),
                                            (",".join(map(str, range(1001))), "at most 1000 seeds")])
def test_grading_seeds_are_distinct_non_negative_and_capped(seeds, message, capsys):
    with pytest.raises(SystemExit) as e:
        lab.main(["grade", "--env", "routing", "--policy", "x.py:f", "--seeds", seeds])
    assert e.value.code == 2 and re.search(message, capsys.readouterr().err)


def _confined(tmp_path, source):
    """The submission's policy run once in a fresh child; skips where the kernel has no Landlock."""
    with _policy(tmp_path, source) as policy:
        if policy.confinement == "none":
            pytest.skip("this kernel has no Landlock: the file-system confinement does not hold here")
        return policy(_view())


def test_the_child_reads_nothing_outside_python_and_the_project(tmp_path):
    secret = tmp_path / "secret" / "answers.txt"
    secret.parent.mkdir()
    secret.write_text("the grader's reference solution")
    source = f"def route(view):\n    return len(open({str(secret)!r}).read())\n"
    with pytest.raises(SubmissionFailed, match="the policy raised PermissionError"):
        _confined(tmp_path, source)


def test_the_child_deletes_nothing_outside_its_scratch_folder(tmp_path):
    victim = tmp_path / "keep.txt"
    victim.write_text("data")
    source = ("import os\n"
              "def route(view):\n"
              "    open('scratch.txt', 'w').close()  # its own folder: allowed\n"
              "    os.remove('scratch.txt')\n"
              f"    os.remove({str(victim)!r})\n"
              "    return 0\n")
    with pytest.raises(SubmissionFailed, match="the policy raised PermissionError"):
        _confined(tmp_path, source)
    assert victim.read_text() == "data"


def test_a_confined_child_still_imports_the_standard_library_numpy_and_the_project(tmp_path):
    source = ("import fractions, statistics, json\n"
              "import numpy as np\n"
              "from mooncake_gym.sim.views import RoutingView\n"
              "def route(view):\n"
              "    return int(np.argmin([view.ttft_s(i) for i in range(view.n_instances)]))\n")
    view = _view()
    assert _confined(tmp_path, source) == int(np.argmin([view.ttft_s(i) for i in range(view.n_instances)]))


def test_a_confined_child_neither_connects_nor_signals_the_grader(tmp_path):
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        source = ("import socket\n"
                  f"def route(view):\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    return 0\n")
        with _policy(tmp_path, source) as policy:
            abi = int(policy.confinement.split()[-1]) if policy.confinement != "none" else 0
            if abi < 4:
                pytest.skip(f"Landlock ABI {abi} has no network rights")
            with pytest.raises(SubmissionFailed, match="the policy raised PermissionError"):
                policy(_view())
    source = "import os, signal\ndef route(view):\n    os.kill(os.getppid(), signal.SIGTERM)\n    return 0\n"
    with _policy(tmp_path, source) as policy:
        if abi < 6:
            pytest.skip(f"Landlock ABI {abi} does not scope signals")
        with pytest.raises(SubmissionFailed, match="the policy raised PermissionError"):
            policy(_view())
