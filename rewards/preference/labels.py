"""``embodied label``: record queries with frames and serve the labelling page for a person."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from rewards.preference.episodes import HELDOUT_SEED
from rewards.preference.queries import check_choice
from rewards.preference.ranking import RankingLearner
from rewards.preference.segments import sample_pairs
from rewards.preference.store import ON_MALFORMED, LabelStore

log = logging.getLogger("embodied.prefer")


@dataclass
class LabelConfig:
    """Schema of ``configs/label.yaml``."""

    labels: str = ""  # the label store directory
    task: str = ""  # with queries > 0: record new queries of this task first (a new store needs it)
    queries: int = 0  # new queries to record before serving (from the ranking learner's candidates)
    segment_length: int = 25
    episodes: int = 4  # episodes (each played by every candidate) the new queries are cut from
    candidates: int = 8
    render_size: int = 96
    host: str = "127.0.0.1"  # loopback only
    port: int = 8765
    exit_when_done: bool = False  # stop serving once every query is answered
    labels_on_malformed: str = "raise"
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.labels:
            raise ValueError("give the label store: labels=DIR (made by `embodied prefer` or by queries=N task=NAME)")
        if self.queries < 0 or self.seed < 0:
            raise ValueError(f"queries and seed must be >= 0, got queries={self.queries}, seed={self.seed}")
        if self.queries and not self.task:
            raise ValueError("queries=N records new queries of a task: give task=NAME")
        check_choice("labels_on_malformed", self.labels_on_malformed, ON_MALFORMED)


def record_queries(cfg: LabelConfig, store_path: str) -> LabelStore:
    """Add ``cfg.queries`` uniformly drawn queries, with frames, to the store (made if absent)."""
    learner = RankingLearner(cfg.task, cfg.candidates, cfg.seed, True, cfg.render_size)
    env = learner.env.unwrapped
    meta = {"task": cfg.task, "state_dim": len(env.privileged_state()), "action_dim": env.action_space.shape[0],
            "segment_length": cfg.segment_length}
    store = LabelStore(store_path, meta, cfg.labels_on_malformed)
    learner.next_seed = cfg.seed + 3 * HELDOUT_SEED + len(store.query_ids)  # fresh episodes for every call
    trajs = learner.rollout(cfg.episodes)
    rng = np.random.default_rng([cfg.seed, len(store.query_ids)])
    for q in sample_pairs(trajs, cfg.queries, cfg.segment_length, rng):
        store.add_query(q)
    return store


def serve_labels(cfg: LabelConfig) -> dict[str, Any]:
    """``embodied label``: serve the page until interrupted (or until done with ``exit_when_done``)."""
    import signal
    import time

    from rewards.preference.server import LabelServer

    store = record_queries(cfg, cfg.labels) if cfg.queries else LabelStore(cfg.labels, None, cfg.labels_on_malformed)
    if not store.query_ids:
        raise ValueError(f"label store {cfg.labels} holds no query: record some with queries=N task=NAME")
    server = LabelServer(store, cfg.host, cfg.port).start()
    print(f"label page: {server.url}  ({len(store.pending())} of {len(store.query_ids)} queries to answer; "
          "every answer is saved at once; Ctrl-C stops)", flush=True)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        while not (cfg.exit_when_done and not store.pending()):
            time.sleep(0.2)
    except KeyboardInterrupt:
        log.info("stopped; answers so far are on disk in %s", store.labels_path)
    finally:
        signal.signal(signal.SIGTERM, old)
        server.stop()
        store.close()
    return {"labels_path": str(store.root), "url": server.url, **store.counts(), "pending": len(store.pending())}
