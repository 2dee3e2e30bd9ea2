"""How the agent ships alone to a provider's GPU server: its wheel (`python -m nodeagent.packaging.build`) and the
systemd unit that runs it (`gpumarket-agent.service`, installed with the wheel as package data)."""
