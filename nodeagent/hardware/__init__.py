"""What a GPU server's hardware is, in pure Python: NVIDIA's MIG geometry (mig.py) and the catalog of GPU models
(gpus.py). The one module the agent and the server share besides the protocol: the agent checks what it may
carve with it, the server's scheduler plans with it. Installed with the agent (it needs nothing else)."""
