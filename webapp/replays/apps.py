from django.apps import AppConfig


class ReplaysConfig(AppConfig):
    name = "webapp.replays"
    label = "replays"

    def ready(self) -> None:
        from webapp.explorer.filters import register
        from webapp.replays.explorer import ReplayFilter

        register(ReplayFilter())  # sort and filter the explorer by a replay's values
