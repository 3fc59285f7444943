"""A replica job stops its server when the run's trainer ends, and ignores end events from before its start."""

import os
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from backend.runtime.records import write_event
from tests.fakehub import wait_until
from tests.helpers import free_port, serve_replica_process

pytestmark = pytest.mark.integration

SERVER = [sys.executable, "-c", "import time; print('serving', flush=True); time.sleep(300)"]


def _start(run_dir, *extra, server=SERVER, env=None, stderr=None):
    return serve_replica_process(run_dir, *extra, server=server, env=env, stderr=stderr)


def _children(proc):
    return psutil.Process(proc.pid).children(recursive=True)


def test_the_replica_stops_when_the_trainer_finishes(tmp_path):
    write_event(str(tmp_path), "trainer", "failed", error="an earlier attempt")   # before the replica started
    time.sleep(0.05)
    proc = _start(tmp_path)
    try:
        assert proc.stdout.readline().strip() == "serving"
        server = _children(proc)
        time.sleep(6)
        assert proc.poll() is None, "an end event from before the replica started must not stop it"
        write_event(str(tmp_path), "trainer", "finished")
        assert proc.wait(timeout=20) == 0
        assert "the trainer has finished" in proc.stdout.read()
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in server)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


def test_a_sweeps_fleet_replica_serves_on_while_a_member_ends_and_stops_once_every_member_has(tmp_path):
    """A member that dies (its heartbeat stops) or is cancelled leaves the fleet serving the others; the fleet stops
    after the last member's trainer ends."""
    fleet, members = tmp_path / "fleet", [tmp_path / "m0", tmp_path / "m1", tmp_path / "m2"]
    fleet.mkdir()
    proc = _start(fleet, *(arg for m in members for arg in ("--member-run-dir", str(m))),
                  env={"GRPO_TRAINER_GONE_AFTER_S": "2"})
    try:
        assert proc.stdout.readline().strip() == "serving"
        said: list[str] = []
        reader = threading.Thread(target=lambda: said.extend(iter(proc.stdout.readline, "")), daemon=True)
        reader.start()
        write_event(str(members[0]), "trainer", "canceled")
        heartbeat = members[1] / "heartbeat" / "trainer.json"
        heartbeat.parent.mkdir(parents=True)
        heartbeat.write_text('{"beat": 1}')     # m1 beats once, then stands still: killed
        wait_until(lambda: "m1: no trainer heartbeat" in "".join(said), timeout=60, interval=0.2,
                   what="m1's trainer counted gone")
        assert proc.poll() is None, "m2 still trains: the fleet serves on"
        write_event(str(members[2]), "trainer", "finished")
        assert proc.wait(timeout=20) == 0
        reader.join(timeout=10)
        said = "".join(said)
        assert "m0: the trainer has canceled; serving 2 member(s) still" in said, said
        assert "m1: no trainer heartbeat for" in said and "serving 1 member(s) still" in said, said
        assert "every member's trainer has ended (3): stopping this replica" in said, said
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


def test_the_replica_waits_for_the_base_model(tmp_path):
    model = tmp_path / "base-model"
    proc = _start(tmp_path, "--wait-for", str(model))
    try:
        assert "waiting for the base model" in proc.stdout.readline()
        time.sleep(1)
        assert _children(proc) == [], "the server must not start before the model exists"
        model.mkdir()
        (model / "config.json").write_text("{}")
        assert proc.stdout.readline().strip() == "serving"
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_float32_is_asked_for_only_where_cuda_is_absent():
    from backend.runtime.serving.server_setup import with_dtype_without_cuda

    serve = ["vllm", "serve", "m"]
    assert with_dtype_without_cuda(serve, "float32", lambda: False) == [*serve, "--dtype", "float32"]
    assert with_dtype_without_cuda(serve, "float32", lambda: True) == serve, "vLLM's own dtype on a GPU"
    assert with_dtype_without_cuda([*serve, "--dtype", "half"], "float32", lambda: False) == [*serve, "--dtype", "half"]
    assert with_dtype_without_cuda(serve, None, lambda: False) == serve


