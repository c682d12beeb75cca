"""Operator tools over the ports: rebuild, verify, replay and analyze."""
