"""A worker: `loop` (its iterations: plan, compute, push, pull), `client` (its requests to
the servers), `coordinator_link` (its requests to the coordinator), `backward_push` and
`forward_pull` (the exchange overlapped with backward and forward), `probes` (a step's
fixed cost and memory, for LB-BSP) and `stretch` (an emulated slow machine). It imports
no other role package.

Public: `Worker`."""

from .loop import Worker

__all__ = ["Worker"]
