"""The first rows of a Hub dataset, through the Hub's dataset viewer API (datasets-server), without downloading it.

    GET {base}/splits?dataset=ID                                   -> {"splits": [{dataset, config, split}], ...}
    GET {base}/rows?dataset=ID&config=C&split=S&offset=0&length=N  -> {"features", "rows": [{row_idx, row}], ...}

huggingface_hub keeps the base URL in `constants.DATASETS_SERVER_ENDPOINT` (not configurable by environment),
so the panel takes it as a setting with that default. Every failure becomes `DatasetUnreadable` with a reason
a user can act on; the token is sent as a bearer header and never appears in a message.
"""

from dataclasses import dataclass

from huggingface_hub.utils import get_session

MAX_LENGTH = 100   # the API refuses a longer slice
TIMEOUT_S = 20.0


class DatasetUnreadable(Exception):
    """The dataset viewer could not give rows of this dataset; str() says why."""


@dataclass(frozen=True)
class ViewerRows:
    config: str
    split: str
    columns: list[str]
    rows: list[dict]
    num_rows_total: int | None


def _get(base: str, path: str, params: dict, token: str | None) -> dict:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = get_session().get(f"{base.rstrip('/')}/{path}", params=params, headers=headers, timeout=TIMEOUT_S)
    except Exception as exc:
        raise DatasetUnreadable(f"the dataset viewer at {base} cannot be reached ({type(exc).__name__})") from exc
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code in (401, 404) and "not accessible" in str(body.get("error", "")):
        raise DatasetUnreadable(f"{params['dataset']!r} does not exist, or your token cannot read it "
                                "(private or gated: accept its conditions on the Hub)")
    if response.status_code != 200:
        reason = body.get("error") or response.text[:200] or f"HTTP {response.status_code}"
        raise DatasetUnreadable(f"the dataset viewer cannot read {params['dataset']!r}: {reason}")
    return body


def resolve_config(base: str, dataset: str, config: str, split: str, token: str | None) -> str:
    """The config to read `split` from: the one given (checked), or the first that has that split."""
    listed = _get(base, "splits", {"dataset": dataset}, token).get("splits", [])
    configs = list(dict.fromkeys(s["config"] for s in listed))
    if config and config not in configs:
        raise DatasetUnreadable(f"{dataset!r} has no config {config!r}; its configs are {', '.join(configs)}")
    candidates = [s["config"] for s in listed if s["split"] == split and (not config or s["config"] == config)]
    if not candidates:
        splits = sorted({s["split"] for s in listed if not config or s["config"] == config})
        raise DatasetUnreadable(f"{dataset!r} has no split {split!r}" + (f" in config {config!r}" if config else "")
                                + f"; its splits are {', '.join(splits) or 'none yet (the viewer may still be busy)'}")
    return "default" if "default" in candidates else candidates[0]


def first_rows(base: str, dataset: str, config: str, split: str, length: int, token: str | None) -> ViewerRows:
    """The first `length` rows (at most 100) of a split, the column names and the split's size."""
    config = resolve_config(base, dataset, config, split, token)
    params = {"dataset": dataset, "config": config, "split": split, "offset": 0, "length": min(length, MAX_LENGTH)}
    body = _get(base, "rows", params, token)
    columns = [f["name"] for f in body.get("features", [])]
    return ViewerRows(config, split, columns, [r["row"] for r in body.get("rows", [])], body.get("num_rows_total"))
