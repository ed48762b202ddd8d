"""Multi-turn rollouts in a data-parallel run: the conversations are shared out, not the turns.

Driving `MultiTurnRollout` over `DataParallelEngine` would make every turn a collective `generate`,
and ranks whose conversations end after different numbers of turns (a tool that timed out on one, an
answer that came a turn earlier on another) would wait on each other forever. Instead each rank runs
whole conversations for its share of the prompts (`DataParallelEngine.share`: contiguous blocks, the
`n` conversations of a prompt on one rank, the rank's seed) through a `MultiTurnRollout` over its own
engine, with no collective in between; one gather at the end puts every rank's conversations and
their per-conversation records back in prompt order on every rank. The metrics are computed from the
gathered records (`multi_turn_metrics`), so they are the whole batch's, exactly as one process would
compute them over the same conversations.
"""

from __future__ import annotations

from typing import Any

from relm.distributed.rollout import DataParallelEngine
from relm.rollout.base import SamplingParams, concat_outputs
from relm.rollout.multi_turn.conversations import MultiTurnOutput, multi_turn_metrics
from relm.rollout.multi_turn.driver import MultiTurnRollout


class DataParallelMultiTurn:
    """A `ConversationRollout` whose `generate` covers all prompts, each rank running its share.

    Args:
        rollout: This rank's rollout, over the rank's own engine (`engine.engine`), not the
            data-parallel one.
        engine: The run's data-parallel engine: its share, seed and gather are used.
    """

    def __init__(self, rollout: MultiTurnRollout, engine: DataParallelEngine) -> None:
        if rollout.engine is engine:
            raise ValueError("the rank's rollout must drive the rank's own engine, not the data-parallel one")
        if engine.tp_size > 1:
            # The ranks of a tensor-parallel group would have to run the same conversations turn for turn,
            # which tools answering differently on two ranks (a timeout on one) would break.
            raise ValueError("multi-turn rollouts need one rank per generation group (tp_size=1)")
        self.rollout, self.engine = rollout, engine

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return self.rollout.schemas

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        tools_kwargs: list[dict[str, Any]] | None = None,
        interaction_kwargs: list[dict[str, Any]] | None = None,
        messages: list[list[dict[str, Any]]] | None = None,
    ) -> MultiTurnOutput:
        """All `len(prompts) * params.n` conversations, in prompt order, on every rank (one gather)."""
        start, end = self.engine.share(len(prompts))

        def mine(values: list[Any] | None) -> list[Any] | None:
            return None if values is None else values[start:end]

        local = self.rollout.generate(
            prompts[start:end],
            self.engine.rank_params(params),
            tools_kwargs=mine(tools_kwargs),
            interaction_kwargs=mine(interaction_kwargs),
            messages=mine(messages),
        )
        parts = self.engine.gather((local.generation.to_cpu(), local.records))
        generation = concat_outputs([gen for gen, _ in parts])
        records = [record for _, part in parts for record in part]
        return MultiTurnOutput(generation, multi_turn_metrics(records), records)