def test_vllm_serve_runs_as_given_where_the_vllm_script_works_and_through_vllm_cli_on_the_cpu_build():
    from backend.runtime.serving.server_setup import server_command

    serve = ["vllm", "serve", "/bucket/base-model", "--port", "8000"]
    assert server_command(serve, lambda: True) == serve, "the GPU image's own `vllm` script"
    own_cli = [sys.executable, "-m", "backend.runtime.serving.vllm_cli", *serve[1:]]
    assert server_command(serve, lambda: False) == own_cli
    assert server_command(SERVER, lambda: False) == SERVER, "another server command is left as it is"


def test_vllm_installed_without_its_scripts_runs_through_vllm_cli(monkeypatch, tmp_path):
    """vLLM unpacked into a folder on PYTHONPATH (pip --target, as on an offline GPU machine) has no `vllm` script."""
    from backend.runtime.serving import server_setup

    serve = ["vllm", "serve", "/bucket/base-model"]
    monkeypatch.setattr(server_setup, "has_vllm_distribution", lambda: True)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert server_setup.server_command(serve)[:3] == [sys.executable, "-m", "backend.runtime.serving.vllm_cli"]
    script = tmp_path / "vllm"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert server_setup.server_command(serve) == serve


def test_the_servers_sockets_go_in_a_folder_of_its_own_that_is_removed_when_it_stops(tmp_path):
    server = [sys.executable, "-c",
              "import os, time; print(os.environ['VLLM_RPC_BASE_PATH'], flush=True); time.sleep(300)"]
    proc = _start(tmp_path, server=server)
    try:
        rpc_dir = proc.stdout.readline().strip()
        assert os.path.isdir(rpc_dir) and os.path.basename(rpc_dir).startswith("vllm-rpc-")
        write_event(str(tmp_path), "trainer", "finished")
        assert proc.wait(timeout=20) == 0
        assert not os.path.exists(rpc_dir), "vLLM's leftover sockets would stay in it"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


def test_the_replica_stops_when_the_trainers_heartbeat_stops(tmp_path):
    beat = tmp_path / "heartbeat" / "trainer.json"     # what the trainer rewrites every few seconds
    beat.parent.mkdir()
    with open(beat, "w") as f:
        f.write('{"beat": 1}')             # an earlier attempt's last beat: not a sign of life
    proc = _start(tmp_path, env={"GRPO_TRAINER_GONE_AFTER_S": "3"})
    try:
        assert proc.stdout.readline().strip() == "serving"
        for n in range(2, 5):
            time.sleep(2)
            with open(beat, "w") as f:
                f.write(f'{{"beat": {n}}}')
        assert proc.poll() is None, "a trainer that beats keeps its replicas"
        # The trainer is SIGKILLed: no event, the heartbeat just stops.
        assert proc.wait(timeout=20) == 0
        assert "no trainer heartbeat for" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


def test_the_trainer_is_gone_when_its_heartbeat_stands_still_or_never_starts():
    from backend.runtime.job.heartbeat import HeartbeatWatch

    now = [0.0]
    content = [b"old"]
    watch = HeartbeatWatch("/nonexistent", gone_after_s=30, first_beat_s=600, clock=lambda: now[0])
    watch._read = lambda: content[0]
    watch.last = b"old"
    now[0] = 500
    assert watch.gone() is None, "still starting"
    content[0], now[0] = b"1", 510
    assert watch.gone() is None
    now[0] = 539
    assert watch.gone() is None
    now[0] = 541
    assert watch.gone() == "no trainer heartbeat for 31 s"
    never = HeartbeatWatch("/nonexistent", gone_after_s=30, first_beat_s=600, clock=lambda: now[0])
    now[0] += 601
    assert never.gone() == "no trainer heartbeat within 600 s"


# One write a line: two servers print at once into one pipe (unbuffered print() writes each of its parts alone).
PORT_SERVER = [sys.executable, "-c", ("import os, sys, time; port = sys.argv[sys.argv.index('--port') + 1]; "
               "sys.stdout.write(f\"serving {port} {os.environ.get('VLLM_CPU_OMP_THREADS_BIND')}\\n\"); "
               "sys.stdout.flush(); "
               "time.sleep(int(os.environ.get('EXIT_AFTER_' + port, 300))); sys.exit(3)"), "--port", "8000"]


