"""Who may see and do what: the deployment's settings, the visitor, and the rules between them. No Gradio here.

- On a Space every visitor acts with their own OAuth token, never the Space's. An anonymous visitor can neither
  launch nor see runs: there is no token to list anyone's jobs with.
- Local runs use the Space's own hardware: off on a Space unless its owner turns them on
  (`GRPO_PANEL_LOCAL_RUNS=owner`), and then only the owner (a visitor who can write to the Space's namespace)
  may see, launch or cancel them.
- Outside a Space the panel acts with the host's token (`HF_TOKEN` or `hf auth login`). A panel that listens
  beyond loopback (`GRADIO_SERVER_NAME=0.0.0.0`) would lend that token, and its bill, to whoever reaches it, so
  there it uses no token unless the operator opts in: a panel password (`GRPO_PANEL_AUTH=user:password`,
  Gradio's own login) or `GRPO_PANEL_ALLOW_HOST_TOKEN=1`.
"""

import ipaddress
import os
import time
from dataclasses import dataclass, field

from huggingface_hub import constants, get_token

from backend.runs.hub_auth import can_control
from backend.runtime.redact import remember_secret
from backend.task.sandbox import ALLOW_UNSANDBOXED_ENV, unsandboxed_allowed

LOOPBACK_NAMES = ("localhost", "")
LOCAL_RUNS_CHOICES = ("on", "off", "owner")
DEFAULT_MAX_UPLOAD_MB = 100.0
MAX_UPLOAD_ENV = "GRPO_PANEL_MAX_UPLOAD_MB"
UPLOAD_QUOTA_FILES_ENV = "GRPO_PANEL_UPLOAD_QUOTA_FILES"
DEFAULT_UPLOAD_QUOTA_FILES = 10.0
UPLOAD_QUOTA_MB_ENV = "GRPO_PANEL_UPLOAD_QUOTA_MB"
DEFAULT_UPLOAD_QUOTA_MB = 200.0
TASK_CHECK_TIMEOUT_ENV = "GRPO_PANEL_TASK_CHECK_TIMEOUT_S"
DEFAULT_TASK_CHECK_TIMEOUT_S = 15.0
HUB_LIST_ENV = "GRPO_PANEL_HUB_LIST_S"
DEFAULT_HUB_LIST_S = 15.0
# Limits read from the environment as positive numbers: the panel refuses to start with any other value.
POSITIVE_SETTINGS = ((MAX_UPLOAD_ENV, "megabytes", DEFAULT_MAX_UPLOAD_MB),
                     (UPLOAD_QUOTA_FILES_ENV, "files", DEFAULT_UPLOAD_QUOTA_FILES),
                     (UPLOAD_QUOTA_MB_ENV, "megabytes", DEFAULT_UPLOAD_QUOTA_MB),
                     (TASK_CHECK_TIMEOUT_ENV, "seconds", DEFAULT_TASK_CHECK_TIMEOUT_S),
                     (HUB_LIST_ENV, "seconds", DEFAULT_HUB_LIST_S))


class Refused(Exception):
    """The visitor may not do this; the message says why and what would help."""


@dataclass(frozen=True)
class Visitor:
    """One browser session's identity as Gradio hands it over: the OAuth token and profile on a Space."""

    token: str | None = None
    username: str | None = None
    expires_at: float | None = None      # epoch seconds when the token stops working (OAuth tokens expire)

    def __post_init__(self):
        remember_secret(self.token)      # masked in every log line and message this process shows from now on


ANONYMOUS = Visitor()


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _default_host(on_space: bool) -> str:
    return os.environ.get("GRADIO_SERVER_NAME") or ("0.0.0.0" if on_space else "127.0.0.1")


