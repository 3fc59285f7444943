"""Hostile reward code, sent the way a visitor sends it: *Check task* through Gradio's request handling.

Two real panels (`python app.py` processes), each with secrets planted where a panel keeps them, every one
distinct: its environment (host token, OAuth client secret, webhook key, another service's token), the login
file, the webhook key file in its home, another run's `spec.json` and a downloaded log in its cache.

- A local panel (loopback, one user): the check runs in the sandbox. Each attack is refused or contained, and no
  planted secret appears in the answer (plain, base64, hex or reversed), in what the code managed to print, or
  on the disk, also not a token in the environment of an unrelated process of the machine (every readable
  `/proc/*/environ` and memory is scanned); no process it started outlives the check; the panel stays up. The same
  with the panel started from a venv under /tmp and from a venv reached through a linked folder (the sandbox binds
  Python by the path it was started with and by its real path).
- Without bubblewrap (a PATH without `bwrap`) the local panel runs nothing, says why and how to fix it, and the page
  shows its isolation state; with the operator's opt-in (GRPO_PANEL_ALLOW_UNSANDBOXED=1) the check runs, the state
  shown. *Try it* with no sandbox loads nothing. The probe tells bubblewrap missing, namespaces refused and binds
  of ours that are wrong apart.
- A Space-mode panel: the panel's machine starts no process at all; exactly one check job reaches the fake Hub,
  created with the signed-in visitor's token and carrying no other; its report comes back from that job (run
  by the fake Hub on a machine of its own). An anonymous visitor is told to sign in and starts nothing.
"""

import base64
import glob
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import psutil
import pytest

from tests.browser_helpers import ROOT, running_panel, space_session_cookie
from tests.fakehub import FakeHub, FakeUser, wait_until

pytestmark = pytest.mark.integration

MARK = f"hostile{uuid.uuid4().hex[:10]}"
SECRETS = {
    "host token": "hf_" + "PlantedHostToken" + "x7Qz9" * 4,
    "oauth client secret": "planted-oauth-client-secret-" + "Kd83" * 5,
    "webhook key env": "planted-webhook-key-env-" + "Lm42" * 5,
    "service token": "planted-service-token-" + "Rt55" * 5,
    "login file": "hf_" + "PlantedLoginFile" + "Yy81" * 5,
    "webhook key file": "PLANTED-webhook-key-file-" + "Zq19" * 5,
    "another run": "planted-other-visitors-run-" + "Wc63" * 5,
    "downloaded log": "planted-downloaded-log-" + "Pv27" * 5,
    "bob's token": "hf_oauth_" + "PlantedBobVisitor" + "Nn64" * 5,
    "another process's token": "hf_" + "PlantedDecoyProcess" + "Jd29" * 5,
}
ALICE = "hf_oauth_" + "aliceCheckVisitor" + "0" * 20


def forms_of(secret: str) -> list[str]:
    raw = secret.encode()
    return [secret, secret[::-1], base64.b64encode(raw).decode(), base64.b64encode(raw).decode().rstrip("="),
            raw.hex(), base64.urlsafe_b64encode(raw).decode().rstrip("=")]


def assert_no_secret(text: str, where: str) -> None:
    for name, secret in SECRETS.items():
        for form in forms_of(secret):
            assert form not in text, f"{name} ({form[:12]}...) leaked into {where}"
    for tag, payload in re.findall(r"LEAK (\S+) ([A-Za-z0-9+/=]+)", text):
        found = base64.b64decode(payload).decode(errors="replace")
        for name, secret in SECRETS.items():
            assert secret not in found, f"the code read the {name} ({tag})"


def plant(tmp_path, space: bool = False) -> tuple[dict, str]:
    """The panel's home, login and environment, each holding a planted secret; returns (env, home)."""
    home = tmp_path / "home"
    (home / "secrets").mkdir(parents=True)
    (home / "secrets" / "key").write_bytes(SECRETS["webhook key file"].encode())
    other = home / "buckets" / "local" / "runs" / "someone-elses-run"
    other.mkdir(parents=True)
    (other / "spec.json").write_text(f'{{"name": "{SECRETS["another run"]}"}}')
    (home / "downloads").mkdir()
    (home / "downloads" / "someone-elses-run-trainer.log").write_text(SECRETS["downloaded log"])
    hf_home = tmp_path / "hf-home"
    hf_home.mkdir()
    (hf_home / "token").write_text(SECRETS["login file"])
    (tmp_path / "tmp").mkdir()
    env = {"HF_TOKEN": SECRETS["host token"], "OAUTH_CLIENT_SECRET": SECRETS["oauth client secret"],
           "GRPO_PANEL_SECRET_KEY": SECRETS["webhook key env"], "MY_SERVICE_TOKEN": SECRETS["service token"],
           "HF_HOME": str(hf_home), "TMPDIR": str(tmp_path / "tmp"),
           # The looping reward waits out the time limit of a call: 6 s, not 15 (the attacks' calls take well under)
           "GRPO_PANEL_TASK_CHECK_TIMEOUT_S": "6"}
    return env, str(home)