def _serving(proc, count: int) -> list[list[str]]:
    """The first `count` "serving" lines of the servers, as words: the job's own lines between them (its note on
    pinning the servers to cores) skipped."""
    lines = []
    for _ in range(count + 5):
        line = proc.stdout.readline()
        if line.startswith("serving "):
            lines.append(line.split())
        if len(lines) == count:
            return lines
    raise AssertionError(f"{count} servers did not say they serve; last line {line!r}")


def test_a_job_of_several_servers_runs_one_on_each_port_and_stops_them_all_when_one_exits(tmp_path):
    proc = _start(tmp_path, "--ports", "8100", "8101", "--cpu-binds", "0", "1", server=PORT_SERVER,
                  env={"EXIT_AFTER_8101": "4"})
    try:
        started = sorted(_serving(proc, 2))
        assert started == [["serving", "8100", "0"], ["serving", "8101", "1"]]
        servers = _children(proc)
        # One server gone takes the job down (its retry starts them all again, and the proxy takes each back).
        assert proc.wait(timeout=40) == 3
        assert "the vLLM server on port 8101 exited (3): stopping the others" in proc.stdout.read()
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in servers)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


def test_every_server_of_a_job_stops_when_the_trainer_finishes(tmp_path):
    proc = _start(tmp_path, "--ports", "8100", "8101", server=PORT_SERVER)
    try:
        assert sorted(words[1] for words in _serving(proc, 2)) == ["8100", "8101"]
        servers = _children(proc)
        write_event(str(tmp_path), "trainer", "finished")
        assert proc.wait(timeout=20) == 0
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in servers)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


def test_a_fleet_job_finds_its_servers_at_its_ports_or_its_commands_port():
    from backend.runtime.serving.server_setup import server_urls

    assert server_urls(["vllm", "serve", "m", "--port", "8001"], ["9000", "9001"]) == [
        "http://127.0.0.1:9000", "http://127.0.0.1:9001"]
    assert server_urls(["vllm", "serve", "m", "--host", "0.0.0.0", "--port", "8001"], None) == ["http://127.0.0.1:8001"]
    assert server_urls(["vllm", "serve", "m", "--port=8002"], None) == ["http://127.0.0.1:8002"]
    assert server_urls(["vllm", "serve", "m"], None) == ["http://127.0.0.1:8000"], "vLLM's own default"


def test_a_port_taken_on_the_replicas_node_stops_it_before_any_server_starts_naming_the_port_and_the_node(tmp_path):
    """A Ray replica's ports are picked free on the panel's machine; the node that runs it (here) has one taken, by a
    server listening on loopback only. The replica starts none of its servers, says which port on which node, and
    records its end, so the trainers waiting for it stop at once."""
    from backend.runtime.serving.run_ends import replicas_ended
    from backend.runtime.serving.serve_replica import PORT_TAKEN_CODE

    free = free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        proc = _start(tmp_path, "--check-ports", "--role", "vllm-0", "--ports", str(free), str(taken),
                      server=PORT_SERVER, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    assert proc.returncode == 1, (proc.returncode, out, err)
    assert "serving" not in out, "no server started"
    assert f"port(s) taken on node {socket.gethostname()}: {taken} (Address already in use)" in err, err
    assert f"{free} (" not in err, "the free port is not named"
    ended = replicas_ended(str(tmp_path))
    assert ended["vllm-0"]["code"] == PORT_TAKEN_CODE and ended["vllm-0"]["last"] is True, ended


def test_a_replica_whose_ports_are_free_on_its_node_says_so_and_serves(tmp_path):
    import socket

    from tests.helpers import free_port

    ports = [str(free_port()), str(free_port())]
    proc = _start(tmp_path, "--check-ports", "--ports", *ports, server=PORT_SERVER)
    try:
        said = proc.stdout.readline()
        assert said == f"port(s) {', '.join(ports)} free on node {socket.gethostname()}: starting the server(s)\n"
        assert sorted(words[1] for words in _serving(proc, 2)) == sorted(ports)
        write_event(str(tmp_path), "trainer", "finished")
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