@dataclass
class Deployment:
    """Where and how this panel runs; read from the environment once, at start-up."""

    home: str = field(default_factory=lambda: os.environ.get("GRPO_PANEL_HOME", os.path.abspath("data")))
    on_space: bool = field(default_factory=lambda: bool(os.environ.get("SPACE_ID")))
    space_owner: str | None = field(default_factory=lambda: os.environ.get("SPACE_AUTHOR_NAME"))
    bucket_mount: str | None = field(default_factory=lambda: os.environ.get("GRPO_PANEL_BUCKET_MOUNT"))
    local_runs: str = field(default_factory=lambda: os.environ.get("GRPO_PANEL_LOCAL_RUNS", "").strip().lower())
    host: str = ""
    auth: tuple[str, str] | None = field(default_factory=lambda: _parse_auth(os.environ.get("GRPO_PANEL_AUTH")))
    allow_host_token: bool = field(default_factory=lambda: _env_flag("GRPO_PANEL_ALLOW_HOST_TOKEN"))
    # A visitor's Hub registry (its log readers, views and caches) is dropped after this long unused, so a
    # long-lived Space does not grow with every visitor and every refreshed OAuth token; it is rebuilt on demand.
    registry_idle_s: float = 3600.0
    # The Hub's dataset viewer API, which previews Hub datasets (huggingface_hub has its URL only as a constant).
    datasets_server: str = field(default_factory=lambda: os.environ.get("GRPO_PANEL_DATASETS_SERVER")
                                 or _hub_constants().DATASETS_SERVER_ENDPOINT)
    # Per reward function call, on the sample completions (GRPO_PANEL_TASK_CHECK_TIMEOUT_S; the tests that wait
    # for a looping reward to time out shorten it).
    task_check_timeout_s: float = field(default_factory=lambda: _positive(
        os.environ.get(TASK_CHECK_TIMEOUT_ENV), DEFAULT_TASK_CHECK_TIMEOUT_S))
    # How old a namespace's list of HF Jobs runs may be (GRPO_PANEL_HUB_LIST_S): one Jobs API call serves every
    # session of the namespace for this long, and a listing the Hub refused or did not answer is asked again after it.
    hub_list_every_s: float = field(default_factory=lambda: _positive(os.environ.get(HUB_LIST_ENV), DEFAULT_HUB_LIST_S))
    # How often this process checks the budget caps of the runs it can reach (0: never; tests call it directly).
    budget_check_s: float = field(default_factory=lambda: float(os.environ.get("GRPO_PANEL_BUDGET_CHECK_S") or 30.0))
    # The largest file a visitor may upload (a dataset), in MB; Gradio refuses a larger one with 413.
    max_upload_mb: float = field(default_factory=lambda: _positive(os.environ.get(MAX_UPLOAD_ENV),
                                                                   DEFAULT_MAX_UPLOAD_MB))
    # What one visitor may keep uploaded at once (files, MB), until Gradio's cache drops it (panel/uploads.py).
    upload_quota_files: int = field(default_factory=lambda: int(_positive(os.environ.get(UPLOAD_QUOTA_FILES_ENV),
                                                                          DEFAULT_UPLOAD_QUOTA_FILES)))
    upload_quota_mb: float = field(default_factory=lambda: _positive(os.environ.get(UPLOAD_QUOTA_MB_ENV),
                                                                     DEFAULT_UPLOAD_QUOTA_MB))

    def __post_init__(self):
        self.host = self.host or _default_host(self.on_space)
        if self.local_runs not in LOCAL_RUNS_CHOICES:
            self.local_runs = "off" if self.on_space else "on"

    @property
    def exposed(self) -> bool:
        """Whether other machines can reach the panel (it listens beyond loopback)."""
        if self.host in LOOPBACK_NAMES:
            return False
        try:
            return not ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return True     # a host name other than localhost: assume it is reachable

    @property
    def serves_others(self) -> bool:
        """Whether people other than this machine's user reach the panel: then no visitor code runs on it (the
        task check runs in the visitor's own job instead)."""
        return self.on_space or self.exposed

    @property
    def lends_host_token(self) -> bool:
        """Whether visitors may act with the host's own Hugging Face token (never on a Space)."""
        if self.on_space:
            return False
        return not self.exposed or self.auth is not None or self.allow_host_token

    def startup_problems(self) -> list[str]:
        """Settings the panel refuses to start with (fail closed: a limit or a protection it cannot honour), each
        with its fix."""
        problems = []
        for name, unit, default in POSITIVE_SETTINGS:
            raw = os.environ.get(name, "").strip()
            if raw and _positive(raw, -1.0) <= 0:
                problems.append(f"{name}={raw!r} is not a positive number of {unit}: set it to one "
                                f"(e.g. {name}={default:g}) or unset it for {default:g} {unit}.")
        if self.serves_others and unsandboxed_allowed():
            where = "a Space" if self.on_space else f"a panel listening on {self.host}"
            problems.append(f"{ALLOW_UNSANDBOXED_ENV}=1 is refused on {where}: visitors' code would run on this "
                            f"machine unconfined. Unset it (and install bubblewrap), or listen on 127.0.0.1 only.")
        return problems

    def startup_notes(self) -> list[str]:
        """What an operator should know at start-up about who can do what."""
        notes = []
        if self.on_space:
            notes.append("Space: visitors sign in with Hugging Face and act with their own token; "
                         f"local runs: {self.local_runs}.")
        elif self.exposed and not self.lends_host_token:
            notes.append(f"Listening on {self.host} without a password: Hugging Face Jobs is OFF for visitors, so "
                         "nobody spends this machine's token. Set GRPO_PANEL_AUTH=user:password (a panel login) or "
                         "GRPO_PANEL_ALLOW_HOST_TOKEN=1 to turn it on.")
        elif self.exposed:
            notes.append(f"Listening on {self.host}: every visitor acts with this machine's Hugging Face token"
                         + (" after the panel login." if self.auth else " (GRPO_PANEL_ALLOW_HOST_TOKEN=1)."))
        return notes


