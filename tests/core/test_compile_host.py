"""core.compile_host: which fleets compile on a larger host first, and on which instance type."""

from __future__ import annotations

from typing import Any

import pytest

from core import catalog
from core.compile_host import compile_host, compile_hosts, compile_instance_for, host_memory_at_risk
from core.manifest import manifest_from_data


def test_the_example_inf2_fleet_compiles_on_the_smallest_inf2_that_clears_its_host_memory(
    manifest_data: dict[str, Any],
) -> None:
    m = manifest_from_data(manifest_data)
    (host,) = compile_hosts(m)  # g6 is not a Neuron fleet: never at risk
    assert (host.fleet, host.fleet_instance_type, host.fleet_host_gib) == ("inf2", "inf2.xlarge", 16)
    # 8.03e9 x 2 bytes = 14.96 GiB, above half of 16 GiB; inf2.8xlarge's 128 GiB clears it and its
    # one chip's 2 NeuronCores hold TP 2 (inf2.24xlarge and .48xlarge would too, at a higher price).
    assert host.weights_gib == pytest.approx(8.03e9 * 2 / catalog.GIB)
    assert (host.instance_type, host.host_gib, host.tensor_parallel) == ("inf2.8xlarge", 128, 2)
    assert compile_host(m, m.fleet("g6")) is None


def test_the_compile_host_must_hold_the_fleets_tensor_parallel_degree() -> None:
    xlarge = catalog.instance("inf2.xlarge")
    assert compile_instance_for(15.0, xlarge, 2).name == "inf2.8xlarge"  # type: ignore[union-attr]
    # TP 8 needs 8 NeuronCores: inf2.8xlarge (2 cores) clears the memory but cannot run it.
    assert compile_instance_for(15.0, xlarge, 8).name == "inf2.24xlarge"  # type: ignore[union-attr]
    assert compile_instance_for(15.0, xlarge, 24).name == "inf2.48xlarge"  # type: ignore[union-attr]


def test_a_model_no_instance_can_compile_has_no_compile_host(manifest_data: dict[str, Any]) -> None:
    # 300B at bf16 = 559 GiB: above half of inf2.48xlarge's 768 GiB too.
    manifest_data["model"]["params_b"] = 300.0
    m = manifest_from_data(manifest_data)
    host = compile_host(m, m.fleet("inf2"))
    assert host is not None and host.instance_type is None and host.host_gib is None
    assert compile_instance_for(host.weights_gib, catalog.instance("inf2.xlarge"), 2) is None
    why = host.cannot_compile()
    assert "weights 558.8 GiB are 3492% of inf2.xlarge's 16 GiB host memory" in why
    assert "no Inferentia2 instance in core/catalog.py with TP 2 has host memory above 1117.6 GiB" in why


def test_only_neuron_hosts_are_at_risk() -> None:
    assert host_memory_at_risk(15.0, catalog.instance("inf2.xlarge"))
    assert not host_memory_at_risk(15.0, catalog.instance("inf2.8xlarge"))
    assert not host_memory_at_risk(15.0, catalog.instance("g6.xlarge"))  # the GPU load path is not the reported risk
