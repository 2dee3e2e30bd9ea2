from django.urls import path

from . import views

app_name = "console"

urlpatterns = [
    path("", views.home, name="home"),
    # provider
    path("nodes/", views.nodes, name="nodes"),
    path("nodes/register/", views.node_register, name="node-register"),
    path("nodes/<uuid:node_id>/", views.node_detail, name="node"),
    path("nodes/<uuid:node_id>/gpus/", views.node_gpus_fragment, name="node-gpus"),
    path("nodes/<uuid:node_id>/gpus/<int:gpu_id>/health/", views.gpu_health, name="gpu-health"),
    path("nodes/<uuid:node_id>/drain/", views.node_drain, name="node-drain"),
    # account
    path("account/", views.account, name="account"),
    path("account/keys/", views.api_key_create, name="api-key-create"),
    path("account/keys/<uuid:key_id>/revoke/", views.api_key_revoke, name="api-key-revoke"),
    path("account/projects/", views.project_create, name="project-create"),
    path("account/projects/<int:project_id>/delete/", views.project_delete, name="project-delete"),
]
