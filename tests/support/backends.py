"""Backend doubles: the process's CPU backend behind the backend interface, with one thing changed."""

import torch

from adafuse.backend import Backend


class Delegating(Backend):
    """A backend that runs everything through `host` (the process's CPU backend); subclasses change one thing."""

    def __init__(self, host: Backend):
        self.host = host
        self.name = host.name

    def prepare(self, model):
        return self.host.prepare(model)

    def execute(self, passes, how):
        return self.host.execute(passes, how)

    def memory_budget(self, device):
        return self.host.memory_budget(device)

    def free_memory(self, device):
        return self.host.free_memory(device)

    def describe(self, model, exact):
        return self.host.describe(model, exact)


class ResultsOnTheHost(Delegating):
    """For runners that name another device: passes computed here, results handed back on the host (as the CUDA
    backend hands them), the host's memory as the named device's."""

    def memory_budget(self, device):
        return self.host.memory_budget(torch.device("cpu"))

    def free_memory(self, device):
        return self.host.free_memory(torch.device("cpu"))
