"""The operator's first templates (the admin edits them): Ubuntu with SSH, PyTorch with SSH, Jupyter, and an
OpenAI-compatible inference server. The SSH ones install and start OpenSSH at boot (the provider's server reaches
the package mirrors; the agent writes the buyer's keys to /root/.ssh/authorized_keys before the container starts).
"""
from django.db import migrations

SSHD = ("if ! command -v sshd >/dev/null; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install "
        "-y -qq openssh-server >/dev/null; fi; mkdir -p /run/sshd && exec /usr/sbin/sshd -D -e "
        "-o PasswordAuthentication=no -o PermitRootLogin=prohibit-password")

TEMPLATES = [
    {"key": "ubuntu-ssh", "name": "Ubuntu 24.04 + SSH", "position": 10,
     "description": "A plain Ubuntu you log into with your SSH keys.",
     "image": "docker.io/library/ubuntu:24.04", "command": ["bash", "-c"], "args": [SSHD],
     "ports": [{"port": 22, "protocol": "tcp", "kind": "ssh"}], "disk_gb": 20},
    {"key": "pytorch", "name": "PyTorch 2.5 (CUDA 12.4) + SSH", "position": 20,
     "description": "PyTorch with CUDA and cuDNN; log in with SSH and train.",
     "image": "docker.io/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", "command": ["bash", "-c"], "args": [SSHD],
     "ports": [{"port": 22, "protocol": "tcp", "kind": "ssh"}], "disk_gb": 50},
    {"key": "jupyter", "name": "Jupyter (PyTorch, CUDA 12)", "position": 30,
     "description": "JupyterLab with PyTorch; opens with the lease's token.",
     "image": "quay.io/jupyter/pytorch-notebook:cuda12-python-3.11",
     "ports": [{"port": 8888, "protocol": "tcp", "kind": "http"}], "disk_gb": 50, "jupyter": True},
    {"key": "vllm", "name": "vLLM OpenAI-compatible server", "position": 40,
     "description": "Serves a Hugging Face model on /v1 (set the model in the arguments; HF_TOKEN as a secret).",
     "image": "docker.io/vllm/vllm-openai:v0.6.4", "args": ["--model", "Qwen/Qwen2.5-0.5B-Instruct"],
     "ports": [{"port": 8000, "protocol": "tcp", "kind": "http"}], "disk_gb": 80},
]


def seed(apps, schema_editor):
    Template = apps.get_model("marketplace", "Template")
    for t in TEMPLATES:
        Template.objects.update_or_create(key=t["key"], defaults=t)


def unseed(apps, schema_editor):
    apps.get_model("marketplace", "Template").objects.filter(key__in=[t["key"] for t in TEMPLATES]).delete()


class Migration(migrations.Migration):
    dependencies = [("marketplace", "0012_workloads")]
    operations = [migrations.RunPython(seed, unseed)]
