from django.apps import AppConfig


class BehavioursConfig(AppConfig):
    name = "webapp.behaviours"
    label = "behaviours"