def attack_code(home: str, tmp_path, ports: list[int]) -> str:
    """One reward function per attack; each prints what it reached as `LEAK <tag> <base64>`."""
    return f'''import base64, os, signal, socket, subprocess, sys, time
HOME, HF_HOME, REPO, PORTS, MARK = {home!r}, {str(tmp_path / "hf-home")!r}, {ROOT!r}, {ports!r}, {MARK!r}


def _leak(tag, data):
    data = data.encode() if isinstance(data, str) else data
    print("LEAK", tag, base64.b64encode(data[:100000]).decode())


def _pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]


def read_environs(completions, **kwargs):
    for pid in [os.getppid(), 1] + _pids():
        try:
            _leak("environ-%d" % pid, open("/proc/%d/environ" % pid, "rb").read())
        except Exception as e:
            print("environ of", pid, "refused:", type(e).__name__)
    _leak("own-environ", repr(dict(os.environ)))
    return [0.0] * len(completions)


def read_memory(completions, **kwargs):
    hits = 0
    for pid in _pids():
        try:
            maps = open("/proc/%d/maps" % pid).read().splitlines()
            mem = open("/proc/%d/mem" % pid, "rb")
        except Exception as e:
            print("memory of", pid, "refused:", type(e).__name__)
            continue
        for line in maps[:500]:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            try:
                mem.seek(lo)
                chunk = mem.read(min(hi - lo, 1 << 22))
            except Exception:
                continue
            for needle in (b"hf_", b"planted", b"PLANTED"):
                at = chunk.find(needle)
                while at >= 0 and hits < 200:
                    _leak("mem-%d" % pid, chunk[at:at + 90])
                    hits += 1
                    at = chunk.find(needle, at + 1)
    return [0.0] * len(completions)


def read_files(completions, **kwargs):
    paths = [os.path.join(HF_HOME, "token"), os.path.expanduser("~/.cache/huggingface/token"),
             "/root/.cache/huggingface/token", os.path.join(HOME, "secrets", "key")]
    for top in (HOME, HF_HOME, os.path.join(REPO, "data")):
        for folder, _, files in os.walk(top):
            paths += [os.path.join(folder, f) for f in files]
    for path in paths:
        try:
            _leak("file-" + path, open(path, "rb").read())
        except Exception as e:
            print("file", path, "refused:", type(e).__name__)
    return [0.0] * len(completions)


def write_outside(completions, **kwargs):
    for path in (os.path.join(HOME, MARK), os.path.join(HF_HOME, MARK), os.path.join(REPO, MARK), "/tmp/" + MARK):
        try:
            with open(path, "w") as f:
                f.write("pwned")
            print("wrote", path)
        except Exception as e:
            print("write", path, "refused:", type(e).__name__)
    return [0.0] * len(completions)


def open_sockets(completions, **kwargs):
    for port in PORTS:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(MARK.encode())
            print("connected to", port)
        except Exception as e:
            print("connect", port, "refused:", type(e).__name__)
    return [0.0] * len(completions)


def start_survivors(completions, **kwargs):
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)  # " + MARK]
    subprocess.Popen(sleeper)
    subprocess.Popen(sleeper, start_new_session=True)
    if os.fork() == 0:
        if os.fork() == 0:
            os.setsid()
            os.execv(sys.executable, sleeper)
        os._exit(0)
    started = 0
    try:
        for _ in range(300):
            subprocess.Popen(["sleep", "600"])
            started += 1
    except Exception as e:
        print("process", started, "refused:", type(e).__name__)
    print("started", started, "more processes")
    return [0.0] * len(completions)
'''


EXPECTED = {"allocate": "MemoryError", "loop": "did not return within", "signal": "before it finished",
            "forge": "the real result is a failure"}
