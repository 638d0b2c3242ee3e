"""One module per ``embodied`` sub-command; each exposes ``main()`` (a Hydra app) and ``run(cfg)``."""
