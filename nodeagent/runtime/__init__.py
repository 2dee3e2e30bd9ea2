"""Container runtimes: what runs a lease's workload on its slice. `docker.DockerRuntime` talks to a real engine
(Docker, or Podman's `podman system service`) over the Docker Engine API; `simulated.SimulatedRuntime` plays the
same states without one (the demo on a laptop); `base.NoRuntime` refuses workloads."""
