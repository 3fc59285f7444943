"""A sweep's shared fleet clears an ended member's adapter versions from its own servers (`MemberAdapters`)."""

import json
import os
import urllib.error
import urllib.request

from ..layout import adapter_member, spec_member
from ..spec_file import read_spec


class MemberAdapters:
    """A sweep's fleet unloads a member's adapter versions (`trl-policy-<member>-v<N>`) from its own servers once that
    member's trainer has ended for good (finished, cancelled, failed with no attempt left, or killed: its heartbeat
    stands still). Nothing else would: the member's proxy, the one that loads and unloads its names, died with its
    trainer (and on HF Jobs a cancelled job's container takes it along at once), and every other member's proxy
    refuses to touch another member's names (proxy_members.py). Left registered, a dead member's versions would stay
    listed and servable until the fleet stops. (vLLM 0.32's unload drops the name from the server's table only: the
    engine's adapter cache, `--max-loras`/`--max-cpu-loras`, gives an adapter's place to the next one loaded by LRU
    either way.) A server that did not answer is tried again at the next poll; one that refuses the connection is not
    up, and holds nothing."""

    def __init__(self, urls: list[str], key: str | None = None, timeout_s: float = 30.0):
        self.urls = urls
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout_s = timeout_s
        self.pending: dict[str, set[str]] = {}     # member tag -> the servers still to clear of its versions
        self.said: set[tuple[str, str]] = set()      # (member, server) whose failure the log has: said once

    def member_ended(self, run_dir: str) -> None:
        try:
            tag = spec_member(read_spec(run_dir))
        except (OSError, ValueError) as error:
            tag, why = "", f"its spec.json cannot be read ({error})"
        else:
            why = "its spec.json names no sweep member"
        if not tag:
            print(f"{os.path.basename(run_dir.rstrip('/'))}: {why}: its adapter versions stay loaded", flush=True)
            return
        self.pending[tag] = set(self.urls)
        self.retry()

    def retry(self) -> None:
        """Clear every ended member's versions from the servers not yet cleared of them."""
        for tag, urls in list(self.pending.items()):
            for url in sorted(urls):
                try:
                    names = self._unload(url, tag)
                except (OSError, ValueError, KeyError, TypeError) as error:
                    refused = isinstance(getattr(error, "reason", None), ConnectionRefusedError)
                    if not refused:
                        if (tag, url) not in self.said:
                            self.said.add((tag, url))
                            print(f"{tag}: could not unload its adapter versions from {url} ({error}): trying "
                                  "again at each poll", flush=True)
                        continue
                    names = []
                urls.discard(url)
                if names:
                    print(f"{tag}: unloaded {', '.join(names)} from {url}", flush=True)
            if not urls:
                del self.pending[tag]

    def _unload(self, url: str, tag: str) -> list[str]:
        """Unload member `tag`'s versions from the server at `url`; their names (a 404: already gone, as wanted)."""
        with urllib.request.urlopen(urllib.request.Request(f"{url}/v1/models", headers=self.headers),
                                    timeout=self.timeout_s) as answer:
            served = [m["id"] for m in json.load(answer)["data"]]
        names = sorted(name for name in served if adapter_member(name) == tag)
        for name in names:
            request = urllib.request.Request(f"{url}/v1/unload_lora_adapter", method="POST",
                                             data=json.dumps({"lora_name": name}).encode(),
                                             headers={**self.headers, "Content-Type": "application/json"})
            try:
                urllib.request.urlopen(request, timeout=self.timeout_s).close()
            except urllib.error.HTTPError as error:
                if error.code != 404:
                    raise
        return names
