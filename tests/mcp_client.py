"""A real MCP client (the `mcp` SDK over streamable HTTP) for the tests that call the panel's MCP tools."""

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from panel.mcp_tools import MCP_PATH

HELLO = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "tests", "version": "0"}}}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def mcp_session(url: str, calls: list[tuple[str, dict]], headers: dict | None = None) -> list:
    """One MCP session on the panel at `url`: `initialize`, then each (tool, arguments) in order ("tools/list"
    lists the tools' names). Returns each answer: the tool's JSON, or {"error": text} for a tool error."""
    async def run() -> list:
        async with (httpx2.AsyncClient(headers=headers or {}, timeout=180) as http,
                    streamable_http_client(f"{url}{MCP_PATH}/", http_client=http) as streams,
                    ClientSession(streams[0], streams[1]) as mcp):
            await mcp.initialize()
            answers = []
            for name, arguments in calls:
                if name == "tools/list":
                    answers.append([tool.name for tool in (await mcp.list_tools()).tools])
                    continue
                result = await mcp.call_tool(name, arguments)
                text = "".join(part.text for part in result.content)
                answers.append({"error": text} if result.is_error else json.loads(text))
            return answers
    # A thread of its own: a test driving a browser with Playwright's sync API already runs an event loop here.
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(lambda: asyncio.run(run())).result()


def initialize_status(url: str, host: str | None = None) -> int:
    """The HTTP status of a bare MCP `initialize`, sent with `host` as its Host header if given."""
    headers = {**ACCEPT, **({"Host": host} if host else {})}
    return httpx2.post(f"{url}{MCP_PATH}/", json=HELLO, headers=headers, timeout=30).status_code