LATE = {   # attacks that end their check: one check each
    "allocate": ("def allocate(completions, **kwargs):\n    block = bytearray(30 * 2**30)\n"
                 "    return [float(len(block))] * len(completions)\n"),
    "loop": "def loop(completions, **kwargs):\n    while True:\n        pass\n",
    "signal": ("import os, signal\n\ndef signal_everyone(completions, **kwargs):\n"
               "    os.kill(os.getppid(), signal.SIGTERM)\n"
               "    for pid in [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]:\n"
               "        try:\n            os.kill(pid, signal.SIGKILL)\n        except Exception:\n            pass\n"
               "    return [1.0] * len(completions)\n"),
    "forge": ("import json, os\n\ndef forge(completions, **kwargs):\n"
              "    fake = ['{\"id\": \"x\", \"event\": \"scores\", \"scores\": [1.0]}', '{\"event\": \"done\"}']\n"
              "    for nonce in ['', 'x', os.environ.get('GRPO_CHECK_NONCE', '')]:\n"
              "        for fd in range(0, 64):\n"
              "            for i, text in enumerate(fake):\n"
              "                try:\n"
              "                    os.write(fd, ('GRPO-CHECK %s %d 1/1 %s\\n' % (nonce, i + 1, text)).encode())\n"
              "                except OSError:\n                    pass\n"
              "    raise RuntimeError('the real result is a failure')\n"),
}


