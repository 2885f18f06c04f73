"""Gatehouse's public API for agent authors: see `gatehouse.durable`."""
