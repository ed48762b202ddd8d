"""`python -m relm.trainer.main_ppo [--config FILE.yaml] [section.key=value ...]` (same as `relm train`)."""

from __future__ import annotations

import logging
import sys

from relm.config.loader import load_config
from relm.config.validate import CONFIG_OK_MESSAGE, validate_config
from relm.errors import UserError, run_guarded
from relm.logs import setup_logging
from relm.models.loading import resolve_model_dir

logger = logging.getLogger("relm")


def model_max_positions(model_dir: str, trust_remote_code: bool) -> int | None:
    """The model's position limit from its config (cheap: no weights are read)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - any failure here is a broken model folder
        raise UserError(
            f"actor_rollout_ref.model.path: cannot read the config of `{model_dir}` "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); point it at a causal-LM folder"
        ) from exc
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text_config, "max_position_embeddings", None)


def train_command(argv: list[str]) -> int:
    """Validate everything cheap first, say so, then build the run and train."""
    cfg = load_config(argv)
    model = cfg.actor_rollout_ref.model
    model_dir = resolve_model_dir(model.path)
    validate_config(cfg, max_position_embeddings=model_max_positions(model_dir, model.trust_remote_code))
    print(CONFIG_OK_MESSAGE, flush=True)

    from relm.trainer.components import build_components
    from relm.trainer.ppo import train

    train(build_components(cfg, model_dir))
    return 0


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    return run_guarded(lambda: train_command(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
