"""The runtime: rollout, evaluation, datasets, sharding, checkpoint loading and the training
loop. It sits above ``sim``, ``policies`` and ``rewards`` and below the commands."""
