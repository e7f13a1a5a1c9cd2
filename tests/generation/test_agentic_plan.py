"""Planning agentic datasets by steps per task (issue 61 item 6): a synthetic pilot whose trajectories re-send their
history; the plan's requests, prompt and output tokens and money are the pilot's own when planned for as many tasks,
and the growth of the prompts with the trajectory is what makes them so."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from eagledata.generation.plan.agentic import (
    AgenticShape,
    estimate,
    measure_tasks,
    pilot_shape,
    prior_shape,
    tasks_for_budget,
)
from eagledata.generation.plan.budget import Prices
from tests.helpers.rollouts import task

PRICES = Prices(0.6, 3.0, "test")
STEPS = [2, 2, 3, 3, 3, 4, 4, 5, 6, 8]  # the pilot's trajectories
P0, GROWTH, OUT = 400, 120, 90


def _pilot() -> list[dict]:
    """Ten ended trajectories, request k's prompt P0 + (k−1)·GROWTH tokens, OUT output tokens each; a pause sample, an
    open trajectory's record and a plain record beside them (none a step of an ended task)."""
    rows = []
    for i, s in enumerate(STEPS):
        for k in range(1, s + 1):
            rows.append({"id": f"t{i}" if k == 1 else f"t{i}#{k}", "dataset": "A", "conversation_id": f"t{i}",
                         "turn": k, "prompt_ids": [1] * (P0 + (k - 1) * GROWTH), "output_ids": [2] * OUT,
                         "usage": {"completion_tokens": OUT}, "finish_reason": "stop" if k == s else "tool_calls",
                         "meta": {"rollout": {"user_turn": 1, "step": k, **({"ended": "answered"} if k == s else {})}}})
    rows.append({**rows[1], "id": "t0#2~1", "finish_reason": "cut", "output_ids": [2] * 5,
                 "usage": {"completion_tokens": 5}, "meta": {**rows[1]["meta"], "cut": "interrupted"}})
    rows.append({**rows[0], "id": "open", "conversation_id": "open"})
    rows.append({"id": "plain", "dataset": "A", "prompt_ids": [1] * 9999, "output_ids": [2], "meta": {}})
    return rows


def test_a_pilots_shape_plans_its_own_totals_and_the_history_growth_is_counted():
    """Planted and caught: a plan of one answer per prompt (requests = tasks), or prompts that do not grow with the
    trajectory (g = 0), or the pause sample counted as a step, misses the pilot's own totals."""
    shape = pilot_shape(_pilot())
    assert shape is not None and dict(shape.steps) == dict(Counter(STEPS))
    assert shape.first_prompt_tokens == P0 and shape.growth_tokens == GROWTH and shape.output_tokens == OUT
    assert shape.output_sd == 0
    ended = [r for r in _pilot() if r["id"] not in ("open", "plain", "t0#2~1")]
    e = estimate(shape, len(STEPS), PRICES)
    assert e.requests == pytest.approx(len(ended)) and e.steps_mean == pytest.approx(sum(STEPS) / len(STEPS))
    assert e.prompt_tokens == pytest.approx(sum(len(r["prompt_ids"]) for r in ended))
    assert e.output_tokens == pytest.approx(OUT * len(ended))
    assert e.usd == pytest.approx((e.prompt_tokens * 0.6 + e.output_tokens * 3.0) / 1e6)
    assert e.steps_p90 == 6 and e.usd_p90 > e.usd  # the spread of the steps
    flat = AgenticShape(shape.steps, P0, 0.0, OUT, 0.0, "no growth")
    assert e.prompt_tokens - estimate(flat, 10, PRICES).prompt_tokens == GROWTH * sum(s * (s - 1) / 2 for s in STEPS)
    at_mean = AgenticShape({4: 1}, P0, GROWTH, OUT, 0.0, "every task at the mean")
    assert estimate(at_mean, 10, PRICES).prompt_tokens < e.prompt_tokens  # the long tail costs more than its mean
    twice = estimate(shape, 2000, PRICES)
    assert twice.usd == pytest.approx(200 * e.usd) and twice.usd_p90 - twice.usd < 200 * (e.usd_p90 - e.usd)


def test_the_tasks_a_budget_allows_fit_it_at_p90():
    shape = pilot_shape(_pilot())
    assert shape is not None
    n = tasks_for_budget(shape, PRICES, 10.0)
    assert estimate(shape, n, PRICES).usd_p90 <= 10.0 < estimate(shape, n + 1, PRICES).usd_p90
    assert tasks_for_budget(shape, PRICES, 0.0) == 0


def test_the_prior_takes_the_task_files_turns_and_first_prompts(tok, tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(task(i, 1 + i % 3)) + "\n" for i in range(6)))
    measured = measure_tasks(tok, path)
    assert measured is not None and measured.user_turns == [1, 2, 3, 1, 2, 3]
    assert all(200 < p < 2000 for p in measured.first_prompt_tokens)  # the tools' declarations rendered
    assert measured.later_user_turn_tokens > 5
    shape = prior_shape(measured.user_turns, measured.first_prompt_tokens, output_tokens=300, output_sd=100,
                        steps_per_user_turn=2.0, result_tokens=150, user_turn_tokens=measured.later_user_turn_tokens)
    assert dict(shape.steps) == {2: 2, 4: 2, 6: 2}
    assert shape.growth_tokens == pytest.approx(450 + measured.later_user_turn_tokens / 2)
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"id": "x", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert measure_tasks(tok, plain) is None
