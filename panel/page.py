"""The page's components by name, and the one adapter between a Gradio event and a plain handler.

A handler is a plain function `handler(panel, visitor, *values) -> {name: value}`: it gets the values of its
inputs in order (a group's, such as the launch form, as a dict member -> value) and answers the components to
update by name (a group's as a dict too), so a unit test calls it with a Panel and a Visitor and no browser.
`Page.on` wires it to Gradio.

Every handler learns who clicked from Gradio itself: `gr.OAuthToken` / `gr.OAuthProfile` parameters, which
Gradio fills only when it can match them positionally (never after `*args`), read through `visitor_of`.
"""

import inspect
from collections.abc import Callable, Sequence

import gradio as gr

from backend.runs.access import Visitor


def visitor_of(token: gr.OAuthToken | None, profile: gr.OAuthProfile | None = None) -> Visitor:
    """The one place a Gradio OAuth token and profile become the backend's Visitor."""
    if token is None:
        return Visitor()
    return Visitor(token=token.token, username=profile.username if profile else None,
                   expires_at=float(token.expires_at) if token.expires_at else None)


class Page:
    """Every component a handler reads or updates, by name: `page["run_pick"]`; a group is a dict of them
    (`page["form"]`, one member: `page["form.bucket"]`)."""

    def __init__(self, panel):
        self.panel = panel
        self.parts: dict = {}

    def add(self, **parts) -> None:
        self.parts.update(parts)

    def __getitem__(self, name: str):
        group, _, member = name.partition(".")
        part = self.parts[group]
        return part[member] if member else part

    def components(self, names: Sequence[str]) -> list:
        out = []
        for name in names:
            part = self[name]
            out += list(part.values()) if isinstance(part, dict) else [part]
        return out

    def arguments(self, names: Sequence[str], values: Sequence) -> list:
        """Gradio's flat input values as the handler's arguments: one per name, a group's as a dict."""
        args, rest = [], list(values)
        for name in names:
            part = self[name]
            if isinstance(part, dict):
                args.append(dict(zip(part, rest[:len(part)])))
                rest = rest[len(part):]
            else:
                args.append(rest.pop(0))
        return args

    def updates(self, answer: dict) -> dict:
        """A handler's answer by name as Gradio's answer by component. A group's answer may name more members
        than the group shows (a preset's whole values for the form): those are not the page's to update."""
        out = {}
        for name, value in answer.items():
            part = self[name]
            if isinstance(part, dict):
                out.update({part[member]: update for member, update in value.items() if member in part})
            else:
                out[part] = value
        return out

    def on(self, triggers, handler: Callable, inputs: Sequence[str] = (), outputs: Sequence[str] = (), *,
           request: bool = False, **kw):
        """Run `handler(panel, visitor, *inputs)` on each trigger (an event listener, or a list of them); with
        `request`, the Gradio request comes right after the visitor."""
        page = self
        shown = self.components(outputs)

        def gradio_answer(answer: dict):
            """Gradio takes an answer by component only when it names one: an empty answer (nothing changed, as
            most ticks) would be read as one value for all the outputs and fail the event."""
            if answer or not shown:
                return answer
            return gr.skip() if len(shown) == 1 else [gr.skip()] * len(shown)

        if inspect.isgeneratorfunction(handler):     # a handler that shows progress yields its answers in turn
            def answer(visitor: Visitor, head: tuple, values: tuple):
                for each in handler(page.panel, visitor, *head, *page.arguments(inputs, values)):
                    yield gradio_answer(page.updates(each))
        else:
            def answer(visitor: Visitor, head: tuple, values: tuple):
                return gradio_answer(page.updates(handler(page.panel, visitor, *head,
                                                          *page.arguments(inputs, values))))

        if inspect.isgeneratorfunction(handler) and request:    # Gradio streams answers only from a generator
            def event(request: gr.Request, oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None,
                      *values):
                yield from answer(visitor_of(oauth_token, profile), (request,), values)
        elif inspect.isgeneratorfunction(handler):
            def event(oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None, *values):
                yield from answer(visitor_of(oauth_token, profile), (), values)
        elif request:
            def event(request: gr.Request, oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None,
                      *values):
                return answer(visitor_of(oauth_token, profile), (request,), values)
        else:
            def event(oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None, *values):
                return answer(visitor_of(oauth_token, profile), (), values)
        event.__name__ = event.__qualname__ = handler.__name__      # Gradio's API name: /on_launch, ...
        listeners = triggers if isinstance(triggers, list) else [triggers]
        args = (event, self.components(inputs), shown)
        return listeners[0](*args, **kw) if len(listeners) == 1 else gr.on(listeners, *args, **kw)
