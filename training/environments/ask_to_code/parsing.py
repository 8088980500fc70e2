"""Reading an ask-to-code transcript: the agent's turns, the code of a submission, whether a
question touches the task's omitted detail, and the task a prompt names."""

from __future__ import annotations

import re
from typing import Any

from ..base import Prompt
from .tasks import TASKS_BY_KEY, Task

_CODE_RE = re.compile(r"```(python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(message: str) -> str | None:
    """The code of a submission, or None when the message is a question. A ```python (or ```py)
    block is code, even unclosed (a truncated generation); a bare ``` block only when it
    defines a function."""
    for lang, body in _CODE_RE.findall(message or ""):
        if lang or re.search(r"^\s*def\s", body, re.MULTILINE):
            return body.strip() + "\n"
    return None


def message_text(message: Any) -> str:
    content = message.get("content", "") if isinstance(message, dict) else message
    if isinstance(content, list):  # multimodal-style content parts
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return content if isinstance(content, str) else str(content or "")


def agent_turns(transcript: Any) -> list[str]:
    """The agent's messages in order. Accepts a full transcript, a TRL conversational completion (a
    list of assistant messages) or a bare string (one turn)."""
    if isinstance(transcript, str):
        return [transcript]
    out = []
    for m in transcript or []:
        if isinstance(m, dict) and m.get("role") == "assistant":
            calls = m.get("tool_calls") or []
            code = next(
                (
                    c.get("arguments", {}).get("code")
                    for c in calls
                    if c.get("name") == "submit_code"
                ),
                None,
            )
            # A submit_code call without a fence in the content still counts as code.
            text = message_text(m)
            out.append(text if code is None or extract_code(text) else f"```python\n{code}\n```")
    return out


def is_relevant(task: Task, question: str) -> bool:
    """Does the question touch the omitted detail? Topics match at a word start (prefix), so
    'round' matches 'rounding'; topics of one or two characters must match a whole word."""
    q = question.lower()
    for topic in task.topics:
        tail = r"(?![a-z0-9])" if len(topic) <= 2 else ""
        if re.search(r"(?<![a-z0-9])" + re.escape(topic) + tail, q):
            return True
    return False


def _task(prompt: Prompt) -> Task | None:
    return TASKS_BY_KEY.get(prompt.spec.get("task", ""))
