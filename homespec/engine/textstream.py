"""Incremental detokenization with stop strings.

Each token's bytes are fed once (no re-detokenizing the whole answer per token, which is O(n²)).
UTF-8 sequences split across tokens are held until complete, and text that could be the start
of a stop string is held back until it is known not to be one.
"""

from __future__ import annotations

import codecs


class TextStream:
    def __init__(self, stop: list[str] | None = None) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = [s for s in (stop or []) if s]
        self._pending = ""  # decoded text not yet released (may start a stop string)
        self.text = ""  # text released so far
        self.stopped = False

    def _held_back(self) -> int:
        """Length of the longest suffix of _pending that is a proper prefix of a stop string."""
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(s[:n]):
                    best = n
                    break
        return best

    def feed(self, piece: bytes) -> str:
        """Add one token's bytes; return the newly releasable text ('' if none)."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(piece)
        cut = min((i for i in (self._pending.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            out = self._pending[:cut]
            self._pending = ""
            self.stopped = True
        else:
            keep = self._held_back()
            out = self._pending[: len(self._pending) - keep]
            self._pending = self._pending[len(self._pending) - keep :]
        self.text += out
        return out

    def flush(self) -> str:
        """End of generation: release whatever is held (an unfinished stop prefix is just text)."""
        if self.stopped:
            return ""
        out = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        self.text += out
        return out
