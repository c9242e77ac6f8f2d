"""Paths on a fleet instance shared by the boot script and the telemetry configs."""

from __future__ import annotations

from core.serving import CACHE_MOUNT

BOOT_LOG = "/var/log/harness-boot.log"
NEURON_MONITOR_CONFIG = "/etc/harness/neuron-monitor.json"
COMPILED_PREFIX = "compiled"  # results bucket: compiled/<key>/, shared by a fleet's instances

__all__ = ["BOOT_LOG", "CACHE_MOUNT", "COMPILED_PREFIX", "NEURON_MONITOR_CONFIG"]
