"""Whether a run's agentic records hold what their environments really give: each trajectory's recorded calls
replayed in order in a fresh environment (in this process by default: an independent path from the run's workers),
every result compared with the one the model was shown. `make demo` checks its agentic dataset with it; a user can
check any run's records the same way."""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..records import Record
from .environment import Environments, InProcessEnvironments
from .tasks import Task


@dataclass
class ReplayCheck:
    """What the replay found: trajectories and calls replayed, the fresh results' error kinds, how the trajectories
    ended at their last record, and every call whose recorded result differs from the fresh one (task id, call id,
    recorded, fresh)."""

    trajectories: int = 0
    calls: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    ended: Counter[str] = field(default_factory=Counter)  # answered, capped, a cut's finish reason, or open
    mismatches: list[tuple[str, str, str, str]] = field(default_factory=list)


def last_requests(records: Iterable[Record]) -> dict[str, Record]:
    """Each trajectory's last request: its messages hold every call the trajectory executed, with the results."""
    last: dict[str, Record] = {}
    for r in records:
        if "rollout" in r.meta and (r.conversation_id not in last or r.turn > last[r.conversation_id].turn):
            last[r.conversation_id] = r
    return last


def replay_trajectories(records: Iterable[Record], tasks: Mapping[str, Task], *, base: str | Path | None = None,
                        code_path: Sequence[str] = (),
                        environments: Environments | None = None) -> ReplayCheck:
    """Replay every trajectory of `records` (rollout records, by their task's id) in a fresh environment of its task
    (`base`: the task file's folder, for a class named by a relative path; `code_path`: BFCL's backends)."""
    environments = environments or InProcessEnvironments()
    check = ReplayCheck()
    for cid, record in sorted(last_requests(records).items()):
        env = environments.open(tasks[cid].spec(code_path=code_path, base=base))
        try:
            shown = {m.get("tool_call_id"): m.get("content") for m in record.messages if m.get("role") == "tool"}
            for m in record.messages:
                for c in m.get("tool_calls") or ():
                    got = env.execute(c["function"]["name"], c["function"]["arguments"])
                    check.calls += 1
                    if got.error is not None:
                        check.errors[got.error] += 1
                    recorded = shown.get(c["id"])
                    if recorded != got.text:
                        check.mismatches.append((cid, c["id"], str(recorded), got.text))
        finally:
            env.close()
        check.trajectories += 1
        check.ended[ending(record)] += 1
    return check


def ending(record: Record) -> str:
    """How a trajectory stands at its last record: `answered` or `capped` (`meta.rollout.ended`), a cut answer's
    finish reason (`length`, `cut`), else `open` (a run stopped before it ended)."""
    ended = record.meta["rollout"].get("ended")
    if ended:
        return str(ended)
    return "open" if record.finish_reason in ("stop", "tool_calls") else str(record.finish_reason)
