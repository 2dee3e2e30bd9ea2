from django.db import models


class GpuMetricRollup(models.Model):
    """One minute of a GPU's samples: min/avg/max of each metric (written in batches by the gateway)."""

    gpu = models.ForeignKey("scheduler.Gpu", related_name="rollups", on_delete=models.CASCADE)
    minute = models.DateTimeField(help_text="start of the minute (UTC)")
    samples = models.PositiveIntegerField()
    util_min = models.FloatField(null=True, blank=True)
    util_avg = models.FloatField(null=True, blank=True)
    util_max = models.FloatField(null=True, blank=True)
    mem_used_min = models.FloatField(null=True, blank=True)
    mem_used_avg = models.FloatField(null=True, blank=True)
    mem_used_max = models.FloatField(null=True, blank=True)
    temp_min = models.FloatField(null=True, blank=True)
    temp_avg = models.FloatField(null=True, blank=True)
    temp_max = models.FloatField(null=True, blank=True)
    power_min = models.FloatField(null=True, blank=True)
    power_avg = models.FloatField(null=True, blank=True)
    power_max = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["gpu", "minute"]
        verbose_name, verbose_name_plural = "GPU metrics minute", "GPU metrics per minute"
        constraints = [models.UniqueConstraint(fields=["gpu", "minute"], name="rollup_unique_gpu_minute")]

    def __str__(self) -> str:
        return f"{self.gpu_id} @ {self.minute:%Y-%m-%d %H:%M}"


class GpuMetricLatest(models.Model):
    """The latest sample of a GPU, upserted in batches by the gateway's flusher (one row per GPU).

    A reading the GPU cannot give (NVML has no whole-GPU utilisation in MIG mode) is null."""

    gpu = models.OneToOneField("scheduler.Gpu", primary_key=True, related_name="latest",
                               on_delete=models.CASCADE)
    at = models.DateTimeField()
    util = models.FloatField(null=True, blank=True)
    mem_used_mib = models.FloatField(null=True, blank=True)
    mem_total_mib = models.FloatField(null=True, blank=True)
    temp_c = models.FloatField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)
    sm_clock_mhz = models.FloatField(null=True, blank=True)
    ecc_sbe = models.BigIntegerField(null=True, blank=True)
    ecc_dbe = models.BigIntegerField(null=True, blank=True)

    class Meta:
        verbose_name, verbose_name_plural = "latest GPU metrics", "latest GPU metrics"

    def __str__(self) -> str:
        return f"{self.gpu_id} @ {self.at:%H:%M:%S}"
