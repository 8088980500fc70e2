from django.apps import AppConfig


class AnnotationsConfig(AppConfig):
    name = "webapp.annotations"
    label = "annotations"
