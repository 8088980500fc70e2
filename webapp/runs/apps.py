from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "webapp.runs"
    label = "runs"

    def ready(self) -> None:
        from webapp.runs import signals  # noqa: F401  # deleting a run fails its queued children
