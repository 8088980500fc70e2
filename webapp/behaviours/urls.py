from django.urls import path

from webapp.behaviours import views

urlpatterns = [
    path("", views.behaviour_list, name="behaviours-list"),
    path("<int:behaviour_id>/", views.behaviour_detail, name="behaviours-detail"),
    path("<int:behaviour_id>/limit/", views.behaviour_limit, name="behaviours-limit"),
    path("runs/<int:run_id>/panel/", views.run_panel, name="behaviours-panel"),
    path("runs/<int:run_id>/series.json", views.run_series, name="behaviours-series"),
    path("runs/<int:run_id>/new/", views.behaviour_new, name="behaviours-new"),
    path("runs/<int:run_id>/like/", views.find_like, name="behaviours-like"),
    path("replays/<int:replay_id>/", views.replay_effects, name="behaviours-replay"),
]
