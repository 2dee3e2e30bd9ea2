from django.urls import path

from . import views

app_name = "console"

urlpatterns = [
    path("", views.home, name="home"),
    path("nodes/", views.nodes, name="nodes"),
    path("nodes/register/", views.node_register, name="node-register"),
    path("nodes/<uuid:node_id>/", views.node_detail, name="node"),
    path("nodes/<uuid:node_id>/gpus/", views.node_gpus_fragment, name="node-gpus"),
]
