"""Interactions: a scripted user or environment that answers the model after each of its turns.

verl's `rollout.multi_turn.interaction_config_path` (verl 0.4 to 0.7; 0.8 removed it): a YAML list
`interaction:` of entries with `name`, `class_name` and `config`, and each row's
`extra_info.interaction_kwargs` naming the one it talks to (`name`) plus its own arguments (a ground
truth, a secret). A turn of the model without a tool call goes to the row's interaction, whose reply
is appended as the chat template's `user` turn (mask 0, like a tool result); the interaction may end
the episode and gives a score each turn, which reaches the reward function as
`extra_info["turn_scores"]`, as in verl.

A class written for verl's `BaseInteraction` works as it is: `start_interaction(instance_id, **kwargs)`,
`generate_response(instance_id, messages, **kwargs) -> (should_terminate, text, score, metadata)` and
`finalize_interaction(instance_id)`, each plain or `async`.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from relm.errors import UserError
from relm.rollout.multi_turn.tools import config_entries

KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"


class Interaction(Protocol):
    """verl's `BaseInteraction` methods that relm calls (any of them may be `async`)."""

    name: str

    def start_interaction(self, instance_id: str, **kwargs: Any) -> Any: ...

    def generate_response(self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any) -> Any: ...

    def finalize_interaction(self, instance_id: str, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class InteractionReply:
    """One answer of the user to the model's turn."""

    should_terminate: bool
    """The episode ends after this reply."""
    text: str
    """What the user says, rendered as the template's `user` turn."""
    score: float | None
    """This turn's score (None: the interaction gave none)."""


@dataclass
class InteractionSession:
    """One conversation's interaction: which one, its instance, and what it has seen."""

    interaction: Interaction
    instance_id: str
    kwargs: dict[str, Any]
    """The row's `extra_info.interaction_kwargs` (its `name` included, as verl passes them)."""
    messages: list[dict[str, Any]]
    """The conversation as chat messages: the prompt's, then each turn's decoded text, as verl keeps them."""
    turn_scores: list[float] = field(default_factory=list)
    replies: int = 0
    """User turns the interaction has written."""


class GuessingGame:
    """A number-guessing environment: the model guesses, the user says `higher`/`lower` until it is
    right, which ends the episode with score 1 (0 for each wrong or missing guess).

    `interaction_kwargs`: `secret` (the number), and optionally `low`/`high` (named when the model
    writes no number).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.name = str(config.get("name", "guessing_game"))
        self._games: dict[str, dict[str, Any]] = {}

    def start_interaction(self, instance_id: str, secret: Any = None, **kwargs: Any) -> str:
        if secret is None:
            raise ValueError("the guessing game needs `secret` in the row's extra_info.interaction_kwargs")
        self._games[instance_id] = {
            "secret": int(secret),
            "low": kwargs.get("low"),
            "high": kwargs.get("high"),
        }
        return instance_id

    def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        game = self._games[instance_id]
        said = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        numbers = re.findall(r"-?\d+", str(said))
        if not numbers:
            span = f" between {game['low']} and {game['high']}" if game["low"] is not None else ""
            return False, f"Guess a number{span}.", 0.0, {}
        guess = int(numbers[-1])
        if guess == game["secret"]:
            return True, "Correct!", 1.0, {}
        return False, "Higher." if guess < game["secret"] else "Lower.", 0.0, {}

    def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self._games.pop(instance_id, None)


def load_interactions(config_path: str) -> dict[str, Interaction]:
    """The interactions of verl's interaction config, by name. A missing `name` is derived from the class
    name as verl does (`Gsm8kInteraction` -> `gsm8k`); each class is built as `cls(config={..., name})`.

    Raises:
        UserError: The file is missing or malformed, a class does not import or build, or two share a name.
    """
    interactions: dict[str, Interaction] = {}
    for loaded in config_entries(config_path, KEY, "interaction", "interaction"):
        where, class_name = loaded.where, loaded.entry["class_name"]
        name = loaded.entry.get("name") or _default_name(class_name)
        if name in interactions:
            raise UserError(f"{where}: a second interaction named `{name}`; give each its own `name`")
        try:
            interactions[name] = loaded.cls(config={**dict(loaded.entry.get("config") or {}), "name": name})
        except Exception as exc:
            raise UserError(f"{where}: {class_name}(config=...) raised {exc!r}") from exc
    return interactions


def _default_name(class_name: str) -> str:
    simple = class_name.rsplit(".", 1)[-1]
    return (simple.removesuffix("Interaction") if simple.endswith("Interaction") else simple).lower()


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class InteractionRunner:
    """Opens, asks and closes the interactions of one rollout's conversations.

    Args:
        interactions: By name, from `load_interactions`.
    """

    def __init__(self, interactions: dict[str, Interaction]) -> None:
        self.interactions = interactions

    def open(
        self, interaction_kwargs: list[dict[str, Any]], messages: list[list[dict[str, Any]]]
    ) -> list[InteractionSession]:
        """One session per conversation; `interaction_kwargs[i]` is row i's `extra_info.interaction_kwargs`
        (its `name` may be left out when only one interaction is configured)."""
        sessions = []
        for kwargs, prompt in zip(interaction_kwargs, messages, strict=True):
            kwargs = dict(kwargs or {})
            name = kwargs.get("name")
            if name is None and len(self.interactions) == 1:
                name = kwargs["name"] = next(iter(self.interactions))
            if name not in self.interactions:
                known = ", ".join(sorted(self.interactions))
                raise UserError(
                    f"a row's extra_info.interaction_kwargs names interaction {name!r}; {KEY} defines: {known} "
                    "(set `interaction_kwargs.name` in every row)"
                )
            sessions.append(
                InteractionSession(self.interactions[name], uuid.uuid4().hex, kwargs, list(prompt))
            )
        asyncio.run(self._each(sessions, "start_interaction"))
        return sessions

    async def _each(self, sessions: list[InteractionSession], method: str) -> None:
        async def one(session: InteractionSession) -> None:
            call = getattr(session.interaction, method)
            kwargs = session.kwargs if method == "start_interaction" else {}
            try:
                await _maybe_await(call(session.instance_id, **kwargs))
            except Exception as exc:
                raise _user_error(session, method, exc) from exc

        await asyncio.gather(*(one(s) for s in sessions))

    def respond(self, sessions: dict[int, InteractionSession]) -> dict[int, InteractionReply]:
        """Each session's reply to the model's latest turn (already in its `messages`), asked concurrently."""

        async def one(session: InteractionSession) -> InteractionReply:
            try:
                out = await _maybe_await(
                    session.interaction.generate_response(
                        session.instance_id, session.messages, **session.kwargs
                    )
                )
                terminate, text, score = bool(out[0]), str(out[1]), out[2]
            except Exception as exc:
                raise _user_error(session, "generate_response", exc) from exc
            session.replies += 1
            if score is not None:
                session.turn_scores.append(float(score))
            session.messages.append({"role": "user", "content": text})
            return InteractionReply(terminate, text, None if score is None else float(score))

        async def run() -> list[InteractionReply]:
            return await asyncio.gather(*(one(s) for s in sessions.values()))

        return dict(zip(sessions, asyncio.run(run()), strict=True))

    def close(self, sessions: list[InteractionSession]) -> None:
        """Release every session's state (verl's `finalize_interaction`)."""
        asyncio.run(self._each(sessions, "finalize_interaction"))


def _user_error(session: InteractionSession, method: str, exc: Exception) -> UserError:
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    name = type(session.interaction).__name__
    return UserError(
        f"interaction `{session.interaction.name}` ({name}.{method}) raised {reason}; fix the class or its row's interaction_kwargs"
    )
