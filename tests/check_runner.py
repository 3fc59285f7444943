"""The fake Hub's Jobs machine for task-check jobs: it runs each one as Hugging Face Jobs would, elsewhere.

A check job (label `grpo-panel-role=task-check`) gets a fresh folder as its machine: the bucket it mounts is
copied there from the fake's files and the job's own command runs in it (its `bash -c` script, with the mount
path pointing at that copy and its `pip install` left out: the test machine already has what the image would
install), with only the job's environment and secrets, never the test process's, in a bubblewrap sandbox of
its own: like a job on Hugging Face's machines, it sees none of this machine's files, processes or loopback
services. What it prints becomes the job's log, streamed as it comes, and its exit status the job's stage. This
is the "remote machine" of the tests: a Space-mode panel under test must not start any process itself.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import threading

from backend.plan.jobspec import LABEL_ROLE
from backend.task.check_job import CHECK_ROLE
from backend.task.sandbox import machine_binds

PASSED = ("LANG", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
JOB_MEMORY_BYTES = 8 * 2**30


class CheckJobRunner:
    def __init__(self, hub):
        self.hub = hub
        self.ran: list[str] = []          # job ids, in the order they ran
        self._stop = threading.Event()
        self._procs: dict[str, subprocess.Popen] = {}
        self._thread = threading.Thread(target=self._watch, name="fakehub-check-runner", daemon=True)

    def start(self) -> "CheckJobRunner":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for proc in list(self._procs.values()):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        started: set[str] = set()
        while not self._stop.wait(0.1):
            with self.hub._cond:
                new = [job for job in self.hub.jobs.values() if job.id not in started and job.stage == "SCHEDULING"
                       and (job.spec.get("labels") or {}).get(LABEL_ROLE) == CHECK_ROLE]
            for job in new:
                started.add(job.id)
                threading.Thread(target=self._run, args=(job,), daemon=True).start()

    def _run(self, job) -> None:
        machine = tempfile.mkdtemp(prefix="fakehub-check-job-")
        os.chmod(machine, 0o755)    # a machine's own folders are open to its users (the check drops to "nobody")
        try:
            self.ran.append(job.id)
            script = self._materialise(job, machine)
            self.hub.set_stage(job.id, "RUNNING")
            env = {"PATH": f"{machine}/bin:/usr/bin:/bin", "HOME": f"{machine}/home", "HF_HUB_OFFLINE": "1",
                   **{k: os.environ[k] for k in PASSED if k in os.environ},
                   **_remapped(job.spec.get("environment") or {}, self._mount(job), machine),
                   **(job.spec.get("secrets") or {})}
            proc = self._procs[job.id] = subprocess.Popen(_elsewhere(machine, script), cwd=machine, env=env,
                                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for line in proc.stdout:
                self.hub.append_logs(job.id, line.rstrip("\n"))
            status = proc.wait()
            if self.hub.jobs[job.id].stage == "RUNNING":
                self.hub.set_stage(job.id, "COMPLETED" if status == 0 else "ERROR",
                                   None if status == 0 else f"exit code {status}")
        finally:
            shutil.rmtree(machine, ignore_errors=True)

    def _mount(self, job) -> dict:
        [volume] = job.spec["volumes"]
        return volume

    def _materialise(self, job, machine: str) -> str:
        """The job's machine: its bucket's files under the mount path, `python` on the PATH; returns its script."""
        volume = self._mount(job)
        with self.hub._cond:
            files = dict(self.hub.buckets[volume["source"]].files)
        root = os.path.join(machine, "mnt")
        for path, stored in files.items():
            target = os.path.join(root, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(stored.data)
        os.makedirs(os.path.join(machine, "bin"))
        os.makedirs(os.path.join(machine, "home"))
        os.symlink(sys.executable, os.path.join(machine, "bin", "python"))
        script = job.spec["command"][-1]
        if script.startswith("pip install"):
            script = script.split(" && ", 1)[1]
        return script.replace(volume["mountPath"] + "/", root + "/")


def _elsewhere(machine: str, script: str) -> list[str]:
    """`bash -c script` as on another machine: none of this one's files, processes or loopback services. Its
    Python is the panel sandbox's (`machine_binds`: this Python by the path it was started with and its real one,
    under the private /tmp), so `python` there is the test's own interpreter however it was installed."""
    # prlimit: the job machine's memory (cpu-basic has 16 GB); a job asking for more fails there, not here.
    return ["prlimit", f"--as={JOB_MEMORY_BYTES}", "--", "bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--die-with-parent", "--new-session", *machine_binds(), "--bind", machine, machine, "bash", "-c", script]


def _remapped(env: dict, volume: dict, machine: str) -> dict:
    return {k: str(v).replace(volume["mountPath"] + "/", os.path.join(machine, "mnt") + "/") for k, v in env.items()}
