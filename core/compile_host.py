"""Where a Neuron fleet's model is compiled: on its own instances, or once on a larger host first.

Loading a checkpoint (and, on Neuron, tracing + compiling it) holds the weights in host memory
at least once more beside the runtime: weights above half the host's RAM are at risk. Reports:
aws-neuron/nki-samples#87 (Llama-3.1-8B, ~16 GB of weights, compile killed on trn1.2xlarge's
32 GB), vllm-project/vllm#6452 (Mistral-7B would not load on Inferentia until a larger instance).

Such a fleet is compiled once, before it boots, on the smallest instance of the same accelerator
whose host memory clears the risk and whose NeuronCores hold the fleet's tensor-parallel degree,
with the fleet's own server definition: the compiled set is keyed by the fleet's instance type
and loads there. The Neuron docs name this flow: "Model compilation can be executed on a non-inf2
instance for later deployment ... leverage Amazon Simple Storage Service (S3) to share the
compiled models between different instances" ("Compile with Framework API and Deploy on EC2
Inf2", https://awsdocs-neuron.readthedocs-hosted.com/en/latest/devflows/inference/ec2-then-ec2-devflow-inf2.html).
`campaign plan` prices it, `campaign deploy` runs it (campaign/aws/compile_phase.py), the stacks
build its instance (stacks/compile_instance.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from core import catalog
from core.manifest import Fleet, Manifest, weight_bytes

HOST_MEMORY_RISK_FRACTION = 0.5


def host_memory_at_risk(weights_gib: float, it: catalog.InstanceType) -> bool:
    """Neuron only: the reports above are of the Neuron load/compile path. GPU stacks map the
    safetensors and copy them to the device, and the seed's G6 baseline serves an 8B model on
    g6.xlarge (16 GiB host) today."""
    return it.accelerator.vendor == "aws-neuron" and weights_gib > HOST_MEMORY_RISK_FRACTION * it.memory_gib


@dataclass(frozen=True)
class CompileHost:
    """One at-risk fleet and the instance type that compiles its model; `instance_type` None: no
    instance of its accelerator in the catalog clears the risk."""

    fleet: str
    fleet_instance_type: str
    fleet_host_gib: int
    weights_gib: float
    tensor_parallel: int
    instance_type: str | None
    host_gib: int | None

    def cannot_compile(self) -> str:
        """Why no host can compile it, with the numbers."""
        acc = catalog.instance(self.fleet_instance_type).accelerator.name
        return (
            f"{self.fleet}: weights {self.weights_gib:.1f} GiB are {self.weights_gib / self.fleet_host_gib:.0%} of "
            f"{self.fleet_instance_type}'s {self.fleet_host_gib} GiB host memory (risk above "
            f"{HOST_MEMORY_RISK_FRACTION:.0%}), and no {acc} instance in core/catalog.py with TP {self.tensor_parallel} "
            f"has host memory above {self.weights_gib / HOST_MEMORY_RISK_FRACTION:.1f} GiB to compile it on"
        )


def compile_instance_for(weights_gib: float, fleet_type: catalog.InstanceType, tp: int) -> catalog.InstanceType | None:
    """The smallest instance (host memory, then vCPUs) of `fleet_type`'s accelerator that holds TP
    `tp` and whose host memory is not at risk; None when the catalog has none."""
    fits = [
        it
        for it in catalog.CATALOG.values()
        if it.accelerator == fleet_type.accelerator and tp in it.tp_degrees and not host_memory_at_risk(weights_gib, it)
    ]
    return min(fits, key=lambda it: (it.memory_gib, it.vcpus, it.name), default=None)


def compile_host(m: Manifest, f: Fleet) -> CompileHost | None:
    """The fleet's compile host when its own host memory is at risk, else None (it compiles on its
    own instances, the first boots)."""
    it = catalog.instance(f.instance_type)
    weights_gib = weight_bytes(m) / catalog.GIB
    if not host_memory_at_risk(weights_gib, it):
        return None
    host = compile_instance_for(weights_gib, it, f.tensor_parallel)
    return CompileHost(
        fleet=f.name,
        fleet_instance_type=f.instance_type,
        fleet_host_gib=it.memory_gib,
        weights_gib=weights_gib,
        tensor_parallel=f.tensor_parallel,
        instance_type=host.name if host else None,
        host_gib=host.memory_gib if host else None,
    )


def compile_hosts(m: Manifest) -> list[CompileHost]:
    """Every at-risk fleet of the manifest, in manifest order."""
    return [h for h in (compile_host(m, f) for f in m.fleets) if h is not None]
