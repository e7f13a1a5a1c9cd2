"""Text for ids, the part every model family's tokenizer shares once it can give a token list's bytes."""
from __future__ import annotations

from collections.abc import Iterable


class TextOfIds:
    """Text for ids, shared by every family: each has `decode_bytes` and `id_to_special` of its own."""

    id_to_special: dict[int, str]

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        raise NotImplementedError

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """Ids to text; a character cut mid-bytes becomes U+FFFD, as the serving stack shows it."""
        return self.decode_bytes(ids).decode("utf-8", errors=errors)

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        """Readable token pieces for reports (specials by name, bytes repr when not UTF-8)."""
        out = []
        for i in ids:
            if i in self.id_to_special:
                out.append(self.id_to_special[i])
                continue
            b = self.decode_bytes([i])
            try:
                out.append(b.decode("utf-8"))
            except UnicodeDecodeError:
                out.append(repr(b))
        return out
