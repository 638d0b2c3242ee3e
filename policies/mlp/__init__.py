"""MLP behaviour-cloning baseline: ``MLPConfig`` (config.py) and ``MLPPolicy`` (model.py)."""
