"""Keep the GpuModel / GpuProfile tables in step with nodeagent.hardware.gpus (the catalog's source)."""
from __future__ import annotations


def catalog_sync(*, gpu_model_cls=None, gpu_profile_cls=None) -> int:
    """Create or update every catalog model and its MIG profiles; deletes nothing. Returns the model count.

    Takes the model classes so the data migration can pass its historical models.
    """
    from nodeagent.hardware.gpus import GPU_MODELS
    from scheduler.core.perf import gpu_pu, profile_pu

    if gpu_model_cls is None:
        from scheduler.models import GpuModel as gpu_model_cls, GpuProfile as gpu_profile_cls  # noqa: N813
    for spec in GPU_MODELS.values():
        model, _ = gpu_model_cls.objects.update_or_create(key=spec.key, defaults={
            "name": spec.name, "memory_gb": spec.memory_gb, "fp64_tflops": spec.fp64_tflops,
            "fp32_tflops": spec.fp32_tflops, "bf16_tensor_tflops": spec.bf16_tensor_tflops,
            "fp16_tensor_tflops": spec.fp16_tensor_tflops, "memory_bandwidth_gbs": spec.memory_bandwidth_gbs,
            "compute_capability": spec.compute_capability, "tdp_w": spec.tdp_w,
            "mig_memory_slices": spec.mig.memory_slices if spec.mig else None,
            "mig_compute_slices": spec.mig.compute_slices if spec.mig else None,
            "pu": gpu_pu(spec)})
        for p in (spec.mig.profiles if spec.mig else ()):
            gpu_profile_cls.objects.update_or_create(gpu_model=model, name=p.name, defaults={
                "compute_slices": p.compute_slices, "memory_slices": p.memory_slices, "memory_gb": p.memory_gb,
                "starts": list(p.starts), "max_count": p.max_count, "media_extensions": p.media_extensions,
                "nvml_profile": p.nvml_profile, "pu": profile_pu(spec, p)})
    return len(GPU_MODELS)
