"""Bad input, naming the field: the one exception every service raises for it (no Django import,
so any layer may raise or catch it). The API answers it through
`webapp.api.errors.exception_handler` as `{"errors": [{"field": ..., "error": ...}]}` with
`status`; pages and commands show `field: message`."""

from __future__ import annotations

MAX_ERRORS = 50  # enough to fix a batch; more only floods the client


class FieldError(ValueError):
    """`errors` is a list of {"field": "groups[0].rollouts[2].rewards.x", "error": "..."}; `field`
    and `message` are the first one's."""

    status = 400

    def __init__(self, field_name: str, message: str) -> None:
        self.errors = [{"field": field_name, "error": message}]
        super().__init__(f"{field_name}: {message}")

    @classmethod
    def of(cls, errors: list[dict[str, str]]) -> FieldError:
        """Several problems at once (a batch checked whole), at most MAX_ERRORS of them."""
        first = errors[0] if errors else {"field": "", "error": "invalid"}
        e = cls(first["field"], first["error"])
        e.errors = errors[:MAX_ERRORS] or e.errors
        return e

    @property
    def field(self) -> str:
        return self.errors[0]["field"]

    @property
    def message(self) -> str:
        return self.errors[0]["error"]


class Conflict(FieldError):
    """The input is well formed but clashes with what is stored (a 409): a run name several runs
    share, a replay with no results yet."""

    status = 409
