"""Rewards: VLM-derived rewards, preference-based reward learning, teachers and reward-quality
metrics, each behind ``embodied.core.reward.RewardModel``. Imports neither ``sim`` nor ``policies``.

- ``rewards.vlm``: CLIP rewards on open_clip (cosine, goal-baseline projection, contrastive
  negatives), their rollout banks and caption labels, their in-domain fitting against a locked
  text side, and their evaluation and throughput.
- ``rewards.quality``: success AUROC, VOC, return Spearman, EPIC -- for any reward.
- ``rewards.registry``: reward models by name (``make_reward({"name": "clip", ...})``).
- ``rewards.wrappers``: a reward model in gymnasium and stable-baselines3 loops.
- ``rewards.report``: the reward-quality report (tables and plots).
"""
