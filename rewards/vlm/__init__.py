"""CLIP rewards over rendered frames and an instruction, on open_clip towers; the room of
``embodied reward fit | eval | bench`` (the runtime only wires it to the command).

Read top to bottom:

- ``model``: the reward (``ClipReward``) and its settings; ``export``: its image tower as one
  inference graph (ONNX Runtime, TorchScript); ``text``: text sides (frozen MiniLM, open_clip's
  own tower); ``towers``: building open_clip models offline and reward checkpoints;
- ``bank``: rollout banks, episodes of a suite's tasks with frames and ground truth;
- ``labels``: the caption labels of a bank's frames (the reward design);
- ``fit``: fitting an image tower in-domain from ground-truth captions; ``fit_reward``: the
  whole fit, from a training bank to a checkpoint;
- ``evaluate``: reward quality of any ``RewardModel`` on a held-out bank; ``bench``: throughput.
"""
