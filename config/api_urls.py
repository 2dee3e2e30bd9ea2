"""/api/v1/: the fleet and market resources, one router."""
from rest_framework.routers import DefaultRouter

from scheduler.api import GpuViewSet, NodeViewSet, SliceViewSet

router = DefaultRouter()
router.register("nodes", NodeViewSet, basename="node")
router.register("gpus", GpuViewSet, basename="gpu")
router.register("slices", SliceViewSet, basename="slice")

urlpatterns = router.urls
