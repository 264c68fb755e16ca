"""Launcher helpers shared by the MSA ops."""
