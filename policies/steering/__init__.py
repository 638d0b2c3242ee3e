"""Latent-noise steering (DSRL, Wagenmaker et al. 2025): improve a frozen flow/diffusion
policy by RL on its initial noise, without touching its weights.

    noise.py      the noise action space (full chunk or shared), features, decoding
    env.py        NoiseEnv / NoiseVecEnv: env'(s, w) = env(s, decode(s, w)); reward sources
    sb3.py        DSRL-SAC (TD3, PPO) with stock stable-baselines3
    na.py         DSRL-NA: noise aliasing, its own small loop
    policy.py     SteeredPolicy: frozen base + noise actor, saved beside the base weights
    baselines.py  raw-action SAC and a residual on the base policy's chunks
    progress.py   the env-step budget, progress bar and periodic evaluation

``embodied steer`` (``embodied.runtime.steer``) runs it end to end. This package needs only
the ``Policy`` contract, gymnasium and stable-baselines3: it imports neither ``sim`` nor
``rewards`` (a reward model arrives as an ``embodied.core.reward.RewardModel``).
"""
