"""Rewards: VLM-derived rewards, preference-based reward learning, teachers and reward-quality
metrics, each behind ``embodied.core.reward.RewardModel``. Imports neither ``sim`` nor ``policies``."""
