"""Devices, links and clusters (pure data), their TOML files and the paper testbed presets."""

from paraplan.hardware.cluster import Cluster, DeviceSpec, LinkSpec, NodeSpec
from paraplan.hardware.presets import launch_placement, load_cluster, preset_names

__all__ = ["Cluster", "DeviceSpec", "LinkSpec", "NodeSpec", "launch_placement", "load_cluster", "preset_names"]
