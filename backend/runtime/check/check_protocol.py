"""The task check's report channel: JSON events framed as text lines that carry the check's own secret.

The check's harness writes each event as one or more lines `GRPO-CHECK <nonce> <seq> <part>/<parts> <text>` (a
long event is cut into parts, so no line is longer than a job log keeps), on a descriptor the visitor's code never
holds; the panel keeps only the lines with the nonce it made for this check. The same framing travels over a pipe
(a local check) and through a Hugging Face job's log (a check job), where other lines (pip's, the code's prints)
come between. Standard library only: it runs in jobs.
"""

import json

TAG = "GRPO-CHECK"
NONCE_ENV = "GRPO_CHECK_NONCE"     # a check job's nonce, passed as a secret
PART_CHARS = 8192
MAX_PARTS = 2048                  # 16 MiB of one event at most: a longer one is dropped, not kept in memory


def frame(event: dict, nonce: str, seq: int) -> list[str]:
    """The lines that carry `event` (the `seq`-th event of the check)."""
    text = json.dumps(event, default=str, ensure_ascii=True)
    parts = [text[i:i + PART_CHARS] for i in range(0, len(text), PART_CHARS)] or [""]
    return [f"{TAG} {nonce} {seq} {i + 1}/{len(parts)} {part}" for i, part in enumerate(parts)]


class Reassembler:
    """Events from the lines of one check: lines without its nonce, out of order or malformed are ignored."""

    def __init__(self, nonce: str):
        self.prefix = f"{TAG} {nonce} "
        self.ignored = 0
        self._seq = 0
        self._parts: list[str] = []

    @property
    def seq_seen(self) -> bool:
        """Whether any event has come through yet."""
        return self._seq > 0

    def is_protocol(self, line: str) -> bool:
        return line.startswith(self.prefix)

    def feed(self, line: str) -> dict | None:
        """The event this line completes, or None."""
        if not line.startswith(self.prefix):
            return None
        try:
            seq_text, count_text, text = line[len(self.prefix):].split(" ", 2)
            seq, (part, parts) = int(seq_text), map(int, count_text.split("/"))
        except ValueError:
            self.ignored += 1
            return None
        if seq != self._seq + 1 or not 1 <= part <= parts <= MAX_PARTS:
            self.ignored += 1
            return None
        if part == 1:
            self._parts = []
        elif part != len(self._parts) + 1:
            self.ignored += 1
            self._parts = []
            return None
        self._parts.append(text)
        if part < parts:
            return None
        self._seq, joined, self._parts = seq, "".join(self._parts), []
        try:
            event = json.loads(joined)
        except ValueError:
            self.ignored += 1
            return None
        return event if isinstance(event, dict) and isinstance(event.get("event"), str) else None


class Channel:
    """The report, framed with the check's nonce, on a descriptor only the harness holds."""

    def __init__(self, stream, nonce: str):
        self.stream, self.nonce, self.seq = stream, nonce, 0

    def emit(self, **event) -> None:
        self.seq += 1
        self.stream.write("".join(line + "\n" for line in frame(event, self.nonce, self.seq)))
        self.stream.flush()
