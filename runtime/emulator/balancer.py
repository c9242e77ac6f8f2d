"""How one fleet's requests are spread over its instances, as the cloud's Network Load Balancer does.

An NLB sends each TCP connection to a target chosen by a hash of its flow (protocol, addresses,
ports), and the load generator opens one connection per request (`Connection: close`), each from
a fresh source port: every request lands on an instance drawn afresh, whatever the others got and
however busy each instance is. Modelled as a seeded uniform draw per request, in arrival order,
by the live emulator (runtime.emulator.scheduler) and the simulated replays
(campaign.backends.simulated.fleets) alike. Not round-robin and not least-outstanding: those smooth each
instance's arrivals (or pool the instances' queues) and would overstate what one instance
sustains behind the NLB; with the draw each instance sees a random thinning of the trace, as one
instance replaying 1/N of it would. Within an instance its replicas take turns (round-robin, the
nginx default of the published data-parallel setups), as before.
"""

from __future__ import annotations

import random

SEED = 0  # fixed: the same spread on every run, live and simulated


class FlowHash:
    """Which of `instances` instances each successive request goes to."""

    def __init__(self, instances: int, seed: int = SEED):
        if instances < 1:
            raise ValueError(f"instances must be >= 1, got {instances}")
        self.instances = instances
        self._rng = random.Random(seed)

    def pick(self) -> int:
        return self._rng.randrange(self.instances) if self.instances > 1 else 0
