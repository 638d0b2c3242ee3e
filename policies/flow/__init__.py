"""Flow-matching policy: ``FlowConfig`` (config.py) and ``FlowPolicy`` (model.py)."""
