"""Contained environments: every planted bad call is an error result of its kind and the next call still works; a
call that hangs, eats memory or kills its process is stopped, the environment rebuilt by replay without it; the
worker reads its code and nothing else of the host, and sees no secrets."""
from __future__ import annotations

import json

import pytest

from eagledata.agentic import BuildError, ContainedEnvironment, Limits, ReplayMismatch, error_counts
from eagledata.agentic.backends import EnvironmentSpec
from eagledata.agentic.calls import (
    CRASHED,
    INVALID_ARGUMENTS,
    MALFORMED_ARGUMENTS,
    OUT_OF_MEMORY,
    RAISED,
    TIMEOUT,
    UNKNOWN_FUNCTION,
)
from tests.helpers.agentic_envs import HERE, PLANTED_TOOLS, UNSEEDED_TOOLS

LIMITS = Limits(call_s=2.0, start_s=60.0, memory_bytes=768 << 20)


def planted(limits: Limits = LIMITS, cls: str = "Planted", tools=PLANTED_TOOLS) -> ContainedEnvironment:
    return ContainedEnvironment(EnvironmentSpec("planted", f"{HERE}:{cls}", {"start": 1}, [], tools), limits)


def test_each_bad_call_is_an_error_result_and_the_next_call_works():
    """The planted failures in turn, each followed by a plain call that must see the state the successful calls
    (and the raising one, which changed it before it raised) left: nothing lost, nothing applied twice."""
    env = planted()
    try:
        expected = 1
        bad = [("nope", "{}", UNKNOWN_FUNCTION, "Error during execution: name 'nope' is not defined"),
               ("add", '{"n": ', MALFORMED_ARGUMENTS, "add() arguments are not valid JSON"),
               ("add", "[1]", MALFORMED_ARGUMENTS, "add() arguments must be a JSON object, got array"),
               ("add", '{"n": "2"}', INVALID_ARGUMENTS, "add() argument 'n' must be integer, got string"),
               ("add", "{}", INVALID_ARGUMENTS, "add() missing required argument 'n'"),
               ("add", '{"n": 1, "m": 2}', INVALID_ARGUMENTS, "add() got an unexpected keyword argument 'm'"),
               ("boom", "{}", RAISED, "Error during execution: planted failure"),
               ("hang", "{}", TIMEOUT, "hang() did not return within 2 s"),
               ("hog", "{}", OUT_OF_MEMORY, "hog() ran out of memory"),
               ("crash", "{}", CRASHED, "crash() ended the environment's process (exit code 7")]
        for name, arguments, kind, text in bad:
            result = env.execute(name, arguments)
            assert (result.error, text in result.text) == (kind, True), (name, result)
            assert result.text.startswith("Error during execution: ")
            expected += 1000 if name == "boom" else 0
            expected += 1
            assert env.execute("add", '{"n": 1}').text == json.dumps({"count": expected}), name
        assert env.restarts == 3  # after the hang, the memory and the crash: each rebuilt by replay
        assert error_counts(e.result for e in env.history) == {
            UNKNOWN_FUNCTION: 1, MALFORMED_ARGUMENTS: 2, INVALID_ARGUMENTS: 3, RAISED: 1, TIMEOUT: 1,
            OUT_OF_MEMORY: 1, CRASHED: 1}
    finally:
        env.close()


