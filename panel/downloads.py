"""A run's downloads: its final adapter or a chosen version as a zip, a job's whole log (masked), its metrics and
held-out evaluations as CSV, written under stable names into a folder private to this user. Part of `Panel`
(panel/actions.py)."""

import csv
import hashlib
import io
import os
import stat
import tempfile

from backend.outcome.best_version import ChoiceError, ChosenAdapter
from backend.outcome.publish import PublishError
from backend.runs.access import Visitor
from backend.runs.registry import RunRegistry
from backend.runtime.best_rule import rule_text
from backend.runtime.layout import atomic_write_chunks
from backend.runtime.redact import redact_tokens
from backend.view.run_history import HISTORY_WAIT_S
from backend.view.runview import RunView, reading
from panel.publish_view import suggested_repo_id
from panel.visitors import as_visitor

HELD_OUT_CSV_FIRST = ["version", "adapter", "step", "best_by", "held_out_score", "best", "trained_score",
                      "trained_score_std", "prompts"]


class Downloads:
    """A run's files to download, built into the panel's private `downloads` folder: the final adapter or a chosen
    version (zips, with their card), a job's whole log, the metrics and the held-out evaluations (CSV). Part of
    `Panel`: reads its `runs` and `view`; `_final_zips` keeps each run's final zip."""

    def final_adapter(self, run_id: str, visitor: Visitor | str | None = None) -> str | None:
        """The final adapter as a zip, built once per run (the bucket's final/ is written once)."""
        registry = self.runs.find(run_id, as_visitor(visitor))
        key = owned_key(registry, run_id)      # two namespaces' runs under one id never share a zip
        if key not in self._final_zips:
            try:
                path = registry.final_adapter_zip(run_id, private_folder(self.downloads),
                                                  suggested_repo_id(self, run_id, as_visitor(visitor)))
            except (ChoiceError, PublishError):     # final/ incomplete: nothing to download yet
                path = None
            if path is None:
                return None
            self._final_zips[key] = path
        return self._final_zips[key]

    def adapter_version_zip(self, run_id: str, choice: str | None,
                            visitor: Visitor | str | None = None) -> tuple[str, ChosenAdapter]:
        """The adapter version `choice` names ("best", "final", "trl-policy-v<N>"; None: the best where an evaluation
        exists, else final/) as a zip with the card a push to the visitor's suggested repo writes, and what it is;
        raises ChoiceError or PublishError (or KeyError: not this visitor's run)."""
        visitor = as_visitor(visitor)
        registry = self.runs.find(run_id, visitor)
        return registry.adapter_zip(run_id, choice, private_folder(self.downloads),
                                    suggested_repo_id(self, run_id, visitor))

    def full_log_file(self, run_id: str, role: str, visitor: Visitor | str | None = None) -> str | None:
        """The whole log of one job (masked, like everything shown) as a file to download."""
        view = self.view(run_id, visitor)
        job = view.jobs.get(role)
        if job is None:
            return None
        path = os.path.join(private_folder(self.downloads), f"{owned_name(view, run_id)}-{role}.log")
        write_log(path, view.executor.all_logs(job.job_id))
        return path

    def metrics_csv(self, run_id: str, visitor: Visitor | str | None = None) -> str:
        """Every step the run logged to its bucket (its metrics) as a CSV file to download: a row a step, a column a
        metric (step and time first), an empty cell where a step did not log that metric."""
        view = self.view(run_id, visitor)
        path = os.path.join(private_folder(self.downloads), f"{owned_name(view, run_id)}-metrics.csv")
        atomic_write_chunks(path, csv_lines(view.metrics))
        return path

    def heldout_csv(self, run_id: str, visitor: Visitor | str | None = None) -> str:
        """The run's held-out evaluations (the adapters table's held-out columns, and more) as a CSV file to
        download: a row per evaluated version, the base model (version 0) first; its adapter, step, the run's
        best-by rule and the version's held-out score under it (the number the header, the table and the picker
        show), whether it is the best version, the trained score (under the run's weights) and its spread over
        prompts, prompts scored, then each held-out reward's mean, std, weight in training and weight in the rule.
        A long run's older records are waited for (at most HISTORY_WAIT_S)."""
        view = self.view(run_id, visitor)
        view.wait_for_history(HISTORY_WAIT_S)
        held = view.held_out
        with reading(view):
            scores = sorted(held.scores.values(), key=lambda s: s.version)
            best, rule = held.best_version, dict(held.rule)
            ruled = {s.version: held.rule_score(s.version) for s in scores}
        names = list(dict.fromkeys(name for s in scores for name in s.rewards))
        said = rule_text(rule)

        def rule_weight(score, name: str):
            # The default rule is the trained score: it weighs each reward as training did.
            return rule.get(name, 0.0) if rule else (score.rewards.get(name) or {}).get("weight")

        rows = [{"version": s.version, "adapter": "base model" if s.version == 0 else held.adapter_name(s.version),
                 "step": s.step, "best_by": said, "held_out_score": ruled[s.version],
                 "best": "yes" if s.version == best else "", "trained_score": s.score,
                 "trained_score_std": s.score_std, "prompts": s.n_prompts,
                 **{key: value for name in names for key, value in (
                     (f"{name} mean", (s.rewards.get(name) or {}).get("mean")),
                     (f"{name} std", (s.rewards.get(name) or {}).get("std")),
                     (f"{name} training weight", (s.rewards.get(name) or {}).get("weight")),
                     (f"{name} rule weight", rule_weight(s, name)))}} for s in scores]
        path = os.path.join(private_folder(self.downloads), f"{owned_name(view, run_id)}-held-out.csv")
        atomic_write_chunks(path, csv_lines(rows, HELD_OUT_CSV_FIRST))
        return path


