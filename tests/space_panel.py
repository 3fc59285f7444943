"""The panel as a Hugging Face Space (`tests/space_app.py` as a process, as a Space runs `app.py`) against a loopback
fake Hub, for the files that visit it: test_space_browser.py (a browser) and test_space_mcp.py (an MCP client).

Its fixtures are module-scoped: one Space process and one fake Hub serve every test of a file, so they replace the
shared per-test `hub` fixture there. A file imports them by name: `from tests.space_panel import hub, space`.
"""

import os
import re

import pytest

from tests.browser_helpers import ROOT, running_panel
from tests.fakehub import FakeHub, FakeUser

CLIENT_SECRET = "fake-oauth-client-secret"
ALICE = "hf_oauth_aliceSpaceVisitor00000000000"
BOB = "hf_oauth_bobSpaceVisitor0000000000000"
CAROL = "hf_oauth_carolSpaceVisitor000000000000"
DAVE = "hf_" + "oauth_daveSpaceVisitorReadsAcme0000"     # reads the acme org's runs, may change none of them
PLANTED = "hf_" + "PlAnTeDiNaLoGlInEpLaNtEdInAlOgLiN"
UPLOAD_MB = 1       # the Space's GRPO_PANEL_MAX_UPLOAD_MB
UPLOAD_QUOTA = (3, 2.5)     # its GRPO_PANEL_UPLOAD_QUOTA_FILES and GRPO_PANEL_UPLOAD_QUOTA_MB: a visitor's kept uploads
OAUTH_MINUTES = int(re.search(r"^hf_oauth_expiration_minutes: (\d+)$",
                              open(os.path.join(ROOT, "README.md")).read(), re.MULTILINE).group(1))


@pytest.fixture(scope="module")
def hub():
    """The fake Hub of this file's Space (not pointed at from this process: the Space is another process)."""
    with FakeHub(users={ALICE: FakeUser("alice", {"acme": "write"}), BOB: FakeUser("bob", {"acme": "write"}),
                        CAROL: FakeUser("carol"), DAVE: FakeUser("dave", {"acme": "read"})}).start() as fake:
        yield fake


@pytest.fixture(scope="module")
def space(hub, tmp_path_factory):
    """The Space's (url, home)."""
    home = tmp_path_factory.mktemp("space-home")
    env = {"SPACE_ID": "alice/grpo-panel", "SYSTEM": "spaces", "SPACE_AUTHOR_NAME": "alice",
           "OAUTH_CLIENT_ID": "fake-client", "OAUTH_CLIENT_SECRET": CLIENT_SECRET,
           "OAUTH_SCOPES": "openid profile jobs", "OPENID_PROVIDER_URL": hub.url, "HF_ENDPOINT": hub.url,
           "HF_HOME": str(home / "hf-home"), "GRPO_PANEL_DATASETS_SERVER": hub.url, "GRPO_PANEL_BUDGET_CHECK_S": "2",
           "GRPO_PANEL_MAX_UPLOAD_MB": str(UPLOAD_MB), "GRADIO_TEMP_DIR": str(home / "gradio-cache"),
           "GRPO_PANEL_UPLOAD_QUOTA_FILES": str(UPLOAD_QUOTA[0]), "GRPO_PANEL_UPLOAD_QUOTA_MB": str(UPLOAD_QUOTA[1]),
           # As on a real Space, where nobody sets it: the app itself must turn Gradio's analytics off.
           "GRADIO_ANALYTICS_ENABLED": "True"}
    with running_panel("tests/space_app.py", env, home, unset=("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")) as url:
        yield url, home
