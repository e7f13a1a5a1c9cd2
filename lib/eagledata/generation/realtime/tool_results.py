"""A rollout's due turn completed with its calls' results, off the event loop (conversations/rollouts.py).

The executor seam (`rollouts.Execute`) is injected (`Seams.environments`): generation never imports an environment.
It may block for a call's time limit or a round trip to a worker process, so it runs on threads of its own, never on
the tokenizer's (a slow tool would stall every prompt's ids) nor on the loop. A turn is completed once per work item
(a retry sends the same results); a kill loses nothing, since the next run executes the same calls again from the
task's initial state. The executor may keep state between steps (live environments) if it stays exact; the run's
end closes it (`close`).
"""
from __future__ import annotations

from concurrent.futures import Executor, ThreadPoolExecutor

from ...aio import in_executor
from ..conversations.rollouts import Execute
from ..conversations.turns import Turn

THREADS = 8  # calls executed at once (each waits on its environment, not on this process's cores)


class ToolResults:
    def __init__(self, execute: Execute | None, pool: Executor | None = None):
        """`execute`: the environment seam, None when the run has none (a due turn is then a bug: the run checks that
        its tasks have one before any request). `pool`: where it runs; None: THREADS threads of its own."""
        self.execute = execute
        self.owned = pool is None and execute is not None
        self.pool = pool if pool is not None else ThreadPoolExecutor(THREADS, thread_name_prefix="eagledata-env") \
            if execute is not None else None
        self.calls = 0  # executed by this run (replays aside)

    async def complete(self, turn: Turn) -> Turn:
        """`turn` with its due calls' results, executed in a fresh environment after the trajectory's earlier calls
        were replayed; `turn` itself when nothing is due."""
        if not turn.due:
            return turn
        rollout = turn.conversation.rollout
        if self.execute is None or self.pool is None or rollout is None:
            raise RuntimeError(f"turn {turn.id!r} waits for tool results, and the run has no environments executor")
        before, calls = turn.replay
        results = await in_executor(self.pool, self.execute, rollout.task, before, calls)
        self.calls += len(calls)
        return turn.with_results(results)

    def close(self) -> None:
        """The threads of its own let go (a call still running is not waited for: its result is not needed), then
        the executor's live environments closed (`close()`, where the executor has one: `agentic.RolloutExecutor`
        keeps environments between steps)."""
        if self.owned and self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        close = getattr(self.execute, "close", None)
        if callable(close):
            close()
