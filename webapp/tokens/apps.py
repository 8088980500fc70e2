from django.apps import AppConfig


class TokensConfig(AppConfig):
    name = "webapp.tokens"
    label = "tokens"
