from django.urls import path

from webapp.runs import views

urlpatterns = [
    path("", views.runs_list, name="runs-list"),
]
