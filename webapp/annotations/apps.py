from django.apps import AppConfig


class AnnotationsConfig(AppConfig):
    name = "webapp.annotations"
    label = "annotations"

    def ready(self) -> None:
        from webapp.annotations.services import explorer_filter
        from webapp.rollouts.queries import ANNOTATION_FILTER_HOOK

        if explorer_filter not in ANNOTATION_FILTER_HOOK:  # ready() may run twice (tests, autoreload)
            ANNOTATION_FILTER_HOOK.append(explorer_filter)
