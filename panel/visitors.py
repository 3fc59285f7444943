"""Who is asking: the backend's `Visitor` from what a caller of the panel holds."""

from backend.runs.access import ANONYMOUS, Visitor


def as_visitor(visitor: Visitor | str | None) -> Visitor:
    """A Visitor from what a caller holds: a Visitor, a bare token (scripts and tests), or nothing."""
    if isinstance(visitor, Visitor):
        return visitor
    return Visitor(token=visitor) if visitor else ANONYMOUS
