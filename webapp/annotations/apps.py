from django.apps import AppConfig


class AnnotationsConfig(AppConfig):
    name = "webapp.annotations"
    label = "annotations"

    def ready(self) -> None:
        from webapp.annotations.explorer import AnnotatedFilter, LabelFilter
        from webapp.explorer.filters import register

        register(LabelFilter())  # the explorer's label= and annotated= filters
        register(AnnotatedFilter())
