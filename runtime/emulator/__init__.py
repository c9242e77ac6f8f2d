"""A local OpenAI-compatible streaming server that simulates one accelerator instance."""

from runtime.emulator.app import create_app
from runtime.emulator.config import EmulatorConfig, FaultConfig
from runtime.emulator.timing import TimingModel

__all__ = ["EmulatorConfig", "FaultConfig", "TimingModel", "create_app"]
