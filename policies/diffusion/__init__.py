"""Diffusion policy: ``DiffusionConfig`` (config.py) and ``DiffusionPolicy`` (model.py)."""
