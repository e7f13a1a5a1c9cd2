"""A user's own environment through the same route as BFCL's: the example in examples/agentic/ from its task file,
contained, rebuilt by replay."""
from __future__ import annotations

import json

from eagledata.agentic import ContainedEnvironment, Limits, read_tasks, rebuild
from eagledata.agentic.calls import RAISED
from eagledata.agentic.contained import ContainedEnvironments
from tests.helpers import ROOT

EXAMPLE = ROOT / "examples" / "agentic"


def test_the_example_key_value_store_runs_from_its_task_file():
    tasks = read_tasks(EXAMPLE / "kv_tasks.jsonl")
    spec = tasks[0].spec(base=EXAMPLE)  # the class's file named relative to the task file
    assert spec.backend == f"{EXAMPLE / 'kv_store.py'}:KeyValueStore"
    env = ContainedEnvironment(spec, Limits(call_s=5.0))
    try:
        assert env.execute("put", json.dumps({"key": "colour", "value": "blue"})).text == \
            '{"stored": "colour", "size": 2}'
        assert env.execute("keys", "{}").text == "['city', 'colour']"
        missing = env.execute("get", json.dumps({"key": "nope"}))
        assert (missing.error, missing.text) == (RAISED, "Error during execution: \"no key 'nope'\"")
        ticket = env.execute("new_ticket", "{}")
        assert env.execute("get", '{"key": "ticket"}').text == json.loads(ticket.text)["ticket"]
        again = rebuild(ContainedEnvironments(Limits(call_s=5.0)), spec, env.history)  # seeded: the same ticket
        assert again.execute("get", '{"key": "ticket"}').text == json.loads(ticket.text)["ticket"]
        again.close()
    finally:
        env.close()


def test_a_module_named_environment_imports_from_the_path_given(tmp_path):
    """`package.module:Class` form: the module is found on the code path the spec carries."""
    (tmp_path / "my_envs").mkdir()
    (tmp_path / "my_envs" / "__init__.py").write_text("")
    (tmp_path / "my_envs" / "kv.py").write_text((EXAMPLE / "kv_store.py").read_text())
    task = read_tasks(EXAMPLE / "kv_tasks.jsonl")[1]
    spec = task.spec(code_path=[str(tmp_path)])
    spec = type(spec)(spec.task_id, "my_envs.kv:KeyValueStore", spec.initial_config, spec.involved_classes,
                      spec.tools, spec.code_path)
    env = ContainedEnvironment(spec, Limits(call_s=5.0))
    try:
        assert env.execute("keys", "{}").text == "[]"
    finally:
        env.close()


def test_a_user_file_opened_from_several_threads_at_once_gives_each_its_class(tmp_path):
    """The executor's threads open a task's environment at once: a file module is in `sys.modules` before its body
    has run, so without the loader's lock a second thread found it without its class ("has no class", seen once on a
    loaded fresh `make test`). Its body sleeps here, so the threads overlap on every machine."""
    import threading

    from eagledata.agentic.backends import user_class

    path = tmp_path / "slow_env.py"
    path.write_text("import time\ntime.sleep(0.3)\n\n\nclass Slow:\n    pass\n")
    got, errors = [], []

    def load():
        try:
            got.append(user_class(f"{path}:Slow", ()))
        except Exception as e:  # noqa: BLE001 - the race's error is what the test reports
            errors.append(e)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(got) == 4 and len(set(got)) == 1 and got[0].__name__ == "Slow"


def test_a_user_file_whose_body_raises_is_loaded_again_next_time(tmp_path):
    from eagledata.agentic.backends import user_class
    from eagledata.agentic.dispatch import BuildError

    path = tmp_path / "flaky_env.py"
    path.write_text("raise RuntimeError('not yet')\n")
    try:
        user_class(f"{path}:Env", ())
    except BuildError as e:
        assert "not yet" in str(e)
    else:
        raise AssertionError("a module whose body raised was taken as loaded")
    path.write_text("class Env:\n    pass\n")
    assert user_class(f"{path}:Env", ()).__name__ == "Env"
