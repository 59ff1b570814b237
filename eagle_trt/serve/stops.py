"""Stop strings over streamed text: what may be sent now, and where the answer ends.

The text arrives in pieces that need not align with a stop string, so the last len(longest stop) - 1 characters are
held back until the next piece shows they do not start one.

    >>> s = StopScanner(["\\n\\n", "END"])
    >>> s.push("Hello E"), s.push("ND of"), s.stopped
    ('Hello ', '', True)
"""

from __future__ import annotations


class StopScanner:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.hold = max(map(len, self.stops), default=1) - 1
        self.text = ""  # everything received
        self.sent = 0  # characters of it released
        self.stopped = False

    def push(self, piece: str) -> str:
        """Add a piece of text; returns what may be released now (nothing after a stop)."""
        if self.stopped:
            return ""
        self.text += piece
        start = max(self.sent - self.hold, 0)
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            end, self.stopped = min(hits), True
        else:
            end = max(len(self.text) - self.hold, self.sent)
        out, self.sent = self.text[self.sent:end], max(end, self.sent)
        return out

    def flush(self) -> str:
        """At the end of the answer: what was held back (nothing after a stop)."""
        if self.stopped:
            return ""
        out, self.sent = self.text[self.sent:], len(self.text)
        return out

    @property
    def released(self) -> str:
        return self.text[:self.sent]
