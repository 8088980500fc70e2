from django.apps import AppConfig


class AnnotationsConfig(AppConfig):
    name = "webapp.annotations"
    label = "annotations"

    def ready(self) -> None:
        from webapp.annotations.services import explorer_filter
        from webapp.rollouts.queries import ANNOTATION_FILTER_HOOK

        if explorer_filter not in ANNOTATION_FILTER_HOOK:  # ready() may run twice (tests, autoreload)
            ANNOTATION_FILTER_HOOK.append(explorer_filter)

        # The diagnostics detector "reward rises but annotated quality does not" reads bad cases here.
        from webapp.annotations.services import annotated_rollout_ids, bad_case_rollout_ids
        from webapp.diagnostics import services as diagnostics

        if bad_case_rollout_ids not in diagnostics.BAD_CASE_PROVIDERS:
            diagnostics.BAD_CASE_PROVIDERS.append(bad_case_rollout_ids)
            diagnostics.ANNOTATED_PROVIDERS.append(annotated_rollout_ids)