class Listener:
    """A loopback server the code tries to reach: it records whoever connects."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    self.received.append(conn.recv(1024))
                except OSError:
                    self.received.append(b"")

    def close(self):
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


def survivors() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if MARK in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


def check_once(client, code: str) -> str:
    """*Check task* with this reward code and no built-in reward (nor the demo's best-by rule, which names one); the
    whole answer as text."""
    params = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/on_check"]["parameters"]
    def param(label: str) -> str:
        return next(f"param_{i}" for i, p in enumerate(params) if p["label"].startswith(label))

    values = {param("Your reward functions"): code, param("Rewards"): [], param("Reward weights"): "",
              param("Best version by"): ""}
    result = client.predict(**values, api_name="/on_check")
    return repr(result)


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


@pytest.fixture
def kill_survivors():
    yield
    for proc in survivors():      # a failed containment must not leave sleepers behind
        proc.kill()


@pytest.fixture(scope="module")
def venvs(tmp_path_factory) -> dict[str, str]:
    """This Python as many people install it: a venv under /tmp, and that venv reached through a linked folder
    (the folder a link to the real one); each venv's interpreter by the path a panel is started with."""
    import site

    base = tmp_path_factory.mktemp("venvs")
    assert str(base).startswith("/tmp/"), base
    (base / "real").mkdir()
    venv = base / "real" / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    # It sees the packages of the environment this suite runs from: --system-site-packages would give it the base
    # interpreter's only, which a suite run from a venv lacks (ModuleNotFoundError: httpx). addsitedir, not a plain
    # path line, so that the .pth files of those folders (editable installs) count too.
    ours = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    (own,) = glob.glob(str(venv / "lib" / "python3*" / "site-packages"))
    with open(os.path.join(own, "suite-environment.pth"), "w") as f:
        f.write("".join(f"import site; site.addsitedir({folder!r})\n" for folder in ours if os.path.isdir(folder)))
    os.symlink(base / "real", base / "link")
    return {"venv under /tmp": str(base / "real" / "venv" / "bin" / "python3"),
            "venv through a linked folder": str(base / "link" / "venv" / "bin" / "python3")}


@pytest.fixture
def decoy():
    """An unrelated process of this machine with a token in its environment (another user's job, say)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdin=subprocess.DEVNULL,
                            env={**os.environ, "HF_TOKEN": SECRETS["another process's token"]})
    yield proc
    proc.kill()
    proc.wait()


def isolation_shown(url: str) -> str:
    """The page's isolation state (the one line under its title), as the page's config serves it."""
    with urllib.request.urlopen(f"{url}/config", timeout=30) as response:
        config = json.loads(response.read())
    return next(c["props"]["value"] for c in config["components"]
                if c.get("props", {}).get("elem_id") == "isolation")


@pytest.mark.parametrize("interpreter", [
    "as installed",
    pytest.param("venv under /tmp", marks=pytest.mark.full),            # the install layouts: tier 2 (~28 s each)
    pytest.param("venv through a linked folder", marks=pytest.mark.full),
])
def test_hostile_code_on_a_local_panel_is_contained(tmp_path, listener, kill_survivors, decoy, interpreter, request):
    from gradio_client import Client

    from backend.task.sandbox import local_sandbox

    assert local_sandbox().missing == (), f"this machine must run the sandbox: {local_sandbox().reason}"
    python = sys.executable if interpreter == "as installed" else request.getfixturevalue("venvs")[interpreter]
    env, home = plant(tmp_path)
    with running_panel("app.py", env, home, python=python) as url:
        assert isolation_shown(url).startswith("🔒 **Isolation:**"), isolation_shown(url)
        port = int(url.rsplit(":", 1)[1])
        client = Client(url, verbose=False)
        answer = check_once(client, attack_code(home, tmp_path, [port, listener.port]))
        assert "Task checked" in answer, answer[-3000:]
        assert "ran without" not in answer and "No sandbox" not in answer, answer[-3000:]
        for name in ("read_environs", "read_memory", "read_files", "write_outside", "open_sockets", "start_survivors"):
            assert name in answer, f"{name} was not scored: {answer[-2000:]}"
        assert_no_secret(answer, "the answer to the read attacks")
        assert "connected to" not in answer and listener.received == [], "the code reached a loopback service"
        assert "wrote " not in answer.replace("wrote /tmp/" + MARK, ""), "the code wrote outside its own folder"
        assert not any(os.path.exists(p) for p in (os.path.join(home, MARK), os.path.join(ROOT, MARK),
                                                   str(tmp_path / "hf-home" / MARK), "/tmp/" + MARK))
        started = int(re.search(r"started (\d+) more processes", answer).group(1))
        assert started < 100, f"the code started {started} processes: no process limit"
        assert wait_until(lambda: not survivors(), timeout=10), [p.cmdline() for p in survivors()]

        for case, code in LATE.items():
            answer = check_once(client, code)
            assert_no_secret(answer, f"the answer to {case}")
            assert "Task checked" not in answer and "reward_code" in answer, (case, answer[-2000:])
            assert EXPECTED[case] in answer, (case, answer[-2000:])
        client.close()
        # The panel survived every case and still checks a good reward.
        good = "def one(completions, **kwargs):\n    return [1.0] * len(completions)\n"
        assert "Task checked" in check_once(Client(url, verbose=False), good)
    assert glob.glob(str(tmp_path / "tmp" / "grpo-task-check-*")) == [], "a check's scratch folder was left behind"
    for path, _, files in os.walk(home):
        for name in files:
            assert MARK not in name, os.path.join(path, name)


def path_without_bwrap(tmp_path) -> str:
    """A PATH holding every program of this one's but bubblewrap (links in one folder)."""
    folder = tmp_path / "bin-without-bwrap"
    folder.mkdir()
    for place in os.environ["PATH"].split(os.pathsep):
        for name in (os.listdir(place) if os.path.isdir(place) else []):
            if name != "bwrap" and not os.path.lexists(folder / name):
                os.symlink(os.path.join(place, name), folder / name)
    return str(folder)


def test_without_bubblewrap_a_local_panel_runs_nothing_unless_the_operator_opts_in(tmp_path, listener,
                                                                                  kill_survivors):
    from gradio_client import Client

    env, home = plant(tmp_path)
    env["PATH"] = path_without_bwrap(tmp_path)
    with running_panel("app.py", env, home) as url:
        state = isolation_shown(url)
        assert state.startswith("⛔ **No sandbox** (bubblewrap is not installed") and "apt-get install bubblewrap" in (
            state) and "GRPO_PANEL_ALLOW_UNSANDBOXED=1" in state, state
        client = Client(url, verbose=False)
        answer = check_once(client, attack_code(home, tmp_path, [int(url.rsplit(":", 1)[1]), listener.port]))
        client.close()
    assert "No sandbox on this machine: bubblewrap is not installed" in answer, answer[-3000:]
    assert "apt-get install bubblewrap" in answer and "GRPO_PANEL_ALLOW_UNSANDBOXED=1" in answer
    assert "Task checked" not in answer and "read_environs" not in answer and "LEAK" not in answer
    assert listener.received == [] and not survivors(), "the code ran"
    assert not any(os.path.exists(p) for p in (os.path.join(home, MARK), os.path.join(ROOT, MARK),
                                               str(tmp_path / "hf-home" / MARK), "/tmp/" + MARK)), "the code ran"
    assert glob.glob(str(tmp_path / "tmp" / "grpo-task-check-*")) == [], "nothing was even staged"

    env["GRPO_PANEL_ALLOW_UNSANDBOXED"] = "1"       # the operator's opt-in: the code runs, and the page says how
    with running_panel("app.py", env, home) as url:
        state = isolation_shown(url)
        assert state.startswith("⚠️ **No sandbox** (bubblewrap is not installed") and "**unsandboxed**" in state
        client = Client(url, verbose=False)
        answer = check_once(client, "def one(completions, **kwargs):\n    print('ran here')\n"
                                    "    return [1.0] * len(completions)\n")
        client.close()
    assert "Task checked" in answer and "ran here" in answer, answer[-3000:]
    assert "The check ran without PID namespace" in answer and "GRPO_PANEL_ALLOW_UNSANDBOXED is set" in answer


def test_python_is_bound_by_the_path_it_was_started_with_and_by_its_real_path(tmp_path, monkeypatch):
    """A uv-managed Python and a venv made from it in a project folder reached through a link: the venv is bound
    at both its paths (from the real one), the uv installation too, all after the private /tmp is mounted."""
    from backend.task import sandbox

    uv = tmp_path / "home" / ".local" / "share" / "uv" / "python" / "cpython-3.11.7-linux-x86_64-gnu"
    (uv / "bin").mkdir(parents=True)
    (uv / "bin" / "python3.11").write_text("")
    (uv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    real = tmp_path / "disk" / "project" / ".venv"
    (real / "bin").mkdir(parents=True)
    (real / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    os.symlink(uv / "bin" / "python3.11", real / "bin" / "python3")
    os.symlink(tmp_path / "disk" / "project", tmp_path / "project")
    venv = tmp_path / "project" / ".venv"
    for name, value in (("executable", str(venv / "bin" / "python3")), ("prefix", str(venv)),
                        ("exec_prefix", str(venv)), ("base_prefix", str(uv)), ("base_exec_prefix", str(uv)),
                        ("path", [str(uv / "lib" / "python3.11"), str(venv / "lib" / "python3.11" / "site-packages")])):
        monkeypatch.setattr(sys, name, value)
    args = sandbox.machine_binds()
    binds = {(args[i + 1], args[i + 2]) for i, arg in enumerate(args) if arg == "--ro-bind"}
    assert {(str(real), str(venv)), (str(real), str(real)), (str(uv), str(uv))} <= binds, binds
    assert not [dest for _, dest in binds if dest.startswith((f"{venv}/", f"{uv}/"))], "nested"
    assert args.index("--tmpfs") < min(args.index(str(venv)), args.index(str(uv))), "/tmp first, then Python"

    # Started through a link of one's own (`~/bin/python3`): that link is made again inside, the home is not bound.
    (tmp_path / "home" / "bin").mkdir()
    os.symlink(uv / "bin" / "python3.11", tmp_path / "home" / "bin" / "python3")
    for name, value in (("executable", str(tmp_path / "home" / "bin" / "python3")), ("prefix", str(uv)),
                        ("exec_prefix", str(uv)), ("path", [str(uv / "lib" / "python3.11")])):
        monkeypatch.setattr(sys, name, value)
    args = sandbox.machine_binds()
    assert ["--symlink", str(uv / "bin" / "python3.11"), sys.executable] == args[-3:], args
    assert [args[i + 2] for i, arg in enumerate(args) if arg == "--ro-bind"][-1] == str(uv), "only the installation"


@pytest.fixture
def fresh_probe():
    """`local_sandbox` probing this machine again (it remembers its answer), and again after the test."""
    from backend.task.sandbox import local_sandbox

    local_sandbox.cache_clear()
    yield local_sandbox
    local_sandbox.cache_clear()


def test_the_probe_tells_what_is_wrong_and_names_the_fix(tmp_path, monkeypatch, fresh_probe):
    from backend.task import sandbox

    no_bwrap = path_without_bwrap(tmp_path)
    monkeypatch.setenv("PATH", no_bwrap)
    missing = fresh_probe()
    assert missing.problem == sandbox.NOT_INSTALLED and "apt-get install bubblewrap" in missing.reason
    assert "Nothing ran" in missing.refusal() and "GRPO_PANEL_ALLOW_UNSANDBOXED=1" in missing.refusal()

    refusing = tmp_path / "refusing"        # a bubblewrap this kernel will not give namespaces
    refusing.mkdir()
    (refusing / "bwrap").write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    (refusing / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{refusing}{os.pathsep}{no_bwrap}")
    fresh_probe.cache_clear()
    refused = fresh_probe()
    assert refused.problem == sandbox.REFUSED and "No permissions to create new namespace" in refused.reason
    assert "user namespaces" in refused.reason and "unprivileged_userns_clone" in refused.reason

    monkeypatch.undo()
    monkeypatch.setattr(sandbox, "python_binds", list)     # our binds wrong: this Python is not inside
    fresh_probe.cache_clear()
    wrong = fresh_probe()
    assert wrong.problem == sandbox.BAD_BINDS and "bubblewrap works here" in wrong.reason
    assert sys.executable in wrong.reason and "bug of the panel's sandbox" in wrong.reason

    monkeypatch.undo()
    fresh_probe.cache_clear()
    assert fresh_probe().problem == "" and fresh_probe().refusal() is None
    monkeypatch.setenv("GRPO_PANEL_ALLOW_UNSANDBOXED", "1")
    assert missing.refusal() is None, "the operator's opt-in"


# A `bwrap` that runs the command it is given, with the sandbox's environment and its runtime found as the sandbox
# would bind it, but in no namespace of its own: it passes a probe that only asks "did Python start and import?".
UNCONFINED_BWRAP = """#!INTERPRETER
import os, sys
args = sys.argv[1:]
# The command: the interpreter before the last -c.
env, lib, start = {}, "", len(args) - 1 - args[::-1].index("-c") - 1
for i, arg in enumerate(args[:start]):
    if arg == "--setenv":
        env[args[i + 1]] = args[i + 2]
    if arg == "--ro-bind" and args[i + 2].endswith("/runtime"):
        lib = os.path.dirname(args[i + 1])
os.execve(args[start], args[start:], {**env, "PYTHONPATH": lib, "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
"""


def test_a_bwrap_that_runs_nothing_or_runs_code_unconfined_fails_the_probe(tmp_path, monkeypatch, fresh_probe):
    """The probe runs a command inside and checks its answer: its nonce, its own PID, network, IPC, UTS and mount
    namespaces, few processes, only loopback. A `bwrap` first on PATH that exits 0 and runs nothing, or one that runs
    the command with the panel's namespaces, leaves no sandbox: code runs nowhere, and the page says why and the fix."""
    from backend.task import sandbox

    fakes = {"does-nothing": "#!/bin/sh\nexit 0\n",
             "unconfined": UNCONFINED_BWRAP.replace("INTERPRETER", sys.executable)}
    for name, script in fakes.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "bwrap").write_text(script)
        (folder / "bwrap").chmod(0o755)
        if name == "unconfined":     # the old probe's question alone: this fake answers it
            argv, env, cwd = sandbox.Sandbox(str(folder / "bwrap")).command(
                [sys.executable, "-c", "import runtime; print('imported')"], str(tmp_path), {})
            ran = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
            assert ran.returncode == 0 and ran.stdout.strip() == "imported", ran.stderr
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
        fresh_probe.cache_clear()
        box = fresh_probe()
        assert box.bwrap is None and box.problem == sandbox.NOT_ISOLATING, (name, box)
        assert str(folder / "bwrap") in box.reason and "apt-get install bubblewrap" in box.reason, box.reason
        why = {"does-nothing": "ran nothing", "unconfined": "shares the panel's pid, net, ipc, uts, mnt"}[name]
        assert why in box.reason, box.reason
        assert "Nothing ran" in box.refusal()
        state = sandbox.isolation_state(False, box)
        assert state.startswith("⛔ **No sandbox**") and "does not isolate" in state, state
        monkeypatch.undo()
    fresh_probe.cache_clear()
    assert fresh_probe().problem == "" and fresh_probe().refusal() is None, "the real bubblewrap still isolates"


@pytest.mark.panel_settings(budget_check_s=0)
def test_without_a_sandbox_a_local_launch_is_refused_before_anything_starts(panel, monkeypatch):
    """A launch checks its task first: with no sandbox that check runs nothing, so nothing is launched."""
    from backend.task import check
    from backend.task.sandbox import REFUSED, no_sandbox

    monkeypatch.setattr(check, "local_sandbox", lambda: no_sandbox(REFUSED, "this machine refused bubblewrap's "
                                                                            "namespaces (setting up uid map)"))
    monkeypatch.setattr(check, "run_in_sandbox", lambda *a, **k: pytest.fail("a check ran without a sandbox"))
    result = panel.launch({"max_steps": 10})
    assert result.run_id is None and "nothing was launched" in result.message, result.message
    assert "No sandbox on this machine: this machine refused bubblewrap" in result.message
    assert "user namespaces" in result.message and "GRPO_PANEL_ALLOW_UNSANDBOXED=1" in result.message
    assert panel.local.list_jobs() == [], "no job was started"


@pytest.mark.panel_settings(budget_check_s=0)
def test_try_it_without_a_sandbox_loads_nothing_and_says_how_to_fix_it(tmp_path, monkeypatch, panel):
    """Through the page (a real Gradio server): a CPU try refused, nothing staged or started."""
    from backend.outcome import try_it
    from backend.task.sandbox import NOT_INSTALLED, no_sandbox
    from tests.helpers import answer_cells
    from tests.test_best_version import SyntheticRun, served

    monkeypatch.setattr(try_it, "local_sandbox", lambda: no_sandbox(NOT_INSTALLED, "bubblewrap is not installed"))
    monkeypatch.setattr(try_it, "_run_worker", lambda *a, **k: pytest.fail("a try ran without a sandbox"))
    run = SyntheticRun(str(tmp_path / "home"), 200)
    base = os.path.join(run.run_dir, "base-model")
    os.makedirs(base)
    for name, data in (("config.json", b"{}"), ("model.safetensors", b"weights")):
        with open(os.path.join(base, name), "wb") as f:
            f.write(data)
    with served(panel) as client:
        _message, table = client.predict(run.spec.run_id, "2+2?", ["base", "trl-policy-v3"], 8, api_name="/on_try")
    cells = answer_cells(table)
    for pick in ("base model", "trl-policy-v3"):
        assert "No sandbox on this machine: bubblewrap is not installed" in cells[pick][0], cells
        assert "apt-get install bubblewrap" in cells[pick][0] and "GRPO_PANEL_ALLOW_UNSANDBOXED" in cells[pick][0]


@pytest.mark.fake_hub(users={ALICE: FakeUser("alice"), SECRETS["bob's token"]: FakeUser("bob")}, serve=False)
def test_hostile_code_on_a_space_runs_only_in_the_visitors_own_job(tmp_path, hub, listener, kill_survivors):
    from gradio_client import Client

    env, home = plant(tmp_path, space=True)
    env.update({"SPACE_ID": "alice/grpo-panel", "SYSTEM": "spaces", "SPACE_AUTHOR_NAME": "alice",
                "OAUTH_CLIENT_ID": "fake-client", "OAUTH_SCOPES": "openid profile jobs",
                "OPENID_PROVIDER_URL": hub.url, "HF_ENDPOINT": hub.url, "GRPO_PANEL_DATASETS_SERVER": hub.url,
                "GRPO_PANEL_BUDGET_CHECK_S": "0"})
    with running_panel("tests/space_app.py", env, home) as url:
        panel = psutil.Process(_panel_pid(url))
        port = int(url.rsplit(":", 1)[1])
        code = attack_code(home, tmp_path, [port, listener.port])

        anonymous = Client(url, verbose=False)
        answer = check_once(anonymous, code)
        assert "Sign in with Hugging Face" in answer and hub.check_job_posts() == [], answer[-2000:]
        anonymous.close()

        def signed_in(token, name):
            cookie = space_session_cookie(SECRETS["oauth client secret"], token, name, time.time() + 8 * 3600)
            return Client(url, verbose=False, headers={"Cookie": f"session={cookie}"})

        bob, alice = signed_in(SECRETS["bob's token"], "bob"), signed_in(ALICE, "alice")
        children: list = []
        watching = threading.Event()

        def watch():
            while not watching.is_set():
                children.extend(c.pid for c in panel.children(recursive=True))
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            good = "def one(completions, **kwargs):\n    return [1.0] * len(completions)\n"
            assert "Task checked" in check_once(bob, good)     # Bob's token is in the panel's memory from now on
            answer = check_once(alice, code)
            late = {case: check_once(alice, late_code) for case, late_code in LATE.items()}
        finally:
            watching.set()
            watcher.join()
        assert children == [], f"the Space's machine started processes: {children}"
        assert "Task checked" in answer and "read_files" in answer, answer[-3000:]
        bobs, post, *_ = hub.check_job_posts()
        assert (bobs.user, post.user) == ("bob", "alice") and post.json["flavor"] == "cpu-basic"
        assert post.json["secrets"] == {"HF_TOKEN": ALICE}, "the visitor's own token, and no other"
        assert_no_secret(repr(post.json), "the check job")
        assert_no_secret(answer, "the answer on the Space")
        for case, late_answer in late.items():     # each in a check job of Alice's own, contained there
            assert_no_secret(late_answer, f"the answer to {case} on the Space")
            assert "Task checked" not in late_answer and EXPECTED[case] in late_answer, (case, late_answer[-2000:])
        assert len(hub.check_job_posts()) == len(hub.check_runner.ran) == 2 + len(LATE)
        assert listener.received == []
        alice.close()
        bob.close()


def _panel_pid(url: str) -> int:
    port = int(url.rsplit(":", 1)[1])
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return conn.pid
    raise AssertionError(f"no process listens on {port}")


def test_a_space_checks_an_uploaded_file_in_the_visitors_job_and_launch_reuses_that_check(tmp_path, monkeypatch):
    """The file goes into the visitor's bucket beside the check; the report comes from the job; Launch then
    reuses that result for the same task instead of starting a second check job."""
    from panel.actions import Panel, Settings

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "uploads"))
    upload = tmp_path / "uploads" / "3f2a" / "math.jsonl"
    upload.parent.mkdir(parents=True)
    upload.write_text("".join(f'{{"question": "What is {i} + {i}?", "answer": "{2 * i}"}}\n' for i in range(20)))
    hub = FakeHub(users={ALICE: FakeUser("alice")}).start()
    with hub.serving(monkeypatch, SECRETS["host token"]):
        panel = Panel(Settings(home=str(tmp_path / "home"), on_space=True, datasets_server=hub.url))
        try:
            form = {"executor": "hf_jobs", "model": "builtin:tiny-qwen2", "dataset": str(upload),
                    "prompt_column": "question", "reward_columns": "solution=answer", "rewards": [],
                    "bucket": "alice/grpo-runs", "flavor": "cpu-basic", "reward_code":
                    "def exact(completions, solution, **kwargs):\n"
                    "    return [float(c[0]['content'] == s) for c, s in zip(completions, solution)]\n"}
            said = []
            report = panel.check_task(form, ALICE, progress=said.append)
            assert report.ok and report.num_rows == 20 and set(report.scores) == {"exact"}, report.errors
            assert report.scores["exact"][1] == 1.0, "the bare right answer scores 1"
            assert any("cpu-basic in your own account" in line for line in said) and report.cost_usd is not None
            [check] = hub.check_job_posts()
            staged = [p for kind, _, p in hub.transfers if kind == "upload" and p.startswith("checks/")]
            assert any(p.endswith("/data/math.jsonl") for p in staged) and any(p.endswith("/request.json")
                                                                                 for p in staged)
            # Once the job has answered, nothing of the check stays in the visitor's bucket.
            assert not [p for p in hub.buckets["alice/grpo-runs"].files if p.startswith("checks/")]
            assert {p for kind, _, p in hub.transfers if kind == "delete"} >= set(staged)
            assert SECRETS["host token"] not in repr(check.json), "the Space's own token never goes into a check"
            shown = panel.preview(form, ALICE)
            result = panel.launch(form, ALICE, confirmed=shown.fingerprint, run_id=shown.run_id)
            assert result.run_id, result.message
            assert len(hub.check_job_posts()) == 1 and len(hub.job_posts()) == 1, "Launch reused the check"
        finally:
            panel.shutdown()


def test_a_panel_listening_beyond_loopback_runs_no_check_on_its_own_machine(tmp_path, monkeypatch):
    """Not a Space, but reachable from other machines, with the host's token in its environment: without an
    operator's opt-in no visitor acts with that token, and no check runs here, sandboxed or not."""
    from backend.task import check as task_check
    from panel.actions import Panel, Settings

    monkeypatch.setenv("HF_TOKEN", SECRETS["host token"])
    monkeypatch.setattr(task_check, "run_in_sandbox", lambda *a, **k: pytest.fail("a check ran on the panel"))
    panel = Panel(Settings(home=str(tmp_path / "home"), on_space=False, host="0.0.0.0"))
    try:
        report = panel.check_task({"reward_code": "def f(completions, **kwargs):\n    return [0.0] * 12\n"})
        [error] = report.errors
        assert error.field == "account" and "GRPO_PANEL_AUTH" in error.message and "never on its own machine" in (
            error.message)
    finally:
        panel.shutdown()
