"""The batch route's conversation with a batch API: what is uploaded, created, polled, adopted and cancelled, each
step journaled before the call it precedes (journal.py), so a kill at any instant leaves a state a rerun adopts.

`BatchService` is the dialect (moonshot.batch_api.MoonshotBatches); `BatchCalls` speaks it for the route.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Protocol

from ...moonshot.batch_api import BatchApiError, BatchInfo, LineResult
from ...moonshot.facts import BatchModel
from ..conversations.work import Work
from .journal import BatchEntry, JournalLine
from .state import INPUTS, LaneBatches

log = logging.getLogger("eagledata.generate")

VANISHED = "vanished"  # a journaled batch the service answers 404 for: settled so, its lines not recorded sent again


class BatchService(Protocol):
    """A batch API's dialect (moonshot.batch_api.MoonshotBatches): the calls the route makes and the price."""

    name: str
    provider: str
    price: BatchModel
    max_file_bytes: int  # an input file's limit: a round holds what fits

    def body(self, messages: list[dict], *, max_tokens: int, tools: list[dict] | None = None,
             parallel_tool_calls: bool = False) -> dict[str, Any]: ...
    async def upload(self, filename: str, data: bytes) -> str: ...
    async def files(self) -> list[dict[str, Any]]: ...
    async def delete_file(self, file_id: str) -> None: ...
    async def create(self, input_file_id: str, window: str, metadata: dict[str, str]) -> BatchInfo: ...
    async def get(self, batch_id: str) -> BatchInfo: ...
    async def batches(self) -> list[BatchInfo]: ...
    async def cancel(self, batch_id: str) -> BatchInfo: ...
    async def results(self, file_id: str) -> list[LineResult]: ...
    async def balance(self) -> float: ...


class BatchCalls:
    """The route's calls to `service`, each dataset's journal kept in step with them."""

    def __init__(self, service: BatchService, *, window: str, max_tokens: int):
        self.service, self.window, self.max_tokens = service, window, max_tokens

    def body(self, work: Work) -> dict[str, Any]:
        """The line's request body in the service's dialect."""
        conversation = work.turn.conversation
        return self.service.body(work.turn.messages, max_tokens=self.max_tokens,
                                 tools=list(conversation.tools or ()) or None,
                                 parallel_tool_calls=conversation.parallel_tool_calls)

    def as_sent(self, work: Work) -> None:
        """The turn as the batch sends it: its messages in the service's dialect (what the record keeps)."""
        work.turn = dataclasses.replace(work.turn, messages=self.body(work)["messages"])

    async def submit(self, lb: LaneBatches, name: str, round_: int, data: bytes, lines: list[JournalLine],
                     at: float, planned_rounds: int | None = None) -> BatchEntry:
        """A round's input file kept under batch_inputs/, journaled as prepared, then uploaded and created."""
        (lb.dir / INPUTS).mkdir(exist_ok=True)
        (lb.dir / INPUTS / f"{name}.jsonl").write_bytes(data)
        lb.entry = lb.journal.prepared(name, round_, lines, at, planned_rounds)
        await self.adopt(lb)
        return lb.entry

    async def adopt(self, lb: LaneBatches) -> None:
        """The batch in progress reaches the service once: an upload or a batch a killed run made but never
        journaled is found by name; only what does not exist yet is made."""
        entry = lb.entry
        if entry is None:
            return
        if entry.file_id is None:
            found = [f for f in await self.service.files() if f.get("filename") == f"{entry.name}.jsonl"]
            file_id = str(found[0]["id"]) if found else \
                await self.service.upload(f"{entry.name}.jsonl", (lb.dir / INPUTS / f"{entry.name}.jsonl").read_bytes())
            lb.journal.uploaded(entry.name, file_id)
        if entry.batch_id is None:
            assert entry.file_id is not None
            found_b = [b for b in await self.service.batches() if b.metadata.get("eagledata") == entry.name]
            info = found_b[0] if found_b else await self._create(lb, entry)
            lb.journal.created(entry.name, info.id)
            if lb.info is not None:
                lb.info.status = info.status
                lb.info.window_end = float(info.expires_at) if info.expires_at else lb.info.window_end
        if lb.info is not None:
            lb.info.batch_id = entry.batch_id

    async def _create(self, lb: LaneBatches, entry: BatchEntry) -> BatchInfo:
        """The batch made from the journaled upload; an upload the service no longer knows (404: deleted, or an
        emulator that stopped with its run) is made again from batch_inputs/ first."""
        assert entry.file_id is not None
        metadata = {"eagledata": entry.name, "dataset": lb.lane.name, "round": str(entry.round)}
        try:
            return await self.service.create(entry.file_id, self.window, metadata)
        except BatchApiError as e:
            if e.status != 404:
                raise
        log.warning("batch route: %s: the service does not know the upload %s any more: uploading %s.jsonl again",
                    lb.lane.name, entry.file_id, entry.name)
        data = (lb.dir / INPUTS / f"{entry.name}.jsonl").read_bytes()
        file_id = await self.service.upload(f"{entry.name}.jsonl", data)
        lb.journal.uploaded(entry.name, file_id)
        return await self.service.create(file_id, self.window, metadata)

    async def status(self, lb: LaneBatches) -> BatchInfo:
        assert lb.entry is not None and lb.entry.batch_id is not None
        return await self.service.get(lb.entry.batch_id)

    async def results(self, info: BatchInfo) -> dict[str, LineResult]:
        """A finished batch's lines by custom id: its output file's, then its error file's."""
        results: dict[str, LineResult] = {}
        for file_id in (info.output_file_id, info.error_file_id):
            if file_id:
                results.update((r.custom_id, r) for r in await self.service.results(file_id))
        return results

    async def forget_input(self, entry: BatchEntry) -> None:
        """An account holds at most 1,000 batch files: a settled batch's input goes (it stays in batch_inputs/)."""
        if entry.file_id:
            try:
                await self.service.delete_file(entry.file_id)
            except BatchApiError as e:
                if e.status != 404:  # 404: already gone
                    log.warning("batch route: input file %s not deleted at the service: %s", entry.file_id, e)

    async def cancel(self, lb: LaneBatches) -> None:
        assert lb.entry is not None and lb.entry.batch_id is not None
        await self.service.cancel(lb.entry.batch_id)
