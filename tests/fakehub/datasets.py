"""The dataset viewer API (datasets-server: `/splits`, `/rows`), answered from `datasets` with the JSON shapes of its
OpenAPI description, and a public stand-in for "trl-lib/DeepMath-103K"."""

from dataclasses import dataclass, field
from typing import Any

from tests.fakehub.common import FakeUser, Reply

VIEWER_PATHS = ("/splits", "/rows")


VIEWER_NOT_ACCESSIBLE = ("The dataset does not exist, or is not accessible without authentication (private or gated). "
                         "Please check the spelling of the dataset name or retry with authentication.")


VIEWER_MAX_LENGTH = 100


DEEPMATH_STAND_IN = [
    {"prompt": [{"role": "user", "content": "What is the remainder when $2^{10}$ is divided by 7?"}], "solution": "2"},
    {"prompt": [{"role": "user", "content": "Compute $\\int_0^1 2x\\,dx$."}], "solution": "1"},
    {"prompt": [{"role": "user", "content": "How many positive divisors does 36 have?"}], "solution": "9"},
    # More rows, so that the math presets' 64 held-out rows leave some to train on, as on the real DeepMath.
    *({"prompt": [{"role": "user", "content": f"What is {n} + {n}?"}], "solution": str(2 * n)} for n in range(4, 81)),
]


@dataclass
class FakeDataset:
    id: str
    private: bool
    splits: dict[tuple[str, str], list[dict]] = field(default_factory=dict)   # (config, split) -> rows


class DatasetsMixin:
    """The Hub's datasets as the viewer serves them."""

    def _init_datasets(self) -> None:
        deepmath = FakeDataset("trl-lib/DeepMath-103K", False, {("default", "train"): DEEPMATH_STAND_IN})
        self.datasets: dict[str, FakeDataset] = {deepmath.id: deepmath}

    def put_dataset(self, dataset_id: str, rows: list[dict], config: str = "default", split: str = "train",
                    private: bool = False) -> None:
        """Serve `rows` as one split of a dataset through the dataset viewer API (adds to an existing dataset)."""
        with self._cond:
            found = self.datasets.setdefault(dataset_id, FakeDataset(dataset_id, private))
            found.private = private
            found.splits[(config, split)] = [dict(r) for r in rows]

    def viewer(self, path: str, query: dict[str, list[str]], user: FakeUser | None) -> Reply:
        """One dataset viewer call (`/splits` or `/rows`); `user` is None for an anonymous or unknown token."""
        dataset = (query.get("dataset") or [""])[0]
        if not dataset:
            return _viewer_error(422, "Parameter 'dataset' is required", "MissingRequiredParameter")
        with self._cond:
            found = self.datasets.get(dataset)
            if found is None or (found.private and (user is None or not self._may_read(user, dataset.split("/")[0]))):
                if user is None:
                    return _viewer_error(401, VIEWER_NOT_ACCESSIBLE, "ExternalUnauthenticatedError")
                return _viewer_error(404, VIEWER_NOT_ACCESSIBLE, "ExternalAuthenticatedError")
            if path == "/splits":
                splits = [{"dataset": dataset, "config": c, "split": sp} for c, sp in found.splits]
                return Reply(200, {"splits": splits, "pending": [], "failed": []})
            return _viewer_rows(found, query)


def _viewer_error(status: int, message: str, code: str) -> Reply:
    return Reply(status, {"error": message}, {"X-Error-Code": code})


def _viewer_rows(found: FakeDataset, query: dict[str, list[str]]) -> Reply:
    for name in ("config", "split"):
        if not (query.get(name) or [""])[0]:
            return _viewer_error(422, f"Parameter '{name}' is required", "MissingRequiredParameter")
    numbers = {}
    for name, default in (("offset", 0), ("length", VIEWER_MAX_LENGTH)):
        raw = (query.get(name) or [str(default)])[0]
        if not raw.lstrip("-").isdigit():
            return _viewer_error(422, f"Parameter '{name}' must be integer", "InvalidParameter")
        numbers[name] = int(raw)
        if numbers[name] < 0:
            return _viewer_error(422, f"Parameter '{name}' must be positive", "InvalidParameter")
    if numbers["length"] > VIEWER_MAX_LENGTH:
        return _viewer_error(422, f"Parameter 'length' must not be greater than {VIEWER_MAX_LENGTH}",
                             "InvalidParameter")
    rows = found.splits.get((query["config"][0], query["split"][0]))
    if rows is None:
        return _viewer_error(404, "Not found.", "ResponseNotFound")
    start, page = numbers["offset"], rows[numbers["offset"]:numbers["offset"] + numbers["length"]]
    columns = list(dict.fromkeys(k for r in rows for k in r))
    features = [{"feature_idx": i, "name": c, "type": _feature_type(next((r[c] for r in rows if c in r), None))}
                for i, c in enumerate(columns)]
    return Reply(200, {"features": features,
                       "rows": [{"row_idx": start + i, "row": r, "truncated_cells": []} for i, r in enumerate(page)],
                       "num_rows_total": len(rows), "num_rows_per_page": VIEWER_MAX_LENGTH, "partial": False})


def _feature_type(value: Any) -> dict[str, Any]:
    """A column's type as the viewer describes it (the `datasets` Features JSON)."""
    if isinstance(value, list):
        inner = _feature_type(value[0]) if value else {"dtype": "string", "_type": "Value"}
        if value and isinstance(value[0], dict):
            inner = {k: _feature_type(v) for k, v in value[0].items()}
        return {"feature": inner, "_type": "List"}
    if isinstance(value, dict):
        return {k: _feature_type(v) for k, v in value.items()}
    dtype = {bool: "bool", int: "int64", float: "float64", str: "string"}.get(type(value), "null")
    return {"dtype": dtype, "_type": "Value"}