def owned_key(registry: RunRegistry, run_id: str) -> tuple:
    """A run by its owner and id: what a cache of things built for a run is keyed by."""
    return (registry.executor.name, registry.namespace, registry.run_bucket(run_id), run_id)


def owned_name(view: RunView, run_id: str) -> str:
    """A download's file name stem for the run: its id and its owner's namespace, so two runs under one id in two
    namespaces never write one file of the shared downloads folder."""
    namespace = getattr(view.executor, "namespace", None) or "local"
    return f"{namespace}-{run_id}"


def csv_lines(rows: list[dict], first: list[str] | None = None):
    """`rows` as CSV, encoded, a line at a time: the `first` columns (step and time by default), then every other
    key, sorted."""
    first = first or ["step", "time"]
    header = [*first, *sorted({key for row in rows for key in row} - set(first))]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    for row in rows:
        writer.writerow([row.get(key, "") for key in header])
        yield out.getvalue().encode()
        out.seek(0)
        out.truncate()
    yield out.getvalue().encode()


def write_log(path: str, pieces) -> None:
    """A log for download at `path` from an executor's `all_logs`, masked as it streams through
    (benchmarks/log_download.py: a 1 GB log in bounded memory)."""
    atomic_write_chunks(path, (redact_tokens(piece).encode() for piece in pieces))


def downloads_folder(home: str) -> str:
    """Where files built for download (final adapters, full logs) live: under stable names, one per run (and role),
    replaced on each build, so a long-lived Space does not collect a file per click.

    A folder of the system's temp dir, private to this user and one per panel home. Gradio hands a visitor only
    files under its working folder or the temp dir (it copies them into its cache first), and the home is neither
    on a Space (app in /home/user/app, data in /home/user/data). Allowing a folder (`launch(allowed_paths=...)`)
    instead would also serve every file in it by its path to anyone, other visitors' adapters and logs included."""
    digest = hashlib.sha256(os.path.abspath(home).encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"grpo-panel-downloads-{os.getuid()}-{digest}")


def private_folder(folder: str) -> str:
    """`folder`, made if need be, readable by this user only."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    found = os.lstat(folder)
    if found.st_uid != os.getuid() or not stat.S_ISDIR(found.st_mode):    # a shared temp dir: someone else's name
        raise RuntimeError(f"{folder} is not a folder of this user's: remove it, or set TMPDIR")
    return folder
