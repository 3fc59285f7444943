"""Push an adapter version of a run (the best, final/ or any other) to the Hub, from the Runs tab: the handler's
logic as plain functions, and the few components it needs. Who may push where is the Hub's rule: a signed-in
visitor, into a namespace they may write to."""

import gradio as gr

from backend.outcome.best_version import BEST, FINAL, ChoiceError, choose
from backend.outcome.publish import PublishError, default_repo_id, push_adapter, repo_id_problem, shipped_adapter
from backend.runs.access import Visitor, acting_token, no_token_reason
from backend.runs.hub_auth import can_control, whoami_name, writable_namespaces
from backend.runs.run_ids import where_label
from backend.storage.adapters import final_adapter_files
from panel.markdown import masked, plain


def suggested_repo_id(panel, run_id: str | None, visitor: Visitor) -> str:
    """`<namespace>/<run name>-lora` for the visitor's own namespace; '' when it cannot be known."""
    if not run_id:
        return ""
    token = acting_token(visitor, panel.settings)
    namespace = visitor.username
    if not namespace and token:
        try:
            namespace = whoami_name(token)
        except Exception:   # the Hub unreachable: the visitor types the repo id
            return ""
    if not namespace:
        return ""
    try:
        view = panel.view(run_id, visitor)
    except KeyError:
        return ""
    if not view.spec:
        view.refresh()
    name = str(view.spec.get("name") or "grpo")
    return default_repo_id(namespace, name)


def push(panel, run_id: str | None, repo_id: str, private: bool, visitor: Visitor, version: str | None = None) -> str:
    """Push one adapter version of the run (`version`: "best", "final", "trl-policy-v<N>"; None: the best where an
    evaluation exists, else final/) and a generated card to `repo_id`; a message saying what happened."""
    token = acting_token(visitor, panel.settings)
    if not token:
        reason = ("Sign in with Hugging Face to push an adapter to the Hub." if panel.settings.on_space
                  else no_token_reason(panel.settings))
        return f"**Not pushed.** {reason}"
    if not run_id:
        return "Pick a finished run first."
    repo_id = (repo_id or "").strip()
    problem = repo_id_problem(repo_id)
    if problem:
        return f"**Not pushed.** repo_id: {problem}."
    refusal = _namespace_refusal(repo_id.split("/", 1)[0], token)
    if refusal:
        return f"**Not pushed.** {refusal}"
    try:
        registry = panel.runs.find(run_id, visitor)
        view = registry.view(run_id)
        view.refresh()
        if not view.final_files:
            view.final_files = final_adapter_files(view.store, run_id)
        chosen = choose(view, version)
        what = pushed_name(chosen)
        files = shipped_adapter(registry, view, chosen, repo_id)
        url = push_adapter(run_id, files, repo_id, token, private=bool(private), what=what)
    except KeyError as exc:
        return f"**Not pushed.** {masked(exc.args[0] if exc.args else exc)}"
    except (PublishError, ChoiceError) as exc:
        return f"**Not pushed.** {masked(exc)}"
    except Exception as exc:   # the Hub refusing or failing: its own words, masked
        return f"**Not pushed:** {masked(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)}"
    return (f"Pushed {what} of {plain(f'run {run_id} ({where_label(registry)})')} to [{repo_id}]({url}) "
            f"({'private' if private else 'public'}): {len(files) - 1} file(s) and a model card (README.md).")


def pushed_name(chosen) -> str:
    """'the final adapter', 'the best version (trl-policy-v7)' or 'trl-policy-v3', as messages say it."""
    if chosen.choice == FINAL:
        return "the final adapter"
    if chosen.choice == BEST:
        return f"the best version ({chosen.name})"
    return chosen.name


def _namespace_refusal(namespace: str, token: str) -> str | None:
    allowed, reason = can_control(namespace, token, on_space=True)
    if allowed:
        return None
    try:
        mine = writable_namespaces(token)
    except Exception:
        return reason
    return f"You cannot write to {namespace}; you can push to: {', '.join(mine)}."


def build(panel) -> dict:
    """The push controls (under the adapter download in the Runs tab)."""
    with gr.Accordion("Push the picked adapter version to the Hub", open=False, elem_id="push-section"):
        with gr.Row():
            repo = gr.Textbox(label="Model repo id", placeholder="namespace/run-name-lora", elem_id="push-repo",
                              scale=3, info="created if it does not exist; a model card is written from the run")
            private = gr.Checkbox(True, label="Private", elem_id="push-private", scale=1)
            button = gr.Button("Push to Hub", elem_id="push-btn", scale=1)
        message = gr.Markdown(elem_id="push-msg")
    return {"repo": repo, "private": private, "button": button, "message": message}