def _positive(value: str | None, default: float) -> float:
    """A positive number from the environment, or `default` (unset, not a number, or not above 0)."""
    try:
        number = float(value) if value else default
    except ValueError:
        return default
    return number if number > 0 else default


def _hub_constants():
    return constants


def _parse_auth(value: str | None) -> tuple[str, str] | None:
    if not value or ":" not in value:
        return None
    user, password = value.split(":", 1)
    return (user, password) if user and password else None


def acting_token(visitor: Visitor, deployment: Deployment) -> str | None:
    """The token to act with for this visitor: their own OAuth token on a Space, else the host's where lent."""
    if deployment.on_space:
        return visitor.token
    if visitor.token:
        return visitor.token
    if not deployment.lends_host_token:
        return None
    return get_token()


def no_token_reason(deployment: Deployment) -> str:
    if deployment.on_space:
        return "Sign in with Hugging Face (button at the top) to see and launch your runs on Hugging Face Jobs."
    if not deployment.lends_host_token:
        return (f"This panel listens on {deployment.host} without a password, so it does not lend this machine's "
                "Hugging Face token to visitors. The operator can set GRPO_PANEL_AUTH=user:password or "
                "GRPO_PANEL_ALLOW_HOST_TOKEN=1.")
    return "No Hugging Face token found: run `hf auth login` or set HF_TOKEN."


def local_runs_problem(visitor: Visitor, deployment: Deployment) -> str | None:
    """Why this visitor may not see or control local runs here, or None if they may."""
    if deployment.local_runs == "off":
        if deployment.on_space:
            return ("Local runs are off on this Space (they would run on the Space's own hardware): choose "
                    "Run on: Hugging Face Jobs (executor 'hf_jobs'). The Space's owner can turn them on with "
                    "GRPO_PANEL_LOCAL_RUNS=owner.")
        return ("Local runs are off on this panel (GRPO_PANEL_LOCAL_RUNS=off): choose Run on: Hugging Face Jobs "
                "(executor 'hf_jobs').")
    if deployment.local_runs == "owner" and deployment.on_space:
        owner = deployment.space_owner or ""
        if not visitor.token:
            return "Sign in with Hugging Face: only this Space's owner may use local runs."
        allowed, _ = can_control(owner, visitor.token, on_space=True)
        if not allowed:
            return (f"Local runs on this Space belong to its owner ({owner}); choose Run on: Hugging Face "
                    "Jobs (executor 'hf_jobs') to run on your own account.")
    return None


def token_lifetime_problem(visitor: Visitor, timeout_s: int, now: float | None = None) -> str | None:
    """Why a run of `timeout_s` would outlive the visitor's token, or None. Its jobs use the token all along
    (the proxy reaches the replicas' exposed ports with it), and an OAuth token cannot be renewed inside a job."""
    if not visitor.expires_at:
        return None
    left = visitor.expires_at - (now or time.time())
    if timeout_s <= left:
        return None
    return (f"your sign-in token expires in {max(left, 0) / 3600:.1f} h but the run's timeout is "
            f"{timeout_s / 3600:.1f} h, and its jobs use the token all along. Sign out and in again for a fresh "
            f"token, or lower the timeout to at most {int(max(left, 0) // 60)} minutes.")
