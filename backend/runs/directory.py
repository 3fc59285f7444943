"""Which runs a visitor can reach, and through which registry.

A Hub registry is built per (namespace, token): every call about a run goes through the token of the visitor
who makes it, so the Hub decides what they may see (two members of one org each reach the org's runs with
their own token; an outsider reaches none). Registries unused for a while are dropped with their log readers
and rebuilt on demand.
"""

import hashlib
import logging
import threading
import time

from backend.executors import shared_executor
from backend.executors.base import answers_lists_with_token
from backend.executors.hf_jobs import HfJobsExecutor
from backend.plan.engines import engines
from backend.plan.engines.base import Engine
from backend.runs.access import Deployment, Visitor, acting_token, local_runs_problem
from backend.runs.hub_auth import whoami_name, whoami_namespaces
from backend.runs.registry import RunRegistry
from backend.runs.run_ids import RunIdBook, id_taken_message, pick_owner, where_label
from backend.runtime.redact import redact_tokens
from backend.storage.hub_store import open_store
from backend.storage.journal import LaunchJournal
from backend.storage.store import FolderStore

log = logging.getLogger(__name__)


class RunDirectory:
    def __init__(self, deployment: Deployment, local: RunRegistry, cache_dir: str | None = None):
        self.deployment = deployment
        self.local = local
        self.cache_dir = cache_dir
        # Every registry records its launches in the home: the next panel rolls back one left half done.
        self.journal = local.journal or LaunchJournal(deployment.home)
        local.journal = self.journal
        # Every registry claims its runs' ids in one book: an id names one run in the whole panel.
        self.run_ids = local.run_ids or RunIdBook(deployment.home)
        local.run_ids = self.run_ids
        self._hub: dict[str, RunRegistry] = {}
        self._shared: dict[str, RunRegistry] = {}   # engine name -> the registry of its cluster's runs
        self._used: dict[str, float] = {}      # registry key -> monotonic time of its last use
        self._lock = threading.Lock()
        self._problems: dict[str, str] = {}    # a token's digest -> why its Hub runs could not be listed, last time
        self._retry_at: dict[int, float] = {}  # a Hub registry whose listing failed -> when to ask it again

    def hub_registry(self, token: str, namespace: str) -> RunRegistry:
        key = f"{namespace}:{_digest(token)}"
        with self._lock:      # handlers run in threads: one registry (and one set of log readers) per key
            now = time.monotonic()
            self._used[key] = now
            self._evict_idle(now)
            if key not in self._hub:
                executor = HfJobsExecutor(token, namespace)
                mount, cache = self.deployment.bucket_mount, self.cache_dir
                self._hub[key] = RunRegistry(
                    executor, lambda bucket: open_store(bucket, token, mount, cache_dir=cache),
                    list_every_s=self.deployment.hub_list_every_s, journal=self.journal, run_ids=self.run_ids)
            return self._hub[key]

    def shared_registry(self, where: Engine) -> RunRegistry | None:
        """The registry of an engine whose runs this deployment's visitors share (a cluster's), while its cluster
        answers; None for any other engine."""
        with self._lock:
            if where.name not in self._shared and not where.runtime_problem():
                executor = shared_executor(where.name, self.deployment.home)
                if executor is not None:
                    self._shared[where.name] = RunRegistry(
                        executor, lambda bucket: FolderStore(executor.bucket_root(bucket)), list_every_s=5.0,
                        journal=self.journal, run_ids=self.run_ids)
            return self._shared.get(where.name) if not where.runtime_problem() else None

    def registry_for(self, where: Engine, token: str | None, namespace: str) -> RunRegistry:
        """Where a run of engine `where` is launched: the panel's own registry, a cluster's, or the namespace's on
        the Hub (with `token`)."""
        if where.on_panel_machine:
            return self.local
        return self.shared_registry(where) or self.hub_registry(token or "", namespace)

    def _evict_idle(self, now: float) -> None:
        for key in [k for k, used in self._used.items() if now - used > self.deployment.registry_idle_s]:
            del self._used[key]
            registry = self._hub.pop(key, None)
            if registry is not None:
                registry.executor.stop(timeout=0)
                log.info("dropped an idle Hugging Face Jobs registry (%s runs)", key.split(":", 1)[0])

    def relist(self, namespace: str) -> None:
        """Runs changed in `namespace` (launched or cancelled here): every visitor's next list asks the Hub again."""
        with self._lock:
            for key, registry in self._hub.items():
                if key.split(":", 1)[0] == namespace:
                    registry.forget_listing()

    def registries(self, visitor: Visitor) -> list[RunRegistry]:
        """Local runs (where this visitor may use them), plus the HF Jobs runs of every namespace the visitor's
        token belongs to."""
        regs = [] if local_runs_problem(visitor, self.deployment) else [self.local]
        if regs:
            regs += [r for r in (self.shared_registry(where) for where in engines() if where.operators_machines
                                 and not where.on_panel_machine) if r is not None]
        token = acting_token(visitor, self.deployment)
        if token:
            try:
                regs += [self.hub_registry(token, ns) for ns in sorted(whoami_namespaces(token))]
            except Exception as exc:  # the Hub unreachable must not take the local runs down with it
                self._listing_failed(token, exc)
        return regs

    def listings(self, visitor: Visitor, registries: list[RunRegistry]) -> tuple[list, ...]:
        """Each registry's runs, newest first; a Hub registry that cannot list them (the Hub down, refusing the
        token) lists none, and is asked again only after its listing interval (a down Hub's requests retry for
        seconds each), and why is kept for `listing_problem`: the local runs are listed as usual."""
        token = acting_token(visitor, self.deployment)
        out, failed = [], False
        for registry in registries:
            per_token = answers_lists_with_token(registry.executor)
            if per_token and time.monotonic() < self._retry_at.get(id(registry), 0.0):
                out.append([])          # failed a moment ago: a down Hub is not asked again by every tick
                failed = True
                continue
            try:
                out.append(registry.list_runs())
            except Exception as exc:
                if not per_token or not token:
                    raise
                self._listing_failed(token, exc)
                self._retry_at[id(registry)] = time.monotonic() + registry.list_every_s
                out.append([])
                failed = True
        if token and not failed and any(answers_lists_with_token(r.executor) for r in registries):
            self._problems.pop(_digest(token), None)
        return tuple(out)

    def listing_problem(self, visitor: Visitor) -> str | None:
        """Why this visitor's runs on Hugging Face Jobs were not listed the last time they were asked for, in words
        that say what to do; None where they were."""
        token = acting_token(visitor, self.deployment)
        return self._problems.get(_digest(token)) if token else None

    def _listing_failed(self, token: str, exc: Exception) -> None:
        log.warning("cannot list Hugging Face Jobs runs: %s", redact_tokens(f"{type(exc).__name__}: {exc}", (token,)))
        self._problems[_digest(token)] = listing_problem_text(exc)

    def held(self) -> list[RunRegistry]:
        """The Hub registries held right now (visitors seen within the idle time, the host's token), without
        counting as a use: the budget enforcer walks them and must not keep an idle visitor's registry alive."""
        with self._lock:
            return list(self._hub.values())

    def find(self, run_id: str, visitor: Visitor) -> RunRegistry:
        """The registry through which this visitor reaches `run_id`, resolved by its owner's namespace and the id
        (`run_ids.pick_owner`); KeyError if they cannot reach it, or reach it in several namespaces none of which
        owns it."""
        regs = self.registries(visitor)
        found: list[RunRegistry] = []
        for fresh in (False, True):    # a run launched a moment ago by someone else may not be listed yet
            found = [registry for registry in regs if registry.has_run(run_id, fresh=fresh)]
            if found:
                break
        if not found:
            raise KeyError(f"no run {run_id!r} that you can see")
        if len(found) == 1:
            return found[0]
        owner = pick_owner(run_id, found, visitor.username or self._username(visitor), self.run_ids.owner(run_id))
        if owner is None:
            places = ", ".join(where_label(r) for r in found)
            raise KeyError(f"run id {run_id} names several runs you can reach ({places}), none of them launched by "
                           "this panel under that id: the panel acts on none of them. Act on each on the Hub "
                           "(`hf jobs ps`, `hf jobs cancel`), or ask its owner.")
        return owner

    def _username(self, visitor: Visitor) -> str | None:
        """The visitor's own user name as the Hub says it (a token's own namespace), or None."""
        token = acting_token(visitor, self.deployment)
        if not token:
            return None
        try:
            return whoami_name(token)
        except Exception:   # the Hub unreachable: the book's owner decides
            return None

    def id_problem(self, run_id: str, visitor: Visitor, look_around: bool = True) -> str | None:
        """Why `run_id` cannot name a new run (it names one already, anywhere this panel serves: its book of
        launched ids, every registry it holds as it last saw it, this home's launch records, and with `look_around`
        the visitor's own namespaces listed afresh), or None."""
        if self.run_ids.owner(run_id) is not None or self.journal.get(run_id) is not None:
            return id_taken_message(run_id)
        with self._lock:
            held = [self.local, *self._shared.values(), *self._hub.values()]
        if any(registry.knows(run_id) for registry in held):
            return id_taken_message(run_id)
        if look_around and any(registry.has_run(run_id, fresh=True) for registry in self.registries(visitor)):
            return id_taken_message(run_id)
        return None

    def shutdown(self) -> None:
        with self._lock:
            for registry in self._hub.values():
                registry.executor.stop(timeout=0)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:16]


def listing_problem_text(exc: Exception) -> str:
    """What failed and what to do, for a failed listing of a visitor's runs on Hugging Face Jobs: never the raw
    error (its text may hold a URL with a token, or a stack of httpx names that tell a user nothing)."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    failed = "Could not list your runs on Hugging Face Jobs: "
    local = " Runs on this machine are listed as usual; the list asks the Hub again every few seconds."
    if status in (401, 403):
        return (failed + f"the Hub refused the token (HTTP {status}). Sign in again (`hf auth login`, or the "
                "Sign in button on a Space) with a token that may read your jobs." + local)
    if status == 429:
        return failed + "the Hub is limiting requests (HTTP 429). Wait a minute." + local
    if isinstance(status, int):
        return (failed + f"the Hub answered with an error (HTTP {status}). Try again in a few minutes; "
                "https://status.huggingface.co says whether the Hub is down." + local)
    return (failed + "the Hub did not answer (" + type(exc).__name__ + "). Check this machine's network connection "
            "(and HF_ENDPOINT, if you set it); https://status.huggingface.co says whether the Hub is down." + local)
