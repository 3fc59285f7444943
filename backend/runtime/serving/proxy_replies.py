"""The proxy's own answers: an error shaped as vLLM's, and the combined answer of a broadcast to every replica."""

from aiohttp import web

from .replicas import Replica, Reply


def error_response(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


def content_type_of(text: str) -> str:
    return "application/json" if text[:1] in "{[" else "text/plain"


def combined_response(replies: dict[Replica, Reply], ok_body: dict) -> web.Response:
    failed = [rep for rep in replies.values() if rep.status != 200]
    if failed:
        return web.Response(status=failed[0].status, text=failed[0].text, content_type=content_type_of(failed[0].text))
    if not replies:
        return error_response(503, "no healthy vLLM replica")
    return web.json_response(ok_body)
