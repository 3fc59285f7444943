"""The MCP tools are registered in one place (`@tool` methods of `panel/mcp_tools.PanelTools`): the server serves
exactly those, each with its method's arguments, and docs/mcp.md documents exactly those."""

import asyncio
import inspect
import os
import re

import pytest

from panel.mcp_tools import TOOLS, PanelTools, build_server

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_server_serves_every_registered_tool_with_its_methods_arguments():
    served = {t.name: t for t in asyncio.run(build_server(panel=None).list_tools())}
    assert list(served) == list(TOOLS) and len(TOOLS) >= 6
    for name, method in TOOLS.items():
        assert getattr(PanelTools, name) is method
        arguments = [p for p in inspect.signature(method).parameters if p not in ("self", "ctx")]
        assert sorted(served[name].input_schema["properties"]) == sorted(arguments), name
        assert served[name].description.startswith(method.__doc__.split("\n")[0])


def test_the_docs_table_lists_exactly_the_registered_tools():
    with open(os.path.join(ROOT, "docs", "mcp.md"), encoding="utf-8") as f:
        text = f.read()
    table = text[text.index("| tool | arguments | answers |"):].split("\n\n")[0]
    documented = re.findall(r"^\| `(\w+)` \|", table, flags=re.MULTILINE)
    assert documented == list(TOOLS)
