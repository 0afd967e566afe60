"""Devices, links and clusters (pure data), their TOML files and the paper testbed presets."""

from paraplan.hardware.cluster import Cluster, DeviceSpec, LinkSpec, NodeSpec
from paraplan.hardware.presets import load_cluster, preset_names

__all__ = ["Cluster", "DeviceSpec", "LinkSpec", "NodeSpec", "load_cluster", "preset_names"]
