from django.apps import AppConfig


class RolloutsConfig(AppConfig):
    name = "webapp.rollouts"
    label = "rollouts"
