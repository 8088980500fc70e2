from django.apps import AppConfig


class DiagnosticsConfig(AppConfig):
    name = "webapp.diagnostics"
    label = "diagnostics"
