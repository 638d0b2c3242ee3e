"""CLIP rewards over rendered frames and an instruction, on open_clip towers.

``model``: the reward (``ClipReward``) and its settings; ``export``: its image tower as one
inference graph (ONNX Runtime, TorchScript); ``text``: text sides (frozen MiniLM, open_clip's
own tower); ``towers``: building open_clip models offline and reward checkpoints;
``fit``: fitting an image tower in-domain from ground-truth captions.
"""
