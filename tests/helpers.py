"""Plain helpers shared by test files (fixtures: tests/conftest.py; browser helpers: tests/browser_helpers.py)."""

import contextlib
import os


def free_port() -> int:
    """A TCP port on 127.0.0.1 free right now, never an ephemeral one (the product's picker: see there why): a test
    never assumes a fixed port."""
    from backend.plan.engines.local import free_port as pick

    return pick()


def serve_replica_process(run_dir, *extra, server: list[str], env: dict | None = None, stderr=None):
    """`python -m runtime.serving.serve_replica --run-dir RUN_DIR EXTRA -- SERVER...` as a replica job runs it (the
    runtime package on its path, vLLM's socket folder its own), its output on a pipe (`stderr`: where its errors go),
    in a process group of its own."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.path.join(root, "backend"), **(env or {})}
    env.pop("VLLM_RPC_BASE_PATH", None)
    return subprocess.Popen([sys.executable, "-m", "runtime.serving.serve_replica", "--run-dir", str(run_dir), *extra,
                             "--", *server], env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
                            start_new_session=True)


def files_under(path) -> list[str]:
    """Every file below `path`, as paths."""
    return [os.path.join(d, f) for d, _, files in os.walk(path) for f in files]



def answer_cells(table: dict) -> dict[str, tuple]:
    """Try it's answer table as a Gradio client receives it (the table itself, or an update that carries it with
    its column widths), as {column: its cells}."""
    table = table["value"] if "headers" not in table and isinstance(table.get("value"), dict) else table
    return dict(zip(table["headers"], zip(*table["data"])))

def launch_reviewed(panel, form: dict, visitor=None):
    """Preview, then launch exactly what was previewed, as a visitor ticking the review box does. Returns (the launch's
    result, the preview shown)."""
    shown = panel.preview(form, visitor)
    assert shown.fingerprint, shown.markdown
    return panel.launch(form, visitor, confirmed=shown.fingerprint, run_id=shown.run_id), shown


@contextlib.contextmanager
def panel_factory(home: str, **defaults):
    """`make(**settings)` builds a Panel over `home` (a second one is the panel after a restart), off a Space, on
    loopback, with `defaults`; every panel made is shut down at the end."""
    from panel.actions import Panel, Settings

    made = []

    def make(**settings):
        made.append(Panel(Settings(**{"home": home, "on_space": False, "host": "127.0.0.1", **defaults, **settings})))
        return made[-1]

    try:
        yield make
    finally:
        for panel in made:
            panel.shutdown()


@contextlib.contextmanager
def small_tmpfs(folder: str, size: str):
    """`folder` (made here) on a tmpfs of `size` of its own, unmounted on the way out: a full disk for a test (root
    ignores file modes, not a full disk). Skips the test where this machine cannot mount one."""
    import subprocess

    import pytest

    os.makedirs(folder)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", folder], capture_output=True,
                            text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", folder], check=False)


@contextlib.contextmanager
def served(panel):
    """The panel's page on a real Gradio server in this process (its style and script as app.py serves them), and
    a client of it; both closed at the end."""
    from gradio_client import Client

    from panel.ui import CSS, PAGE_JS, build_ui

    demo = build_ui(panel)
    port = free_port()
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                        run_history=False, css=CSS, js=PAGE_JS)
    client = None
    try:
        client = Client(f"http://127.0.0.1:{port}", verbose=False)
        client.url = f"http://127.0.0.1:{port}"
        yield client
    finally:
        if client is not None:
            client.close()
        demo.close()


@contextlib.contextmanager
def synthetic_sweep(home: str, scores: dict[str, float | None], rows: int = 60, failed: tuple[str, ...] = (),
                    sweep_id: str = "sweep-20260101-000000-abcdef", early_stop_after: int = 0,
                    members_decide: bool = False):
    """A sweep of synthetic live members in a local panel home, written as a launch writes it (the bucket's
    sweeps/<id>.json record, each member's spec with its sweep id and tag) and as a trainer does (benchmarks'
    SyntheticRun: metrics, adapter versions `trl-policy-<tag>-vN` every 20 steps, a held-out record each). A member's
    score is every version's held-out score (None: no held-out set, so no score). Each live member's jobs stand for a
    process of its own (detached, so that once stopped nothing keeps it as a zombie), `tests/sweep_member_stub.py`:
    the real stop orders' poll and heartbeat of a trainer (`members_decide`: it also decides the sweep's stated rule,
    as a trainer does; else it only obeys), so a cancel or an order stops that process alone; `failed` members ended
    in ERROR. Yields {tag: member}: its `run_id`, `pid` (its process's; None for a failed one) and `run` (its
    SyntheticRun: `grow()` logs more steps and versions). Every process is stopped, by its pid, at the end."""
    import json
    import shlex
    import signal
    import subprocess
    import sys
    from types import SimpleNamespace

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(repo, "benchmarks"))
    from dashboard_scale import JOBS, SyntheticRun, write_whole

    from backend.runtime import layout
    from backend.runtime.job.job_wrapper import process_start_time

    members, pids = {}, []
    try:
        for i, (tag, score) in enumerate(scores.items()):
            run_id = f"20260101-00000{i}-sweep{i}"
            fields = {"run_id": run_id, "name": f"lr-{tag}", "sweep_id": sweep_id, "sweep_member": tag,
                      "max_steps": 1000}
            if score is None:
                run = SyntheticRun(home, rows, fields=fields)
            else:
                run = SyntheticRun(home, rows, evals=True, fields=fields, score=lambda v, s=score: s if v else 0.1)
            proc = None
            for role in JOBS:
                path = os.path.join(home, "jobs", run.job_ids[role], "job.json")
                with open(path) as f:
                    job = json.load(f)
                if tag in failed:
                    write_whole(os.path.join(home, "jobs", run.job_ids[role], "exit.json"),
                                {"stage": "ERROR", "code": 1, "message": "failed", "time": 0})
                    continue
                if proc is None:
                    stub = [sys.executable, "-m", "tests.sweep_member_stub", "--run-dir", run.run_dir,
                            *(a for r in JOBS for a in ("--job-dir", os.path.join(home, "jobs", run.job_ids[r]))),
                            *(() if members_decide else ("--obey-only",))]
                    log = os.path.join(home, "jobs", run.job_ids[role], "stub.log")
                    proc = int(subprocess.run(["sh", "-c", f'{shlex.join(stub)} >{shlex.quote(log)} 2>&1 & echo $!'],
                                              check=True, capture_output=True, text=True, cwd=repo).stdout)
                    pids.append((proc, process_start_time(proc)))
                job.update(pid=proc, pid_started_at=process_start_time(proc))
                write_whole(path, job)
            members[tag] = SimpleNamespace(run_id=run_id, pid=proc, run=run)
        record = {"sweep_id": sweep_id, "grid": True, "swept": {"learning_rate": list(range(len(scores)))},
                  "members": {tag: member.run_id for tag, member in members.items()},
                  "settings": {tag: {"learning_rate": i} for i, tag in enumerate(scores)},
                  "early_stop": ({"rule": "successive halving", "after_versions": early_stop_after}
                                 if early_stop_after else {"rule": "by hand"})}
        write_whole(os.path.join(home, "buckets", "local", "bench", layout.sweep_record_path(sweep_id)), record)
        yield members
    finally:
        for pid, started in pids:
            if process_start_time(pid) == started:      # still that process, not one given its number since
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
