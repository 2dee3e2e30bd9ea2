"""Seed the GPU catalog from scheduler.core.gpus (every model of DESIGN.md §4 with its MIG geometry).

Re-running (or a later data migration) updates figures in place; nothing is deleted, so GPUs keep their model.
"""
from django.db import migrations


def seed(apps, schema_editor):
    from scheduler.core.gpus import GPU_MODELS
    from scheduler.core.perf import gpu_pu, profile_pu

    GpuModel = apps.get_model("scheduler", "GpuModel")
    GpuProfile = apps.get_model("scheduler", "GpuProfile")
    for spec in GPU_MODELS.values():
        model, _ = GpuModel.objects.update_or_create(key=spec.key, defaults={
            "name": spec.name, "memory_gb": spec.memory_gb, "fp64_tflops": spec.fp64_tflops,
            "fp32_tflops": spec.fp32_tflops, "bf16_tensor_tflops": spec.bf16_tensor_tflops,
            "fp16_tensor_tflops": spec.fp16_tensor_tflops, "memory_bandwidth_gbs": spec.memory_bandwidth_gbs,
            "compute_capability": spec.compute_capability, "tdp_w": spec.tdp_w,
            "mig_memory_slices": spec.mig.memory_slices if spec.mig else None,
            "mig_compute_slices": spec.mig.compute_slices if spec.mig else None,
            "pu": gpu_pu(spec)})
        for p in (spec.mig.profiles if spec.mig else ()):
            GpuProfile.objects.update_or_create(gpu_model=model, name=p.name, defaults={
                "compute_slices": p.compute_slices, "memory_slices": p.memory_slices, "memory_gb": p.memory_gb,
                "starts": list(p.starts), "max_count": p.max_count, "media_extensions": p.media_extensions,
                "nvml_profile": p.nvml_profile, "pu": profile_pu(spec, p)})


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0001_initial")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
