"""Listing query parameters, as RabbitMQ's API takes them: filter, sort, columns, pagination.

    ?name=ab                 items whose name contains "ab"
    ?name=^ab&use_regex=true items whose name matches the regular expression
    ?sort=messages&sort_reverse=true
    ?columns=name,messages   only these fields (dotted paths reach into objects)
    ?page=2&page_size=100    one page: {"items", "page", "page_count", "page_size",
                             "filtered_count", "item_count", "total_count"}

A listing without `page` is the whole (filtered) list. `page_size` is at most 500.
"""

from __future__ import annotations

import math
import re
from typing import Any

from aiohttp import web

from hutch.control.errors import bad_request

PAGE_SIZE_MAX = 500
PAGE_SIZE_DEFAULT = 100


def int_param(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise bad_request(f"{name} must be an integer, got {raw!r}") from None


def _get_path(item: dict[str, Any], path: str) -> Any:
    cur: Any = item
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def _sort_key(v: Any) -> tuple:
    if v is None:
        return (0, 0)
    if isinstance(v, bool):
        return (1, int(v))
    if isinstance(v, (int, float)):
        return (1, v)
    return (2, str(v))


def _select_columns(item: dict[str, Any], columns: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for col in columns:
        parts = col.split(".")
        v = _get_path(item, col)
        if v is None and not _has_path(item, parts):
            continue
        cur = out
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = v
    return out


def _has_path(item: dict[str, Any], parts: list[str]) -> bool:
    cur: Any = item
    for p in parts:
        if not isinstance(cur, dict) or p not in cur:
            return False
        cur = cur[p]
    return True


def respond(request: web.Request, items: list[dict[str, Any]]) -> web.Response:
    """Apply the listing parameters of `request` to `items` and answer with JSON."""
    total = len(items)
    name = request.query.get("name")
    if name:
        if request.query.get("use_regex", "false").lower() == "true":
            try:
                rx = re.compile(name)
            except re.error as e:
                raise bad_request(f"invalid regular expression {name!r}: {e}") from None
            items = [i for i in items if rx.search(str(i.get("name", "")))]
        else:
            items = [i for i in items if name in str(i.get("name", ""))]
    sort = request.query.get("sort")
    reverse = request.query.get("sort_reverse", "false").lower() == "true"
    if sort:
        items = sorted(items, key=lambda i: _sort_key(_get_path(i, sort)), reverse=reverse)
    elif reverse:
        items = list(reversed(items))
    columns = [c for c in request.query.get("columns", "").split(",") if c]
    if columns:
        items = [_select_columns(i, columns) for i in items]
    if "page" not in request.query:
        return web.json_response(items)
    page = int_param(request, "page", 1)
    page_size = int_param(request, "page_size", PAGE_SIZE_DEFAULT)
    if page < 1:
        raise bad_request("page must be a positive integer")
    if not 1 <= page_size <= PAGE_SIZE_MAX:
        raise bad_request(f"page_size must be between 1 and {PAGE_SIZE_MAX}")
    filtered = len(items)
    page_count = math.ceil(filtered / page_size)
    if page_count and page > page_count:
        raise bad_request("page out of range")
    chunk = items[(page - 1) * page_size: page * page_size]
    return web.json_response({"filtered_count": filtered, "item_count": len(chunk), "items": chunk, "page": page,
                              "page_count": page_count, "page_size": page_size, "total_count": total})
