"""Parts shared by every policy family: config schema, normaliser, encoders, text
embedders, denoising networks, EMA, the ``TorchPolicy`` base and checkpoints."""