def test_the_worker_reads_its_code_and_nothing_else_of_the_host(tmp_path, monkeypatch):
    """Writing a host file, reading one outside the code's folders, a socket, a process: each refused inside the
    call (an error result); no file appears; the parent's secrets are not in the worker's environment."""
    monkeypatch.setenv("EAGLEDATA_PLANTED_SECRET", "sk-planted")  # the test process's own environment
    outside = tmp_path / "host.txt"
    outside.write_text("host data")
    env = planted()
    try:
        wrote = env.execute("write_file", json.dumps({"path": str(tmp_path / "new.txt"), "text": "x"}))
        assert wrote.error == RAISED and "writing" in wrote.text and "not allowed" in wrote.text
        assert not (tmp_path / "new.txt").exists()
        read = env.execute("read_file", json.dumps({"path": str(outside)}))
        assert read.error == RAISED and f"reading {outside}" in read.text
        code = env.execute("read_file", json.dumps({"path": str(HERE)}))  # its own code: allowed
        assert code.error is None and "class Planted" in code.text
        for name in ("connect", "spawn"):
            refused = env.execute(name, "{}")
            assert refused.error == RAISED and "is not allowed in an environment" in refused.text, refused
        assert env.execute("secret", "{}").text == ""
        assert env.execute("add", '{"n": 1}').text == '{"count": 2}'
    finally:
        env.close()


def test_an_environment_that_does_not_replay_is_refused():
    """Unseeded randomness: the rebuild after a crash replays `roll` and gets another number: a ReplayMismatch,
    never a silently different state."""
    env = planted(cls="Unseeded", tools=UNSEEDED_TOOLS)
    try:
        env.execute("roll", "{}")
        env.worker.kill()  # the process gone under it, as a crash would leave it
        env.worker = None
        with pytest.raises(ReplayMismatch, match="replaying call 0 \\(roll"):
            env.execute("roll", "{}")
    finally:
        env.close()


def test_bad_environments_fail_to_build_naming_why(tmp_path):
    for backend, said in [(f"{HERE}:Missing", "has no class Missing"),
                          (f"{tmp_path / 'none.py'}:X", "importing"),
                          ("no_such_module_here:X", "No module named 'no_such_module_here'"),
                          (f"{HERE}:Unseeded", "tool 'add' has no public method in Unseeded")]:
        with pytest.raises(BuildError, match=said):
            ContainedEnvironment(EnvironmentSpec("t", backend, {}, [], PLANTED_TOOLS), LIMITS)
    tight = Limits(call_s=2.0, start_s=60.0, memory_bytes=8 << 20)
    with pytest.raises(BuildError, match="task t: "):
        ContainedEnvironment(EnvironmentSpec("t", f"{HERE}:Planted", {}, [], PLANTED_TOOLS), tight)


def test_bfcl_bad_calls_are_error_results(bfcl_tasks, bfcl_backends):
    """The same through BFCL's backends: BFCL's wording, and the environment goes on."""
    task = next(t for t in bfcl_tasks if t.involved_classes == ["TravelAPI"] or "TravelAPI" in t.involved_classes)
    env = ContainedEnvironment(task.spec(bfcl_backends), LIMITS)
    try:
        results = [env.execute("rm_rf", "{}"), env.execute("get_flight_cost", "{not json"),
                   env.execute("get_flight_cost", json.dumps({"travel_from": 1, "travel_to": "JFK",
                                                              "travel_date": "2024-01-01",
                                                              "travel_class": "economy"})),
                   env.execute("get_flight_cost", json.dumps({"travel_from": "ZZZ", "travel_to": "YYY",
                                                              "travel_date": "2024-01-01",
                                                              "travel_class": "economy"}))]
        assert [r.error for r in results] == [UNKNOWN_FUNCTION, MALFORMED_ARGUMENTS, INVALID_ARGUMENTS, RAISED]
        assert results[3].text == "Error during execution: No available route for the given airports."
        assert env.execute("list_all_airports", "{}").error is None
    finally:
        env.close()


def test_a_hung_worker_whose_parent_is_gone_ends_itself():
    """The parent stops waiting (as a parent killed mid-call would) and never kills the worker: the worker's own
    alarm, set past the parent's limit, ends it (remove the alarm and it hangs on: the wait below times out)."""
    import subprocess

    with planted(Limits(call_s=0.5, replay_slack=1.0, memory_bytes=768 << 20)) as env:
        worker = env.worker
        assert worker is not None
        assert worker.request({"name": "hang", "arguments": "{}"}, 0.2) is None
        try:
            code = worker.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            code = None
        assert code == -14  # SIGALRM
