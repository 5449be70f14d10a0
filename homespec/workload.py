"""Benchmark workloads: JSONL, one request a line (`task`, `messages`, `max_tokens`, and an
optional `prediction`: the answer as a client expects it, OpenAI's Predicted Outputs)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from homespec.engine.types import Message
from homespec.errors import ConfigError
from homespec.plain_text import bad_text


class _ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: str = Field(pattern="^(system|user|assistant)$")
    content: str


class _Item(BaseModel):
    model_config = ConfigDict(extra="ignore")
    task: str = Field(min_length=1)
    messages: list[_ChatMessage] = Field(min_length=1)
    max_tokens: int = Field(256, ge=1, le=32768)
    prediction: str | None = None


@dataclass(frozen=True)
class WorkItem:
    task: str
    messages: list[Message]
    max_tokens: int
    line: int
    prediction: str | None = None


def default_workload() -> Path:
    return Path(str(resources.files("homespec") / "data" / "workload.jsonl"))


def load_workload(path: Path) -> list[WorkItem]:
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()  # a BOM dropped
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read workload: {exc}", "give a JSONL file") from None
    items = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            problem = bad_text(data, "")
            if problem:  # a "\ud800" escape: tokenizing it raised UnicodeEncodeError mid-bench
                raise ConfigError(f"{path}:{n}: {problem}", "write the line's strings as text")
            item = _Item.model_validate(data)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{path}:{n}: not JSON ({exc.msg})", "one JSON object a line"
            ) from None
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise ConfigError(
                f"{path}:{n}: {loc}: {first['msg']}",
                'each line needs "task", "messages" [{"role","content"}] and "max_tokens"',
            ) from None
        items.append(
            WorkItem(
                task=item.task,
                messages=[Message(m.role, m.content) for m in item.messages],
                max_tokens=item.max_tokens,
                line=n,
                prediction=item.prediction or None,
            )
        )
    if not items:
        raise ConfigError(f"{path}: workload is empty", "add at least one request line")
    return items
