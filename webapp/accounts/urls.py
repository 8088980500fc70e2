from django.contrib.auth import views as auth_views
from django.urls import path

from webapp.accounts import views

urlpatterns = [
    path("login/", views.LoginView.as_view(), name="accounts-login"),
    path("logout/", auth_views.LogoutView.as_view(), name="accounts-logout"),
]
