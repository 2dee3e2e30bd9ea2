"""The hardware catalog: GPU models and their MIG profiles, seeded from nodeagent.hardware.gpus."""
from django.db import models

from nodeagent.hardware import gpus as core_gpus
from nodeagent.hardware import mig as core_mig


class GpuModel(models.Model):
    key = models.SlugField(max_length=40, unique=True, help_text="stable slug, e.g. h100-80gb")
    name = models.CharField(max_length=60)
    memory_gb = models.FloatField()
    fp64_tflops = models.FloatField()
    fp32_tflops = models.FloatField()
    bf16_tensor_tflops = models.FloatField(help_text="dense; 0 where the GPU has no BF16 tensor cores")
    fp16_tensor_tflops = models.FloatField(help_text="dense")
    memory_bandwidth_gbs = models.FloatField()
    compute_capability = models.CharField(max_length=8)
    tdp_w = models.PositiveIntegerField()
    mig_memory_slices = models.PositiveSmallIntegerField(null=True, blank=True)
    mig_compute_slices = models.PositiveSmallIntegerField(null=True, blank=True)
    pu = models.FloatField(help_text="performance units of the whole GPU (docs/performance-units.md)")

    class Meta:
        ordering = ["key"]
        verbose_name, verbose_name_plural = "GPU model", "GPU models"
        constraints = [models.CheckConstraint(condition=models.Q(memory_gb__gt=0), name="gpumodel_memory_positive")]

    def __str__(self) -> str:
        return self.name

    @property
    def mig_capable(self) -> bool:
        return self.mig_memory_slices is not None

    @property
    def spec(self) -> core_gpus.GpuModelSpec:
        return core_gpus.model_for(self.key)

    def geometry(self) -> core_mig.MigGeometry | None:
        """The catalog's geometry for this model (the reference; a GPU plans with what its agent reported)."""
        if not self.mig_capable:
            return None
        return core_mig.MigGeometry(
            memory_slices=self.mig_memory_slices, compute_slices=self.mig_compute_slices,
            profiles=tuple(p.as_core() for p in self.profiles.all()))


class GpuProfile(models.Model):
    """A MIG profile of a model (NVIDIA MIG user guide): size in memory slices, legal starts, max count."""

    gpu_model = models.ForeignKey(GpuModel, related_name="profiles", on_delete=models.CASCADE)
    name = models.CharField(max_length=30)
    compute_slices = models.PositiveSmallIntegerField()
    memory_slices = models.PositiveSmallIntegerField()
    memory_gb = models.FloatField()
    starts = models.JSONField(help_text="legal start memory slices")
    max_count = models.PositiveSmallIntegerField()
    media_extensions = models.BooleanField(default=False)
    nvml_profile = models.PositiveSmallIntegerField(null=True, blank=True)
    pu = models.FloatField()

    class Meta:
        ordering = ["gpu_model", "memory_slices", "compute_slices", "name"]
        verbose_name, verbose_name_plural = "MIG profile", "MIG profiles"
        constraints = [models.UniqueConstraint(fields=["gpu_model", "name"], name="gpuprofile_unique_name")]

    def __str__(self) -> str:
        return f"{self.gpu_model.name} {self.name}"

    def as_core(self) -> core_mig.MigProfile:
        return core_mig.MigProfile(self.name, self.compute_slices, self.memory_slices, self.memory_gb,
                                   tuple(self.starts), self.max_count, self.media_extensions, self.nvml_profile)
