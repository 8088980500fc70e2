from django.urls import path

from webapp.annotations import views

urlpatterns = [
    path("", views.home, name="annotations-home"),
    path("rollout/<int:rollout_id>/", views.rollout_page, name="annotations-rollout"),
    path("rollout/<int:rollout_id>/slot/", views.rollout_slot, name="annotations-slot"),
    path("rollout/<int:rollout_id>/annotate/", views.annotate, name="annotations-annotate"),
    path("<int:annotation_id>/delete/", views.delete, name="annotations-delete"),
    path("queues/new/", views.queue_new, name="annotations-queue-new"),
    path("queues/<int:queue_id>/", views.queue_detail, name="annotations-queue"),
    path("queues/<int:queue_id>/assign/", views.queue_assign, name="annotations-queue-assign"),
    path("queues/<int:queue_id>/agreement/", views.queue_agreement, name="annotations-agreement"),
    path("queues/<int:queue_id>/focus/", views.focus_next, name="annotations-focus-next"),
    path("queues/<int:queue_id>/focus/<int:position>/", views.focus, name="annotations-focus"),
    path(
        "queues/<int:queue_id>/focus/<int:position>/save/",
        views.focus_save,
        name="annotations-focus-save",
    ),
    path(
        "queues/<int:queue_id>/focus/<int:position>/skip/",
        views.focus_skip,
        name="annotations-focus-skip",
    ),
    path("labels/", views.labels, name="annotations-labels"),
    path("labels/new/", views.label_edit, name="annotations-label-new"),
    path("labels/<int:label_id>/edit/", views.label_edit, name="annotations-label-edit"),
    path("activity/", views.activity, name="annotations-activity"),
    path("datasets/", views.datasets, name="annotations-datasets"),
    path("datasets/export/", views.export_view, name="annotations-export"),
    path("datasets/<int:dataset_id>/", views.dataset_detail, name="annotations-dataset"),
    path(
        "datasets/<int:dataset_id>/download.jsonl",
        views.dataset_download,
        name="annotations-dataset-download",
    ),
    path(
        "datasets/<int:dataset_id>/launch/", views.dataset_launch, name="annotations-dataset-launch"
    ),
]
